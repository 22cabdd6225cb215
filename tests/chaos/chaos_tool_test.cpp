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
  o.deployments["echo/Echo"] = {"HEALTHY", 2, 2, 2};
  o.replica_ids = {"r1", "r2"};
  o.replicas_per_node["head"] = 2;
  o.node_state = {{"head", "ALIVE"}, {"w1", "ALIVE"}};
  return o;
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
