// Model multiplexing on a real 2-node cluster (issue 15, item 3): 4 ModelHost
// replicas holding at most 2 models each, 8 model ids, requests from 8
// concurrent clients through both nodes' proxies. After a warm-up, at least
// 95 % of the requests must be answered by a replica that already held their
// model when the request arrived ("hit" in the answer: the ModelCache found it
// loaded; a request that loaded it, or waited for a load in progress, is a
// miss), and no answer may show a replica holding more than 2 models.
// With 4 x 2 slots for exactly 8 models there is no slack: routing must be
// sticky, or every misrouted request evicts a model that is then missed too.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"

using namespace troupe::testing;
using nlohmann::json;

namespace {

const char* kModels = R"(applications:
  - name: models
    route_prefix: /models
    import_path: libtroupe_examples.so:ModelHost
    deployments:
      - name: ModelHost
        num_replicas: 4
        max_ongoing_requests: 8
        max_num_models_per_replica: 2
)";

constexpr int kModelCount = 8;
constexpr int kClients = 8;

struct Tally {
  std::mutex mutex;
  int answers = 0;
  int hits = 0;
  int failed = 0;
  size_t most_loaded = 0;  // the longest `loaded` list seen
  std::map<std::string, std::set<std::string>> replicas_of_model;
  std::string last_failure;
};

// One request for `model` through `port`, accounted in `tally`.
void ask(uint16_t port, const std::string& model, Tally& tally) {
  // Loads take 20 ms: concurrent requests for a model being loaded wait for
  // that one load.
  auto r = http_request(port, "GET", "/models/?load_ms=20", "", 10,
                        {{"serve_multiplexed_model_id", model}});
  std::lock_guard<std::mutex> lock(tally.mutex);
  json body = r ? json::parse(r->body, nullptr, false) : json();
  if (!r || r->status != 200 || !body.is_object() || body.value("model_id", "") != model) {
    ++tally.failed;
    tally.last_failure = r ? std::to_string(r->status) + " " + r->body : "no answer";
    return;
  }
  // The proxy strips the replica's internal header.
  CHECK(r->head.find("X-Troupe-Held-Models") == std::string::npos);
  ++tally.answers;
  tally.hits += body.value("hit", false) ? 1 : 0;
  tally.most_loaded = std::max(tally.most_loaded, body["loaded"].size());
  tally.replicas_of_model[model].insert(body.value("replica_id", ""));
}

// `per_client` requests from each of kClients threads, for random models (a
// seeded generator per client), through the proxies in turn.
void run_load(const std::vector<uint16_t>& ports, int per_client, uint32_t seed, Tally& tally) {
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 rng(seed + static_cast<uint32_t>(c));
      std::uniform_int_distribution<int> pick(0, kModelCount - 1);
      for (int i = 0; i < per_client; ++i) {
        ask(ports[static_cast<size_t>(c + i) % ports.size()], "m" + std::to_string(pick(rng)),
            tally);
      }
    });
  }
  for (auto& t : clients)
    t.join();
}

}  // namespace

TEST_CASE(
    "multiplex: 4 replicas x 2 models for 8 model ids - 95 % of requests hit a replica holding "
    "their model") {
  Cluster cluster;
  cluster.start({"w1"});
  const std::vector<uint16_t> ports = {cluster.http_ports.at("head"), cluster.http_ports.at("w1")};
  const std::vector<uint16_t> admins = {cluster.admin_ports.at("head"),
                                        cluster.admin_ports.at("w1")};
  cluster.deploy_yaml("models.yaml", kModels, 60s);
  // Every proxy routes to all 4 replicas.
  for (uint16_t port : admins) {
    CAPTURE(port);
    std::string routes;
    INFO("last /-/routes: ", routes);
    REQUIRE(wait_until(
        [&] {
          auto r = http_get(port, "/-/routes", 5);
          if (!r || r->status != 200)
            return false;
          routes = r->body;
          const json body = json::parse(r->body);
          for (const auto& d : body["deployments"]) {
            if (d["deployment"] == "ModelHost")
              return d["replicas"].size() == 4;
          }
          return false;
        },
        30s, 100ms));
  }

  // Warm-up: 40 requests per model on average, loads placed and settled.
  Tally warmup;
  run_load(ports, 40, 1, warmup);
  INFO("warm-up: ", warmup.hits, " hits of ", warmup.answers, ", failed ", warmup.failed, " (",
       warmup.last_failure, ")");
  CHECK(warmup.failed == 0);
  CHECK(warmup.most_loaded <= 2);

  // Measured: 800 requests.
  Tally measured;
  run_load(ports, 100, 1000, measured);
  INFO("measured: ", measured.hits, " hits of ", measured.answers, ", failed ", measured.failed,
       " (", measured.last_failure, ")");
  CHECK(measured.failed == 0);
  CHECK(measured.answers == kClients * 100);
  CHECK(measured.hits * 100 >= measured.answers * 95);
  CHECK(measured.most_loaded <= 2);
  std::string spread;
  for (const auto& [model, replicas] : measured.replicas_of_model)
    spread += model + ": " + std::to_string(replicas.size()) + " replica(s); ";
  MESSAGE("measured: ", measured.hits, " hits of ", measured.answers, "; ", spread);

  // The controller pushed the replicas' model lists to the proxies: every
  // model is listed at some replica in /-/routes of both proxies.
  for (uint16_t port : admins) {
    CAPTURE(port);
    CHECK(wait_until(
        [&] {
          auto r = http_get(port, "/-/routes", 5);
          if (!r || r->status != 200)
            return false;
          std::set<std::string> listed;
          const json body = json::parse(r->body);
          for (const auto& d : body["deployments"]) {
            for (const auto& rep : d["replicas"]) {
              for (const auto& m : rep.value("model_ids", json::array()))
                listed.insert(m.get<std::string>());
            }
          }
          return listed.size() == kModelCount;
        },
        10s, 100ms));
  }
}
