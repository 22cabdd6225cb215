// Node faults that leave the node process alive: a worker frozen with SIGSTOP
// (then resumed), and a node agent actor killed. Real troupe-node processes
// on loopback; every wait is a condition with a deadline; the Cluster kills
// every process it started, also when a check fails.
#include <signal.h>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "runtime/resources.hpp"
#include "runtime/system_setup.hpp"
#include "tests/support/client_cluster.hpp"
#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"
#include "tests/support/load.hpp"
#include "tests/support/specs.hpp"
#include "tools/troupectl/client.hpp"

using namespace troupe;
using namespace troupe::testing;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

controller::ApplicationSpec app_spec(const std::string& name, const std::string& prefix,
                                     const std::string& cls, uint32_t replicas,
                                     uint32_t max_ongoing) {
  auto app = example_app(name, prefix, cls, replicas);
  app.deployments[0].config.max_ongoing_requests = max_ongoing;
  return app;
}

struct Fixture : ClientCluster {
  // `basp_timeout_s`: replaces the BASP connection timeout of kFastLiveness.
  // `worker_args`: extra arguments of some workers, by id.
  Fixture(const std::vector<std::string>& workers, std::optional<double> basp_timeout_s = {},
          const std::map<std::string, std::vector<std::string>>& worker_args = {}) {
    if (basp_timeout_s) {
      auto& l = cluster.liveness;
      auto it = std::find(l.begin(), l.end(), "--basp-connection-timeout");
      REQUIRE(it != l.end());
      *(it + 1) = std::to_string(*basp_timeout_s);
    }
    start(workers, {}, worker_args);
  }

  uint16_t port(const std::string& node) { return cluster.http_ports.at(node); }
  uint16_t admin(const std::string& node) { return cluster.admin_ports.at(node); }

  // Replica id -> node of the RUNNING replicas.
  std::map<std::string, std::string> running(const std::string& app, const std::string& dep) {
    std::map<std::string, std::string> out;
    auto replicas = deployment(app, dep).value("replicas", json::array());
    for (const auto& r : replicas) {
      if (r.at("state") == "RUNNING")
        out[r.at("id")] = r.at("node");
    }
    return out;
  }

  // HEALTHY with exactly `n` replicas listed, all RUNNING, none on `not_on`.
  bool wait_at_target(const std::string& app, const std::string& dep, size_t n,
                      std::chrono::milliseconds deadline, const std::string& not_on = "") {
    json last;
    bool ok = wait_until(
        [&] {
          last = deployment(app, dep);
          auto replicas = last.value("replicas", json::array());
          if (last.value("status", "") != "HEALTHY" || replicas.size() != n)
            return false;
          for (const auto& r : replicas) {
            if (r.at("state") != "RUNNING" || (!not_on.empty() && r.at("node") == not_on))
              return false;
          }
          return true;
        },
        deadline, 100ms);
    if (!ok)
      MESSAGE("last status of " << app << "/" << dep << ": " << last.dump(2));
    return ok;
  }

  // Established TCP connections to the proxy of `node` (/proc/net/tcp): the
  // kernel accepts them even while the process is stopped.
  size_t accepted_connections(const std::string& node) {
    std::ifstream in("/proc/net/tcp");
    std::string line;
    std::getline(in, line);  // header
    char local_port[8];
    std::snprintf(local_port, sizeof(local_port), ":%04X", port(node));
    size_t n = 0;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      if (state == "01" && local.size() > 5 && local.substr(local.size() - 5) == local_port)
        ++n;
    }
    return n;
  }

  int occurrences(const std::string& node, const std::string& text) {
    auto out = cluster.nodes.at(node).output();
    int n = 0;
    for (size_t pos = 0; (pos = out.find(text, pos)) != std::string::npos; pos += text.size())
      ++n;
    return n;
  }

  // The RUNNING replicas of (app, dep) are exactly `before` (id -> node);
  // otherwise both lists and every node's output are printed.
  bool same_replicas(const std::string& app, const std::string& dep,
                     const std::map<std::string, std::string>& before) {
    auto after = running(app, dep);
    if (after == before)
      return true;
    for (const auto& [id, node] : before)
      MESSAGE("before: " << id << " on " << node);
    for (const auto& [id, node] : after)
      MESSAGE("after: " << id << " on " << node);
    cluster.dump_output();
    return false;
  }

  bool output_has(const std::string& node, const std::string& text) {
    return cluster.nodes.at(node).output().find(text) != std::string::npos;
  }
};

// The end of a head fault under load through w1: 40 answers more once the
// cluster is back, then the load stops. Every request answered (at least
// 99.9 %, the goal; in fact none should fail; each failure is printed), and
// w1 kept answering (`during`) while the head was gone.
void finish_through_w1(Load& load, size_t during) {
  size_t at_back = load.count();
  REQUIRE(wait_until([&] { return load.count() >= at_back + 40; }, 20s));
  load.stop();
  auto outcomes = load.outcomes();
  size_t failed = 0;
  for (const auto& o : outcomes) {
    if (o.status != 200) {
      ++failed;
      MESSAGE("failed: " << o.status << " after " << o.seconds << " s: " << o.body);
    }
  }
  MESSAGE(outcomes.size() << " requests through w1, " << failed << " failed; " << during
                          << " answered while the head was gone");
  CHECK(failed * 1000 <= outcomes.size());
  CHECK(during >= 100);
}

// Freezes the head (SIGSTOP) for 10 s under `load` through w1, then resumes
// it (SIGCONT). Returns the answers w1 gave from when it noticed the head
// was gone until the head was resumed.
// Requests the proxy whose admin listener is on `port` sent over other
// workers' data ports so far.
long peer_sends(uint16_t port) {
  auto n = metric_value(port, R"(troupe_proxy_replica_sends_total{transport="peer"})");
  REQUIRE(n);
  return static_cast<long>(*n);
}

size_t freeze_head_10s(Fixture& f, Load& load) {
  f.cluster.nodes.at("head").signal(SIGSTOP);
  auto frozen_at = Clock::now();
  CHECK(wait_until(
      [&] { return f.output_has("w1", "lost the connection to the controller's node"); }, 8s));
  size_t at_lost = load.count();
  // The freeze's length is the fault under test.
  std::this_thread::sleep_until(frozen_at + 10s);
  size_t during = load.count() - at_lost;
  f.cluster.nodes.at("head").signal(SIGCONT);
  return during;
}

// After freeze_head_10s: both workers reconnect and register again, with the
// replicas they host; every node is ALIVE; the test's own connection to the
// head (which timed out too) is made again; echo/Echo is at its 3 replicas
// and w1 routes to them.
void back_after_frozen_head(Fixture& f) {
  CHECK(wait_until(
      [&] {
        return f.output_has("head", "node w1 re-registered") &&
               f.output_has("head", "node w2 re-registered");
      },
      20s));
  CHECK(f.cluster.wait_states({{"head", "ALIVE"}, {"w1", "ALIVE"}, {"w2", "ALIVE"}}, 20s));
  f.reconnect();
  CHECK(f.wait_at_target("echo", "Echo", 3, 30s));
  CHECK(f.wait_routed("w1", "echo", "Echo", 3));
}

}  // namespace

TEST_CASE("frozen worker: requests in flight on its replica fail over once it is declared DEAD") {
  // The BASP connection timeout is far beyond the test: the connection to the
  // frozen node never drops, so only the controller's DEAD declaration (node
  // timeout 2 s) can end the requests in flight on its replica.
  Fixture f({"w1", "w2"}, 120.0);
  // Three replicas of 4 slots, one per node, kept full by 12 clients through
  // head and w2: w1's replica always has requests in flight.
  REQUIRE(f.client->deploy(app_spec("sleep", "/sleep", "Sleep", 3, 4)).has_value());
  REQUIRE(f.wait_at_target("sleep", "Sleep", 3, 30s));
  auto before = f.running("sleep", "Sleep");
  REQUIRE(std::count_if(before.begin(), before.end(),
                        [](const auto& kv) { return kv.second == "w1"; }) == 1);
  REQUIRE(f.wait_routed("head", "sleep", "Sleep", 3));
  REQUIRE(f.wait_routed("w2", "sleep", "Sleep", 3));

  std::vector<uint16_t> ports;
  for (int i = 0; i < 12; ++i)
    ports.push_back(f.port(i % 2 == 0 ? "head" : "w2"));
  Load load(ports, "/sleep?ms=300", 60);
  REQUIRE(wait_until([&] { return load.count() >= 24; }, 20s));

  f.cluster.nodes.at("w1").signal(SIGSTOP);
  auto frozen_at = Clock::now();
  REQUIRE(f.cluster.wait_states({{"head", "ALIVE"}, {"w1", "DEAD"}, {"w2", "ALIVE"}}, 6s));
  // Replaced on the other nodes while w1 is still frozen.
  CHECK(f.wait_at_target("sleep", "Sleep", 3, 15s, "w1"));
  size_t at_dead = load.count();
  REQUIRE(wait_until([&] { return load.count() >= at_dead + 40; }, 30s));
  load.stop();
  double frozen_for = std::chrono::duration<double>(Clock::now() - frozen_at).count();

  auto outcomes = load.outcomes();
  double slowest = 0;
  size_t failed = 0;
  for (const auto& o : outcomes) {
    slowest = std::max(slowest, o.seconds);
    if (o.status != 200) {
      ++failed;
      MESSAGE("failed: " << o.status << " after " << o.seconds << " s: " << o.body);
    }
  }
  MESSAGE(outcomes.size() << " requests; slowest " << slowest << " s; w1 frozen for " << frozen_for
                          << " s");
  CHECK(failed == 0);
  // Requests caught on the frozen replica (there always are some: its 4
  // slots are kept busy) wait for the DEAD declaration (2 s + a heartbeat +
  // a tick) and then complete elsewhere, not at the 120 s connection timeout
  // or the client's 60 s.
  CHECK(slowest > 1.0);
  CHECK(slowest < 8.0);
  bool failed_over = f.output_has("head", "declared DEAD; failing over") ||
                     f.output_has("w2", "declared DEAD; failing over");
  if (!failed_over)
    f.cluster.dump_output();
  CHECK(failed_over);

  // Resumed: the node comes back, its stale replica is stopped (the count
  // returns to target), and its own proxy answers.
  f.cluster.nodes.at("w1").signal(SIGCONT);
  CHECK(f.cluster.wait_states({{"head", "ALIVE"}, {"w1", "ALIVE"}, {"w2", "ALIVE"}}, 15s));
  CHECK(f.wait_at_target("sleep", "Sleep", 3, 20s));
  CHECK(wait_until(
      [&] {
        auto r = http_get(f.port("w1"), "/sleep?ms=1", 2);
        return r && r->status == 200;
      },
      15s, 100ms));
}

TEST_CASE("frozen worker: after its connections timed out its proxy serves again on SIGCONT") {
  // kFastLiveness: BASP connection timeout 3 s, node timeout 2 s. A freeze
  // long enough for the head to drop the connection: on SIGCONT the worker
  // finds every remote handle dead and reconnects.
  Fixture f({"w1", "w2"});
  // One request at a time per replica: requests sent to w1 while frozen go
  // to the remote replicas too, whose handles die with the connection.
  REQUIRE(f.client->deploy(app_spec("echo", "/echo", "Echo", 3, 1)).has_value());
  REQUIRE(f.wait_at_target("echo", "Echo", 3, 30s));
  REQUIRE(f.wait_routed("w1", "echo", "Echo", 3));
  for (int i = 0; i < 10; ++i) {
    auto r = http_get(f.port("w1"), "/echo/before", 5);
    REQUIRE(r);
    CHECK(r->status == 200);
  }

  f.cluster.nodes.at("w1").signal(SIGSTOP);
  REQUIRE(f.cluster.wait_states({{"head", "ALIVE"}, {"w1", "DEAD"}, {"w2", "ALIVE"}}, 6s));
  CHECK(f.wait_at_target("echo", "Echo", 3, 15s, "w1"));
  // The head drops the connection to the frozen worker (its agent's handle
  // goes down as unreachable).
  REQUIRE(wait_until([&] { return f.output_has("head", "lost the node agent of w1"); }, 15s));
  // Requests sent to the frozen proxy wait in its sockets until SIGCONT;
  // then they meet the dropped connection (their remote replicas' handles
  // die) and the reconnect (new handles for the same replicas).
  std::vector<std::optional<HttpReply>> during(12);
  std::vector<std::thread> waiting;
  for (size_t i = 0; i < during.size(); ++i)
    waiting.emplace_back([&, i] { during[i] = http_get(f.port("w1"), "/echo/during", 30); });
  REQUIRE(wait_until([&] { return f.accepted_connections("w1") >= during.size(); }, 10s));

  f.cluster.nodes.at("w1").signal(SIGCONT);
  CHECK(f.cluster.wait_states({{"head", "ALIVE"}, {"w1", "ALIVE"}, {"w2", "ALIVE"}}, 15s));
  for (auto& t : waiting)
    t.join();
  if (std::any_of(during.begin(), during.end(), [](const auto& r) { return !r || r->status != 200; })) {
    for (const auto& r : during)
      if (r && r->status != 200)
        MESSAGE("answer " << r->status << ": " << r->body);
    f.cluster.dump_output();
    auto routes = http_get(f.admin("w1"), "/-/routes", 2);
    MESSAGE("routes of w1: " << (routes ? routes->body : "no answer"));
  }
  for (const auto& r : during) {
    REQUIRE(r);
    CHECK(r->status == 200);
  }
  // Back at target: the stale replica on w1 was stopped or adopted in place
  // of a replacement, never both.
  CHECK(f.wait_at_target("echo", "Echo", 3, 20s));
  // The resumed worker's own proxy answers every request, from replicas the
  // controller lists.
  REQUIRE(wait_until(
      [&] {
        auto r = http_get(f.port("w1"), "/echo/after", 2);
        return r && r->status == 200;
      },
      15s, 100ms));
  auto listed = f.running("echo", "Echo");
  for (int i = 0; i < 20; ++i) {
    auto r = http_get(f.port("w1"), "/echo/after", 5);
    REQUIRE(r);
    CHECK(r->status == 200);
    if (r->status == 200) {
      auto id = json::parse(r->body).value("replica_id", "");
      CHECK(listed.count(id) == 1);
    }
  }
}

TEST_CASE("frozen head: 10 s under load through a worker - answered - after it no node is DEAD and no replica replaced") {
  // kFastLiveness: node timeout 2 s, BASP connection timeout 3 s. The head
  // is stopped far longer than both: the workers give up their connections
  // to it, and the resumed controller finds every node silent for 10 s. It
  // must see that it was the one stopped (issue: it declared every node
  // DEAD, itself included, and replaced their replicas).
  Fixture f({"w1", "w2"});
  REQUIRE(f.client->deploy(app_spec("echo", "/echo", "Echo", 3, 4)).has_value());
  REQUIRE(f.wait_at_target("echo", "Echo", 3, 30s));
  auto before = f.running("echo", "Echo");
  REQUIRE(before.size() == 3);
  // Load through w1, which has a replica of its own to serve from while the
  // head (the route to every other node) is gone.
  REQUIRE(std::count_if(before.begin(), before.end(),
                        [](const auto& kv) { return kv.second == "w1"; }) >= 1);
  REQUIRE(f.wait_routed("w1", "echo", "Echo", 3));
  Load load({f.port("w1"), f.port("w1"), f.port("w1"), f.port("w1")}, "/echo/through-w1", 30);
  REQUIRE(wait_until([&] { return load.count() >= 40; }, 20s));

  size_t during = freeze_head_10s(f, load);

  CHECK(wait_until([&] { return f.output_has("head", "the controller made no progress for"); },
                   10s));
  back_after_frozen_head(f);
  finish_through_w1(load, during);
  // No node was declared DEAD, and the same three replicas run: none was
  // replaced, stopped or started.
  if (f.output_has("head", "-> DEAD"))
    f.cluster.dump_output();
  CHECK_FALSE(f.output_has("head", "-> DEAD"));
  CHECK(f.same_replicas("echo", "Echo", before));
  CHECK(f.output_has("head", "is back with its node"));
}

TEST_CASE("frozen head: 10 s under load through w1 on the replicas of w2 - answered over their direct connection") {
  // The replicas run on w2 only (the resource `w2`); the load enters at w1.
  // w1 reaches them over its direct connection to w2's peer port, not
  // through the head: freezing the head (the route between the workers when
  // they had no connection of their own) must not stop that traffic.
  std::vector<std::string> w2_only = {"--resources", "cpu=2,w2=1"};
  Fixture f({"w1", "w2"}, {}, {{"w2", w2_only}});
  auto app = app_spec("echo", "/echo", "Echo", 3, 4);
  app.deployments[0].config.resources = parse_resources("w2=0.25").value();
  REQUIRE(f.client->deploy(app).has_value());
  REQUIRE(f.wait_at_target("echo", "Echo", 3, 30s));
  auto before = f.running("echo", "Echo");
  REQUIRE(before.size() == 3);
  for (const auto& [id, node] : before)
    REQUIRE(node == "w2");
  REQUIRE(f.wait_routed("w1", "echo", "Echo", 3));
  REQUIRE(wait_until([&] { return f.output_has("w1", "direct connection to node w2 at"); }, 20s));
  Load load({f.port("w1"), f.port("w1"), f.port("w1"), f.port("w1")}, "/echo/w1-to-w2", 30);
  REQUIRE(wait_until([&] { return load.count() >= 40; }, 20s));
  // The requests go over w2's data port (proxy/peer_client.cpp), opened by
  // w1's io thread on its first request there: w1's peer sends grow (w2
  // hosts every replica).
  REQUIRE(wait_until([&] { return peer_sends(f.admin("w1")) > 0; }, 20s));
  long peer_before = peer_sends(f.admin("w1"));

  size_t during = freeze_head_10s(f, load);
  long peer_during = peer_sends(f.admin("w1")) - peer_before;

  back_after_frozen_head(f);
  // The direct connection and the data port connection held: w1 never fell
  // back to the head, and the requests during the freeze went over the data
  // port.
  CHECK_FALSE(f.output_has("w1", "lost the direct connection to node w2"));
  CHECK_FALSE(f.output_has("w1", "lost the data port connection to node w2"));
  CHECK(peer_during >= static_cast<long>(during));
  finish_through_w1(load, during);
  CHECK(f.same_replicas("echo", "Echo", before));
}

TEST_CASE("a replica process frozen past its node's connection timeout attaches again on SIGCONT - the same process serves on") {
  // kFastLiveness: BASP connection timeout 3 s. The replica process of
  // Gateway is stopped for 5 s: its node drops the connection to it (as a
  // node that was itself frozen does when it resumes). On SIGCONT the
  // process connects again and attaches the same replica actor again; the
  // node's handle for it, and its own handles for the node's actors (its
  // deployment handles go through the node's proxy), reach each other over
  // the new connection. Health checks are far apart, so that they do not
  // replace the frozen replica first.
  Fixture f({"w1"});
  controller::ApplicationSpec app = example_app("compose", "/compose", "Gateway", 1);
  for (const char* cls : {"Upper", "Reverse"}) {
    controller::DeploymentSpec d = app.deployments[0];
    d.name = cls;
    d.import_path = std::string("libtroupe_examples.so:") + cls;
    app.deployments.push_back(d);
  }
  for (auto& d : app.deployments) {
    d.config.health_check_period_s = 60;
    d.config.health_check_timeout_s = 60;
  }
  REQUIRE(f.client->deploy(app).has_value());
  for (const char* cls : {"Gateway", "Upper", "Reverse"})
    REQUIRE(f.wait_at_target("compose", cls, 1, 30s));
  auto before = f.running("compose", "Gateway");
  REQUIRE(before.size() == 1);
  const std::string id = before.begin()->first;
  const std::string node = before.begin()->second;
  auto pids = proc::processes_mentioning("--replica-id " + id + " ");
  REQUIRE(pids.size() == 1);
  const pid_t pid = pids.front();
  auto gateway_answers = [&] {
    auto r = http_get(f.port(node), "/compose/?text=Hello", 10);
    if (!r || r->status != 200)
      return false;
    auto body = json::parse(r->body, nullptr, false);
    return body.is_object() && body["gateway"].value("replica_id", "") == id &&
           body["upper"].value("text", "") == "HELLO" &&
           body["reverse"].value("text", "") == "olleH";
  };
  REQUIRE(wait_until(gateway_answers, 30s, 100ms));

  REQUIRE(::kill(pid, SIGSTOP) == 0);
  bool dropped = wait_until(
      [&] { return f.output_has(node, "lost the connection to replica process " + id); }, 15s);
  // Resumed whatever happened, so that the cluster can stop it.
  REQUIRE(::kill(pid, SIGCONT) == 0);
  REQUIRE(dropped);
  CHECK(wait_until(
      [&] {
        return f.output_has(node, "replica process " + id + " (pid " + std::to_string(pid) +
                                      ") attached again");
      },
      15s));
  CHECK(wait_until(gateway_answers, 15s, 100ms));
  for (int i = 0; i < 10; ++i)
    CHECK(gateway_answers());
  CHECK(f.same_replicas("compose", "Gateway", before));
  CHECK(proc::processes_mentioning("--replica-id " + id + " ") == std::vector<pid_t>{pid});
  CHECK_FALSE(f.output_has(node, "did not attach again"));
}

TEST_CASE("head killed -9 for 20 s: a worker serves throughout - the restarted controller adopts every replica and starts none") {
  // The replicas run on the workers only (the resource `worker`): what dies
  // with the head is the controller, not a replica.
  std::vector<std::string> worker = {"--resources", "cpu=2,worker=1"};
  Fixture f({"w1", "w2"}, {}, {{"w1", worker}, {"w2", worker}});
  auto app = app_spec("echo", "/echo", "Echo", 3, 4);
  app.deployments[0].config.resources = parse_resources("worker=0.25").value();
  REQUIRE(f.client->deploy(app).has_value());
  REQUIRE(f.wait_at_target("echo", "Echo", 3, 30s));
  auto before = f.running("echo", "Echo");
  REQUIRE(before.size() == 3);
  REQUIRE(std::count_if(before.begin(), before.end(),
                        [](const auto& kv) { return kv.second == "w1"; }) >= 1);
  REQUIRE(f.wait_routed("w1", "echo", "Echo", 3));
  int started_w1 = f.occurrences("w1", "started replica process");
  int started_w2 = f.occurrences("w2", "started replica process");
  Load load({f.port("w1"), f.port("w1"), f.port("w1"), f.port("w1")}, "/echo/through-w1", 30);
  REQUIRE(wait_until([&] { return load.count() >= 40; }, 20s));

  f.cluster.nodes.at("head").signal(SIGKILL);
  REQUIRE(f.cluster.nodes.at("head").wait_exit(5s).has_value());
  auto killed_at = Clock::now();
  CHECK(wait_until(
      [&] { return f.output_has("w1", "lost the connection to the controller's node"); }, 8s));
  size_t at_lost = load.count();
  // The head's absence is the fault under test.
  std::this_thread::sleep_until(killed_at + 20s);
  size_t during = load.count() - at_lost;

  // The same head again (same state directory and ports). Its recovery
  // window is the default's 3 s; the agents retry about once a second.
  auto& l = f.cluster.liveness;
  auto window = std::find(l.begin(), l.end(), "--recovery-window");
  REQUIRE(window != l.end());
  *(window + 1) = "3";
  f.cluster.start_head();
  CHECK(f.cluster.wait_states({{"head", "ALIVE"}, {"w1", "ALIVE"}, {"w2", "ALIVE"}}, 30s));
  f.reconnect();
  CHECK(wait_until(
      [&] { return f.output_has("head", "every node known before the restart has registered"); },
      20s));
  CHECK(f.wait_at_target("echo", "Echo", 3, 30s));
  CHECK(f.wait_routed("w1", "echo", "Echo", 3));
  finish_through_w1(load, during);
  // Adopted, not restarted: the same three replicas, and the restarted
  // controller started none.
  CHECK(f.same_replicas("echo", "Echo", before));
  CHECK(f.occurrences("w1", "started replica process") == started_w1);
  CHECK(f.occurrences("w2", "started replica process") == started_w2);
}

TEST_CASE("troupectl kill agent: the node restarts its agent and its replicas are adopted") {
  Fixture f({"w1"});
  REQUIRE(f.client->deploy(app_spec("echo", "/echo", "Echo", 4, 8)).has_value());
  REQUIRE(f.wait_at_target("echo", "Echo", 4, 30s));
  auto before = f.running("echo", "Echo");
  REQUIRE(std::count_if(before.begin(), before.end(),
                        [](const auto& kv) { return kv.second == "w1"; }) >= 1);
  REQUIRE(f.wait_routed("w1", "echo", "Echo", 4));

  for (int round = 1; round <= 2; ++round) {
    CAPTURE(round);
    auto killed = f.client->kill("agent", "w1");
    INFO(killed.to_string());
    if (!killed.is_ok())
      f.cluster.dump_output();
    REQUIRE(killed.is_ok());
    // The node process restarts the agent; the new one registers again.
    REQUIRE(wait_until([&] { return f.occurrences("w1", "node agent died") >= round; }, 10s));
    REQUIRE(
        wait_until([&] { return f.occurrences("head", "node w1 re-registered") >= round; }, 10s));
    CHECK(f.cluster.wait_states({{"head", "ALIVE"}, {"w1", "ALIVE"}}, 10s));
    // Adopted, not restarted: the very same replicas, on the same nodes.
    CHECK(f.wait_at_target("echo", "Echo", 4, 15s));
    CHECK(f.running("echo", "Echo") == before);
    // w1 kept serving and still does, also from its own replicas.
    for (int i = 0; i < 10; ++i) {
      auto r = http_get(f.port("w1"), "/echo/agent", 5);
      REQUIRE(r);
      CHECK(r->status == 200);
    }
  }
  // The node never went DEAD: only the agent actor died.
  CHECK_FALSE(f.output_has("head", "node w1 ALIVE -> DEAD"));

  // The restarted agent is the one stopping the node: SIGTERM stops every
  // replica, deregisters, and exits 0.
  f.cluster.nodes.at("w1").signal(SIGTERM);
  auto code = f.cluster.nodes.at("w1").wait_exit(15s);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK(f.output_has("w1", "deregistered from the controller"));
  CHECK(f.cluster.wait_states({{"head", "ALIVE"}}, 10s));
}

// Every keeper is the one keeper (runtime/keeper_actor.hpp) and gives up the
// same way: past its restart policy (10 restarts within 60 s) it stops the
// node, which exits 1 naming what it gave up on. The controller's case is in
// recovery_test ("head supervisor: a controller that keeps dying ...").
TEST_CASE("every keeper gives up the same way: a node agent or proxy actor that keeps dying stops its node - exit 1 naming it") {
  for (std::string kind : {"agent", "proxy"}) {
    CAPTURE(kind);
    const std::string what = kind == "agent" ? "node agent" : "proxy actor";
    Fixture f({"w1"});
    auto& w1 = f.cluster.nodes.at("w1");
    // Each kill lands on the current actor: one that is restarting, or whose
    // successor the controller does not know yet, is tried again.
    for (int kill = 1; kill <= 11; ++kill) {
      CAPTURE(kill);
      bool landed = wait_until(
          [&] {
            if (!f.client->kill(kind, "w1").is_ok())
              return false;
            // The 11th death is not restarted: it is the give-up.
            return wait_until(
                [&] {
                  return f.occurrences("w1", what + " died") +
                             f.occurrences("w1", "gave up on the " + what) >=
                         kill;
                },
                2s);
          },
          30s);
      if (!landed)
        f.cluster.dump_output();
      REQUIRE(landed);
    }
    auto code = w1.wait_exit(30s);
    if (!code)
      f.cluster.dump_output();
    REQUIRE(code.has_value());
    CHECK(*code == 1);
    CHECK(f.output_has("w1", "gave up on the " + what +
                                 ": it was restarted 10 times within 60 s and died again; last "
                                 "exit reason: "));
    CHECK(f.output_has("w1", "troupe-node: error: gave up on the " + what));
  }
}

// The shutdown crash of a proxy (a replica's down message posted to an
// io_context being destroyed) showed only when nodes stopped while replicas
// died under load. Every round stops all nodes at once in that state; the
// Cluster's exit check fails the test for any node that does not exit by
// itself with status 0.
TEST_CASE("every node exits 0 when all are stopped while replicas are killed under load - 4 rounds") {
  for (int round = 0; round < 4; ++round) {
    CAPTURE(round);
    Fixture f({"w1", "w2"});
    auto in_process = app_spec("echo", "/echo", "Echo", 4, 4);
    in_process.deployments[0].config.isolation = controller::Isolation::in_process;
    REQUIRE(f.client->deploy(in_process).has_value());
    REQUIRE(f.client->deploy(app_spec("counter", "/counter", "Counter", 3, 4)).has_value());
    REQUIRE(f.wait_at_target("echo", "Echo", 4, 30s));
    REQUIRE(f.wait_at_target("counter", "Counter", 3, 30s));
    std::vector<uint16_t> ports;
    for (const auto& [id, port] : f.cluster.http_ports) {
      ports.push_back(port);
      ports.push_back(port);
    }
    Load echo(ports, "/echo/x", 10);
    Load counter(ports, "/counter/", 10);
    REQUIRE(wait_until([&] { return echo.count() >= 50 && counter.count() >= 50; }, 20s));
    for (int kill = 0; kill < 3; ++kill) {
      for (const char* dep : {"Echo", "Counter"}) {
        std::string app = std::string(dep) == "Echo" ? "echo" : "counter";
        auto replicas = f.running(app, dep);
        if (!replicas.empty())
          CHECK(f.client->kill_replica(replicas.begin()->first).is_ok());
      }
      size_t at = echo.count();
      REQUIRE(wait_until([&] { return echo.count() >= at + 20; }, 20s));
    }
    // All nodes at once, with requests, replacements and down messages in
    // flight.
    auto problems = f.cluster.stop_all();
    echo.stop();
    counter.stop();
    for (const auto& p : problems)
      FAIL_CHECK(p);
    CHECK(problems.empty());
  }
}
