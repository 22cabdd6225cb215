// Replicas of example deployments on a real 3-node loopback cluster, driven
// through the controller's actor interface (the client library troupectl
// uses). Every wait is a condition with a deadline.
#include <signal.h>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "runtime/system_setup.hpp"
#include "tests/support/cluster.hpp"
#include "tools/troupectl/client.hpp"

using namespace troupe;
using namespace troupe::testing;
using nlohmann::json;

namespace {

controller::ApplicationSpec app_spec(const std::string& name, const std::string& prefix,
                                     const std::string& cls, uint32_t replicas,
                                     const std::string& user_config = "",
                                     const std::string& version = "v1",
                                     const std::string& library = "libtroupe_examples.so") {
  controller::DeploymentSpec d;
  d.name = cls;
  d.import_path = library + ":" + cls;
  d.code_version = version;
  d.config.num_replicas = replicas;
  d.config.user_config = user_config;
  d.config.health_check_period_s = 0.5;
  d.config.health_check_timeout_s = 2;
  d.config.graceful_shutdown_wait_loop_s = 0.2;
  d.config.graceful_shutdown_timeout_s = 2;
  controller::ApplicationSpec app;
  app.name = name;
  app.route_prefix = prefix;
  app.ingress = cls;
  app.deployments = {d};
  return app;
}

struct Fixture {
  Cluster cluster;
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::optional<ControllerClient> client;

  explicit Fixture(std::vector<std::string> worker_ids = {"w1", "w2"}) {
    cluster.start_head();
    std::map<std::string, std::string> expected{{"head", "ALIVE"}};
    for (const auto& id : worker_ids) {
      cluster.start_worker(id);
      expected[id] = "ALIVE";
    }
    REQUIRE(cluster.wait_states(expected, 20s));
    configure_actor_system(cfg, TransportOptions{});
    sys = std::make_unique<caf::actor_system>(cfg);
    auto endpoint = parse_endpoint(cluster.address).value();
    auto c = ControllerClient::connect(*sys, endpoint, 5);
    REQUIRE(c.has_value());
    client.emplace(std::move(c.value()));
  }

  json status() {
    auto s = client->status_json();
    REQUIRE(s.has_value());
    return json::parse(*s);
  }

  json deployment(const std::string& app, const std::string& dep) {
    auto s = status();
    auto& apps = s.at("applications");
    if (!apps.contains(app) || !apps[app]["deployments"].contains(dep))
      return json::object();
    return apps[app]["deployments"][dep];
  }

  // Waits until the deployment is HEALTHY with `n` RUNNING replicas.
  bool wait_healthy(const std::string& app, const std::string& dep, size_t n,
                    std::chrono::milliseconds deadline = 30s) {
    json last;
    bool ok = wait_until(
        [&] {
          last = deployment(app, dep);
          if (last.value("status", "") != "HEALTHY")
            return false;
          auto rows = last.value("replicas", json::array());
          return rows.size() == n && std::all_of(rows.begin(), rows.end(), [](const json& r) {
                   return r.at("state") == "RUNNING";
                 });
        },
        deadline, 100ms);
    if (!ok) {
      MESSAGE("last status of " << app << "/" << dep << ": " << last.dump(2));
      cluster.dump_output();
    }
    return ok;
  }

  std::vector<ReplicaEndpoint> endpoints(const std::string& app, const std::string& dep) {
    auto snap = client->snapshot();
    REQUIRE(snap.has_value());
    for (auto& d : snap->deployments) {
      if (d.app == app && d.deployment == dep)
        return d.replicas;
    }
    return {};
  }

  Result<HttpResponse> call(const caf::actor& replica, const std::string& path,
                            const std::string& query = "", double timeout_s = 10) {
    caf::scoped_actor self{*sys};
    Result<HttpResponse> out(errc::internal, "no answer");
    HttpRequest req{"GET", path, query, {}, "", "test"};
    self->request(replica, std::chrono::milliseconds(static_cast<int>(timeout_s * 1000)),
                  handle_atom::value, req)
        .receive([&](HttpResponse& r) { out = std::move(r); },
                 [&](caf::error& e) { out = from_caf_error(e); });
    return out;
  }

  std::map<std::string, int> per_node(const json& dep) {
    std::map<std::string, int> out;
    for (const auto& r : dep.at("replicas"))
      out[r.at("node").get<std::string>()]++;
    return out;
  }

  std::set<std::string> replica_ids(const json& dep) {
    std::set<std::string> out;
    for (const auto& r : dep.at("replicas"))
      out.insert(r.at("id").get<std::string>());
    return out;
  }
};

}  // namespace

TEST_CASE("echo with 6 replicas runs 2-2-2 over three nodes, and counter answers from every node") {
  Fixture f;
  REQUIRE(f.client->deploy(app_spec("echo", "/echo", "Echo", 6)).has_value());
  REQUIRE(f.wait_healthy("echo", "Echo", 6));
  auto spread = f.per_node(f.deployment("echo", "Echo"));
  CHECK(spread == std::map<std::string, int>{{"head", 2}, {"w1", 2}, {"w2", 2}});

  REQUIRE(f.client->deploy(app_spec("counter", "/counter", "Counter", 3)).has_value());
  REQUIRE(f.wait_healthy("counter", "Counter", 3));
  std::set<std::string> nodes_seen;
  auto eps = f.endpoints("counter", "Counter");
  REQUIRE(eps.size() == 3);
  for (auto& ep : eps) {
    for (int i = 1; i <= 2; ++i) {
      auto r = f.call(ep.handle, "/");
      REQUIRE(r.has_value());
      CHECK(r->status == 200);
      auto body = json::parse(r->body);
      CHECK(body.at("count") == i);  // per-replica state
      CHECK(body.at("replica_id") == ep.replica_id);
      nodes_seen.insert(body.at("node_id").get<std::string>());
    }
  }
  CHECK(nodes_seen == std::set<std::string>{"head", "w1", "w2"});
}

TEST_CASE("a killed replica is replaced; the others are untouched") {
  Fixture f;
  REQUIRE(f.client->deploy(app_spec("echo", "/echo", "Echo", 3)).has_value());
  REQUIRE(f.wait_healthy("echo", "Echo", 3));
  auto before = f.replica_ids(f.deployment("echo", "Echo"));
  auto victim = *before.begin();
  REQUIRE(f.client->kill_replica(victim).is_ok());
  // Wait until the replacement runs: three RUNNING replicas, the victim gone.
  REQUIRE(wait_until(
      [&] {
        auto dep = f.deployment("echo", "Echo");
        return dep.value("status", "") == "HEALTHY" && f.replica_ids(dep).size() == 3 &&
               f.replica_ids(dep).count(victim) == 0;
      },
      30s, 50ms));
  // The controller logs every status transition; the crash showed as UNHEALTHY.
  auto log = f.cluster.nodes.at("head").output();
  CHECK(log.find("deployment echo/Echo: HEALTHY -> UNHEALTHY (HEALTH_CHECK_FAILED): Replica " +
                 victim + " crashed") != std::string::npos);
  CHECK(log.find("deployment echo/Echo: UNHEALTHY -> HEALTHY") != std::string::npos);
  auto after = f.replica_ids(f.deployment("echo", "Echo"));
  CHECK(after.count(victim) == 0);
  for (const auto& id : before) {
    if (id != victim)
      CHECK(after.count(id) == 1);
  }
}

TEST_CASE("a constructor that throws makes the deployment DEPLOY_FAILED; other apps run on") {
  Fixture f;
  REQUIRE(f.client->deploy(app_spec("echo", "/echo", "Echo", 2)).has_value());
  REQUIRE(f.wait_healthy("echo", "Echo", 2));
  REQUIRE(f.client->deploy(app_spec("fail", "/fail", "FailInit", 1)).has_value());
  json last;
  bool failed = wait_until(
      [&] {
        last = f.deployment("fail", "FailInit");
        return last.value("status", "") == "DEPLOY_FAILED";
      },
      30s, 100ms);
  CHECK(failed);
  CHECK(last.value("message", "").find("FailInit always fails to start") != std::string::npos);
  CHECK(f.status()["applications"]["fail"]["status"] == "DEPLOY_FAILED");
  CHECK(f.deployment("echo", "Echo").value("status", "") == "HEALTHY");
}

TEST_CASE("a missing library or class is a DEPLOY_FAILED naming the path and the loader error") {
  Fixture f(std::vector<std::string>{});
  REQUIRE(f.client->deploy(app_spec("nolib", "/nolib", "Echo", 1, "", "v1", "libmissing.so"))
              .has_value());
  REQUIRE(f.client->deploy(app_spec("nocls", "/nocls", "NoSuchClass", 1)).has_value());
  json lib;
  json cls;
  bool failed = wait_until(
      [&] {
        lib = f.deployment("nolib", "Echo");
        cls = f.deployment("nocls", "NoSuchClass");
        return lib.value("status", "") == "DEPLOY_FAILED" &&
               cls.value("status", "") == "DEPLOY_FAILED";
      },
      30s, 100ms);
  CHECK(failed);
  CHECK(lib.value("message", "").find("library 'libmissing.so' not found in plugin path") !=
        std::string::npos);
  CHECK(cls.value("message", "").find("has no deployment 'NoSuchClass'") != std::string::npos);
  CHECK(cls.value("message", "").find(std::string(TROUPE_PLUGIN_DIR) + "/libtroupe_examples.so") !=
        std::string::npos);
}
