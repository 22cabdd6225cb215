// Stuck replicas on a real loopback cluster: handlers that never return hold
// every request thread of a deployment's replicas; the replicas' health
// checks then fail with "stuck: ...", the controller replaces them (its
// status says why), the node kills the old replica processes when their
// graceful stop times out, and the deployment serves again. Every wait is a
// condition with a deadline; the fixture stops every process it starts.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <dirent.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/client_cluster.hpp"
#include "tests/support/http_client.hpp"
#include "tests/support/process.hpp"
#include "tests/support/specs.hpp"

using namespace troupe;
using namespace troupe::testing;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// Live (not zombie) troupe-replica processes whose parent is `parent`.
std::set<pid_t> live_replica_children(pid_t parent) {
  std::set<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d)
    return out;
  while (auto* e = ::readdir(d)) {
    char* end = nullptr;
    long v = std::strtol(e->d_name, &end, 10);
    if (!end || *end != '\0' || v <= 0)
      continue;
    std::ifstream in("/proc/" + std::to_string(v) + "/stat");
    std::string line;
    if (!std::getline(in, line))
      continue;
    auto open = line.find('(');
    auto close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos)
      continue;
    std::istringstream rest(line.substr(close + 2));
    char state = '?';
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && state != 'Z' &&
        line.substr(open + 1, close - open - 1) == "troupe-replica")
      out.insert(static_cast<pid_t>(v));
  }
  ::closedir(d);
  return out;
}

std::set<std::string> replica_ids(const json& dep) {
  std::set<std::string> out;
  for (const auto& r : dep.value("replicas", json::array()))
    out.insert(r.at("id").get<std::string>());
  return out;
}

}  // namespace

TEST_CASE("twelve requests that never end - each gets 504 - the stuck replicas are replaced") {
  ClientCluster f;
  f.start({});  // one node: both replicas are its children
  auto app = example_app("sleep", "/sleep", "Sleep", 2);
  auto& config = app.deployments[0].config;
  config.max_ongoing_requests = 2;
  config.stuck_after_s = 3;  // the default would be max(3 x 2 s, 30 s)
  controller::TargetState state;
  state.applications[app.name] = app;
  state.http.request_timeout_s = 2;
  auto applied = f.client->apply(state);
  REQUIRE_MESSAGE(applied.has_value(), applied.status().message());
  REQUIRE(f.wait_healthy("sleep", "Sleep", 2));
  const auto first = replica_ids(f.deployment("sleep", "Sleep"));
  const uint16_t port = f.cluster.http_ports.at("head");
  const pid_t node = f.cluster.nodes.at("head").pid();
  REQUIRE(wait_until([&] { return live_replica_children(node).size() == 2; }, 10s, 50ms));
  const auto first_pids = live_replica_children(node);

  // Twelve requests that sleep for the longest the example allows (an hour:
  // forever for this test) without looking at their cancellation
  // (cancel=ignore: Sleep otherwise returns when the proxy cancels it at its
  // 504), all at once: four hold the two replicas' request threads, the
  // proxy queues the rest; every client gets 504 after the 2 s request
  // timeout.
  const auto hang_start = std::chrono::steady_clock::now();
  std::vector<int> statuses(12, 0);
  std::vector<double> waited(12, 0);
  {
    std::vector<std::thread> clients;
    for (size_t i = 0; i < statuses.size(); ++i) {
      clients.emplace_back([&, i] {
        auto t0 = std::chrono::steady_clock::now();
        auto r = http_get(port, "/sleep/?ms=3600000&cancel=ignore", 20);
        waited[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        statuses[i] = r ? r->status : -1;
      });
    }
    for (auto& t : clients)
      t.join();
  }
  for (size_t i = 0; i < statuses.size(); ++i) {
    CAPTURE(i);
    CHECK(statuses[i] == 504);
    CHECK(waited[i] < 6);
  }

  // Within 60 s: replaced (no replica of before), HEALTHY, a normal request
  // answered 200; the status said the replicas were stuck meanwhile.
  std::string stuck_message;
  json last;
  bool serving = wait_until(
      [&] {
        last = f.deployment("sleep", "Sleep");
        auto message = last.value("message", "");
        if (message.find("stuck: all 2 request threads busy") != std::string::npos)
          stuck_message = message;
        auto ids = replica_ids(last);
        for (const auto& id : ids) {
          if (first.count(id))
            return false;
        }
        if (last.value("status", "") != "HEALTHY" || ids.size() != 2)
          return false;
        auto r = http_get(port, "/sleep/?ms=0", 5);
        return r && r->status == 200;
      },
      std::chrono::duration_cast<std::chrono::milliseconds>(
          60s - (std::chrono::steady_clock::now() - hang_start)),
      50ms);
  if (!serving)
    MESSAGE(last.dump(2));
  CHECK(serving);
  CAPTURE(stuck_message);
  CHECK(stuck_message.find("Replica ") == 0);
  CHECK(stuck_message.find("with none finished") != std::string::npos);
  auto log = f.cluster.nodes.at("head").output();
  for (const auto& id : first) {
    CAPTURE(id);
    CHECK(log.find("health check of " + id + " failed: stuck: all 2 request threads busy") !=
          std::string::npos);
  }

  // The old processes are gone (killed when their graceful stop timed out),
  // so the threads the handlers held are really freed.
  bool old_gone = wait_until(
      [&] {
        for (pid_t p : live_replica_children(node)) {
          if (first_pids.count(p))
            return false;
        }
        return true;
      },
      10s, 50ms);
  CHECK(old_gone);
}
