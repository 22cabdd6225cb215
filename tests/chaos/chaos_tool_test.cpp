// The chaos tool's own logic without a cluster: scenario files, and the
// analysis that turns observations into recovery times, failure classes and
// goal verdicts.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tools/chaos/report.hpp"
#include "tools/chaos/scenario.hpp"

using namespace chaos;
namespace fs = std::filesystem;

namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  auto path = fs::temp_directory_path() / ("chaos_tool_test_" + name + ".yaml");
  std::ofstream(path) << text;
  return path.string();
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
  o.deployments["echo/Echo"] = {"HEALTHY", 2, 2, 2, {{"head", 2}}, {{"head", 2}}};
  o.replica_ids = {"r1", "r2"};
  o.replicas_per_node["head"] = 2;
  o.node_state = {{"head", "ALIVE"}, {"w1", "ALIVE"}};
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
  RunData run;
  run.scenario.goals.max_recovery_s = 1.0;
  FaultEvent f;
  f.kind = FaultKind::kill_controller;
  f.t_s = 10;
  f.ok = true;
  run.faults.push_back(f);
  auto recovering = healthy_at(10.1, 10.2);
  recovering.recovering = true;
  run.observations.push_back(recovering);
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
  RunData run;
  run.scenario.goals.max_recovery_s = 1.0;
  FaultEvent f;
  f.kind = FaultKind::kill_controller;
  f.t_s = 10;
  f.ok = true;
  run.faults.push_back(f);
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
