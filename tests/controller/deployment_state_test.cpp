// Behaviour of one deployment, driven tick by tick with fake replicas and a
// fake clock (every tick is 1 s unless stated). Answers to a tick's commands
// arrive at the next tick.
#include <algorithm>
#include <cmath>
#include <random>
#include <unordered_map>

#include <doctest/doctest.h>

#include "controller/core/deployment_state.hpp"
#include "tests/controller/fakes.hpp"

using namespace troupe;
using namespace troupe::controller;
using namespace troupe::controller::testing;
using V = std::vector<std::string>;

namespace {

void deploy(Harness& h, const DeploymentSpec& d) {
  auto r = h.core->deploy_application(make_app("a", "/a", {d}));
  REQUIRE(r.has_value());
}

DeploymentSpec scaled(DeploymentSpec d, uint32_t n) {
  d.config.num_replicas = n;
  return d;
}

void expect_status(Harness& h, DeploymentStatus s, DeploymentTrigger t,
                   const std::string& app = "a", const std::string& dep = "D") {
  auto st = h.status(app, dep);
  CHECK(to_string(st.status) == std::string(to_string(s)));
  CHECK(to_string(st.trigger) == std::string(to_string(t)));
}

}  // namespace

// ---------------------------------------------------------------- scaling

TEST_CASE("scaling: create - scale up - scale down") {
  Harness h;
  auto d = make_deployment("D", 3);
  deploy(h, d);
  expect_status(h, DeploymentStatus::updating, DeploymentTrigger::config_update_started);
  CHECK(h.core->application_status("a")->status == ApplicationStatus::deploying);

  CHECK(h.tick() == V{"start a#D#1@n1", "start a#D#2@n2", "start a#D#3@n3"});
  CHECK(h.count("a", "D", ReplicaState::starting) == 3);
  CHECK(h.tick() == V{});
  CHECK(h.count("a", "D", ReplicaState::running) == 3);
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
  CHECK(h.core->application_status("a")->status == ApplicationStatus::running);

  auto up = h.core->deploy_deployment("a", scaled(d, 5));
  REQUIRE(up.has_value());
  CHECK(up->deployments.at("D") == ChangeKind::scaled);
  expect_status(h, DeploymentStatus::upscaling, DeploymentTrigger::config_update_started);
  CHECK(h.status("a", "D").message == "Upscaling from 3 to 5 replicas.");
  CHECK(h.tick() == V{"start a#D#4@n1", "start a#D#5@n2"});
  CHECK(h.tick() == V{});
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::upscale_completed);

  REQUIRE(h.core->deploy_deployment("a", scaled(d, 2)).has_value());
  expect_status(h, DeploymentStatus::downscaling, DeploymentTrigger::config_update_started);
  CHECK(h.status("a", "D").message == "Downscaling from 5 to 2 replicas.");
  // Nodes with the fewest replicas first (n3 holds one), newest first: n3
  // empties, then n2 (Ray Serve's scheduler; n1 and n2 held two each).
  CHECK(h.tick() == V{"stop a#D#3 20", "stop a#D#5 20", "stop a#D#2 20"});
  CHECK(h.count("a", "D", ReplicaState::stopping) == 3);
  CHECK(h.count("a", "D", ReplicaState::running) == 2);
  expect_status(h, DeploymentStatus::downscaling, DeploymentTrigger::config_update_started);
  CHECK(h.tick() == V{});
  CHECK(h.replicas("a", "D").size() == 2);
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::downscale_completed);
}

TEST_CASE("scaling: downscale stops not-yet-running replicas first") {
  Harness h;
  auto d = make_deployment("D", 2);
  deploy(h, d);
  h.ticks(2);
  h.cluster.hang_start.insert("D");
  REQUIRE(h.core->deploy_deployment("a", scaled(d, 4)).has_value());
  CHECK(h.tick() == V{"start a#D#3@n3", "start a#D#4@n1"});
  CHECK(h.tick() == V{});
  CHECK(h.count("a", "D", ReplicaState::starting) == 2);
  REQUIRE(h.core->deploy_deployment("a", scaled(d, 2)).has_value());
  // STARTING replicas first, stopped gracefully as Ray Serve does (having
  // no request, they go at once); the one on the node with fewer replicas
  // (n3 holds one, n1 two) first.
  CHECK(h.tick() == V{"stop a#D#3 20", "stop a#D#4 20"});
  CHECK(h.tick() == V{});
  CHECK(h.count("a", "D", ReplicaState::running) == 2);
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::downscale_completed);
}

TEST_CASE("scaling: a scale-down empties the nodes with the fewest replicas of all deployments") {
  Harness h;
  REQUIRE(h.core->deploy_application(make_app("b", "/b", {make_deployment("E", 2)})).has_value());
  h.ticks(2);  // b#E#1 on n1, b#E#2 on n2
  auto d = make_deployment("D", 5);
  deploy(h, d);
  h.ticks(2);
  std::map<std::string, std::string> where;
  for (const auto& r : h.replicas("a", "D"))
    where[r.id] = r.node_id;
  // Placed where this deployment had fewest, then where all had fewest.
  REQUIRE(where ==
          std::map<std::string, std::string>{
              {"a#D#3", "n3"}, {"a#D#4", "n1"}, {"a#D#5", "n2"}, {"a#D#6", "n3"}, {"a#D#7", "n1"}});
  // Replicas of every deployment: n1 3 (E and two of D), n2 2, n3 2. Ties
  // go to the newest replica: a#D#6 on n3, then n3 (one left) before n2,
  // then n2 (two, against n1's three). n3 is empty, n2 holds only E.
  REQUIRE(h.core->deploy_deployment("a", scaled(d, 2)).has_value());
  CHECK(h.tick() == V{"stop a#D#6 20", "stop a#D#3 20", "stop a#D#5 20"});
  h.tick();
  for (const auto& r : h.replicas("a", "D"))
    CHECK(r.node_id == "n1");
}

TEST_CASE("scaling: never exceeds the target counting STOPPING replicas") {
  Harness h;
  auto d = make_deployment("D", 2);
  deploy(h, d);
  h.ticks(2);
  h.cluster.ignore_stop.insert("a#D#2");
  REQUIRE(h.core->deploy_deployment("a", scaled(d, 1)).has_value());
  CHECK(h.tick() == V{"stop a#D#2 20"});
  REQUIRE(h.core->deploy_deployment("a", scaled(d, 2)).has_value());
  // One running + one stopping = 2: no new replica until it is gone.
  CHECK(h.tick() == V{});
  CHECK(h.tick() == V{});
  h.cluster.ignore_stop.clear();
  h.cluster.execute(Command{CommandKind::kill, "a#D#2", "n2", "", "", nullptr, {}, 0});
  CHECK(h.tick() == V{"start a#D#3@n2"});
}

TEST_CASE("deploy: the same spec twice is a no-op reporting unchanged") {
  Harness h;
  auto d = make_deployment("D", 2);
  auto app = make_app("a", "/a", {d});
  auto first = h.core->deploy_application(app);
  REQUIRE(first.has_value());
  CHECK(first->changed);
  CHECK(first->deployments.at("D") == ChangeKind::created);
  h.ticks(2);
  const int saves = h.store->saves;
  const auto generation = h.core->target_state().generation;
  auto again = h.core->deploy_application(app);
  REQUIRE(again.has_value());
  CHECK_FALSE(again->changed);
  CHECK(again->deployments.at("D") == ChangeKind::unchanged);
  CHECK(again->generation == generation);
  CHECK(h.store->saves == saves);
  CHECK(h.tick() == V{});
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
  auto same = h.core->deploy_deployment("a", d);
  REQUIRE(same.has_value());
  CHECK_FALSE(same->changed);
}

TEST_CASE("deploy: prev_version rejects the call when the current version differs") {
  Harness h;
  auto d = make_deployment("D", 1);
  deploy(h, d);
  auto next = d;
  next.code_version = "v2";
  auto r = h.core->deploy_deployment("a", next, std::string("v0"));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().code() == errc::conflict);
  CHECK(r.status().message() ==
        "applications[a].deployments[D].prev_version: \"v0\" must equal the current version "
        "\"v1\"");
  CHECK(h.core->target_state().applications.at("a").deployments[0].code_version == "v1");
  auto ok = h.core->deploy_deployment("a", next, std::string("v1"));
  REQUIRE(ok.has_value());
  CHECK(ok->deployments.at("D") == ChangeKind::restart);
}

TEST_CASE("target capacity scales targets - rounding half up as Ray Serve does - at least one") {
  CHECK(capacity_adjusted(10, std::nullopt) == 10);
  CHECK(capacity_adjusted(10, 100.0) == 10);
  CHECK(capacity_adjusted(10, 50.0) == 5);
  CHECK(capacity_adjusted(10, 25.0) == 3);  // 2.5: half up
  CHECK(capacity_adjusted(10, 24.0) == 2);  // 2.4: down
  CHECK(capacity_adjusted(4, 30.0) == 1);   // 1.2: Ray's 1 (rounding up gave 2)
  CHECK(capacity_adjusted(4, 40.0) == 2);   // 1.6: up
  CHECK(capacity_adjusted(3, 50.0) == 2);   // 1.5: half up
  CHECK(capacity_adjusted(10, 1.0) == 1);   // 0.1: at least one
  CHECK(capacity_adjusted(10, 0.0) == 0);
  CHECK(capacity_adjusted(0, 50.0) == 0);

  Harness h;
  deploy(h, make_deployment("D", 4));
  h.ticks(2);
  REQUIRE(h.core->set_target_capacity(50.0).is_ok());
  CHECK(h.core->target_replicas({"a", "D"}) == 2u);
  // n3 holds one replica (a#D#3), n1 two: n3 empties first, then n2's.
  CHECK(h.tick() == V{"stop a#D#3 20", "stop a#D#2 20"});
  h.tick();
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::downscale_completed);
  REQUIRE(h.core->set_target_capacity(std::nullopt).is_ok());
  CHECK(h.core->target_replicas({"a", "D"}) == 4u);
}

TEST_CASE("autoscaling hook: a desired count is clamped to the bounds") {
  Harness h;
  auto d = make_deployment("D", 1);
  AutoscalingConfig a;
  a.min_replicas = 1;
  a.max_replicas = 5;
  a.initial_replicas = 2;
  d.config.autoscaling_config = a;
  deploy(h, d);
  CHECK(h.core->target_replicas({"a", "D"}) == 2u);
  h.ticks(2);
  REQUIRE(h.core->set_autoscaled_target({"a", "D"}, 4).is_ok());
  expect_status(h, DeploymentStatus::upscaling, DeploymentTrigger::autoscaling);
  CHECK(h.tick() == V{"start a#D#3@n3", "start a#D#4@n1"});
  h.tick();
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::upscale_completed);
  REQUIRE(h.core->set_autoscaled_target({"a", "D"}, 50).is_ok());
  CHECK(h.core->target_replicas({"a", "D"}) == 5u);
  CHECK(h.core->set_autoscaled_target({"a", "X"}, 3).code() == errc::not_found);
  Harness g;
  deploy(g, make_deployment("D", 1));
  CHECK(g.core->set_autoscaled_target({"a", "D"}, 3).code() == errc::invalid_argument);
}

// ---------------------------------------------------------------- scheduling

TEST_CASE("scheduling: spread over ALIVE nodes within resources - pending allocation message") {
  Harness h;
  h.set_nodes({{"n1", NodeState::alive, *parse_resources("cpu=2")},
               {"n2", NodeState::alive, *parse_resources("cpu=2")},
               {"n3", NodeState::draining, *parse_resources("cpu=8")}});
  auto d = make_deployment("D", 5);
  d.config.resources = *parse_resources("cpu=1");
  deploy(h, d);
  CHECK(h.tick() == V{"start a#D#1@n1", "start a#D#2@n2", "start a#D#3@n1", "start a#D#4@n2"});
  auto reps = h.replicas("a", "D");
  REQUIRE(reps.size() == 5);
  CHECK(reps[4].pending_allocation);
  CHECK(reps[4].state == ReplicaState::starting);
  h.ticks(30);  // t = 31: pending for 30 s, not more
  CHECK(h.status("a", "D").message == "");
  CHECK(h.tick() == V{});  // t = 32
  CHECK(h.status("a", "D").message ==
        "Deployment 'D' in application 'a' has 1 replicas that have taken more than 30s to be "
        "scheduled. Resources required for each replica: cpu=1; free resources: n1: cpu=0; n2: "
        "cpu=0.");
  expect_status(h, DeploymentStatus::updating, DeploymentTrigger::config_update_started);
  // Capacity arrives: the pending replica is placed.
  auto nodes = h.nodes;
  nodes.push_back({"n4", NodeState::alive, *parse_resources("cpu=4")});
  h.set_nodes(nodes);
  CHECK(h.tick() == V{"start a#D#5@n4"});
  h.tick();
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
}

TEST_CASE("scheduling: max_replicas_per_node") {
  Harness h;
  auto d = make_deployment("D", 4);
  d.config.max_replicas_per_node = 1;
  deploy(h, d);
  CHECK(h.tick() == V{"start a#D#1@n1", "start a#D#2@n2", "start a#D#3@n3"});
  CHECK(h.replicas("a", "D")[3].pending_allocation);
  h.ticks(31);
  CHECK(h.status("a", "D").message ==
        "Deployment 'D' in application 'a' has 1 replicas that have taken more than 30s to be "
        "scheduled. Resources required for each replica: none, at most 1 per node; free "
        "resources: n1: cpu=100; n2: cpu=100; n3: cpu=100.");
}

TEST_CASE("scheduling: ties are broken by the injected random source") {
  Harness h;
  h.rng.pick = 2;
  deploy(h, make_deployment("D", 1));
  CHECK(h.tick() == V{"start a#D#1@n3"});
}

TEST_CASE("slow start: replicas initializing for more than 30 s") {
  Harness h;
  h.cluster.hang_start.insert("D");
  deploy(h, make_deployment("D", 2));
  h.ticks(31);
  CHECK(h.status("a", "D").message == "");
  h.tick();
  CHECK(h.status("a", "D").message ==
        "Deployment 'D' in application 'a' has 2 replicas that have taken more than 30s to "
        "initialize. This may be caused by a slow constructor or reconfigure.");
}

// ---------------------------------------------------------------- health

TEST_CASE("health: checks every period with jitter from the injected random source") {
  for (double fraction : {0.0, 0.5, 1.0}) {
    Harness h;
    h.rng.fraction = fraction;
    auto d = make_deployment("D", 1);
    deploy(h, d);
    h.tick(1.0);
    h.tick(1.0);  // t = 2: RUNNING; the first check is due at once (Ray Serve's)
    const double period = 10 * (0.9 + 0.2 * fraction);  // 10 * uniform(0.9, 1.1)
    // The node is told once, at the next tick; it runs the checks.
    CHECK(h.tick(0.5, true) == V{"watch a#D#1"});
    for (int i = 0; i < 59; ++i)
      CHECK(h.tick(0.5, true) == V{});
    auto checks = h.cluster.checks_of("a#D#1");
    REQUIRE(checks.size() >= 3);
    CHECK(checks[0] == doctest::Approx(2.5));  // the first tick after RUNNING
    // Then every period, rounded up to the next 0.5 s tick.
    CHECK(checks[1] == doctest::Approx(std::ceil((2.5 + period) * 2) / 2));
    CHECK(checks[2] == doctest::Approx(std::ceil((checks[1] + period) * 2) / 2));
  }
}

TEST_CASE(
    "health: failures below the threshold keep the replica - at the threshold it is replaced") {
  Harness h;
  deploy(h, make_deployment("D", 1));
  h.ticks(2);  // t = 2: RUNNING; checks at 3, 13, 23, ... (the first at once)
  h.cluster.unhealthy.insert("a#D#1");
  h.ticks(11);             // t = 13: check; its failed answer arrives at 14
  CHECK(h.tick() == V{});  // t = 14: two consecutive failures (3 and 13)
  h.cluster.unhealthy.clear();
  h.ticks(10);  // t = 24: the check at 23 succeeded, counter reset
  h.cluster.unhealthy.insert("a#D#1");
  h.ticks(20);  // t = 44: failures at 33 and 43
  CHECK(h.count("a", "D", ReplicaState::running) == 1);
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
  h.ticks(9);                             // t = 53: third check
  CHECK(h.tick() == V{"stop a#D#1 20"});  // t = 54: third failure in a row
  expect_status(h, DeploymentStatus::unhealthy, DeploymentTrigger::health_check_failed);
  CHECK(h.status("a", "D").message ==
        "Replica a#D#1 failed 3 health checks in a row. This deployment is UNHEALTHY until the "
        "replica is replaced or a new deploy happens.");
  CHECK(h.core->application_status("a")->status == ApplicationStatus::unhealthy);
  CHECK(h.tick() == V{"start a#D#2@n1"});  // gone: replaced
  CHECK(h.tick() == V{});                  // t = 56: a#D#2 runs; checks at 57, 67, 77
  // Not HEALTHY until the replacement passed 3 checks (issue 39).
  for (int i = 0; i < 21; ++i) {
    h.tick();
    expect_status(h, DeploymentStatus::unhealthy, DeploymentTrigger::health_check_failed);
  }
  h.tick();  // t = 78: the third passed check arrives
  // Ray Serve's names: HEALTHY with trigger UNSPECIFIED.
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::unspecified);
  CHECK(h.status("a", "D").message == "Every replica is healthy again.");
}

TEST_CASE("health: no answer within health_check_timeout_s counts as a failure") {
  Harness h;
  auto d = make_deployment("D", 1);
  d.config.health_check_timeout_s = 5;
  deploy(h, d);
  h.ticks(2);
  h.cluster.silent.insert("a#D#1");
  CHECK(h.tick(1, true) == V{"watch a#D#1"});    // t = 3: checked at once, deadline 8
  CHECK(h.tick(4, true) == V{});                 // t = 7
  CHECK(h.tick(1, true) == V{});                 // t = 8: failure 1, next check due at 13
  CHECK(h.cluster.checks_of("a#D#1") == std::vector<double>{3});
  CHECK(h.tick(5, true) == V{});                 // t = 13: checked
  CHECK(h.tick(5, true) == V{});                 // t = 18: failure 2
  CHECK(h.tick(5, true) == V{});                 // t = 23: checked
  CHECK(h.cluster.checks_of("a#D#1") == std::vector<double>{3, 13, 23});
  CHECK(h.tick(5, true) == V{"stop a#D#1 20"});  // t = 28: failure 3
}

TEST_CASE("health: the status says what the last failed check said") {
  Harness h;
  deploy(h, make_deployment("D", 1));
  h.ticks(2);  // t = 2: RUNNING; checks at 3, 13, 23
  h.cluster.unhealthy.insert("a#D#1");
  // The first two failures say nothing, the last one why: the status quotes
  // the last.
  h.ticks(11);  // t = 13: failures at 3 and 13
  h.cluster.unhealthy_why["a#D#1"] =
      "stuck: all 2 request threads busy for 31.0 s with none finished";
  h.ticks(10);                            // t = 23: third check
  CHECK(h.tick() == V{"stop a#D#1 20"});  // t = 24: third failure in a row
  expect_status(h, DeploymentStatus::unhealthy, DeploymentTrigger::health_check_failed);
  CHECK(h.status("a", "D").message ==
        "Replica a#D#1 failed 3 health checks in a row (last: stuck: all 2 request threads busy "
        "for 31.0 s with none finished). This deployment is UNHEALTHY until the replica is "
        "replaced or a new deploy happens.");
}

TEST_CASE("health: a check that timed out is named as the last failure") {
  Harness h;
  auto d = make_deployment("D", 1);
  d.config.health_check_timeout_s = 5;
  deploy(h, d);
  h.ticks(2);
  h.cluster.silent.insert("a#D#1");
  h.ticks(21);                             // t = 23: failures at 8 and 18; check at 23
  CHECK(h.tick(5) == V{"stop a#D#1 20"});  // t = 28: failure 3
  CHECK(h.status("a", "D").message ==
        "Replica a#D#1 failed 3 health checks in a row (last: no answer within "
        "health_check_timeout_s). This deployment is UNHEALTHY until the replica is replaced or "
        "a new deploy happens.");
}

TEST_CASE("health: a crash marks the replica unhealthy at once and replaces it") {
  Harness h;
  deploy(h, make_deployment("D", 2));
  h.ticks(2);
  h.cluster.crash("a#D#1");
  // The crashed replica is replaced at once; a kill makes sure it is gone.
  CHECK(h.tick() == V{"kill a#D#1", "start a#D#3@n1"});
  expect_status(h, DeploymentStatus::unhealthy, DeploymentTrigger::health_check_failed);
  CHECK(h.status("a", "D").message ==
        "Replica a#D#1 crashed. This deployment is UNHEALTHY until the replica is replaced or a "
        "new deploy happens.");
  CHECK(h.tick() == V{});
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::unspecified);
}

TEST_CASE("health: replicas on a node that died are replaced") {
  Harness h;
  deploy(h, make_deployment("D", 2));
  h.ticks(2);
  h.set_nodes({h.nodes[0], h.nodes[2]});  // n2 is gone
  CHECK(h.tick() == V{"start a#D#3@n3"});
  expect_status(h, DeploymentStatus::unhealthy, DeploymentTrigger::health_check_failed);
}

// ---------------------------------------------------------------- start failures

TEST_CASE(
    "start failures: DEPLOY_FAILED after 3 x target failures - then backoff 1 - 2 - 4 ... 64") {
  Harness h;
  h.rng.fraction = 0;  // no jitter
  h.cluster.fail_start["D"] = "RuntimeError: cannot open model file";
  deploy(h, make_deployment("D", 1));
  std::vector<double> starts;
  for (int i = 0; i < 210; ++i) {
    for (const auto& op : h.tick()) {
      if (op.rfind("start", 0) == 0)
        starts.push_back(h.clock.now_s());
    }
    if (h.clock.now_s() == 5) {
      expect_status(h, DeploymentStatus::updating, DeploymentTrigger::config_update_started);
    }
    if (h.clock.now_s() == 6) {
      expect_status(h, DeploymentStatus::deploy_failed, DeploymentTrigger::replica_startup_failed);
      CHECK(h.status("a", "D").message ==
            "The deployment failed to start 3 times in a row. This may be due to a problem with "
            "its constructor, reconfigure or initial health check. Retrying after 1 seconds. "
            "Error:\n"
            "RuntimeError: cannot open model file");
      CHECK(h.core->application_status("a")->status == ApplicationStatus::deploy_failed);
    }
  }
  // Failures at t = 2, 4, 6 (threshold reached), then waits of 1, 2, 4, ... 64, 64 s.
  CHECK(starts == std::vector<double>{1, 3, 5, 7, 10, 15, 24, 41, 74, 139, 204});
  expect_status(h, DeploymentStatus::deploy_failed, DeploymentTrigger::replica_startup_failed);
  CHECK(h.core->deployment({"a", "D"})->start_failures() == 11);

  // Fixing the code (a new deploy) resets the counting and the backoff.
  h.cluster.fail_start.clear();
  auto d = make_deployment("D", 1, "v2");
  deploy(h, d);
  CHECK(h.core->deployment({"a", "D"})->start_failures() == 0);
  CHECK(h.core->deployment({"a", "D"})->backoff_s() == 1);
  h.ticks(3);
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
}

TEST_CASE("start failures: backoff waits are jittered through the random source") {
  Harness h;
  h.rng.fraction = 0.9;  // every wait + uniform(0, 3) = + 2.7 s (Ray Serve's offset)
  h.cluster.fail_start["D"] = "boom";
  deploy(h, make_deployment("D", 1));
  std::vector<double> starts;
  h.rng.uniform_calls.clear();
  for (int i = 0; i < 50; ++i) {
    for (const auto& op : h.tick(0.5)) {
      if (op.rfind("start", 0) == 0)
        starts.push_back(h.clock.now_s());
    }
  }
  // Failures at 1, 2, 3; waits 1 + 2.7 (-> 6.7, next tick 7), 2 + 2.7 (fail 7.5 -> 12.2,
  // tick 12.5), 4 + 2.7 (fail 13 -> 19.7, tick 20), 8 + 2.7 (fail 20.5 -> 31.2: after t = 25).
  CHECK(starts == std::vector<double>{0.5, 1.5, 2.5, 7, 12.5, 20});
  // One draw per wait, from [0, 3].
  CHECK(std::count(h.rng.uniform_calls.begin(), h.rng.uniform_calls.end(),
                   std::make_pair(0.0, 3.0)) == 4);
}

TEST_CASE("start failures: a success stops the counting at the threshold (partial success)") {
  Harness h;
  h.cluster.fail_start["D"] = "flaky";
  h.cluster.succeed_ids.insert("a#D#3");
  deploy(h, make_deployment("D", 3));
  CHECK(h.tick() == V{"start a#D#1@n1", "start a#D#2@n2", "start a#D#3@n3"});
  CHECK(h.tick() == V{"kill a#D#1", "kill a#D#2"});
  // Counted on although a#D#3 runs (Ray Serve checks at the threshold, 9).
  CHECK(h.core->deployment({"a", "D"})->start_failures() == 2);
  CHECK(h.count("a", "D", ReplicaState::running) == 1);
  int64_t seen = 2;
  for (int i = 0; i < 20 && h.core->deployment({"a", "D"})->start_failures() >= 0; ++i) {
    h.tick();
    seen = std::max(seen, h.core->deployment({"a", "D"})->start_failures());
  }
  CHECK(seen >= 8);
  CHECK(h.core->deployment({"a", "D"})->start_failures() == -1);
  h.ticks(60);  // keeps failing: retried without backoff, never DEPLOY_FAILED
  expect_status(h, DeploymentStatus::updating, DeploymentTrigger::config_update_started);
  CHECK(h.cluster.starts > 40);
  CHECK(h.count("a", "D", ReplicaState::running) == 1);
  h.cluster.fail_start.clear();
  h.ticks(3);
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
  CHECK(h.count("a", "D", ReplicaState::running) == 3);
}

// ---------------------------------------------------------------- graceful stop

TEST_CASE("graceful stop: killed at graceful_shutdown_timeout_s - STOPPING until confirmed") {
  Harness h;
  auto d = make_deployment("D", 1);
  d.config.graceful_shutdown_timeout_s = 5;
  deploy(h, d);
  h.ticks(2);
  h.cluster.ignore_stop.insert("a#D#1");
  REQUIRE(h.core->deploy_deployment("a", scaled(d, 0)).has_value());
  CHECK(h.tick() == V{"stop a#D#1 5"});  // t = 3
  for (int i = 0; i < 4; ++i) {
    CHECK(h.tick() == V{});  // t = 4 .. 7
    CHECK(h.count("a", "D", ReplicaState::stopping) == 1);
  }
  CHECK(h.tick() == V{"kill a#D#1"});  // t = 8
  CHECK(h.count("a", "D", ReplicaState::stopping) == 1);
  CHECK(h.tick() == V{});  // t = 9: confirmed gone
  CHECK(h.replicas("a", "D").empty());
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::downscale_completed);
}

TEST_CASE("graceful stop: the kill is sent again every second until the replica is gone") {
  Harness h;
  auto d = make_deployment("D", 1);
  d.config.graceful_shutdown_timeout_s = 2;
  deploy(h, d);
  h.ticks(2);
  h.cluster.ignore_stop.insert("a#D#1");
  h.cluster.ignore_kill.insert("a#D#1");  // its node never carries a kill out
  REQUIRE(h.core->deploy_deployment("a", scaled(d, 0)).has_value());
  CHECK(h.tick(0.5) == V{"stop a#D#1 2"});  // t = 2.5
  CHECK(h.tick(0.5) == V{});
  CHECK(h.tick(0.5) == V{});
  CHECK(h.tick(0.5) == V{});
  CHECK(h.tick(0.5) == V{"kill a#D#1"});  // t = 4.5: the grace is over
  for (int i = 0; i < 5; ++i) {
    CHECK(h.tick(0.5) == V{});
    CHECK(h.tick(0.5) == V{"kill a#D#1"});  // every second
    CHECK(h.count("a", "D", ReplicaState::stopping) == 1);
  }
  h.cluster.ignore_kill.clear();
  CHECK(h.tick(0.5) == V{});
  CHECK(h.tick(0.5) == V{"kill a#D#1"});  // carried out this time
  CHECK(h.tick(0.5) == V{});
  CHECK(h.replicas("a", "D").empty());
  CHECK(h.cluster.actors.empty());
}

// ---------------------------------------------------------------- rolling update

TEST_CASE("rolling update: a code change with 10 replicas moves 2 at a time") {
  Harness h;
  auto d = make_deployment("D", 10);
  deploy(h, d);
  h.ticks(2);
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
  auto v2 = d;
  v2.code_version = "v2";
  auto r = h.core->deploy_application(make_app("a", "/a", {v2}));
  REQUIRE(r.has_value());
  CHECK(r->deployments.at("D") == ChangeKind::restart);
  expect_status(h, DeploymentStatus::updating, DeploymentTrigger::config_update_started);

  // Surge: each pair of new replicas starts beside the old ones, and two old
  // ones stop only once their replacements run (passed their gate).
  std::vector<V> expected = {{"start a#D#11", "start a#D#12"},
                             {"stop a#D#1 20", "stop a#D#2 20"},
                             {"start a#D#13", "start a#D#14"},
                             {"stop a#D#3 20", "stop a#D#4 20"},
                             {"start a#D#15", "start a#D#16"},
                             {"stop a#D#5 20", "stop a#D#6 20"},
                             {"start a#D#17", "start a#D#18"},
                             {"stop a#D#7 20", "stop a#D#8 20"},
                             {"start a#D#19", "start a#D#20"},
                             {"stop a#D#9 20", "stop a#D#10 20"},
                             {}};
  for (const auto& want : expected) {
    CHECK(without_nodes(h.tick()) == want);
    const auto alive = h.cluster.alive_not_stopping("a", "D");
    CHECK(alive <= 12);
    CHECK(alive >= 10);
    CHECK(h.count("a", "D", ReplicaState::running) >= 10);
    if (!want.empty()) {
      expect_status(h, DeploymentStatus::updating, DeploymentTrigger::config_update_started);
    }
  }
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
  for (const auto& rep : h.replicas("a", "D"))
    CHECK(rep.version == version_of(v2));
}

TEST_CASE("rolling update: a user_config change reconfigures in place - 2 at a time") {
  Harness h;
  auto d = make_deployment("D", 10);
  deploy(h, d);
  h.ticks(2);
  const int starts = h.cluster.starts;
  auto v2 = d;
  v2.config.user_config = "{\"threshold\": 0.7}";
  auto r = h.core->deploy_application(make_app("a", "/a", {v2}));
  REQUIRE(r.has_value());
  CHECK(r->deployments.at("D") == ChangeKind::reconfigure);
  CHECK(h.tick() == V{"reconfigure a#D#1", "reconfigure a#D#2"});
  CHECK(h.count("a", "D", ReplicaState::updating) == 2);
  CHECK(h.tick() == V{"reconfigure a#D#3", "reconfigure a#D#4"});
  CHECK(h.tick() == V{"reconfigure a#D#5", "reconfigure a#D#6"});
  CHECK(h.tick() == V{"reconfigure a#D#7", "reconfigure a#D#8"});
  CHECK(h.tick() == V{"reconfigure a#D#9", "reconfigure a#D#10"});
  CHECK(h.tick() == V{});
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
  CHECK(h.cluster.starts == starts);  // nothing restarted
  for (const auto& rep : h.replicas("a", "D"))
    CHECK(rep.version.user_config == v2.config.user_config);
}

TEST_CASE("rolling update: a batching change reconfigures in place - nothing restarts") {
  Harness h;
  auto d = make_deployment("D", 2);
  d.config.max_ongoing_requests = 64;
  deploy(h, d);
  h.ticks(2);
  const int starts = h.cluster.starts;
  auto v2 = d;
  v2.config.max_batch_size = 32;
  v2.config.batch_wait_timeout_s = 0.005;
  auto r = h.core->deploy_application(make_app("a", "/a", {v2}));
  REQUIRE(r.has_value());
  CHECK(r->deployments.at("D") == ChangeKind::reconfigure);
  CHECK(h.tick() == V{"reconfigure a#D#1"});
  CHECK(h.tick() == V{"reconfigure a#D#2"});
  CHECK(h.tick() == V{});
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
  // The adaptive wait is a change of its own; so is turning batching off.
  auto v3 = v2;
  v3.config.batch_wait_auto = true;
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {v3})).has_value());
  CHECK(h.tick() == V{"reconfigure a#D#1"});
  CHECK(h.tick() == V{"reconfigure a#D#2"});
  CHECK(h.tick() == V{});
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {d})).has_value());
  CHECK(h.tick() == V{"reconfigure a#D#1"});
  CHECK(h.tick() == V{"reconfigure a#D#2"});
  CHECK(h.tick() == V{});
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
  CHECK(h.cluster.starts == starts);  // nothing restarted
  for (const auto& rep : h.replicas("a", "D"))
    CHECK(rep.version == version_of(d));
}

TEST_CASE("rolling update: a pending scale-down completes before the rollout proceeds") {
  Harness h;
  auto d = make_deployment("D", 10);
  deploy(h, d);
  h.ticks(2);
  auto v2 = make_deployment("D", 5, "v2");
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {v2})).has_value());
  auto first = h.tick();
  CHECK(first.size() == 5);
  for (const auto& op : first)
    CHECK(op.rfind("stop", 0) == 0);
  // Then one at a time (rollout_size = max(20% of 5, 1) = 1), each new
  // replica beside the old one it replaces.
  CHECK(without_nodes(h.tick()) == V{"start a#D#11"});
  CHECK(without_nodes(h.tick()) == V{"stop a#D#1 20"});
  CHECK(without_nodes(h.tick()) == V{"start a#D#12"});
  CHECK(without_nodes(h.tick()) == V{"stop a#D#2 20"});
}

TEST_CASE("rolling update: replicas still STARTING with an old version are killed without grace") {
  Harness h;
  h.cluster.hang_start.insert("D");
  auto d = make_deployment("D", 2);
  deploy(h, d);
  h.tick();
  h.cluster.hang_start.clear();
  REQUIRE(
      h.core->deploy_application(make_app("a", "/a", {make_deployment("D", 2, "v2")})).has_value());
  // rollout_size is 1 for 2 replicas.
  CHECK(h.tick() == V{"kill a#D#1"});
  CHECK(without_nodes(h.tick()) == V{"start a#D#3"});
}

TEST_CASE("rolling update: a new version that fails to start leaves every old replica serving") {
  Harness h;
  h.rng.fraction = 0;  // no jitter
  auto d = make_deployment("D", 4);
  deploy(h, d);
  h.ticks(2);
  const auto old_ids = [&] {
    V ids;
    for (const auto& r : h.replicas("a", "D")) {
      if (r.state == ReplicaState::running && r.version == version_of(d))
        ids.push_back(r.id);
    }
    return ids;
  };
  const V v1 = old_ids();
  REQUIRE(v1 == V{"a#D#1", "a#D#2", "a#D#3", "a#D#4"});
  // Version 2's replicas fail their start (in a real replica: the first
  // health check after the constructor).
  const auto v2 = make_deployment("D", 4, "v2");
  h.cluster.fail_codes.insert(code_identity(v2));
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {v2})).has_value());
  std::vector<double> starts;
  bool failed = false;
  for (int i = 0; i < 60; ++i) {
    for (const auto& op : h.tick()) {
      CHECK(op.rfind("stop a#D#", 0) != 0);  // no old replica is ever stopped
      if (op.rfind("start", 0) == 0)
        starts.push_back(h.clock.now_s());
    }
    CHECK(old_ids() == v1);
    CHECK(h.count("a", "D", ReplicaState::running) == 4);
    if (!failed && h.status("a", "D").status == DeploymentStatus::deploy_failed) {
      failed = true;
      // 3 x 4 = 12 failures, one replacement at a time (rollout_size 1).
      // Each failed start takes 2 ticks (the failure, then the kill's
      // answer), from t = 3 on.
      CHECK(h.core->deployment({"a", "D"})->start_failures() == 12);
      CHECK(h.clock.now_s() == 26);
    }
  }
  REQUIRE(failed);
  expect_status(h, DeploymentStatus::deploy_failed, DeploymentTrigger::replica_startup_failed);
  CHECK(h.status("a", "D").message.find("The previous version keeps serving on 4 replicas.") !=
        std::string::npos);
  CHECK(h.status("a", "D").message.find("Error:\nbad version") != std::string::npos);
  // Before the threshold one start every 2 s; after it, each failure waits
  // 1, 2, 4, 8, 16 s before the next start.
  REQUIRE(starts.size() >= 13);
  CHECK(std::vector<double>(starts.begin() + 11, starts.end()) ==
        std::vector<double>{25, 27, 30, 35, 44, 61});
  CHECK(h.core->application_status("a")->status == ApplicationStatus::deploy_failed);

  // Back to version 1 (what `troupectl rollback` deploys): nothing restarts.
  const int before = h.cluster.starts;
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {d})).has_value());
  h.ticks(3);
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
  CHECK(old_ids() == v1);
  CHECK(h.replicas("a", "D").size() == 4);
  CHECK(h.cluster.starts == before);
}

TEST_CASE(
    "rolling update: a new version that fails its checks after its gate stops costing old "
    "replicas") {
  Harness h;
  h.rng.fraction = 0;
  auto d = make_deployment("D", 4);
  d.config.health_check_period_s = 1;
  deploy(h, d);
  h.ticks(2);
  auto v2 = d;
  v2.code_version = "v2";
  // v2's replicas pass their start-up gate, then fail every check.
  h.cluster.unhealthy_codes.insert(code_identity(v2));
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {v2})).has_value());
  const auto old_running = [&] {
    std::size_t n = 0;
    for (const auto& r : h.replicas("a", "D"))
      n += r.state == ReplicaState::running && r.version.code != version_of(v2).code;
    return n;
  };
  std::size_t fewest = 4;
  for (int i = 0; i < 150; ++i) {
    h.tick();
    fewest = std::min(fewest, old_running());
  }
  // The replacements that ran before the first v2 replica failed its third
  // check (two, 1 s checks apart) stopped their old replicas. From then on
  // old replicas wait for a proven replacement: no further loss.
  CHECK(fewest == 2);
  CHECK(old_running() == 2);
  CHECK(h.core->deployment({"a", "D"})->unproven_failures() >= 12);
  CHECK(h.cluster.starts < 40);  // backed off after 3 x 4, not a tight loop
  CHECK(h.status("a", "D").message.find("failed their health checks before passing 3") !=
        std::string::npos);
}

TEST_CASE("rolling update: a new version that passes its gate late completes - nothing dips") {
  Harness h;
  deploy(h, make_deployment("D", 2));
  h.ticks(2);
  h.cluster.slow_ready.insert("a#D#3");  // its gate has not answered yet
  REQUIRE(
      h.core->deploy_application(make_app("a", "/a", {make_deployment("D", 2, "v2")})).has_value());
  CHECK(without_nodes(h.tick()) == V{"start a#D#3"});
  for (int i = 0; i < 5; ++i) {
    CHECK(h.tick() == V{});
    CHECK(h.count("a", "D", ReplicaState::running) == 2);
  }
  h.core->on_replica_ready("a#D#3", version_of(make_deployment("D", 2, "v2")));
  CHECK(without_nodes(h.tick()) == V{"stop a#D#1 20"});
  CHECK(without_nodes(h.tick()) == V{"start a#D#4"});
  CHECK(without_nodes(h.tick()) == V{"stop a#D#2 20"});
  CHECK(h.tick() == V{});
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
  for (const auto& r : h.replicas("a", "D"))
    CHECK(r.version == version_of(make_deployment("D", 2, "v2")));
}

TEST_CASE("rolling update: with no room for a replica beside the old ones an old one makes room") {
  Harness h;
  auto d = make_deployment("D", 3);
  d.config.max_replicas_per_node = 1;  // three nodes, one replica each
  deploy(h, d);
  h.ticks(2);
  auto v2 = d;
  v2.code_version = "v2";
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {v2})).has_value());
  // The replacement has nowhere to go: a#D#1 stops for it, then it starts.
  CHECK(without_nodes(h.tick()) == V{"stop a#D#1 20"});
  CHECK(without_nodes(h.tick()) == V{"start a#D#4"});
  CHECK(without_nodes(h.tick()) == V{"stop a#D#2 20"});
  CHECK(without_nodes(h.tick()) == V{"start a#D#5"});
  CHECK(without_nodes(h.tick()) == V{"stop a#D#3 20"});
  CHECK(without_nodes(h.tick()) == V{"start a#D#6"});
  CHECK(h.tick() == V{});
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
}

// ---------------------------------------------------------------- draining

TEST_CASE("draining: a replica on a DRAINING node is replaced first - then stopped") {
  Harness h;
  deploy(h, make_deployment("D", 3));
  h.ticks(2);
  auto nodes = h.nodes;
  nodes[2].state = NodeState::draining;
  h.set_nodes(nodes);
  CHECK(h.tick() == V{"start a#D#4@n1"});
  CHECK(h.count("a", "D", ReplicaState::running) == 3);  // no capacity dip
  CHECK(h.replicas("a", "D")[2].migrating);
  CHECK(h.tick() == V{"stop a#D#3 20"});  // its replacement runs
  CHECK(h.count("a", "D", ReplicaState::running) == 3);
  CHECK(h.tick() == V{});
  CHECK(h.replicas("a", "D").size() == 3);
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
}

TEST_CASE("draining: several replicas on a draining node move rollout_size at a time") {
  Harness h;
  deploy(h, make_deployment("D", 6));  // two per node; rollout_size = 1
  h.ticks(2);
  auto nodes = h.nodes;
  nodes[0].state = NodeState::draining;  // n1 holds a#D#1 and a#D#4
  h.set_nodes(nodes);
  CHECK(h.tick() == V{"start a#D#7@n2"});
  CHECK(h.tick() == V{"stop a#D#1 20"});
  CHECK(h.tick() == V{"start a#D#8@n3"});
  CHECK(h.tick() == V{"stop a#D#4 20"});
  CHECK(h.tick() == V{});
  CHECK(h.count("a", "D", ReplicaState::running) == 6);
  for (const auto& r : h.replicas("a", "D"))
    CHECK(r.node_id != "n1");
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
}

TEST_CASE(
    "health: replicas failing their checks soon after starting back off - never HEALTHY in "
    "between") {
  Harness h;
  h.rng.fraction = 0;
  auto d = make_deployment("D", 1, "v1");
  d.config.health_check_period_s = 1;
  h.cluster.unhealthy_codes.insert(code_identity(d));  // passes its gate, fails every check after
  deploy(h, d);
  std::vector<double> starts;
  bool failed_once = false;
  for (int i = 0; i < 120; ++i) {
    for (const auto& op : h.tick()) {
      if (op.rfind("start", 0) == 0)
        starts.push_back(h.clock.now_s());
    }
    // Its first replica passed its gate: HEALTHY until its checks fail;
    // never again between two failed replacements.
    const auto s = h.status("a", "D").status;
    if (failed_once)
      CHECK(s != DeploymentStatus::healthy);
    failed_once = failed_once || s == DeploymentStatus::unhealthy;
  }
  REQUIRE(failed_once);
  // Each replica fails 3 checks (~4 s); after 3 of them (the threshold for
  // 1 replica) new ones wait 1, 2, 4, 8, 16, 32 s more.
  CHECK(h.core->deployment({"a", "D"})->unproven_failures() >= 3);
  MESSAGE("starts: " << doctest::toString(starts));
  CHECK(starts.size() < 14);
  expect_status(h, DeploymentStatus::unhealthy, DeploymentTrigger::health_check_failed);
  CHECK(h.status("a", "D").message.find("replicas of this version in a row failed their health "
                                        "checks before passing 3.") != std::string::npos);
  // A fixed version that proves itself: HEALTHY after 3 passed checks.
  h.cluster.unhealthy_codes.clear();
  auto v2 = d;
  v2.code_version = "v2";
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {v2})).has_value());
  h.ticks(10);
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
  CHECK(h.core->deployment({"a", "D"})->unproven_failures() == 0);
}

TEST_CASE("health: after a failed check HEALTHY waits for the replacement to pass 3 checks") {
  Harness h;
  auto d = make_deployment("D", 1);
  d.config.health_check_period_s = 2;
  deploy(h, d);
  h.ticks(12);  // a#D#1 passes its checks (proven)
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
  h.cluster.unhealthy.insert("a#D#1");
  int ticks = 0;
  while (h.status("a", "D").status == DeploymentStatus::healthy && ticks++ < 20)
    h.tick();
  expect_status(h, DeploymentStatus::unhealthy, DeploymentTrigger::health_check_failed);
  // Replaced; the replacement runs but has not passed its checks yet.
  while (h.count("a", "D", ReplicaState::running) == 0 || h.replicas("a", "D")[0].id == "a#D#1") {
    REQUIRE(ticks++ < 40);
    h.tick();
  }
  CHECK(h.replicas("a", "D")[0].id == "a#D#2");
  double running_at = h.clock.now_s();
  while (h.status("a", "D").status != DeploymentStatus::healthy) {
    REQUIRE(ticks++ < 60);
    expect_status(h, DeploymentStatus::unhealthy, DeploymentTrigger::health_check_failed);
    h.tick();
  }
  // Three checks 2 s apart: the first at once, the third ~4 s later.
  CHECK(h.clock.now_s() - running_at >= 4);
  CHECK(h.status("a", "D").message == "Every replica is healthy again.");
  // It was a proven replica: nothing counts against the version.
  CHECK(h.core->deployment({"a", "D"})->unproven_failures() == 0);
}

TEST_CASE("health: force_stop_unhealthy_replicas kills an unhealthy replica without grace") {
  Harness h;
  auto d = make_deployment("D", 1);
  d.config.force_stop_unhealthy_replicas = true;
  deploy(h, d);
  h.ticks(2);  // t = 2: RUNNING; checks at 3, 13, 23
  h.cluster.unhealthy.insert("a#D#1");
  h.ticks(21);                         // t = 23: third check
  CHECK(h.tick() == V{"kill a#D#1"});  // t = 24: third failure in a row, no "stop ... 20"
  expect_status(h, DeploymentStatus::unhealthy, DeploymentTrigger::health_check_failed);
  CHECK(without_nodes(h.tick()) == V{"start a#D#2"});
  // In place: the same deployment without it stops the next one gracefully.
  d.config.force_stop_unhealthy_replicas = false;
  auto r = h.core->deploy_application(make_app("a", "/a", {d}));
  REQUIRE(r.has_value());
  CHECK(r->deployments.at("D") == ChangeKind::config_only);
  h.ticks(2);
  h.cluster.unhealthy.insert("a#D#2");
  std::vector<std::string> seen;
  for (int i = 0; i < 40 && seen.empty(); ++i) {
    for (const auto& op : h.tick()) {
      if (op.find("a#D#2") != std::string::npos)
        seen.push_back(op);
    }
  }
  CHECK(seen == V{"stop a#D#2 20"});
}

TEST_CASE("health: the failure threshold is configurable") {
  Harness h;
  h.options.health_check_failure_threshold = 1;
  h.restart();
  deploy(h, make_deployment("D", 1));
  h.ticks(2);  // RUNNING at t = 2 (this incarnation tags its ids "r1"), first check at 3
  h.cluster.unhealthy.insert("a#D#r1-1");
  h.ticks(1);
  CHECK(h.tick() == V{"stop a#D#r1-1 20"});  // t = 4: the first failure is enough
}

TEST_CASE(
    "health: a redeploy that changes the check timings tells the node - counts go on - a "
    "reconfigure starts them afresh") {
  Harness h;
  h.rng.fraction = 0.5;  // no jitter: every period exact
  auto d = make_deployment("D", 1);
  deploy(h, d);
  h.ticks(2);                                  // t = 2: RUNNING
  CHECK(h.tick(1, true) == V{"watch a#D#1"});  // t = 3: watched, checked at once
  h.cluster.unhealthy.insert("a#D#1");
  h.ticks(10);  // t = 13: the check at 13 fails (the one at 3 passed)
  auto watch = [&] {
    for (const auto& c : h.last)
      if (c.kind == CommandKind::watch_health)
        return std::optional<Command>(c);
    return std::optional<Command>();
  };
  // Only the timings change: config_only, the replica stays.
  auto d2 = d;
  d2.config.health_check_period_s = 2;
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {d2})).has_value());
  CHECK(h.tick(1, true) == V{"watch a#D#1"});  // t = 14
  auto w = watch();
  REQUIRE(w);
  CHECK(w->check_seq == 1);  // the same watch: its counts go on
  CHECK(w->health.period_s == 2);
  CHECK(w->health.timeout_s == 30);
  CHECK(w->health.threshold == 3);
  // The next check keeps its time (23); from then on every 2 s: failures at
  // 13, 23 and 25 are three in a row.
  h.ticks(9);  // t = 23
  CHECK(h.cluster.checks_of("a#D#1") == std::vector<double>{3, 13, 23});
  h.ticks(2);                             // t = 25: the third failure is sent back
  CHECK(h.tick() == V{"stop a#D#1 20"});  // t = 26
  CHECK(h.count("a", "D", ReplicaState::running) == 0);
}

TEST_CASE("health: a reconfigured replica is watched afresh - its node counts from zero") {
  Harness h;
  auto d = make_deployment("D", 1);
  deploy(h, d);
  h.ticks(2);
  CHECK(h.tick(1, true) == V{"watch a#D#1"});  // t = 3, watch 1
  h.cluster.unhealthy.insert("a#D#1");
  h.ticks(20);  // failures at 13 and 23: two in a row
  h.cluster.unhealthy.clear();
  auto d2 = d;
  d2.config.user_config = R"({"x": 1})";
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {d2})).has_value());
  CHECK(h.tick(1) == V{"reconfigure a#D#1"});
  h.tick(1);  // RUNNING again
  CHECK(h.tick(1, true) == V{"watch a#D#1"});
  bool found = false;
  for (const auto& c : h.last) {
    if (c.kind == CommandKind::watch_health) {
      CHECK(c.check_seq == 2);  // a new watch: the node's counts start over
      found = true;
    }
  }
  CHECK(found);
  // Two more failures are not three in a row: the earlier two were of the
  // old watch.
  h.cluster.unhealthy.insert("a#D#1");
  h.ticks(12);  // failures at once and 10 s later
  CHECK(h.count("a", "D", ReplicaState::running) == 1);
}

TEST_CASE("slow start: a reconfigure that does not answer for more than 30 s") {
  Harness h;
  auto d = make_deployment("D", 1);
  deploy(h, d);
  h.ticks(2);
  auto v2 = d;
  v2.config.user_config = "{}";
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {v2})).has_value());
  // Swallow the answer to the reconfigure.
  h.clock.advance(1);
  h.cluster.deliver(*h.core);
  auto cmds = h.core->update();
  CHECK(ops(cmds) == V{"reconfigure a#D#1"});
  h.ticks(31);
  CHECK(h.count("a", "D", ReplicaState::updating) == 1);
  CHECK(h.status("a", "D").message ==
        "Deployment 'D' in application 'a' has 1 replicas that have taken more than 30s to "
        "initialize. This may be caused by a slow constructor or reconfigure.");
}

TEST_CASE("health: a late answer to a timed-out check is not taken for the next one") {
  Harness h;
  auto d = make_deployment("D", 1);
  d.config.health_check_timeout_s = 5;
  d.config.health_check_period_s = 5;
  deploy(h, d);
  h.ticks(2);  // RUNNING at t = 2; checks due every 5 s
  h.cluster.late_health.insert("a#D#1");
  CHECK(h.tick(5, true) == V{"watch a#D#1"});  // t = 7: check 1, deadline 12
  CHECK(h.tick(5, true) == V{});               // t = 12: failure 1, check 2 sent
  CHECK(h.cluster.checks_of("a#D#1") == std::vector<double>{7, 12});
  REQUIRE(h.cluster.late_answers.size() == 2);
  // The answer to check 1 arrives now (ok): it must not count for check 2.
  h.cluster.late_answers[0]();
  CHECK(h.tick(5, true) == V{});  // t = 17: failure 2
  h.cluster.late_answers.clear();
  CHECK(h.tick(5, true) == V{"stop a#D#1 20"});  // t = 22: failure 3
}

// ---------------------------------------------------------------- downscale order

namespace {

// The rule written the plain way: one scan of every candidate per pick.
std::vector<Replica*> downscale_by_scan(std::vector<Replica*> candidates,
                                        std::map<std::string, uint32_t> per_node, size_t n,
                                        const ReplicaVersion& target) {
  auto rank = [](const Replica& r) {
    switch (r.state) {
      case ReplicaState::starting:
        return r.placed ? 1 : 0;
      case ReplicaState::recovering:
        return 2;
      case ReplicaState::updating:
        return 3;
      default:
        return 4;
    }
  };
  std::vector<Replica*> out;
  while (out.size() < n && !candidates.empty()) {
    auto better = [&](const Replica* a, const Replica* b) {
      if (rank(*a) != rank(*b))
        return rank(*a) < rank(*b);
      const bool ta = a->version == target;
      const bool tb = b->version == target;
      if (ta != tb)
        return !ta;
      const uint32_t na = a->placed ? per_node[a->node_id] : 0;
      const uint32_t nb = b->placed ? per_node[b->node_id] : 0;
      if (na != nb)
        return na < nb;
      return a->seq > b->seq;
    };
    auto it = std::min_element(candidates.begin(), candidates.end(), better);
    Replica* victim = *it;
    candidates.erase(it);
    if (victim->placed)
      --per_node[victim->node_id];
    out.push_back(victim);
  }
  return out;
}

}  // namespace

TEST_CASE("scaling: the downscale order is the plain rule's on random replicas and nodes") {
  std::mt19937_64 gen(7);
  auto pick = [&](uint64_t n) { return gen() % n; };
  const ReplicaVersion target{"v2", ""};
  const ReplicaState states[] = {ReplicaState::starting, ReplicaState::recovering,
                                 ReplicaState::updating, ReplicaState::running};
  size_t picked = 0;
  for (int round = 0; round < 300; ++round) {
    std::vector<std::unique_ptr<Replica>> owned;
    std::vector<Replica*> candidates;
    std::map<std::string, uint32_t> per_node;
    const size_t count = 1 + pick(60);
    const uint64_t nodes = 1 + pick(8);
    for (size_t i = 0; i < count; ++i) {
      auto r = std::make_unique<Replica>();
      r->id = "r" + std::to_string(i);
      r->seq = pick(count);  // repeats: ids of two controller incarnations
      r->state = states[pick(4)];
      r->placed = r->state != ReplicaState::starting || pick(2) == 0;
      r->node_id = r->placed ? "n" + std::to_string(pick(nodes)) : "";
      r->version = pick(2) ? target : ReplicaVersion{"v1", ""};
      if (r->placed)
        ++per_node[r->node_id];
      candidates.push_back(r.get());
      owned.push_back(std::move(r));
    }
    // Replicas of other deployments on the same nodes.
    for (uint64_t k = 0; k < nodes; ++k)
      per_node["n" + std::to_string(k)] += static_cast<uint32_t>(pick(5));
    const size_t n = pick(count + 2);
    std::unordered_map<std::string, uint32_t> counts(per_node.begin(), per_node.end());
    auto fast = downscale_victims(candidates, counts, n, target);
    auto plain = downscale_by_scan(candidates, per_node, n, target);
    INFO("round " << round);
    REQUIRE(fast == plain);
    picked += fast.size();
  }
  CHECK(picked > 1000);
}
