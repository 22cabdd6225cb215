// Autoscaling end to end: load through a node's HTTP proxy makes a
// deployment scale up, and down again when the load stops; a deployment
// scaled to zero serves a request by starting a replica (cold start).
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <optional>
#include <thread>
#include <vector>

#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"

using namespace troupe::testing;
using nlohmann::json;

namespace {

struct Scaled {
  Cluster cluster;
  uint16_t http_port = 0;

  Scaled() {
    cluster.start();
    http_port = cluster.http_ports.at("head");
  }

  // The deployment's entry of `troupectl status --json`; nullopt when the
  // status call fails or does not list the deployment.
  std::optional<json> deployment(const std::string& app, const std::string& dep) {
    auto s = cluster.status(120s);
    if (!s.is_object() || !s.contains("applications") || !s["applications"].contains(app))
      return std::nullopt;
    auto& deployments = s["applications"][app]["deployments"];
    if (!deployments.contains(dep))
      return std::nullopt;
    return deployments[dep];
  }

  // RUNNING replicas of the deployment; nullopt (never 0) when the status
  // call fails or lists no replicas for it, so that "== 0" means zero.
  std::optional<size_t> running(const std::string& app, const std::string& dep) {
    auto d = deployment(app, dep);
    if (!d || !d->contains("replicas") || !(*d)["replicas"].is_array())
      return std::nullopt;
    size_t n = 0;
    for (const auto& r : (*d)["replicas"]) {
      if (r["state"] == "RUNNING")
        ++n;
    }
    return n;
  }
};

}  // namespace

TEST_CASE("a sleep deployment scales from 1 up to 6 under 20 concurrent requests - and back down") {
  Scaled s;
  auto file = s.cluster.write("sleep.yaml", R"(applications:
  - name: sleepy
    route_prefix: /sleep
    import_path: libtroupe_examples.so:Sleep
    deployments:
      - name: Sleep
        max_ongoing_requests: 5
        health_check_period_s: 1
        graceful_shutdown_timeout_s: 2
        autoscaling_config:
          min_replicas: 1
          max_replicas: 6
          target_ongoing_requests: 2
          metrics_interval_s: 0.2
          look_back_period_s: 1
          upscale_delay_s: 0.5
          downscale_delay_s: 2
)");
  auto r = s.cluster.ctl({"deploy", file, "--wait"}, 120s);
  REQUIRE(r.exit_code == 0);
  REQUIRE(s.running("sleepy", "Sleep") == 1u);

  std::atomic<bool> stop{false};
  std::atomic<int> ok{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 20; ++i) {
    clients.emplace_back([&] {
      for (int n = 0; n < 2000 && !stop; ++n) {
        auto reply = http_get(s.http_port, "/sleep/?ms=200", 30);
        (reply && reply->status == 200 ? ok : failed)++;
      }
    });
  }
  struct Stop {
    std::atomic<bool>& stop;
    std::vector<std::thread>& threads;
    ~Stop() {
      stop = true;
      for (auto& t : threads)
        if (t.joinable())
          t.join();
    }
  } guard{stop, clients};

  // 20 ongoing / target 2 = 10, bounded by max_replicas 6.
  bool up = wait_until([&] { return s.running("sleepy", "Sleep") == 6u; }, 60s, 200ms);
  if (!up)
    MESSAGE(s.deployment("sleepy", "Sleep").value_or(json("troupectl status failed")).dump(2));
  CHECK(up);
  auto log = s.cluster.nodes.at("head").output();
  CHECK(log.find("deployment sleepy/Sleep: HEALTHY -> UPSCALING (AUTOSCALING)") !=
        std::string::npos);

  stop = true;
  for (auto& t : clients)
    t.join();
  CHECK(ok > 0);
  CHECK(failed == 0);
  bool down = wait_until([&] { return s.running("sleepy", "Sleep") == 1u; }, 60s, 200ms);
  if (!down)
    MESSAGE(s.deployment("sleepy", "Sleep").value_or(json("troupectl status failed")).dump(2));
  CHECK(down);
}

TEST_CASE("a request to a deployment scaled to zero is served by a cold start") {
  Scaled s;
  auto file = s.cluster.write("zero.yaml", R"(applications:
  - name: zero
    route_prefix: /zero
    import_path: libtroupe_examples.so:Echo
    deployments:
      - name: Echo
        autoscaling_config:
          min_replicas: 0
          max_replicas: 2
          initial_replicas: 0
          metrics_interval_s: 0.2
          look_back_period_s: 1
          downscale_delay_s: 1
)");
  REQUIRE(s.cluster.ctl({"deploy", file}, 120s).exit_code == 0);
  REQUIRE(wait_until(
      [&] {
        auto d = s.deployment("zero", "Echo");
        return d && d->contains("replicas");
      },
      20s, 100ms));
  CHECK(s.running("zero", "Echo") == 0u);
  auto reply = http_get(s.http_port, "/zero/hello", 60);
  REQUIRE(reply.has_value());
  CHECK(reply->status == 200);
  CHECK(json::parse(reply->body).at("path") == "/hello");
  // ... and back to zero once idle.
  CHECK(wait_until([&] { return s.running("zero", "Echo") == 0u; }, 60s, 200ms));
}
