// The head's memory grows linearly with the replicas it manages, not with
// their square (issue 23). Real troupe-node processes on loopback: a head
// that hosts no replica and four workers; one deployment of in-process Noop
// replicas with a small cpu share, so that they are cheap to run and every
// worker takes many. The growth is the head's peak resident memory (VmHWM)
// from before the deploy until every proxy routes to every replica: it
// includes what the head held while the pushes of the deploy were on their
// way. Memory, not time: nothing here depends on the machine's speed.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/resources.hpp"
#include "tests/support/client_cluster.hpp"
#include "tests/support/http_client.hpp"
#include "tests/support/specs.hpp"

using namespace troupe;
using namespace troupe::testing;
using nlohmann::json;

namespace {

// A field of /proc/<pid>/status in KiB ("VmRSS", "VmHWM"); 0 when absent.
uint64_t status_kib(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      std::istringstream fields(line.substr(field.size() + 1));
      uint64_t kib = 0;
      fields >> kib;
      return kib;
    }
  }
  return 0;
}

// The proxy whose admin listener is on `port` routes (app, dep) to `n` replicas.
bool routes_to(uint16_t port, const std::string& app, const std::string& dep, size_t n) {
  auto r = http_get(port, "/-/routes", 5);
  if (!r || r->status != 200)
    return false;
  auto view = json::parse(r->body, nullptr, false);
  if (view.is_discarded())
    return false;
  for (const auto& d : view.value("deployments", json::array())) {
    if (d.value("application", "") == app && d.value("deployment", "") == dep)
      return d.value("replicas", json::array()).size() == n;
  }
  return false;
}

// Deploys `n` replicas on a fresh cluster and returns the head's growth in
// KiB: its peak resident memory once every proxy routes to all of them,
// minus its resident memory before the deploy.
uint64_t head_growth_kib(uint32_t n) {
  ClientCluster c;
  std::map<std::string, std::vector<std::string>> workers;
  for (const char* w : {"w1", "w2", "w3", "w4"})
    workers[w] = {"--resources", "cpu=1000"};
  c.start({"w1", "w2", "w3", "w4"}, {"--resources", "cpu=0.001"}, workers);
  pid_t head = c.cluster.nodes.at("head").pid();
  uint64_t before = status_kib(head, "VmRSS");
  REQUIRE(before > 0);

  auto app = example_app("noop", "/noop", "Noop", n);
  auto& config = app.deployments[0].config;
  config.max_ongoing_requests = 1;
  config.resources = parse_resources("cpu=0.01").value();
  config.isolation = controller::Isolation::in_process;
  REQUIRE(c.client->deploy(app).has_value());
  REQUIRE(c.wait_healthy("noop", "Noop", n, std::chrono::seconds(120)));
  for (const auto& [node, port] : c.cluster.admin_ports) {
    CAPTURE(node);
    CHECK(wait_until([&, port = port] { return routes_to(port, "noop", "Noop", n); },
                     std::chrono::seconds(60), std::chrono::milliseconds(200)));
  }
  uint64_t peak = status_kib(head, "VmHWM");
  uint64_t after = status_kib(head, "VmRSS");
  MESSAGE(n << " replicas: head RSS " << before << " KiB before, " << after
            << " KiB after, peak " << peak << " KiB: +" << (peak - before) << " KiB, "
            << (peak - before) * 1024 / n << " bytes per replica");
  CHECK(c.cluster.stop_all().empty());
  return peak - before;
}

}  // namespace

TEST_CASE("head memory per replica at 1000 replicas is at most twice that at 250") {
  uint64_t at_250 = head_growth_kib(250);
  uint64_t at_1000 = head_growth_kib(1000);
  double per_250 = static_cast<double>(at_250) / 250;
  double per_1000 = static_cast<double>(at_1000) / 1000;
  MESSAGE("KiB per replica: " << per_250 << " at 250, " << per_1000 << " at 1000");
  // Linear growth keeps the two equal (the fixed share of the smaller
  // deploy makes the first larger); growth with the square of the replicas
  // makes the second four times the first.
  CHECK(per_1000 <= 2 * per_250);
}
