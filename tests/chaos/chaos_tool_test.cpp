// The chaos tool's own logic without a cluster: scenario files, and the
// analysis that turns observations into recovery times, failure classes and
// goal verdicts.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tests/support/temp_dir.hpp"
#include "tools/chaos/report.hpp"
#include "tools/chaos/scenario.hpp"

using namespace chaos;
namespace fs = std::filesystem;

namespace {

// <name>.yaml in this test process's own directory (removed at its exit).
std::string write_temp(const std::string& name, const std::string& text) {
  static const troupe::testing::TempDir dir("chaos-tool-test");
  auto path = dir / ("chaos_tool_test_" + name + ".yaml");
  std::ofstream(path) << text;
  return path;
}

std::string error_of(const std::string& name, const std::string& text) {
  try {
    load_scenario(write_temp(name, text));
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

const char* kMinimal = R"(name: t
deploy:
  applications:
    - name: echo
      route_prefix: /echo
      import_path: libtroupe_examples.so:Echo
)";

Observation healthy_at(double start, double end) {
  Observation o;
  o.start_s = start;
  o.state_end_s = end;
  o.end_s = end;
  o.status_ok = true;
  o.nodes_ok = true;
  o.app_status["echo"] = "RUNNING";
  DeploymentView v;
  v.status = "HEALTHY";
  v.target = 2;
  v.running = 2;
  v.total = 2;
  v.running_on = {{"head", 2}};
  v.kept_on = {{"head", 2}};
  v.state_of = {{"r1", "RUNNING"}, {"r2", "RUNNING"}};
  o.deployments["echo/Echo"] = v;
  o.replica_ids = {"r1", "r2"};
  o.replicas_per_node["head"] = 2;
  o.node_state = {{"head", "ALIVE"}, {"w1", "ALIVE"}};
  return o;
}

// A healthy round that also saw the controller still recovering.
Observation recovering_at(double start, double end) {
  auto o = healthy_at(start, end);
  o.recovering = true;
  return o;
}

// A network fault that was injected at `t` and healed at `end`.
FaultEvent injected(FaultKind kind, const std::string& node, std::vector<std::string> peers,
                    double t, double end) {
  FaultEvent f;
  f.kind = kind;
  f.node = node;
  f.peers = std::move(peers);
  f.t_s = t;
  f.end_s = end;
  f.ok = true;
  return f;
}

// A run whose one fault, a controller kill at `t`, is judged against a
// recovery limit of `limit` s.
RunData controller_killed_at(double t, double limit) {
  RunData run;
  run.scenario.goals.max_recovery_s = limit;
  FaultEvent f;
  f.kind = FaultKind::kill_controller;
  f.t_s = t;
  f.ok = true;
  run.faults.push_back(f);
  return run;
}

}  // namespace

TEST_CASE("chaos/every scenario file loads - at least five - named after its file") {
  int count = 0;
  int short_ones = 0;
  for (const auto& entry : fs::directory_iterator(CHAOS_SCENARIO_DIR)) {
    if (entry.path().extension() != ".yaml")
      continue;
    CAPTURE(entry.path().string());
    Scenario s;
    REQUIRE_NOTHROW(s = load_scenario(entry.path().string()));
    CHECK(s.name == entry.path().stem().string());
    CHECK(s.has_load);
    CHECK(!s.faults.empty());
    ++count;
    if (!s.long_running) {
      ++short_ones;
      // Short scenarios fit in a minute: load, then at most the convergence
      // deadline when it ends later.
      CHECK(s.load.duration_s <= 45);
    }
  }
  CHECK(count >= 5);
  CHECK(short_ones >= 3);
}

TEST_CASE("chaos/bad scenarios are refused with file - line and field") {
  CHECK(error_of("ok", kMinimal).empty());
  auto unknown = error_of("unknown", std::string(kMinimal) + "lod: {rate: 1}\n");
  CHECK(unknown.find("chaos_tool_test_unknown.yaml:7:1: unknown field 'lod' in scenario") !=
        std::string::npos);
  auto both = error_of(
      "both", std::string(kMinimal) + "load: {rate: 10, concurrency: 2, paths: [/echo]}\n");
  CHECK(both.find("exactly one of concurrency") != std::string::npos);
  auto action = error_of("action", std::string(kMinimal) + "faults:\n  - {action: nuke}\n");
  CHECK(action.find("unknown action 'nuke'") != std::string::npos);
  auto path = error_of("path", std::string(kMinimal) + "load: {rate: 10, paths: [echo]}\n");
  CHECK(path.find("paths start with /") != std::string::npos);
  auto no_deploy = error_of("nodeploy", "name: t\n");
  CHECK(no_deploy.find("needs `deploy:`") != std::string::npos);
  auto late = error_of("late", std::string(kMinimal) +
                                   "load: {rate: 10, duration_s: 5, paths: [/echo]}\n"
                                   "faults:\n  - {action: kill_replica, at_s: 9}\n");
  CHECK(late.find("starts after the load ends") != std::string::npos);
}

TEST_CASE("chaos/recovery is read from the first poll that started after the fault") {
  RunData run;
  run.scenario.goals.max_recovery_s = 1.0;
  FaultEvent f;
  f.kind = FaultKind::kill_replica;
  f.t_s = 10;
  f.ok = true;
  f.victim = "r1";
  run.faults.push_back(f);
  // A poll that started before the fault does not count, even if it ended
  // after it; one that still lists the victim does not either.
  run.observations.push_back(healthy_at(9.9, 10.2));
  auto still = healthy_at(10.1, 10.2);
  run.observations.push_back(still);
  auto replaced = healthy_at(10.3, 10.45);
  replaced.replica_ids = {"r2", "r3"};
  run.observations.push_back(replaced);
  analyze(run);
  REQUIRE(run.faults[0].recovery_s.has_value());
  CHECK(*run.faults[0].recovery_s == doctest::Approx(0.45));
  CHECK(run.faults[0].met == true);
  REQUIRE(run.goals.size() == 1);
  CHECK(run.goals[0].met);
}

TEST_CASE("chaos/recovery is read from the round that saw it and answered first - not the first to start") {
  RunData run = controller_killed_at(10, 1.0);
  // Rounds overlap: the first after the fault met the restarting controller
  // and answered 1.2 s after it; one that started later answered healthy
  // 0.6 s after it. An earlier round saw the controller recovering.
  run.observations.push_back(recovering_at(10.05, 10.1));
  run.observations.push_back(healthy_at(10.1, 11.2));
  run.observations.push_back(healthy_at(10.3, 10.6));
  analyze(run);
  REQUIRE(run.faults[0].recovery_s.has_value());
  CHECK(*run.faults[0].recovery_s == doctest::Approx(0.6));
  // The round that saw it started at 10.3; the last before it that did not
  // see it started at 10.05 (the one at 10.1 saw it, later).
  REQUIRE(run.faults[0].recovery_lower_s.has_value());
  CHECK(*run.faults[0].recovery_lower_s == doctest::Approx(0.05));
  CHECK(run.faults[0].met == true);
  CHECK_FALSE(run.faults[0].inconclusive);
  CHECK(run.goals[0].met);
}

TEST_CASE("chaos/a fault followed too soon by the next one is not judged") {
  RunData run;
  run.scenario.goals.max_recovery_s = 2.0;
  for (double t : {10.0, 11.0}) {
    FaultEvent f;
    f.kind = FaultKind::kill_controller;
    f.t_s = t;
    f.ok = true;
    run.faults.push_back(f);
  }
  auto down = healthy_at(10.1, 10.2);
  down.status_ok = false;
  run.observations.push_back(down);
  run.observations.push_back(healthy_at(12.0, 12.5));
  analyze(run);
  CHECK(run.faults[0].superseded);
  CHECK(!run.faults[0].met.has_value());
  CHECK(*run.faults[1].recovery_s == doctest::Approx(1.5));
  CHECK(run.faults[1].met == true);
  CHECK(run.goals[0].met);
}

TEST_CASE("chaos/a recovery beyond the limit with time to spare is a miss") {
  RunData run = controller_killed_at(10, 1.0);
  run.observations.push_back(recovering_at(10.1, 10.2));
  run.observations.push_back(healthy_at(11.5, 11.6));
  analyze(run);
  CHECK(run.faults[0].met == false);
  CHECK(!run.goals[0].met);
  CHECK(!run.ok);
}

TEST_CASE("chaos/failed requests are classified against the node faults") {
  RunData run;
  run.load_enabled = true;
  run.scenario.goals.max_failures_via_unfaulted_nodes = 0;
  run.scenario.goals.max_unexplained_failures = 0;
  FaultEvent f;
  f.kind = FaultKind::sigstop_node;
  f.node = "w1";
  f.t_s = 10;
  f.end_s = 15;
  f.ok = true;
  run.faults.push_back(f);
  run.load.ok = 100;
  run.load.failed = 3;
  run.load.failures = {{9.9, 12.0, "w1", "timeout"},   // in flight when frozen
                       {12.0, 14.0, "w1", "timeout"},  // sent while frozen
                       {13.0, 13.1, "w2", "503"}};     // through a node never hit
  analyze(run);
  CHECK(run.failures_in_flight == 1);
  CHECK(run.failures_node_unavailable == 1);
  CHECK(run.failures_unexplained == 1);
  CHECK(run.failures_via_unfaulted == 1);
  CHECK(!run.ok);
}

TEST_CASE("chaos/a recovery whose bounds straddle the limit is inconclusive - not met") {
  RunData run = controller_killed_at(10, 1.0);
  // The only poll after the fault started 0.5 s late and answered 1.5 s
  // after it: healthy, but no proof that it was within 1 s.
  run.observations.push_back(healthy_at(10.5, 11.5));
  analyze(run);
  CHECK(run.faults[0].inconclusive);
  CHECK(run.faults[0].met == false);
  CHECK(*run.faults[0].recovery_lower_s == doctest::Approx(0.0));
  CHECK(!run.goals[0].met);
}

// -- poisoned requests (action poison) and the goals that judge them ---------

TEST_CASE("chaos/a poison fault is loaded with its paths - mark and timeout") {
  auto path = write_temp("poison", std::string(kMinimal) +
                                       "load: {rate: 10, duration_s: 30, paths: [/echo]}\n"
                                       "faults:\n"
                                       "  - action: poison\n"
                                       "    start_s: 5\n"
                                       "    every_s: 1\n"
                                       "    stop_s: 24\n"
                                       "    node: round_robin\n"
                                       "    paths:\n"
                                       "      - /crash/?mode=segv\n"
                                       "      - /crash/?mode=abort\n"
                                       "    mark: print\n"
                                       "    timeout_s: 4\n"
                                       "  - {action: poison, at_s: 3, path: /crash/x}\n"
                                       "goals:\n"
                                       "  min_poison_502_ratio: 1.0\n"
                                       "  max_nodes_seen_not_alive: 0\n"
                                       "  max_failed_status_polls: 2\n"
                                       "  max_status_gap_s: 3\n");
  Scenario s = load_scenario(path);
  REQUIRE(s.faults.size() == 2);
  const auto& f = s.faults[0];
  CHECK(f.kind == FaultKind::poison);
  CHECK(std::string(to_string(f.kind)) == "poison");
  CHECK(!node_scoped(f.kind));
  CHECK(f.node == "round_robin");
  CHECK(f.paths == std::vector<std::string>{"/crash/?mode=segv", "/crash/?mode=abort"});
  CHECK(f.mark == "print");
  CHECK(f.timeout_s == doctest::Approx(4));
  CHECK(f.every_s == doctest::Approx(1));
  CHECK(f.stop_s == doctest::Approx(24));
  // Defaults: through a random node, no mark, 10 s.
  CHECK(s.faults[1].node == "random");
  CHECK(s.faults[1].paths == std::vector<std::string>{"/crash/x"});
  CHECK(s.faults[1].mark.empty());
  CHECK(s.faults[1].timeout_s == doctest::Approx(10));
  CHECK(s.goals.min_poison_502_ratio == doctest::Approx(1.0));
  CHECK(s.goals.max_nodes_seen_not_alive == 0);
  CHECK(s.goals.max_failed_status_polls == 2);
  CHECK(s.goals.max_status_gap_s == doctest::Approx(3));
}

TEST_CASE("chaos/bad poison faults are refused") {
  auto faults = [](const std::string& items) {
    return std::string(kMinimal) + "load: {rate: 10, duration_s: 30, paths: [/echo]}\nfaults:\n" +
           items;
  };
  CHECK(error_of("p_nopath", faults("  - {action: poison, at_s: 1}\n")).find("poison needs path") !=
        std::string::npos);
  CHECK(error_of("p_both", faults("  - {action: poison, at_s: 1, path: /a, paths: [/b]}\n"))
            .find("path or paths, not both") != std::string::npos);
  CHECK(error_of("p_slash", faults("  - {action: poison, at_s: 1, path: crash}\n"))
            .find("poison paths start with /") != std::string::npos);
  CHECK(error_of("p_mark", faults("  - {action: poison, at_s: 1, path: /a, mark: 'a=b'}\n"))
            .find("mark is a query parameter name") != std::string::npos);
  CHECK(error_of("p_timeout", faults("  - {action: poison, at_s: 1, path: /a, timeout_s: 0}\n"))
            .find("timeout_s must be > 0") != std::string::npos);
  CHECK(error_of("p_other", faults("  - {action: kill_replica, at_s: 1, path: /a}\n"))
            .find("path is for action poison only") != std::string::npos);
  CHECK(error_of("p_rr", faults("  - {action: kill_proxy, at_s: 1, node: round_robin}\n"))
            .find("round_robin is for poison only") != std::string::npos);
  CHECK(error_of("p_goal", faults("  - {action: kill_replica, at_s: 1}\n") +
                               "goals: {min_poison_502_ratio: 1}\n")
            .find("min_poison_502_ratio needs a poison fault") != std::string::npos);
  auto unknown = error_of("p_goal2", std::string(kMinimal) + "goals: {max_poison: 1}\n");
  CHECK(unknown.find("unknown field 'max_poison' in goals") != std::string::npos);
}

namespace {

FaultEvent poisoned(double t, int status, const std::string& error = "") {
  FaultEvent f;
  f.kind = FaultKind::poison;
  f.t_s = t;
  f.ok = true;
  f.node = "head";
  f.path = "/crash/?mode=segv";
  f.answered = true;
  f.answered_s = t + 0.05;
  f.status = status;
  f.error = error;
  if (status == 502) {
    f.request_id = "r" + std::to_string(static_cast<int>(t));
    f.answer =
        "request " + f.request_id + " crashed 2 replicas of crash/Crash; it is not retried again";
  }
  return f;
}

bool has_check(const RunData& run, const std::string& prefix, bool ok) {
  for (const auto& c : run.invariants) {
    if (c.name.rfind(prefix, 0) == 0)
      return c.ok == ok;
  }
  return false;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

const GoalResult* goal(const RunData& run, const std::string& name) {
  for (const auto& g : run.goals) {
    if (g.name == name)
      return &g;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("chaos/poisoned requests: 502 naming the request is the query-of-death answer") {
  RunData run;
  run.scenario.goals.min_poison_502_ratio = 1.0;
  run.faults = {poisoned(5, 502), poisoned(6, 502)};
  // A 502 without the body's request id and "crashed" is not the answer.
  auto bare = poisoned(7, 502);
  bare.request_id.clear();
  CHECK(!bare.query_of_death());
  analyze(run);
  CHECK(run.poison_sent == 2);
  CHECK(run.poison_502 == 2);
  CHECK(has_check(run, "no poisoned request hung", true));
  REQUIRE(goal(run, "min_poison_502_ratio"));
  CHECK(goal(run, "min_poison_502_ratio")->met);
  CHECK(*goal(run, "min_poison_502_ratio")->measured == doctest::Approx(1.0));
  // analyze() again does not add the invariant twice.
  analyze(run);
  int count = 0;
  for (const auto& c : run.invariants)
    count += c.name.rfind("no poisoned request hung", 0) == 0;
  CHECK(count == 1);
}

TEST_CASE(
    "chaos/poisoned requests: a hang or a 2xx violates the invariant - a 503 misses the goal") {
  RunData run;
  run.scenario.goals.min_poison_502_ratio = 1.0;
  run.faults = {poisoned(5, 502), poisoned(6, 503)};
  analyze(run);
  CHECK(has_check(run, "no poisoned request hung", true));  // 503: an error status, in time
  CHECK(!goal(run, "min_poison_502_ratio")->met);
  CHECK(*goal(run, "min_poison_502_ratio")->measured == doctest::Approx(0.5));
  CHECK(run.poison_by_answer["503"] == 1);
  CHECK(!run.ok);

  RunData hung;
  hung.faults = {poisoned(5, 0, "timeout"), poisoned(6, 200)};
  analyze(hung);
  CHECK(hung.poison_no_answer == 1);
  CHECK(hung.poison_2xx == 1);
  CHECK(has_check(hung, "no poisoned request hung", false));
  CHECK(!hung.ok);
}

TEST_CASE("chaos/a poison recovers once the replicas it crashed are gone") {
  RunData run;
  run.scenario.goals.max_recovery_s = 1.0;
  auto f = poisoned(10, 502);
  f.victims = {"r1", "r2"};
  f.victim_nodes = {"head", "head"};
  f.victims_known = true;
  run.faults.push_back(f);
  // Healthy, but still listing a victim (the crash not yet reported): not
  // recovered; then the victims replaced.
  run.observations.push_back(healthy_at(10.01, 10.1));
  auto replaced = healthy_at(10.2, 10.3);
  replaced.replica_ids = {"r3", "r4"};
  run.observations.push_back(replaced);
  analyze(run);
  REQUIRE(run.faults[0].recovery_s.has_value());
  CHECK(*run.faults[0].recovery_s == doctest::Approx(0.3));
  CHECK(run.faults[0].met == true);
}

TEST_CASE("chaos/nodes seen not ALIVE and unanswered polls are counted - targeted nodes apart") {
  RunData run;
  run.http_ports = {{"head", 1}, {"w1", 2}, {"w2", 3}};
  run.scenario.goals.max_nodes_seen_not_alive = 0;
  run.scenario.goals.max_failed_status_polls = 0;
  run.scenario.goals.max_status_gap_s = 1.0;
  FaultEvent k;
  k.kind = FaultKind::kill9_node;
  k.node = "w2";
  k.t_s = 0.3;
  k.ok = true;
  run.faults.push_back(k);
  auto a = healthy_at(0.0, 0.1);
  a.node_state = {{"head", "ALIVE"}, {"w1", "ALIVE"}, {"w2", "ALIVE"}};
  auto b = healthy_at(0.5, 0.6);
  b.node_state = {{"head", "ALIVE"}, {"w1", "DEAD"}, {"w2", "DEAD"}};  // w2 was killed: apart
  auto c = healthy_at(1.0, 1.2);
  c.status_ok = false;
  c.status_error = "troupectl timed out";
  auto d = healthy_at(2.0, 2.1);
  d.node_state = a.node_state;
  run.observations = {a, b, c, d};
  analyze(run);
  CHECK(run.nodes_seen_not_alive.size() == 1);
  CHECK(run.nodes_seen_not_alive.count("w1") == 1);
  CHECK(run.polls == 4);
  CHECK(run.polls_failed == 1);
  // From b's answer to d's: the unanswered poll between them.
  CHECK(run.longest_unanswered_s == doctest::Approx(1.5));
  CHECK(!goal(run, "max_nodes_seen_not_alive")->met);
  CHECK(!goal(run, "max_failed_status_polls")->met);
  CHECK(!goal(run, "max_status_gap_s")->met);
  // A gap limit of 2 s tolerates the one unanswered poll; the count does not.
  run.scenario.goals.max_status_gap_s = 2.0;
  analyze(run);
  CHECK(goal(run, "max_status_gap_s")->met);
  CHECK(!goal(run, "max_failed_status_polls")->met);
  CHECK(!run.ok);
}

TEST_CASE("chaos/network faults are loaded with their peers - direction - delay and loss") {
  auto path = write_temp("net", std::string(kMinimal) + R"(cluster: {workers: 2, network: namespaces}
load: {rate: 10, duration_s: 30, paths: [/echo]}
faults:
  - {action: partition, node: w1, from: head, direction: out, at_s: 1, duration_s: 5}
  - {action: degrade, node: head, from: workers, delay_ms: 200, loss_pct: 5, at_s: 10, duration_s: 5}
goals: {max_dead_transitions_per_fault: 1, max_replicas_above_surge: 0}
)");
  auto s = load_scenario(path);
  CHECK(s.cluster.network == "namespaces");
  CHECK(!s.cluster.tls.has_value());
  REQUIRE(s.faults.size() == 2);
  CHECK(s.faults[0].kind == FaultKind::partition);
  CHECK(s.faults[0].from == "head");
  CHECK(s.faults[0].direction == Direction::out);
  CHECK(s.faults[0].duration_s == 5);
  CHECK(s.faults[1].kind == FaultKind::degrade);
  CHECK(s.faults[1].from == "workers");
  CHECK(s.faults[1].delay_ms == 200);
  CHECK(s.faults[1].loss_pct == 5);
  CHECK(*s.goals.max_dead_transitions_per_fault == 1);
  CHECK(*s.goals.max_replicas_above_surge == 0);
}

TEST_CASE("chaos/bad network faults are refused") {
  const std::string hosts = std::string(kMinimal) + "cluster: {network: namespaces}\n";
  auto loopback = error_of("net1", std::string(kMinimal) +
                                       "faults:\n  - {action: partition, node: w1, duration_s: 5}\n");
  CHECK(loopback.find("partition needs cluster.network: namespaces") != std::string::npos);
  auto network = error_of("net2", std::string(kMinimal) + "cluster: {network: vlan}\n");
  CHECK(network.find("network is loopback or namespaces") != std::string::npos);
  auto heal = error_of("net3", hosts + "faults:\n  - {action: partition, node: w1}\n");
  CHECK(heal.find("partition needs duration_s") != std::string::npos);
  auto dir = error_of(
      "net4", hosts + "faults:\n  - {action: partition, node: w1, direction: up, duration_s: 5}\n");
  CHECK(dir.find("direction is both, out") != std::string::npos);
  auto nothing = error_of("net5", hosts + "faults:\n  - {action: degrade, node: head, duration_s: 5}\n");
  CHECK(nothing.find("degrade needs delay_ms or loss_pct") != std::string::npos);
  auto loss = error_of(
      "net6", hosts + "faults:\n  - {action: degrade, node: head, loss_pct: 101, duration_s: 5}\n");
  CHECK(loss.find("loss_pct within 0-100") != std::string::npos);
  auto mixed = error_of("net7", hosts + "faults:\n  - {action: partition, node: w1, delay_ms: 10, "
                                        "duration_s: 5}\n");
  CHECK(mixed.find("delay_ms and loss_pct are for action degrade") != std::string::npos);
  auto from = error_of("net8", std::string(kMinimal) + "faults:\n  - {action: kill9_node, from: head}\n");
  CHECK(from.find("from is for actions partition and degrade") != std::string::npos);
}

TEST_CASE("chaos/a partition from the head is judged like a lost node - detection and replacement") {
  RunData run;
  run.load_enabled = false;
  run.scenario.goals.max_dead_detection_s = 3;
  run.scenario.goals.max_replacement_s = 5;
  run.faults.push_back(injected(FaultKind::partition, "w1", {"head"}, 10, 25));
  auto before = healthy_at(9.0, 9.1);
  auto dead = healthy_at(12.0, 12.2);
  dead.node_state["w1"] = "DEAD";
  dead.deployments["echo/Echo"].status = "UPDATING";
  auto replaced = healthy_at(14.0, 14.1);
  replaced.node_state["w1"] = "DEAD";
  auto back = healthy_at(27.0, 27.1);
  run.observations = {before, dead, replaced, back};
  analyze(run);
  CHECK(*run.faults[0].dead_detection_s == doctest::Approx(2.2));
  CHECK(*run.faults[0].replacement_s == doctest::Approx(4.1));
  CHECK(*run.faults[0].recovery_s == doctest::Approx(2.1));
  CHECK(goal(run, "max_dead_detection_s")->met);
  CHECK(goal(run, "max_replacement_s")->met);
  // A partition between two workers loses no node: nothing to judge.
  run.faults[0].peers = {"w2"};
  analyze(run);
  CHECK(!run.faults[0].dead_detection_s);
  CHECK(!goal(run, "max_dead_detection_s")->met);
}

TEST_CASE("chaos/turning DEAD is counted per node against the faults that involved it") {
  RunData run;
  run.http_ports = {{"head", 1}, {"w1", 2}, {"w2", 3}};
  run.scenario.goals.max_dead_transitions_per_fault = 1;
  run.faults.push_back(injected(FaultKind::degrade, "head", {"w1"}, 1, 9));
  auto alive = healthy_at(0.0, 0.1);
  alive.node_state = {{"head", "ALIVE"}, {"w1", "ALIVE"}, {"w2", "ALIVE"}};
  auto w1_dead = alive;
  w1_dead.start_s = 2;
  w1_dead.node_state["w1"] = "DEAD";
  auto back = alive;
  back.start_s = 3;
  run.observations = {alive, w1_dead, back};
  analyze(run);
  CHECK(goal(run, "max_dead_transitions_per_fault")->met);  // once, for one fault
  auto again = w1_dead;
  again.start_s = 4;
  run.observations.push_back(again);
  analyze(run);
  CHECK(!goal(run, "max_dead_transitions_per_fault")->met);  // flapped
  CHECK(*goal(run, "max_dead_transitions_per_fault")->measured == doctest::Approx(2.0));
  // A node that no fault involved may never turn DEAD.
  run.observations = {alive, back};
  run.observations[1].node_state["w2"] = "DEAD";
  analyze(run);
  CHECK(!goal(run, "max_dead_transitions_per_fault")->met);
  CHECK(!run.ok);
}

TEST_CASE("chaos/node states are read in the order they were answered - a round that waited does not make a node flap") {
  RunData run;
  run.http_ports = {{"head", 1}, {"w1", 2}};
  run.scenario.goals.max_dead_transitions_per_fault = 1;
  run.faults.push_back(injected(FaultKind::partition, "w1", {"head"}, 1, 5));
  auto alive = healthy_at(0.0, 0.1);
  alive.node_state = {{"head", "ALIVE"}, {"w1", "ALIVE"}};
  auto dead = alive;
  dead.start_s = 3;
  dead.state_end_s = 3.1;
  dead.node_state["w1"] = "DEAD";
  // Two rounds that overlap the heal: the first started earlier, but its
  // status call waited out its timeout, so it read the nodes last (w1 is
  // back); the second read them first (w1 still DEAD).
  auto slow = alive;
  slow.start_s = 5.0;
  slow.state_end_s = 6.6;
  auto quick = dead;
  quick.start_s = 5.1;
  quick.state_end_s = 5.2;
  auto after = alive;
  after.start_s = 7;
  after.state_end_s = 7.1;
  run.observations = {alive, dead, slow, quick, after};
  analyze(run);
  CHECK(goal(run, "max_dead_transitions_per_fault")->met);
  CHECK(*goal(run, "max_dead_transitions_per_fault")->measured == doctest::Approx(1.0));
}

TEST_CASE("chaos/a round that read DEAD before a re-registration and ended after the next round read ALIVE is no second turn") {
  RunData run;
  run.http_ports = {{"head", 1}, {"w1", 2}, {"w2", 3}};
  run.scenario.goals.max_dead_transitions_per_fault = 1;
  run.faults.push_back(injected(FaultKind::partition, "head", {"w1", "w2"}, 5, 20));
  auto alive = healthy_at(0.0, 0.1);
  alive.node_state = {{"head", "ALIVE"}, {"w1", "ALIVE"}, {"w2", "ALIVE"}};
  auto dead = alive;
  dead.start_s = 16.4;
  dead.state_end_s = 16.6;
  dead.node_state["w1"] = "DEAD";
  dead.node_state["w2"] = "DEAD";
  // w1 is back; the nodes call of this round began just before w2
  // re-registered, but it ended last (a slow troupectl on a loaded machine).
  auto before = dead;
  before.start_s = 32.0;
  before.nodes_start_s = 32.1;
  before.state_end_s = 32.5;
  before.node_state["w1"] = "ALIVE";
  // The next round's call began after w2 re-registered and ended first.
  auto after = alive;
  after.start_s = 32.2;
  after.nodes_start_s = 32.25;
  after.state_end_s = 32.4;
  auto later = alive;
  later.start_s = 33;
  later.nodes_start_s = 33.05;
  later.state_end_s = 33.1;
  run.observations = {alive, dead, before, after, later};
  analyze(run);
  CHECK(goal(run, "max_dead_transitions_per_fault")->met);
  CHECK(*goal(run, "max_dead_transitions_per_fault")->measured == doctest::Approx(1.0));
  // Once the rounds do not overlap, a DEAD after an ALIVE is a turn again.
  auto again = dead;
  again.start_s = 34;
  again.nodes_start_s = 34.05;
  again.state_end_s = 34.1;
  run.observations.push_back(again);
  analyze(run);
  CHECK(!goal(run, "max_dead_transitions_per_fault")->met);
  CHECK(*goal(run, "max_dead_transitions_per_fault")->measured == doctest::Approx(2.0));
}

TEST_CASE("chaos/replicas listed on live nodes above target plus surge are a miss") {
  RunData run;
  run.scenario.goals.max_replicas_above_surge = 0;
  auto ok = healthy_at(0.0, 0.1);  // target 2: surge 1, at most 3
  ok.deployments["echo/Echo"].kept_on = {{"head", 2}, {"w1", 1}};
  auto dead_node = ok;  // the replicas of a DEAD node do not count
  dead_node.start_s = 1;
  dead_node.node_state["w1"] = "DEAD";
  dead_node.deployments["echo/Echo"].kept_on = {{"head", 3}, {"w1", 2}};
  run.observations = {ok, dead_node};
  analyze(run);
  CHECK(goal(run, "max_replicas_above_surge")->met);
  CHECK(*goal(run, "max_replicas_above_surge")->measured == doctest::Approx(0.0));
  auto over = ok;
  over.start_s = 2;
  over.deployments["echo/Echo"].kept_on = {{"head", 2}, {"w1", 2}};
  run.observations.push_back(over);
  analyze(run);
  CHECK(!goal(run, "max_replicas_above_surge")->met);
  CHECK(*goal(run, "max_replicas_above_surge")->measured == doctest::Approx(1.0));
}

TEST_CASE("chaos/replicas_unchanged and seen_unreachable are read - and checked") {
  auto s = load_scenario(
      write_temp("unch", std::string(kMinimal) + R"(cluster: {workers: 2, network: namespaces}
faults:
  - {action: partition, node: head, from: workers, at_s: 1, duration_s: 5}
goals: {replicas_unchanged: true, seen_unreachable: [w1, w2], max_full_route_tables: 1}
)"));
  CHECK(s.goals.replicas_unchanged);
  REQUIRE(s.goals.max_full_route_tables.has_value());
  CHECK(*s.goals.max_full_route_tables == 1);
  CHECK(s.goals.seen_unreachable == std::vector<std::string>{"w1", "w2"});
  auto stranger = error_of("unch1", std::string(kMinimal) + R"(cluster: {workers: 2}
faults:
  - {action: kill_replica, at_s: 1}
goals: {seen_unreachable: [w3]}
)");
  CHECK(stranger.find("seen_unreachable names nodes of the cluster (head, w1 to w2), not 'w3'") !=
        std::string::npos);
  auto nothing = error_of("unch2", std::string(kMinimal) + "goals: {replicas_unchanged: true}\n");
  CHECK(nothing.find("replicas_unchanged needs a fault") != std::string::npos);
}

TEST_CASE(
    "chaos/replicas_unchanged - the same replicas through the fault - none new - all RUNNING at "
    "the end") {
  RunData run;
  run.load_enabled = false;
  run.scenario.goals.replicas_unchanged = true;
  run.scenario.goals.seen_unreachable = {"w1"};
  run.faults.push_back(injected(FaultKind::partition, "head", {"w1"}, 10, 25));
  auto before = healthy_at(9.0, 9.1);
  auto cut = healthy_at(13.0, 13.1);
  cut.node_state["w1"] = "UNREACHABLE";
  auto back = healthy_at(27.0, 27.1);
  run.observations = {before, cut, back};
  analyze(run);
  REQUIRE(goal(run, "replicas_unchanged"));
  CHECK_MESSAGE(goal(run, "replicas_unchanged")->met, goal(run, "replicas_unchanged")->detail);
  CHECK(*goal(run, "replicas_unchanged")->measured == doctest::Approx(0.0));
  REQUIRE(goal(run, "seen_unreachable"));
  CHECK(goal(run, "seen_unreachable")->met);
  CHECK(goal(run, "seen_unreachable")->detail == "w1 UNREACHABLE at t=13.00; ");

  // A replacement started during the cut, and the old one gone.
  auto replaced = healthy_at(15.0, 15.1);
  replaced.replica_ids = {"r1", "r3"};
  replaced.deployments["echo/Echo"].state_of = {{"r1", "RUNNING"}, {"r3", "STARTING"}};
  run.observations = {before, cut, replaced, back};
  analyze(run);
  CHECK_FALSE(goal(run, "replicas_unchanged")->met);
  CHECK(*goal(run, "replicas_unchanged")->measured == doctest::Approx(1.0));
  CHECK(goal(run, "replicas_unchanged")->detail.rfind("first at t=15.00: new r3: gone r2; ", 0) ==
        0);

  // The same ids at the end, but one not RUNNING.
  auto unhealthy_end = healthy_at(27.0, 27.1);
  unhealthy_end.deployments["echo/Echo"].state_of["r2"] = "RECOVERING";
  run.observations = {before, cut, unhealthy_end};
  analyze(run);
  CHECK_FALSE(goal(run, "replicas_unchanged")->met);
  CHECK(contains(goal(run, "replicas_unchanged")->detail, "not all RUNNING at the last poll"));

  // Nothing healthy before the fault: nothing to compare with.
  auto sick = before;
  sick.deployments["echo/Echo"].status = "UPDATING";
  run.observations = {sick, cut, back};
  run.scenario.goals.seen_unreachable = {"w1", "head"};
  analyze(run);
  CHECK_FALSE(goal(run, "replicas_unchanged")->met);
  CHECK(contains(goal(run, "replicas_unchanged")->detail, "was not healthy"));
  CHECK_FALSE(goal(run, "seen_unreachable")->met);
  CHECK(*goal(run, "seen_unreachable")->measured == doctest::Approx(1.0));
  CHECK(contains(goal(run, "seen_unreachable")->detail, "head never UNREACHABLE"));
}

TEST_CASE("chaos/a full disk needs a disk of the head's own - and hits the head only") {
  auto s = load_scenario(write_temp("disk", std::string(kMinimal) + R"(cluster: {head_disk_mb: 16}
faults:
  - {action: fill_disk, at_s: 1, duration_s: 5}
)"));
  CHECK(s.cluster.head_disk_mb == 16);
  REQUIRE(s.faults.size() == 1);
  CHECK(s.faults[0].kind == FaultKind::fill_disk);
  CHECK(s.faults[0].node == "head");
  auto no_disk = error_of("disk1", std::string(kMinimal) +
                                       "faults:\n  - {action: fill_disk, duration_s: 5}\n");
  CHECK(no_disk.find("fill_disk needs cluster.head_disk_mb") != std::string::npos);
  const std::string disk = std::string(kMinimal) + "cluster: {head_disk_mb: 16}\n";
  auto worker = error_of("disk2", disk + "faults:\n  - {action: fill_disk, node: w1, duration_s: 5}\n");
  CHECK(worker.find("node is head") != std::string::npos);
  auto forever = error_of("disk3", disk + "faults:\n  - {action: fill_disk}\n");
  CHECK(forever.find("fill_disk needs duration_s") != std::string::npos);
  auto tiny = error_of("disk4", std::string(kMinimal) + "cluster: {head_disk_mb: 1}\n");
  CHECK(tiny.find("head_disk_mb is within 8-4096") != std::string::npos);
}

// -- a release under test: redeploy, rollback and the rollout goals ---------

namespace {

const char* kRelease = R"(name: t
deploy:
  applications:
    - name: release
      route_prefix: /release
      import_path: libtroupe_examples.so:Release
      args: {release: v1}
      deployments:
        - {name: Release, num_replicas: 4}
load: {rate: 10, duration_s: 40, paths: [/release/]}
)";

// A redeploy of `release` as v2 and whatever follows, as fault items.
std::string release_faults(const std::string& more, const std::string& redeploy_extra = "") {
  return std::string(kRelease) +
         "faults:\n"
         "  - action: redeploy\n"
         "    at_s: 5\n" +
         redeploy_extra +
         "    deploy:\n"
         "      applications:\n"
         "        - name: release\n"
         "          route_prefix: /release\n"
         "          import_path: libtroupe_examples.so:Release\n"
         "          args: {release: v2, status: 500, unhealthy_for_ms: forever}\n"
         "          deployments:\n"
         "            - {name: Release, num_replicas: 4}\n" +
         more;
}

}  // namespace

TEST_CASE("chaos/redeploy and rollback faults are loaded with their config - app and goals") {
  auto s = load_scenario(write_temp("rel", release_faults("  - {action: rollback, app: release, "
                                                          "at_s: 25}\n"
                                                          "goals:\n"
                                                          "  min_success_ratio: 1.0\n"
                                                          "  deploy_failed_within_s: 15\n"
                                                          "  deploy_failed_message: weights\n"
                                                          "  replicas_kept: true\n"
                                                          "  no_healthy_until_rollback: true\n"
                                                          "  rollback_healthy_within_s: 5\n")));
  REQUIRE(s.faults.size() == 2);
  const auto& r = s.faults[0];
  CHECK(r.kind == FaultKind::redeploy);
  CHECK(std::string(to_string(r.kind)) == "redeploy");
  CHECK(!node_scoped(r.kind));
  CHECK(r.start_s == doctest::Approx(5));
  // The only application and its only deployment are the ones watched.
  CHECK(r.app == "release");
  CHECK(r.deployment == "Release");
  REQUIRE(r.deploy["applications"]);
  CHECK(r.deploy["applications"][0]["args"]["release"].as<std::string>() == "v2");
  CHECK(r.deploy["applications"][0]["args"]["unhealthy_for_ms"].as<std::string>() == "forever");
  const auto& b = s.faults[1];
  CHECK(b.kind == FaultKind::rollback);
  CHECK(std::string(to_string(b.kind)) == "rollback");
  CHECK(b.app == "release");
  CHECK(b.start_s == doctest::Approx(25));
  CHECK(*s.goals.deploy_failed_within_s == doctest::Approx(15));
  CHECK(s.goals.deploy_failed_message == std::vector<std::string>{"weights"});
  CHECK(s.goals.replicas_kept);
  CHECK(s.goals.no_healthy_until_rollback);
  CHECK(*s.goals.rollback_healthy_within_s == doctest::Approx(5));
  // A deployment named explicitly; the ingress of an application that
  // lists none is its import_path's class.
  auto named = load_scenario(write_temp(
      "rel2", release_faults("goals: {deploy_failed_message: [weights, keeps serving]}\n",
                             "    deployment: Release\n")));
  CHECK(named.faults[0].deployment == "Release");
  CHECK(named.goals.deploy_failed_message ==
        std::vector<std::string>{"weights", "keeps serving"});
  auto bare = load_scenario(write_temp("rel3", std::string(kRelease) + R"(faults:
  - action: redeploy
    at_s: 5
    deploy: {applications: [{name: release, route_prefix: /release, import_path: "libtroupe_examples.so:Release"}]}
)"));
  CHECK(bare.faults[0].app == "release");
  CHECK(bare.faults[0].deployment == "Release");
  // Without goals of its own a rollback may follow a plain redeploy too.
  CHECK_NOTHROW(load_scenario(
      write_temp("rel4", release_faults("  - {action: redeploy, at_s: 20, deploy: {applications: "
                                        "[{name: release, route_prefix: /release, import_path: "
                                        "'libtroupe_examples.so:Release'}]}}\n"
                                        "goals: {rollback_healthy_within_s: 5}\n"))));
}

TEST_CASE("chaos/bad redeploy and rollback faults and rollout goals are refused") {
  auto err = [](const std::string& name, const std::string& text) { return error_of(name, text); };
  // redeploy: its config.
  auto none = err("rb1", std::string(kRelease) + "faults:\n  - {action: redeploy, at_s: 5}\n");
  CHECK(none.find("redeploy needs deploy:") != std::string::npos);
  auto scalar = err("rb2", std::string(kRelease) +
                               "faults:\n  - {action: redeploy, at_s: 5, deploy: v2}\n");
  CHECK(scalar.find("chaos_tool_test_rb2.yaml:12:") != std::string::npos);
  CHECK(scalar.find("redeploy needs deploy:") != std::string::npos);
  auto empty = err("rb3", std::string(kRelease) +
                              "faults:\n  - {action: redeploy, at_s: 5, deploy: {applications: []}}\n");
  CHECK(empty.find("redeploy needs deploy:") != std::string::npos);
  auto app = err("rb4", release_faults("", "    app: other\n"));
  CHECK(app.find("app 'other' is not an application of this deploy") != std::string::npos);
  CHECK(app.find("chaos_tool_test_rb4.yaml:14:10") != std::string::npos);
  auto dep = err("rb5", release_faults("", "    deployment: Nope\n"));
  CHECK(dep.find("deployment 'Nope' is not a deployment of application 'release'") !=
        std::string::npos);
  auto every = err("rb6", release_faults("", "    every_s: 1\n"));
  CHECK(every.find("redeploy happens once") != std::string::npos);
  auto node = err("rb7", release_faults("", "    node: w1\n"));
  CHECK(node.find("node is not a field of action redeploy") != std::string::npos);
  auto other = err("rb8", std::string(kRelease) +
                              "faults:\n  - {action: kill_replica, at_s: 5, deploy: {a: 1}}\n");
  CHECK(other.find("deploy is for action redeploy only") != std::string::npos);
  // rollback: its application.
  auto no_app = err("rb9", std::string(kRelease) + "faults:\n  - {action: rollback, at_s: 5}\n");
  CHECK(no_app.find("rollback needs app") != std::string::npos);
  auto unknown = err("rb10", std::string(kRelease) +
                                 "faults:\n  - {action: rollback, app: nope, at_s: 5}\n");
  CHECK(unknown.find("app 'nope' is not an application the scenario deploys") !=
        std::string::npos);
  auto dep2 = err("rb11", std::string(kRelease) + "faults:\n  - {action: rollback, app: release, "
                                                  "deployment: Release, at_s: 5}\n");
  CHECK(dep2.find("rollback rolls back a whole application") != std::string::npos);
  auto dur = err("rb12", std::string(kRelease) + "faults:\n  - {action: rollback, app: release, "
                                                 "at_s: 5, duration_s: 3}\n");
  CHECK(dur.find("duration_s is not a field of action rollback") != std::string::npos);
  // The goals: a release to judge, sound values.
  auto alone = err("rb13", std::string(kRelease) + "goals: {replicas_kept: true}\n");
  CHECK(alone.find("replicas_kept needs a redeploy fault") != std::string::npos);
  auto zero = err("rb14", release_faults("goals: {deploy_failed_within_s: 0}\n"));
  CHECK(zero.find("deploy_failed_within_s must be > 0") != std::string::npos);
  auto text = err("rb15", release_faults("goals: {deploy_failed_message: ''}\n"));
  CHECK(text.find("deploy_failed_message is a text to find") != std::string::npos);
  auto texts = err("rb19", release_faults("goals: {deploy_failed_message: [a, '']}\n"));
  CHECK(texts.find("deploy_failed_message is a text to find, or a list") != std::string::npos);
  auto nested = err("rb20", release_faults("goals: {deploy_failed_message: {a: b}}\n"));
  CHECK(nested.find("deploy_failed_message: wrong type") != std::string::npos);
  auto type = err("rb16", release_faults("goals: {no_healthy_until_rollback: often}\n"));
  CHECK(type.find("no_healthy_until_rollback: wrong type") != std::string::npos);
  auto back = err("rb17", release_faults("goals: {rollback_healthy_within_s: 5}\n"));
  CHECK(back.find("rollback_healthy_within_s needs a rollback") != std::string::npos);
  auto typo = err("rb18", release_faults("goals: {replica_kept: true}\n"));
  CHECK(typo.find("unknown field 'replica_kept' in goals") != std::string::npos);
}

namespace {

// A poll of the release deployment: `replicas` as id -> state.
Observation release_poll(double start, const std::string& status,
                         std::map<std::string, std::string> replicas,
                         const std::string& message = "") {
  Observation o;
  o.start_s = start;
  o.state_end_s = start + 0.05;
  o.end_s = start + 0.05;
  o.status_ok = true;
  o.nodes_ok = true;
  o.app_status["release"] = status == "HEALTHY" ? "RUNNING" : "DEPLOYING";
  DeploymentView v;
  v.status = status;
  v.message = message;
  v.target = 4;
  v.state_of = std::move(replicas);
  for (const auto& [id, state] : v.state_of) {
    ++v.total;
    if (state == "RUNNING")
      ++v.running;
  }
  o.deployments["release/Release"] = v;
  o.node_state = {{"head", "ALIVE"}, {"w1", "ALIVE"}, {"w2", "ALIVE"}};
  return o;
}

const std::map<std::string, std::string> kV1 = {
    {"r1", "RUNNING"}, {"r2", "RUNNING"}, {"r3", "RUNNING"}, {"r4", "RUNNING"}};

std::map<std::string, std::string> v1_and(const std::string& id, const std::string& state) {
  auto m = kV1;
  m[id] = state;
  return m;
}

FaultEvent release_event(FaultKind kind, double t) {
  FaultEvent f;
  f.kind = kind;
  f.t_s = t;
  f.acked_s = t + 0.1;
  f.ok = true;
  f.app = "release";
  if (kind == FaultKind::redeploy)
    f.deployment = "Release";
  return f;
}

const char* kFailed =
    "The deployment failed to start 12 times in a row. This may be due to a problem with its "
    "constructor, reconfigure or initial health check. The previous version keeps serving on 4 "
    "replicas. Retrying after 1.0 seconds. Error:\nrelease v2: the model's weights did not load";

// The story of acceptance 1 as the polls should see it.
RunData broken_release_run() {
  RunData run;
  auto& g = run.scenario.goals;
  g.deploy_failed_within_s = 15;
  g.deploy_failed_message = {"the model's weights did not load",
                             "The previous version keeps serving on 4 replicas."};
  g.replicas_kept = true;
  g.no_healthy_until_rollback = true;
  g.rollback_healthy_within_s = 5;
  run.faults = {release_event(FaultKind::redeploy, 5), release_event(FaultKind::rollback, 25)};
  run.observations = {
      release_poll(4.0, "HEALTHY", kV1),
      release_poll(4.96, "HEALTHY", kV1),  // answered after the redeploy started: not the reference
      release_poll(5.02, "HEALTHY", kV1),  // started before the acknowledgement: not judged
      release_poll(5.2, "UPDATING", v1_and("r5", "STARTING")),
      release_poll(6.0, "UPDATING", v1_and("r6", "STARTING")),
      release_poll(12.0, "DEPLOY_FAILED", v1_and("r16", "STARTING"), kFailed),
      release_poll(24.96, "DEPLOY_FAILED", kV1, kFailed),  // answered after the rollback started
      release_poll(25.3, "UPDATING", v1_and("r17", "STOPPING")),
      release_poll(26.0, "HEALTHY", kV1),
      release_poll(40.0, "HEALTHY", kV1),
  };
  return run;
}

}  // namespace

TEST_CASE("chaos/a broken release kept off by the gate and rolled back meets the rollout goals") {
  auto run = broken_release_run();
  analyze(run);
  REQUIRE(run.rollout.has_value());
  const auto& r = *run.rollout;
  CHECK(r.deployment == "release/Release");
  CHECK(r.kept_ids == std::set<std::string>{"r1", "r2", "r3", "r4"});
  CHECK(*r.before_t_s == doctest::Approx(4.0));
  CHECK(*r.deploy_failed_s == doctest::Approx(7.05));
  // 5.2, 6 and 12; not 5.02 (before the acknowledgement) nor 24.96
  // (answered at 25.01, after the rollback started).
  CHECK(r.between_polls == 3);
  CHECK(r.between_healthy == 0);
  CHECK(r.new_ids == std::set<std::string>{"r5", "r6", "r16", "r17"});
  CHECK(*r.rollback_healthy_s == doctest::Approx(1.05));
  CHECK(r.final_exact);
  CHECK(goal(run, "deploy_failed_within_s")->met);
  CHECK(*goal(run, "deploy_failed_within_s")->measured == doctest::Approx(7.05));
  CHECK(goal(run, "deploy_failed_message")->met);
  CHECK(*goal(run, "deploy_failed_message")->measured == doctest::Approx(2));
  CHECK(goal(run, "replicas_kept")->met);
  CHECK(*goal(run, "replicas_kept")->measured == doctest::Approx(0));
  CHECK(goal(run, "no_healthy_until_rollback")->met);
  CHECK(goal(run, "rollback_healthy_within_s")->met);
  CHECK(run.ok);
  // The JSON report carries the findings.
  auto j = to_json(run);
  CHECK(j["rollout"]["kept_ids"].size() == 4);
  CHECK(j["rollout"]["deploy_failed_message"] == kFailed);
  CHECK(!j["rollout"]["steps"].empty());
  CHECK(to_text(run).find("rollout of release/Release") != std::string::npos);
  // A redeploy's recovery counts from its acknowledgement: the poll that
  // started at 5.02, before it, saw the old declaration HEALTHY.
  REQUIRE(run.faults[0].recovery_s);
  CHECK(*run.faults[0].recovery_s == doctest::Approx(26.05 - 5.1));
}

TEST_CASE("chaos/a broken release that takes over - restarts or reads HEALTHY misses the goals") {
  SUBCASE("a poll reads HEALTHY between the redeploy and the rollback") {
    auto run = broken_release_run();
    run.observations.insert(run.observations.begin() + 5,
                            release_poll(8.0, "HEALTHY", kV1, "Every replica is healthy again."));
    analyze(run);
    CHECK(!goal(run, "no_healthy_until_rollback")->met);
    CHECK(*goal(run, "no_healthy_until_rollback")->measured == doctest::Approx(1));
    CHECK(goal(run, "no_healthy_until_rollback")->detail.find("at t=8.00") != std::string::npos);
    CHECK(goal(run, "replicas_kept")->met);
    CHECK(!run.ok);
  }
  SUBCASE("a v1 replica is stopped for a v2 one") {
    auto run = broken_release_run();
    run.observations[4] = release_poll(6.0, "UPDATING", v1_and("r2", "STOPPING"));
    analyze(run);
    CHECK(!goal(run, "replicas_kept")->met);
    CHECK(*goal(run, "replicas_kept")->measured == doctest::Approx(1));
    CHECK(goal(run, "replicas_kept")->detail.find("r2 STOPPING") != std::string::npos);
  }
  SUBCASE("after the rollback the replicas are not the ones kept") {
    auto run = broken_release_run();
    auto replaced = kV1;
    replaced.erase("r4");
    replaced["r20"] = "RUNNING";
    run.observations.back() = release_poll(40.0, "HEALTHY", replaced);
    analyze(run);
    CHECK(!goal(run, "replicas_kept")->met);
    CHECK(!run.rollout->final_exact);
    CHECK(goal(run, "replicas_kept")->detail.find("r4 not listed") != std::string::npos);
    // It was HEALTHY with exactly those ids once, right after the rollback.
    CHECK(goal(run, "rollback_healthy_within_s")->met);
  }
  SUBCASE("never DEPLOY_FAILED - or with another message") {
    auto run = broken_release_run();
    for (auto& o : run.observations) {
      auto& v = o.deployments["release/Release"];
      if (v.status == "DEPLOY_FAILED")
        v.status = "UPDATING";
    }
    analyze(run);
    CHECK(!goal(run, "deploy_failed_within_s")->met);
    CHECK(std::isinf(*goal(run, "deploy_failed_within_s")->measured));
    CHECK(!goal(run, "deploy_failed_message")->met);
    auto other = broken_release_run();
    other.observations[5].deployments["release/Release"].message = "failed to start 12 times";
    analyze(other);
    CHECK(goal(other, "deploy_failed_within_s")->met);
    CHECK(!goal(other, "deploy_failed_message")->met);
    CHECK(*goal(other, "deploy_failed_message")->measured == doctest::Approx(0));
    // One text of two.
    other.observations[5].deployments["release/Release"].message =
        "The previous version keeps serving on 4 replicas.";
    analyze(other);
    CHECK(!goal(other, "deploy_failed_message")->met);
    CHECK(*goal(other, "deploy_failed_message")->measured == doctest::Approx(1));
    CHECK(goal(other, "deploy_failed_message")->detail.find(
              "does NOT contain \"the model's weights did not load\"") != std::string::npos);
  }
  SUBCASE("DEPLOY_FAILED later than the limit") {
    auto run = broken_release_run();
    run.scenario.goals.deploy_failed_within_s = 5;
    analyze(run);
    CHECK(!goal(run, "deploy_failed_within_s")->met);
  }
  SUBCASE("not HEALTHY at target before the redeploy: nothing to keep") {
    auto run = broken_release_run();
    run.observations[0] = release_poll(4.0, "UPDATING", v1_and("r4", "STARTING"));
    analyze(run);
    CHECK(!goal(run, "replicas_kept")->met);
    CHECK(goal(run, "replicas_kept")->detail.find("before the redeploy") != std::string::npos);
    CHECK(!goal(run, "rollback_healthy_within_s")->met);
  }
  SUBCASE("the redeploy or the rollback failed") {
    auto run = broken_release_run();
    run.faults[0].ok = false;
    run.faults[0].message = "troupectl timed out";
    analyze(run);
    for (const char* name : {"deploy_failed_within_s", "deploy_failed_message", "replicas_kept",
                             "no_healthy_until_rollback", "rollback_healthy_within_s"}) {
      CAPTURE(name);
      REQUIRE(goal(run, name));
      CHECK(!goal(run, name)->met);
      CHECK(goal(run, name)->detail.find("the redeploy failed: troupectl timed out") !=
            std::string::npos);
    }
    auto stuck = broken_release_run();
    stuck.faults[1].ok = false;
    stuck.faults[1].message = "unknown command rollback";
    for (auto& o : stuck.observations) {
      if (o.start_s > 25)
        o = release_poll(o.start_s, "DEPLOY_FAILED", v1_and("r30", "STARTING"), kFailed);
    }
    analyze(stuck);
    CHECK(!goal(stuck, "rollback_healthy_within_s")->met);
    CHECK(goal(stuck, "rollback_healthy_within_s")->detail.find("the rollback failed") !=
          std::string::npos);
    CHECK(!goal(stuck, "replicas_kept")->met);  // never HEALTHY with them again
  }
  SUBCASE("without a rollback the goals run to the end") {
    auto run = broken_release_run();
    run.scenario.goals.rollback_healthy_within_s.reset();
    run.faults.pop_back();
    run.observations.resize(7);  // ... DEPLOY_FAILED to the end
    analyze(run);
    CHECK(goal(run, "replicas_kept")->met);
    CHECK(goal(run, "no_healthy_until_rollback")->met);
    CHECK(run.rollout->between_polls == 4);
  }
}

TEST_CASE("chaos/faults of highly available heads are loaded - the leader and etcd picked at the time") {
  auto path = write_temp("ha", std::string(kMinimal) + R"(cluster: {heads: 3, workers: 2, network: namespaces}
load: {rate: 10, duration_s: 60, paths: [/echo]}
faults:
  - {action: kill_leader, at_s: 1, restart_after_s: 3}
  - {action: partition_leader, at_s: 10, duration_s: 8}
  - {action: kill_etcd_member, member: m2, at_s: 30, restart_after_s: 4}
  - {action: etcd_quorum_loss, at_s: 40, duration_s: 5, probe_deploy: false}
goals: {max_failover_s: 3, max_step_down_s: 2}
)");
  auto s = load_scenario(path);
  CHECK(s.cluster.ha());
  CHECK(s.cluster.heads == 3);
  CHECK(s.cluster.etcd_members == 3);  // the default with heads
  CHECK(s.cluster.ha_lease_ttl_s == 2);
  REQUIRE(s.faults.size() == 4);
  CHECK(s.faults[0].kind == FaultKind::kill_leader);
  CHECK(s.faults[0].node == "leader");
  CHECK(s.faults[0].restart_after_s == 3);
  CHECK_FALSE(s.faults[0].probe_deploy);
  CHECK(s.faults[1].kind == FaultKind::partition_leader);
  CHECK(s.faults[1].from == "all");
  CHECK(s.faults[1].probe_deploy);
  CHECK(network_fault(FaultKind::partition_leader));
  CHECK(s.faults[2].member == "m2");
  CHECK(s.faults[2].node.empty());
  CHECK(s.faults[3].kind == FaultKind::etcd_quorum_loss);
  CHECK_FALSE(s.faults[3].probe_deploy);
  CHECK(*s.goals.max_failover_s == 3);
  CHECK(*s.goals.max_step_down_s == 2);
}

TEST_CASE("chaos/bad faults of highly available heads are refused") {
  const std::string ha = std::string(kMinimal) + "cluster: {heads: 3}\n";
  auto single = error_of("ha1", std::string(kMinimal) + "faults:\n  - {action: kill_leader}\n");
  CHECK(single.find("kill_leader needs highly available heads (cluster.heads > 1)") !=
        std::string::npos);
  auto node = error_of("ha2", ha + "faults:\n  - {action: kill_leader, node: h1}\n");
  CHECK(node.find("kill_leader picks its node itself") != std::string::npos);
  auto member = error_of("ha3", ha + "faults:\n  - {action: kill_etcd_member, member: m4}\n");
  CHECK(member.find("member is random or m1..m3") != std::string::npos);
  auto quorum = error_of("ha4", ha + "faults:\n  - {action: etcd_quorum_loss}\n");
  CHECK(quorum.find("etcd_quorum_loss needs duration_s") != std::string::npos);
  auto hosts = error_of("ha5", ha + "faults:\n  - {action: partition_leader, duration_s: 5}\n");
  CHECK(hosts.find("partition_leader needs cluster.network: namespaces") != std::string::npos);
  auto etcd = error_of("ha6", std::string(kMinimal) + "cluster: {etcd_members: 3}\n");
  CHECK(etcd.find("etcd_members needs heads > 1") != std::string::npos);
  auto none = error_of("ha7", std::string(kMinimal) + "cluster: {heads: 2, etcd_members: 0}\n");
  CHECK(none.find("need etcd_members within 1-7") != std::string::npos);
  auto ttl = error_of("ha8", std::string(kMinimal) + "cluster: {heads: 2, ha_lease_ttl_s: 1.5}\n");
  CHECK(ttl.find("ha_lease_ttl_s is whole seconds") != std::string::npos);
  auto goal = error_of("ha9", std::string(kMinimal) + "goals: {max_failover_s: 3}\n");
  CHECK(goal.find("max_failover_s and max_step_down_s need highly available heads") !=
        std::string::npos);
  auto probe = error_of("ha10", ha + "faults:\n  - {action: kill_leader, probe_deploy: true}\n");
  CHECK(probe.find("probe_deploy is for the etcd faults and partition_leader") != std::string::npos);
}

TEST_CASE("chaos/failover is read from the first status answered by another leader - quorum loss from its end") {
  RunData run;
  run.load_enabled = false;
  run.scenario.cluster.heads = 3;
  run.scenario.goals.max_failover_s = 3;
  run.scenario.goals.max_step_down_s = 2;
  auto kill = injected(FaultKind::kill_leader, "h1", {}, 10, -1);
  auto cut = injected(FaultKind::partition_leader, "h2", {"h1", "h3", "w1"}, 30, 40);
  cut.stepped_down_s = 31.7;
  cut.cut_s = 30.2;  // the rules in place: the step-down counts from here
  auto quorum = injected(FaultKind::etcd_quorum_loss, "", {}, 50, 56);
  run.faults = {kill, cut, quorum};
  auto at = [](double start, double end, const std::string& leader) {
    auto o = healthy_at(start, end);
    o.leader = leader;
    return o;
  };
  // The killed leader still named by a poll after the kill, then the
  // status fails, then another head answers.
  auto failed = at(11, 11.2, "");
  failed.status_ok = false;
  run.observations = {at(9, 9.1, "h1"), at(10.1, 10.2, "h1"), failed, at(12.3, 12.5, "h2"),
                      at(31, 31.1, "h2"), at(34, 34.2, "h3"),
                      // Quorum loss: nothing answers until after the members are back.
                      at(55, 55.1, ""), at(57, 57.4, "h3")};
  run.observations[6].status_ok = false;
  analyze(run);
  REQUIRE(run.faults[0].failover_s.has_value());
  CHECK(*run.faults[0].failover_s == doctest::Approx(2.5));
  CHECK(run.faults[0].new_leader == "h2");
  REQUIRE(run.faults[1].failover_s.has_value());
  CHECK(*run.faults[1].failover_s == doctest::Approx(4.2));
  REQUIRE(run.faults[2].failover_s.has_value());
  CHECK(*run.faults[2].failover_s == doctest::Approx(1.4));
  const GoalResult* failover = nullptr;
  const GoalResult* step_down = nullptr;
  for (const auto& g : run.goals) {
    if (g.name == "max_failover_s")
      failover = &g;
    if (g.name == "max_step_down_s")
      step_down = &g;
  }
  REQUIRE(failover);
  CHECK_FALSE(failover->met);  // 4.2 s for the partition
  CHECK(*failover->measured == doctest::Approx(4.2));
  REQUIRE(step_down);
  CHECK(step_down->met);
  CHECK(*step_down->measured == doctest::Approx(1.5));
  // A cut-off leader that never says it stepped down misses the goal.
  run.faults[1].stepped_down_s = -1;
  analyze(run);
  for (const auto& g : run.goals) {
    if (g.name == "max_step_down_s")
      CHECK_FALSE(g.met);
  }
}
