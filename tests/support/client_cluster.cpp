#include "tests/support/client_cluster.hpp"

#include <algorithm>
#include <map>

#include <doctest/doctest.h>

#include "runtime/address.hpp"
#include "runtime/system_setup.hpp"
#include "tests/support/http_client.hpp"

namespace troupe::testing {

using namespace std::chrono_literals;

void ClientCluster::start(const std::vector<std::string>& workers,
                          const std::vector<std::string>& head_args,
                          const std::map<std::string, std::vector<std::string>>& worker_args) {
  cluster.start(workers, head_args, worker_args);
  configure_actor_system(cfg, TransportOptions{});
  sys = std::make_unique<caf::actor_system>(cfg);
  auto c = ControllerClient::connect(*sys, parse_endpoint(cluster.address).value(), 5);
  REQUIRE(c.has_value());
  client.emplace(std::move(c.value()));
}

void ClientCluster::reconnect(std::chrono::milliseconds deadline) {
  std::string last;
  bool ok = wait_until(
      [&] {
        auto c = ControllerClient::connect(*sys, parse_endpoint(cluster.address).value(), 5);
        if (!c) {
          last = c.status().to_string();
          return false;
        }
        client.emplace(std::move(c.value()));
        return client->status_json().has_value();
      },
      deadline, 200ms);
  REQUIRE_MESSAGE(ok, "cannot connect to the head again: " << last);
}

nlohmann::json ClientCluster::status() {
  auto s = client->status_json();
  REQUIRE(s.has_value());
  return nlohmann::json::parse(*s);
}

nlohmann::json ClientCluster::deployment(const std::string& app, const std::string& dep) {
  auto s = client->status_json();
  if (!s)
    return nlohmann::json::object();
  auto all = nlohmann::json::parse(*s);
  auto& apps = all.at("applications");
  if (!apps.contains(app) || !apps[app]["deployments"].contains(dep))
    return nlohmann::json::object();
  return apps[app]["deployments"][dep];
}

bool ClientCluster::wait_healthy(const std::string& app, const std::string& dep, size_t n,
                                 std::chrono::milliseconds deadline) {
  nlohmann::json last;
  bool ok = wait_until(
      [&] {
        last = deployment(app, dep);
        if (last.value("status", "") != "HEALTHY")
          return false;
        auto rows = last.value("replicas", nlohmann::json::array());
        return rows.size() == n &&
               std::all_of(rows.begin(), rows.end(),
                           [](const nlohmann::json& r) { return r.at("state") == "RUNNING"; });
      },
      deadline, 100ms);
  if (!ok) {
    MESSAGE("last status of " << app << "/" << dep << ": " << last.dump(2));
    cluster.dump_output();
  }
  return ok;
}

bool ClientCluster::wait_routed(const std::string& node, const std::string& app,
                                const std::string& dep, size_t n,
                                std::chrono::milliseconds deadline) {
  std::string last;
  bool ok = wait_until(
      [&] {
        auto r = http_get(cluster.admin_ports.at(node), "/-/routes", 2);
        if (!r || r->status != 200) {
          last = r ? std::to_string(r->status) + " " + r->body : "no answer";
          return false;
        }
        last = r->body;
        auto view = nlohmann::json::parse(r->body, nullptr, false);
        if (!view.is_object())
          return false;
        for (const auto& d : view.value("deployments", nlohmann::json::array())) {
          if (d.at("application") == app && d.at("deployment") == dep)
            return d.at("replicas").size() == n;
        }
        return false;
      },
      deadline, std::chrono::milliseconds(100));
  if (!ok)
    MESSAGE("last routes of " << node << ": " << last);
  return ok;
}

}  // namespace troupe::testing
