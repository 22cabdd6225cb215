// Safe rollouts on a real cluster: a replica passes its start-up health check
// before it takes traffic, a rolling update starts each new replica beside
// the old ones, and a release whose check never passes is a start failure
// that backs off (issue 39). The broken release replacing a working one
// under load is the chaos scenario broken_release (tools/chaos). Every wait
// is a condition with a deadline.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/client_cluster.hpp"
#include "tests/support/http_client.hpp"
#include "tests/support/specs.hpp"

using namespace troupe;
using namespace troupe::testing;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

controller::ApplicationSpec release_app(const std::string& args, uint32_t replicas,
                                        double period_s) {
  auto app = example_app("release", "/release", "Release", replicas);
  app.deployments[0].init_args = args;
  app.deployments[0].config.health_check_period_s = period_s;
  return app;
}

std::set<std::string> ids_of(const json& dep) {
  std::set<std::string> out;
  for (const auto& r : dep.value("replicas", json::array()))
    out.insert(r.at("id").get<std::string>());
  return out;
}

// Clients sending GET /release/ through one node's proxy, one request after
// the other each, until stop(); every answer that is not a 200 (or no answer)
// is kept with what it said.
class Load {
 public:
  Load(uint16_t port, int clients) {
    for (int i = 0; i < clients; ++i) {
      threads_.emplace_back([this, port] {
        while (!stop_.load()) {
          auto reply = http_get(port, "/release/", 10);
          std::lock_guard<std::mutex> lock(mutex_);
          ++sent_;
          if (!reply) {
            failures_.push_back("no answer");
          } else if (reply->status != 200) {
            failures_.push_back(std::to_string(reply->status) + " " + reply->body);
          } else {
            ++by_release_[json::parse(reply->body).value("release", "?")];
          }
        }
      });
    }
  }
  ~Load() { stop(); }

  void stop() {
    stop_.store(true);
    for (auto& t : threads_) {
      if (t.joinable())
        t.join();
    }
  }
  int64_t sent() {
    std::lock_guard<std::mutex> lock(mutex_);
    return sent_;
  }
  std::map<std::string, int64_t> by_release() {
    std::lock_guard<std::mutex> lock(mutex_);
    return by_release_;
  }
  std::vector<std::string> failures() {
    std::lock_guard<std::mutex> lock(mutex_);
    return failures_;
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  int64_t sent_ = 0;
  std::map<std::string, int64_t> by_release_;
  std::vector<std::string> failures_;
};

// Every replica process's log of every node (<state-dir>/logs/replicas).
std::string replica_logs(ClientCluster& f) {
  std::string all;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(f.cluster.dir.path())) {
    const auto& p = entry.path();
    if (entry.is_regular_file() && p.parent_path().filename() == "replicas") {
      std::ifstream in(p);
      all += std::string(std::istreambuf_iterator<char>(in), {});
    }
  }
  return all;
}

// troupe_replica_starts_total of the application on every node's /-/metrics.
int64_t replica_starts(ClientCluster& f, const std::string& app) {
  int64_t total = 0;
  const std::string series = "troupe_replica_starts_total{application=\"" + app + "\"";
  for (const auto& [node, port] : f.cluster.admin_ports) {
    auto reply = http_get(port, "/-/metrics", 10);
    REQUIRE(reply.has_value());
    for (auto pos = reply->body.find(series); pos != std::string::npos;
         pos = reply->body.find(series, pos + 1)) {
      auto value = reply->body.find("} ", pos);
      REQUIRE(value != std::string::npos);
      total += std::stoll(reply->body.substr(value + 2));
    }
  }
  return total;
}

}  // namespace

TEST_CASE(
    "a release whose health check passes only after 3 s rolls out under load - no request "
    "fails") {
  ClientCluster f;
  f.start({"w1", "w2"});
  REQUIRE(f.client->deploy(release_app(R"({"release": "v1"})", 4, 2)).has_value());
  REQUIRE(f.wait_healthy("release", "Release", 4));
  const auto v1 = ids_of(f.deployment("release", "Release"));
  REQUIRE(f.cluster.wait_answers("w1", "/release/"));

  Load load(f.cluster.http_ports.at("w1"), 4);
  REQUIRE(wait_until([&] { return load.sent() >= 50; }, 20s, 20ms));
  // Checks 2 s apart: its first two fail ("still warming up"), the third
  // passes; each new replica waits ~4 s in its gate, taking no traffic.
  REQUIRE(f.client->deploy(release_app(R"({"release": "v2", "unhealthy_for_ms": 3000})", 4, 2))
              .has_value());
  std::set<std::string> statuses;
  json last;
  const bool done = wait_until(
      [&] {
        last = f.deployment("release", "Release");
        statuses.insert(last.value("status", "?"));
        if (last.value("status", "") != "HEALTHY")
          return false;
        const auto now = ids_of(last);
        for (const auto& id : now) {
          if (v1.count(id))
            return false;
        }
        return now.size() == 4;
      },
      120s, 100ms);
  INFO("last status: " << last.dump());
  REQUIRE(done);
  // Answers from v2 arrive now that every replica runs it.
  const int64_t v2_before = load.by_release()["v2"];
  REQUIRE(wait_until([&] { return load.by_release()["v2"] >= v2_before + 20; }, 20s, 20ms));
  load.stop();

  CHECK(statuses.count("DEPLOY_FAILED") == 0);
  CHECK(statuses.count("UNHEALTHY") == 0);
  const auto failures = load.failures();
  INFO("first failures: " << (failures.empty() ? "" : failures.front()));
  CHECK(failures.empty());
  CHECK(load.by_release()["v1"] > 0);
  CHECK(load.sent() > 200);
  // The replicas waited in their gate: their logs have the failed
  // attempts, each tried again rather than counted as a start failure.
  CHECK(replica_logs(f).find("initial health check failed (1 of 3): unhealthy: release v2: "
                             "still warming up") != std::string::npos);
}

TEST_CASE(
    "a first release whose check never passes is DEPLOY_FAILED within the threshold - "
    "its starts back off - no poll reads HEALTHY") {
  ClientCluster f;
  f.start({});
  REQUIRE(
      f.client->deploy(release_app(R"({"release": "v1", "unhealthy_for_ms": "forever"})", 1, 0.2))
          .has_value());
  std::set<std::string> statuses;
  std::set<std::string> ids;
  json failed;
  const auto t0 = std::chrono::steady_clock::now();
  double failed_at = -1;
  // 30 s of polls: failed starts, then waits of 1, 2, 4, 8, 16 s (each + up
  // to 3 s of jitter).
  wait_until(
      [&] {
        auto dep = f.deployment("release", "Release");
        const std::string s = dep.value("status", "?");
        statuses.insert(s);
        for (const auto& id : ids_of(dep))
          ids.insert(id);
        if (s == "DEPLOY_FAILED" && failed_at < 0) {
          failed = dep;
          failed_at = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        return false;
      },
      30s, 50ms);
  INFO("statuses seen: " << json(statuses).dump() << "; failed: " << failed.dump());
  CHECK(statuses.count("HEALTHY") == 0);
  REQUIRE(failed_at >= 0);
  CHECK(failed_at < 20);
  const std::string message = failed.value("message", "");
  CHECK(message.find("The deployment failed to start 3 times in a row.") != std::string::npos);
  CHECK(message.find("the initial health check failed 3 times in a row: unhealthy: release v1: "
                     "the model's weights did not load") != std::string::npos);
  // Without backoff a start every ~0.5 s would make 60 in these 30 s.
  const int64_t starts = replica_starts(f, "release");
  MESSAGE("replica starts in 30 s: " << starts << ", first DEPLOY_FAILED after " << failed_at
                                     << " s");
  CHECK(starts >= 4);
  CHECK(starts <= 10);
  CHECK(f.status().at("applications").at("release").value("status", "") == "DEPLOY_FAILED");
}
