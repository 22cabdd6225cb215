// Request batching across a real cluster (issue 44): the XGBoost example
// (examples/xgboost/) on worker w2, 64 concurrent clients, half of them
// through w2's own proxy (to a replica process: its data channel; to an
// in-process replica: its request threads) and half through w1's (across
// nodes, over w2's data port). Every answer must be the prediction of the
// client's own row, computed here by XGBoost from the same model file; the
// replicas' batch-size histogram must show batches of more than one
// request; and a redeploy that turns batching off, then on again, must take
// effect in the replicas that run (same replica ids), not by restarting
// them. Real troupe-node processes on loopback; every wait is a condition
// with a deadline; the Cluster stops every process it started, also when a
// check fails.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/resources.hpp"
#include "tests/support/client_cluster.hpp"
#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"
#include "tests/support/specs.hpp"
#include "tests/support/xgboost_reference.hpp"

using namespace troupe;
using namespace troupe::testing;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

constexpr size_t kFeatures = 30;
constexpr size_t kClients = 64;
constexpr size_t kPerClient = 8;

// The XGBoost example pinned to w2: 2 replicas, room for 64 requests each.
controller::ApplicationSpec xgboost_app(uint32_t max_batch_size, double wait_s, bool adaptive,
                                        controller::Isolation isolation) {
  auto app = example_app("xgb", "/xgb", "XGBoostModel", 2);
  auto& d = app.deployments[0];
  d.import_path = "libtroupe_xgboost.so:XGBoostModel";
  d.config.resources = parse_resources("w2=0.1").value();
  d.config.isolation = isolation;
  d.config.max_ongoing_requests = 64;
  d.config.max_batch_size = max_batch_size;
  d.config.batch_wait_timeout_s = wait_s;
  d.config.batch_wait_auto = adaptive;
  return app;
}

// The rows the clients send: client c's request k has row c * kPerClient +
// k, random values from a fixed seed.
std::vector<float> make_rows(size_t n) {
  std::mt19937 rng(44);
  std::uniform_real_distribution<float> value(-1.5f, 1.5f);
  std::vector<float> rows(n * kFeatures);
  for (auto& v : rows)
    v = value(rng);
  return rows;
}

// XGBoost's own predictions of `rows` from the model file the build
// trained.
std::vector<float> predict_here(const std::vector<float>& rows, size_t n) {
  return xgboost_reference(TROUPE_TEST_XGBOOST_MODEL, rows, n, kFeatures);
}

struct BatchFixture : ClientCluster {
  std::vector<float> rows = make_rows(kClients * kPerClient);
  std::vector<float> expected = predict_here(rows, kClients* kPerClient);

  BatchFixture() {
    start({"w1", "w2"}, {},
          {{"w1", {"--resources", "cpu=2,w1=1"}}, {"w2", {"--resources", "cpu=2,w2=1"}}});
  }

  uint16_t port(const std::string& node) { return cluster.http_ports.at(node); }
  uint16_t admin(const std::string& node) { return cluster.admin_ports.at(node); }

  // Replica id -> node of the RUNNING replicas.
  std::map<std::string, std::string> running() {
    std::map<std::string, std::string> out;
    for (const auto& r : deployment("xgb", "XGBoostModel").value("replicas", json::array())) {
      if (r.at("state") == "RUNNING")
        out[r.at("id")] = r.at("node");
    }
    return out;
  }

  // Both proxies route to `n` replicas of the deployment.
  bool routed(size_t n) {
    return wait_routed("w1", "xgb", "XGBoostModel", n) &&
           wait_routed("w2", "xgb", "XGBoostModel", n);
  }

  // Sums of the series `name` of the application's replicas on w2's
  // metrics page (a replica process's registry reaches it every second).
  double metric_sum(const std::string& name) {
    auto page = http_get(admin("w2"), "/-/metrics", 5);
    if (!page || page->status != 200)
      return -1;
    std::istringstream lines(page->body);
    std::string line;
    double sum = 0;
    while (std::getline(lines, line)) {
      if (line.rfind(name + "{", 0) != 0 || line.find("application=\"xgb\"") == std::string::npos)
        continue;
      sum += std::stod(line.substr(line.rfind(' ') + 1));
    }
    return sum;
  }

  // Requests `node`'s proxy sent to replicas over `transport` so far.
  double sends(const std::string& node, const std::string& transport) {
    auto v = metric_value(admin(node),
                          "troupe_proxy_replica_sends_total{transport=\"" + transport + "\"}");
    REQUIRE(v);
    return *v;
  }

  struct Batches {
    double count = 0;  // batches run
    double sum = 0;    // requests in them
    double waits = 0;  // batches whose wait was observed
  };

  // The batch histogram once the replicas' request counter reached `requests`
  // (so the page holds everything the replicas did until then).
  Batches batches_after(double requests) {
    Batches b;
    REQUIRE_MESSAGE(wait_until(
                        [&] {
                          if (metric_sum("troupe_deployment_requests_total") < requests)
                            return false;
                          b.count = metric_sum("troupe_deployment_batch_size_count");
                          b.sum = metric_sum("troupe_deployment_batch_size_sum");
                          b.waits = metric_sum("troupe_deployment_batch_wait_seconds_count");
                          return true;
                        },
                        20s, 100ms),
                    "the replicas' metrics never counted " << requests << " requests");
    return b;
  }

  // kClients clients at once, each sending its kPerClient rows one request
  // at a time, the odd ones through w1 and the even ones through w2; every
  // answer is checked against the prediction of its own row.
  void run_clients() {
    std::atomic<size_t> right{0};
    std::mutex mutex;
    std::vector<std::string> wrong;
    std::vector<std::thread> clients;
    for (size_t c = 0; c < kClients; ++c) {
      clients.emplace_back([&, c] {
        const uint16_t through = port(c % 2 ? "w1" : "w2");
        for (size_t k = 0; k < kPerClient; ++k) {
          const size_t row = c * kPerClient + k;
          json values = json::array();
          for (size_t f = 0; f < kFeatures; ++f)
            values.push_back(rows[row * kFeatures + f]);
          auto reply = http_request(through, "POST", "/xgb", json{{"features", {values}}}.dump());
          std::string problem;
          if (!reply) {
            problem = "no answer";
          } else if (reply->status != 200) {
            problem = "status " + std::to_string(reply->status) + ": " + reply->body;
          } else {
            auto body = json::parse(reply->body, nullptr, false);
            if (!body.is_object() || !body.contains("predictions") ||
                body["predictions"].size() != 1 ||
                body["predictions"][0].get<float>() != expected[row])
              problem = "answered " + reply->body + ", expected " + std::to_string(expected[row]);
          }
          if (problem.empty()) {
            ++right;
          } else {
            std::lock_guard<std::mutex> lock(mutex);
            wrong.push_back("row " + std::to_string(row) + ": " + problem);
          }
        }
      });
    }
    for (auto& t : clients)
      t.join();
    for (size_t i = 0; i < wrong.size() && i < 5; ++i)
      MESSAGE(wrong[i]);
    CHECK(wrong.empty());
    CHECK(right.load() == kClients * kPerClient);
  }

  // Deploys `app`, waits until it is HEALTHY with 2 replicas routed by
  // both proxies.
  void deploy(const controller::ApplicationSpec& app) {
    REQUIRE(client->deploy(app).has_value());
    REQUIRE(wait_healthy("xgb", "XGBoostModel", 2, 60s));
    REQUIRE(routed(2));
  }

  // The scenario for replicas of `isolation`: batching on (fixed wait),
  // off, then on with the adaptive wait, each by a redeploy of the same
  // code, in the same replicas.
  void scenario(controller::Isolation isolation) {
    const double n = static_cast<double>(kClients * kPerClient);
    deploy(xgboost_app(16, 0.02, false, isolation));
    const auto replicas = running();
    REQUIRE(replicas.size() == 2);
    for (const auto& [id, node] : replicas)
      CHECK(node == "w2");
    const double peer_before = sends("w1", "peer");
    const double caf_before = sends("w1", "caf");

    // max_batch_size 16, wait 20 ms.
    run_clients();
    const Batches on = batches_after(n);
    MESSAGE("batching on: " << on.sum << " requests in " << on.count << " batches");
    CHECK(on.count > 0);
    CHECK(on.sum == n);
    CHECK(on.sum > on.count);  // batches of more than one request
    CHECK(on.waits == on.count);  // each batch's wait is observed too
    // w1's half went across nodes, most of it over w2's data port (the
    // first requests go over CAF while w1's proxy opens its connection).
    const double peer = sends("w1", "peer") - peer_before;
    CHECK(peer + sends("w1", "caf") - caf_before >= n / 2);
    CHECK(peer >= n / 4);

    // max_batch_size 1: no batch runs any more; every request runs alone.
    deploy(xgboost_app(1, 0.02, false, isolation));
    CHECK(running() == replicas);
    run_clients();
    const Batches off = batches_after(2 * n);
    CHECK(off.count == on.count);
    CHECK(off.sum == on.sum);

    // max_batch_size 16 with the adaptive wait: batches again.
    deploy(xgboost_app(16, 0.01, true, isolation));
    CHECK(running() == replicas);
    run_clients();
    const Batches adaptive = batches_after(3 * n);
    MESSAGE("adaptive: " << adaptive.sum - off.sum << " requests in " << adaptive.count - off.count
                         << " batches");
    CHECK(adaptive.sum - off.sum == n);
    CHECK(adaptive.sum - off.sum > adaptive.count - off.count);
    CHECK(running() == replicas);
  }
};

}  // namespace

TEST_CASE("batching: 64 clients get their own rows' predictions from batches of process replicas") {
  BatchFixture f;
  f.scenario(controller::Isolation::process);
}

TEST_CASE(
    "batching: 64 clients get their own rows' predictions from batches of in-process "
    "replicas") {
  BatchFixture f;
  f.scenario(controller::Isolation::in_process);
}

TEST_CASE("batching: a class without handle_batch is refused when its deployment batches") {
  BatchFixture f;
  auto app = example_app("echo", "/echo", "Echo", 1);
  app.deployments[0].config.max_ongoing_requests = 8;
  app.deployments[0].config.max_batch_size = 8;
  REQUIRE(f.client->deploy(app).has_value());
  // A plugin-path library is not checked at deploy (troupectl checks an
  // uploaded one): the replica refuses to start, naming the field, and the
  // deployment says so.
  std::string message;
  CHECK(wait_until(
      [&] {
        auto d = f.deployment("echo", "Echo");
        message = d.value("message", std::string());
        return message.find(
                   "max_batch_size is 8, but the deployment class Echo "
                   "(libtroupe_examples.so)") != std::string::npos &&
               message.find("does not implement handle_batch()") != std::string::npos;
      },
      30s, 100ms));
  MESSAGE("status message: " << message);
  for (const auto& r : f.deployment("echo", "Echo").value("replicas", json::array()))
    CHECK(r.at("state") != "RUNNING");
}
