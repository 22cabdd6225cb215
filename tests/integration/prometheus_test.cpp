// The metrics against the real thing: promtool (Debian's prometheus
// package) accepts every node's /-/metrics (on its admin port) after traffic, errors and a
// replica kill, every metric of docs/observability.md is there with its
// labels, and a real Prometheus scraping a three-node cluster sees every
// node up, measures the request rate the test produced and shows a user
// counter with its labels.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cctype>
#include <cmath>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
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

// The `status` of an instant query and its result vector.
std::pair<std::string, json> query_status(uint16_t port, const std::string& promql) {
  auto r = http_get(port, "/api/v1/query?query=" + encode(promql), 5);
  if (!r)
    return {"no answer", json::array()};
  auto body = json::parse(r->body, nullptr, false);
  if (body.is_discarded())
    return {"not JSON: " + r->body, json::array()};
  if (body.value("status", "") != "success")
    return {body.value("status", "") + ": " + body.value("error", ""), json::array()};
  return {"success", body["data"]["result"]};
}

// The sum of the samples of `metric` (a counter or gauge) whose line has
// `having` in its labels.
double count_sum(const std::string& text, const std::string& metric,
                 const std::string& having = "") {
  double sum = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(metric + "{", 0) != 0 && line.rfind(metric + " ", 0) != 0)
      continue;
    auto close = line.rfind(' ');
    if (!having.empty() && line.substr(0, close).find(having) == std::string::npos)
      continue;
    sum += std::stod(line.substr(close + 1));
  }
  return sum;
}

}  // namespace

TEST_CASE("metrics: promtool accepts every node's /-/metrics after a replica kill - a real Prometheus scrapes three nodes - measures the request rate and sees a user counter") {
  const auto promtool = on_path("promtool");
  const auto prometheus = on_path("prometheus");
  REQUIRE_MESSAGE(!promtool.empty(), "promtool is missing (Debian: apt-get install prometheus)");
  REQUIRE_MESSAGE(!prometheus.empty(), "prometheus is missing (Debian: apt-get install prometheus)");

  Cluster cluster;
  cluster.start({"w1", "w2"}, 30s);
  cluster.deploy_yaml("probe.yaml", R"(applications:
  - name: probe
    route_prefix: /probe
    import_path: libtroupe_examples.so:InlineProbe
    deployments:
      - name: InlineProbe
        num_replicas: 3
)");
  const std::vector<std::string> nodes = {"head", "w1", "w2"};
  for (const auto& n : nodes)
    REQUIRE(cluster.wait_answers(n, "/probe/"));

  // Traffic, a handler's error and a path nobody serves on every node, then
  // a replica killed (and replaced), then promtool on each node's
  // exposition.
  for (const auto& n : nodes) {
    const uint16_t port = cluster.http_ports.at(n);
    CHECK(http_get(port, "/probe/?mode=throw", 10)->status == 500);
    CHECK(http_get(port, "/nowhere", 10)->status == 404);
  }
  // Every replica process reports its registry to its node every second:
  // wait until the nodes together serve the three throws and the ok calls
  // counted by the replicas, and the user's counter.
  auto all_metrics = [&] {
    std::string all;
    for (const auto& n : nodes) {
      auto r = http_get(cluster.admin_ports.at(n), "/-/metrics", 10);
      if (r && r->status == 200)
        all += r->body;
    }
    return all;
  };
  auto replicas_in = [](const std::string& text, const std::string& metric) {
    std::set<std::string> ids;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind(metric + "{", 0) != 0)
        continue;
      auto at = line.find("replica=\"");
      if (at != std::string::npos)
        ids.insert(line.substr(at + 9, line.find('"', at + 9) - at - 9));
    }
    return ids;
  };
  std::string all;
  REQUIRE_MESSAGE(wait_until(
                      [&] {
                        all = all_metrics();
                        return replicas_in(all, "troupe_deployment_errors_total").size() == 3 &&
                               count_sum(all, "troupe_deployment_errors_total") == 3 &&
                               count_sum(all, "probe_calls_total", "mode=\"throw\"") == 3;
                      },
                      20s, 200ms),
                  all);
  const auto first_replicas = replicas_in(all, "troupe_replica_healthy");
  REQUIRE(first_replicas.size() == 3);
  const std::string victim = *first_replicas.begin();
  auto killed = cluster.ctl({"kill", "replica", victim}, 30s);
  REQUIRE_MESSAGE(killed.exit_code == 0, killed.err);
  // Replaced: three replicas again, the victim's series gone from its node,
  // and every node answers.
  REQUIRE_MESSAGE(wait_until(
                      [&] {
                        all = all_metrics();
                        auto now = replicas_in(all, "troupe_replica_healthy");
                        return now.size() == 3 && now.count(victim) == 0 &&
                               all.find("troupe_deployment_running_replicas{application=\"probe\","
                                        "deployment=\"InlineProbe\"} 3") != std::string::npos;
                      },
                      40s, 200ms),
                  all);
  for (const auto& n : nodes)
    REQUIRE(cluster.wait_answers(n, "/probe/"));
  // Every metric of docs/observability.md, with its labels, on the nodes
  // that keep it: the proxy's and the replicas' on every node hosting them,
  // the controller's on the head.
  const std::string replica_labels = "{application=\"probe\",deployment=\"InlineProbe\",replica=";
  all = all_metrics();
  for (const auto& series : {
           std::string(
               "troupe_http_requests_total{application=\"probe\",code=\"200\",method=\"GET\","
               "route=\"/probe\"}"),
           std::string("troupe_http_request_duration_seconds_bucket{application=\"probe\","
                       "route=\"/probe\",le="),
           std::string("troupe_http_requests_in_flight "),
           std::string("troupe_deployment_queued_requests{application=\"probe\","
                       "deployment=\"InlineProbe\"}"),
           "troupe_replica_processing_requests" + replica_labels,
           "troupe_deployment_requests_total" + replica_labels,
           "troupe_deployment_errors_total" + replica_labels,
           "troupe_deployment_processing_duration_seconds_bucket" + replica_labels,
           std::string(
               "troupe_replica_starts_total{application=\"probe\",deployment=\"InlineProbe\"}"),
           "troupe_replica_healthy" + replica_labels,
           "troupe_health_check_duration_seconds_bucket" + replica_labels,
           std::string("troupe_deployment_target_replicas{application=\"probe\","
                       "deployment=\"InlineProbe\"} 3"),
           std::string("troupe_deployment_running_replicas{application=\"probe\","
                       "deployment=\"InlineProbe\"} 3"),
           std::string("troupe_controller_reconcile_duration_seconds_bucket{le="),
           std::string("troupe_controller_checkpoint_write_duration_seconds_bucket{le="),
           std::string("troupe_controller_deploys_total{outcome=\"ok\"} 1"),
           std::string("troupe_controller_restarts_total 0"),
           // The workers' proxies are subscribers in other processes.
           std::string("troupe_controller_snapshots_pushed_total "),
           std::string("troupe_controller_snapshot_pushes_total{to=\"remote\"} "),
           std::string("troupe_controller_snapshot_serializations_total "),
           std::string("troupe_controller_snapshot_serialization_copies_total "),
           std::string("troupe_nodes{state=\"ALIVE\"} 3"),
           std::string("troupe_build_info{version="),
       }) {
    CHECK_MESSAGE(all.find(series) != std::string::npos, series);
  }
  // Two workers' proxies got the same snapshots: serialized at most once
  // each, the other send copied the bytes.
  const double serialized = count_sum(all, "troupe_controller_snapshot_serializations_total");
  CHECK(serialized >= 1);
  CHECK(serialized <= count_sum(all, "troupe_controller_snapshots_pushed_total"));
  CHECK(serialized + count_sum(all, "troupe_controller_snapshot_serialization_copies_total") <=
        count_sum(all, "troupe_controller_snapshot_pushes_total", "to=\"remote\""));
  for (const auto& n : nodes) {
    // The ingress does not show them; the admin listener does.
    auto ingress = http_get(cluster.http_ports.at(n), "/-/metrics", 10);
    REQUIRE(ingress);
    CHECK(ingress->status == 404);
    const uint16_t port = cluster.admin_ports.at(n);
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
      config << (i ? ", " : "") << "'127.0.0.1:" << cluster.admin_ports.at(nodes[i]) << "'";
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
  // second for 34 s (the 30 s window of the query below, and 4 s for the
  // scrapes at its start). The rate is the load's shape, so the sender keeps
  // to a schedule (sleep_until the next send), and counts what was answered.
  constexpr double kRate = 60;
  constexpr auto kLoad = 34s;
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
  // The user's counter, as Prometheus scraped it from the nodes, with the
  // labels troupe adds and its own.
  // Every ok call of the load ran a handler that counted it: the sum
  // reaches at least the load's calls (more: the calls before it) once the
  // replicas' last reports were scraped (a report a second, a scrape a
  // second).
  json user;
  double user_sum = 0;
  CHECK_MESSAGE(wait_until(
                    [&] {
                      user = query(prom_port, "probe_calls_total{mode=\"ok\"}");
                      user_sum = 0;
                      for (const auto& s : user)
                        user_sum += std::stod(s["value"][1].get<std::string>());
                      return user.size() == 3 && user_sum >= static_cast<double>(answered.load());
                    },
                    10s, 200ms),
                user.dump() << " against " << answered.load() << " answered");
  for (const auto& s : user) {
    CHECK(s["metric"].value("application", "") == "probe");
    CHECK(s["metric"].value("deployment", "") == "InlineProbe");
    CHECK(s["metric"].value("replica", "").rfind("probe#InlineProbe#", 0) == 0);
  }

  // The Grafana dashboard of docs/grafana: every query is valid PromQL for
  // this Prometheus, names only metrics the nodes serve, and (but for the
  // 5xx ratio, empty while no 5xx happened in its window) has data.
  std::ifstream dashboard_file(std::string(TROUPE_SOURCE_DIR) + "/docs/grafana/troupe-dashboard.json");
  auto dashboard = json::parse(dashboard_file, nullptr, false);
  REQUIRE_FALSE(dashboard.is_discarded());
  REQUIRE(dashboard["panels"].size() >= 10);
  all = all_metrics();
  for (const auto& panel : dashboard["panels"]) {
    for (const auto& target : panel["targets"]) {
      const std::string expr = target["expr"];
      CAPTURE(expr);
      for (size_t at = expr.find("troupe_"); at != std::string::npos;
           at = expr.find("troupe_", at + 1)) {
        size_t end = at;
        while (end < expr.size() && (std::isalnum(static_cast<unsigned char>(expr[end])) || expr[end] == '_'))
          ++end;
        const std::string name = expr.substr(at, end - at);
        CHECK_MESSAGE(all.find("\n" + name) != std::string::npos, name);
      }
      auto [status, result] = query_status(prom_port, expr);
      CHECK(status == "success");
      if (expr.find("code=~") == std::string::npos)
        CHECK_MESSAGE(!result.empty(), panel["title"].get<std::string>());
    }
  }
  server.stop(10s);
  auto reports = cluster.stop_all();
  for (const auto& r : reports)
    FAIL_CHECK(r);
}
