// The proxy's metrics against the real thing: promtool (Debian's
// prometheus package) accepts every node's /-/metrics after traffic and
// errors, and a real Prometheus scraping a three-node cluster sees every
// node up and measures the request rate the test produced.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cctype>
#include <cmath>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"

using namespace troupe::testing;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

std::string on_path(const std::string& name) {
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/bin"}) {
    std::string candidate = std::string(dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0)
      return candidate;
  }
  return "";
}

// URL-encodes a PromQL query for the HTTP API.
std::string encode(const std::string& in) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : in) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

// The result vector of an instant query; empty when Prometheus does not
// answer (yet).
json query(uint16_t port, const std::string& promql) {
  auto r = http_get(port, "/api/v1/query?query=" + encode(promql), 5);
  if (!r || r->status != 200)
    return json::array();
  auto body = json::parse(r->body, nullptr, false);
  if (body.is_discarded() || body.value("status", "") != "success")
    return json::array();
  return body["data"]["result"];
}

}  // namespace

TEST_CASE("metrics: promtool accepts every node's /-/metrics - a real Prometheus scrapes three nodes and measures the request rate") {
  const auto promtool = on_path("promtool");
  const auto prometheus = on_path("prometheus");
  REQUIRE_MESSAGE(!promtool.empty(), "promtool is missing (Debian: apt-get install prometheus)");
  REQUIRE_MESSAGE(!prometheus.empty(), "prometheus is missing (Debian: apt-get install prometheus)");

  Cluster cluster;
  cluster.start_head();
  REQUIRE(cluster.wait_states({{"head", "ALIVE"}}, 20s));
  cluster.start_worker("w1");
  cluster.start_worker("w2");
  REQUIRE(cluster.wait_states({{"head", "ALIVE"}, {"w1", "ALIVE"}, {"w2", "ALIVE"}}, 30s));
  std::ofstream(cluster.dir / "probe.yaml") << R"(applications:
  - name: probe
    route_prefix: /probe
    import_path: libtroupe_examples.so:InlineProbe
    deployments:
      - name: InlineProbe
        num_replicas: 3
)";
  auto deployed = run({bin("troupectl"), "--address", cluster.address, "deploy",
                       cluster.dir / "probe.yaml", "--wait"},
                      90s);
  CAPTURE(deployed.err);
  REQUIRE(deployed.exit_code == 0);
  const std::vector<std::string> nodes = {"head", "w1", "w2"};
  for (const auto& n : nodes) {
    const uint16_t port = cluster.http_ports.at(n);
    REQUIRE(wait_until(
        [&] {
          auto r = http_get(port, "/probe/", 5);
          return r && r->status == 200;
        },
        30s, 100ms));
  }

  // Traffic, a handler's error and a path nobody serves on every node, then
  // promtool on each node's exposition.
  for (const auto& n : nodes) {
    const uint16_t port = cluster.http_ports.at(n);
    CHECK(http_get(port, "/probe/?mode=throw", 10)->status == 500);
    CHECK(http_get(port, "/nowhere", 10)->status == 404);
    auto metrics = http_get(port, "/-/metrics", 10);
    REQUIRE(metrics);
    REQUIRE(metrics->status == 200);
    CHECK(metrics->body.find("troupe_http_requests_total{application=\"probe\",code=\"500\","
                             "method=\"GET\",route=\"/probe\"} 1") != std::string::npos);
    CHECK(metrics->body.find("troupe_build_info{version=") != std::string::npos);
    auto file = cluster.dir / ("metrics-" + n + ".txt");
    std::ofstream(file) << metrics->body;
    auto checked = run({"/bin/sh", "-c", promtool + " check metrics < " + file}, 30s);
    CAPTURE(n);
    CAPTURE(checked.out);
    CAPTURE(checked.err);
    CHECK(checked.exit_code == 0);
  }

  // A real Prometheus scraping the three nodes every second.
  const uint16_t prom_port = free_port();
  {
    std::ofstream config(cluster.dir / "prometheus.yml");
    config << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
              "scrape_configs:\n  - job_name: troupe\n    metrics_path: /-/metrics\n"
              "    static_configs:\n      - targets: [";
    for (size_t i = 0; i < nodes.size(); ++i)
      config << (i ? ", " : "") << "'127.0.0.1:" << cluster.http_ports.at(nodes[i]) << "'";
    config << "]\n";
  }
  ChildProcess server({prometheus, "--config.file=" + (cluster.dir / "prometheus.yml"),
                       "--storage.tsdb.path=" + (cluster.dir / "prometheus-data"),
                       "--web.listen-address=127.0.0.1:" + std::to_string(prom_port),
                       "--log.level=warn"},
                      (cluster.dir / "prometheus.log"));
  json up;
  REQUIRE_MESSAGE(wait_until(
                      [&] {
                        up = query(prom_port, "up{job=\"troupe\"}");
                        if (up.size() != nodes.size())
                          return false;
                        for (const auto& s : up) {
                          if (s["value"][1] != "1")
                            return false;
                        }
                        return true;
                      },
                      30s, 200ms),
                  "up: " << up.dump() << "; prometheus: " << server.output());

  // A steady load of a known rate, spread over the three nodes: 60 requests a
  // second for 40 s. The rate is the load's shape, so the sender keeps to a
  // schedule (sleep_until the next send), and counts what was answered.
  constexpr double kRate = 60;
  constexpr auto kLoad = 40s;
  std::atomic<uint64_t> answered{0};
  std::atomic<uint64_t> failed{0};
  auto began = std::chrono::steady_clock::now();
  std::vector<std::thread> senders;
  for (size_t i = 0; i < nodes.size(); ++i) {
    senders.emplace_back([&, port = cluster.http_ports.at(nodes[i])] {
      auto period = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(nodes.size() / kRate));
      auto next = began;
      while (std::chrono::steady_clock::now() - began < kLoad) {
        auto r = http_get(port, "/probe/", 10);
        (r && r->status == 200 ? answered : failed)++;
        next += period;
        std::this_thread::sleep_until(next);
      }
    });
  }
  for (auto& t : senders)
    t.join();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  double produced = static_cast<double>(answered.load()) / seconds;
  CHECK(failed.load() == 0);
  CHECK(produced > kRate * 0.9);
  // The last 30 s of the load, as Prometheus saw them (queried at once, so
  // the window lies within the load).
  json rate = query(prom_port, "sum(rate(troupe_http_requests_total{application=\"probe\"}[30s]))");
  CAPTURE(rate.dump());
  CAPTURE(produced);
  REQUIRE(rate.size() == 1);
  double measured = std::stod(rate[0]["value"][1].get<std::string>());
  MESSAGE("Prometheus: " << measured << " req/s; the test produced " << produced << " req/s");
  CHECK(std::fabs(measured - produced) <= 0.1 * produced);
  server.stop(10s);
  auto reports = cluster.stop_all();
  for (const auto& r : reports)
    FAIL_CHECK(r);
}
