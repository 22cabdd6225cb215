// The controller actor's wiring under CAF's deterministic test scheduler
// (scheduler.policy = testing): messages run only when the test says so,
// timers fire only when it advances CAF's clock, and the controller measures
// time on a fake clock. Nothing waits on real time. The fixture's run() also
// fires every timer, so with the controller's periodic tick it never ends:
// the tests run the scheduler's own run() (messages only) instead.
//
// CAF's test DSL (caf/test/dsl.hpp) needs the definitions of CAF's own test
// engine, which Debian ships as a header meant for the test's main file
// (unit_test_impl.hpp); CAF_TEST_NO_MAIN leaves doctest's main in charge.
#define CAF_TEST_NO_MAIN
#include <caf/test/unit_test_impl.hpp>

#include <caf/test/dsl.hpp>

#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "controller/controller_actor.hpp"
#include "controller/store/codec.hpp"
#include "runtime/time.hpp"
#include "runtime/wire.hpp"
#include "runtime/wire_rollback.hpp"
#include "tests/controller/fakes.hpp"

using namespace troupe;
using namespace troupe::controller;
using namespace troupe::controller::testing;

namespace {

struct WiringConfig : caf::actor_system_config {
  WiringConfig() { register_wire_types(*this); }
};

// A replica that constructs at once and answers health checks; its
// constructor fails when its init_args say "fail".
caf::behavior fake_replica(caf::event_based_actor*, ReplicaSpec spec) {
  return {
      [=](initialize_atom) -> caf::result<ReplicaMetadata> {
        if (spec.init_args == "fail")
          return to_caf_error(Status(errc::internal, "the constructor threw"));
        return ReplicaMetadata{spec.replica_id,  "n1",         1,         spec.code_version,
                               spec.user_config, 1700000000.0, spec.batch};
      },
      [](health_atom) { return caf::ok_atom::value; },
  };
}

struct Spawned {
  std::vector<ReplicaSpec> specs;
  std::vector<caf::actor> replicas;
  // The health watches the agent was sent: (replica, watch id, period).
  std::vector<std::tuple<std::string, uint64_t, double>> watches;
};

// A node agent that spawns fake replicas and records what it was asked to run.
caf::behavior fake_agent(caf::event_based_actor* self, std::shared_ptr<Spawned> spawned) {
  self->set_default_handler(caf::drop);
  return {
      [=](spawn_replica_atom, const ReplicaSpec& spec) {
        auto replica = self->spawn(fake_replica, spec);
        spawned->specs.push_back(spec);
        spawned->replicas.push_back(replica);
        return caf::actor_cast<ReplicaActor>(replica);
      },
      [=](health_atom, const std::vector<HealthWatch>& watches) {
        for (const auto& w : watches)
          spawned->watches.emplace_back(w.replica_id, w.watch, w.settings.period_s);
      },
  };
}

// Spawn requests held unanswered until the test releases them ((ok) to the
// agent): how many the controller had waiting at once.
struct HeldSpawns {
  std::vector<std::pair<caf::typed_response_promise<ReplicaActor>, ReplicaSpec>> pending;
  size_t most = 0;
  size_t asked = 0;
  std::vector<caf::actor> replicas;
};

caf::behavior holding_agent(caf::event_based_actor* self, std::shared_ptr<HeldSpawns> held) {
  self->set_default_handler(caf::drop);
  return {
      [=](spawn_replica_atom, const ReplicaSpec& spec) -> caf::result<ReplicaActor> {
        auto rp = self->make_response_promise<ReplicaActor>();
        held->pending.emplace_back(rp, spec);
        held->most = std::max(held->most, held->pending.size());
        ++held->asked;
        return rp;
      },
      [=](caf::ok_atom) {
        auto pending = std::move(held->pending);
        held->pending.clear();
        for (auto& [rp, spec] : pending) {
          auto replica = self->spawn(fake_replica, spec);
          held->replicas.push_back(replica);
          rp.deliver(caf::actor_cast<ReplicaActor>(replica));
        }
      },
      [](health_atom, const std::vector<HealthWatch>&) {},
  };
}

// Answers health checks with an error while `*healthy` is false.
caf::behavior fake_proxy(caf::event_based_actor*, std::shared_ptr<bool> healthy) {
  return {
      [=](health_atom) -> caf::result<caf::ok_atom> {
        if (*healthy)
          return caf::ok_atom::value;
        return to_caf_error(Status(errc::unavailable, "io thread 0 has not run for 6.0 s"));
      },
      [](snapshot_atom, const RoutingSnapshot&) { return caf::ok_atom::value; },
  };
}

struct Fixture : test_coordinator_fixture<WiringConfig> {
  std::shared_ptr<FakeClock> clock = std::make_shared<FakeClock>();
  std::shared_ptr<MemoryStore> store = std::make_shared<MemoryStore>();
  std::shared_ptr<Spawned> spawned = std::make_shared<Spawned>();
  ControllerOptions options;
  caf::actor controller;
  caf::actor agent;

  Fixture() {
    options.tick_interval_s = 0.25;  // exact in binary: ticks add up exactly
    options.recovery_window_s = 3.0;
    options.proxy_health_period_s = 1.0;
    options.proxy_health_timeout_s = 0.5;
    options.proxy_unhealthy_after = 3;
    agent = sys.spawn(fake_agent, spawned);
  }

  ~Fixture() override {
    for (auto& a : spawned->replicas)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    for (auto& a : {controller, agent}) {
      if (a)
        caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    }
    sched.run();
  }

  void start() {
    controller = caf::actor_cast<caf::actor>(spawn_controller(sys, options, store, clock));
    sched.run();
  }

  // Sends `xs` from the test's own actor, runs every actor until idle, and
  // returns the controller's answer.
  template <class... Ts>
  caf::message call(Ts&&... xs) {
    self->send(controller, std::forward<Ts>(xs)...);
    sched.run();
    // Every answer type the tests expect.
    caf::message answer;
    self->receive([&](uint64_t x) { answer = caf::make_message(x); },
                  [&](bool b, uint64_t x) { answer = caf::make_message(b, x); },
                  [&](uint64_t x, uint64_t y) { answer = caf::make_message(x, y); },
                  [&](std::string& x) { answer = caf::make_message(std::move(x)); },
                  [&](std::vector<NodeStatus>& x) { answer = caf::make_message(std::move(x)); },
                  [&](caf::error& x) { answer = caf::make_message(std::move(x)); },
                  caf::after(std::chrono::seconds(0)) >> [] { FAIL("no answer"); });
    return answer;
  }

  caf::message register_node() {
    troupe::NodeInfo info{"n1", "127.0.0.1", 8001, "cpu=4", 4242, kProtocolVersion};
    return call(register_atom::value, info, agent, std::vector<HostedReplicaInfo>{}, Credential{});
  }

  caf::message deploy(const ApplicationSpec& app) {
    return call(deploy_atom::value, encode_application(app), Credential{});
  }

  nlohmann::json status() {
    auto m = call(status_atom::value);
    REQUIRE(m.match_elements<std::string>());
    return nlohmann::json::parse(m.get_as<std::string>(0));
  }

  std::string proxy_column() {
    auto m = call(nodes_atom::value);
    REQUIRE(m.match_elements<std::vector<NodeStatus>>());
    for (const auto& n : m.get_as<std::vector<NodeStatus>>(0)) {
      if (n.id == "n1")
        return n.proxy;
    }
    return "?";
  }

  std::string node_state() {
    auto m = call(nodes_atom::value);
    REQUIRE(m.match_elements<std::vector<NodeStatus>>());
    for (const auto& n : m.get_as<std::vector<NodeStatus>>(0)) {
      if (n.id == "n1")
        return n.state;
    }
    return "?";
  }

  // One controller tick: the fake clock and CAF's clock move together.
  void tick() {
    clock->advance(options.tick_interval_s);
    sched.advance_time(seconds_as(options.tick_interval_s));
    sched.run();
  }
};

// The error an answer carries, or "" for none.
std::string error_of(const caf::message& m) {
  if (!m.match_elements<caf::error>())
    return "";
  return from_caf_error(m.get_as<caf::error>(0)).message();
}

}  // namespace

TEST_CASE("wiring: a deploy makes the node's agent spawn the replica") {
  Fixture f;
  f.start();
  auto reg = f.register_node();
  REQUIRE(reg.match_elements<uint64_t>());
  auto d = make_deployment("D", 1);
  auto answer = f.deploy(make_app("a", "/a", {d}));
  REQUIRE(answer.match_elements<bool, uint64_t>());
  CHECK(answer.get_as<bool>(0));
  REQUIRE(f.spawned->specs.size() == 1);
  const auto& spec = f.spawned->specs.front();
  CHECK(spec.app == "a");
  CHECK(spec.deployment == "D");
  CHECK(spec.import_path == d.import_path);
  CHECK(spec.code_version.rfind("v1-", 0) == 0);  // "v1-<hash of the spec>"
  // The replica constructed; the controller reports it running with the
  // start time it gave.
  auto s = f.status();
  const auto& replica = s["applications"]["a"]["deployments"]["D"]["replicas"].at(0);
  CHECK(replica["id"] == spec.replica_id);
  CHECK(replica["node"] == "n1");
  CHECK(replica["state"] == "RUNNING");
  CHECK(replica["started"] == 1700000000.0);
  CHECK(s["recovering"] == false);
}

TEST_CASE("wiring: requests for replicas beyond the cap wait for answers - every replica starts") {
  Fixture f;
  f.options.max_replica_requests = 2;
  auto held = std::make_shared<HeldSpawns>();
  caf::anon_send_exit(f.agent, caf::exit_reason::user_shutdown);
  f.agent = f.sys.spawn(holding_agent, held);
  f.start();
  REQUIRE(f.register_node().match_elements<uint64_t>());
  auto answer = f.deploy(make_app("a", "/a", {make_deployment("D", 5)}));
  REQUIRE(answer.match_elements<bool, uint64_t>());
  // Two spawns asked; the other three wait for answers.
  CHECK(held->asked == 2);
  CHECK(held->pending.size() == 2);
  // Each release answers the spawns held; their replicas initialize (those
  // requests count too), and only then do the next spawns go.
  for (int round = 0; round < 10 && !held->pending.empty(); ++round) {
    f.self->send(f.agent, caf::ok_atom::value);
    f.sched.run();
  }
  CHECK(held->pending.empty());
  CHECK(held->asked == 5);
  CHECK(held->most == 2);
  std::set<std::string> ids;
  for (const auto& r : held->replicas)
    ids.insert(caf::to_string(r.address()));
  CHECK(ids.size() == 5);
  auto s = f.status();
  const auto& replicas = s["applications"]["a"]["deployments"]["D"]["replicas"];
  REQUIRE(replicas.size() == 5);
  for (const auto& r : replicas)
    CHECK(r["state"] == "RUNNING");
  for (auto& a : held->replicas)
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

TEST_CASE("wiring: a deploy above the limits is refused and spawns nothing") {
  Fixture f;
  f.options.limits.max_replicas_per_deployment = 2;
  f.start();
  f.register_node();
  auto answer = f.deploy(make_app("a", "/a", {make_deployment("D", 3)}));
  CHECK(error_of(answer).find("asks for 3 replicas") != std::string::npos);
  CHECK(f.spawned->specs.empty());
}

namespace {

// A controller starting on a checkpoint with one deployment of one replica:
// it recovers first.
void start_on_checkpoint(Fixture& f) {
  TargetState saved;
  saved.generation = 1;
  saved.applications["a"] = make_app("a", "/a", {make_deployment("D", 1)});
  f.store->saved = saved;
  f.start();
}

}  // namespace

TEST_CASE("wiring: after a restart calls are refused until the recovery window ends") {
  Fixture f;
  start_on_checkpoint(f);
  f.register_node();
  CHECK(f.status()["recovering"] == true);
  CHECK(error_of(f.deploy(make_app("b", "/b", {make_deployment("E", 1)}))) ==
        "the controller is recovering its state after a restart; retry in a few seconds");
  CHECK(f.spawned->specs.empty());  // nothing started while collecting
  // The window ends on CAF's clock (its own message) or on the controller's
  // (the next tick), whichever comes first.
  f.clock->advance(f.options.recovery_window_s);
  f.sched.advance_time(seconds_as(f.options.recovery_window_s));
  f.sched.run();
  CHECK(f.status()["recovering"] == false);
  // The node hosted nothing: the checkpointed deployment starts its replica.
  REQUIRE(f.spawned->specs.size() == 1);
  CHECK(f.spawned->specs.front().deployment == "D");
}

TEST_CASE("wiring: a node registering late in the recovery window moves the window's end") {
  Fixture f;
  start_on_checkpoint(f);
  auto advance = [&](double s) {
    f.clock->advance(s);
    f.sched.advance_time(seconds_as(s));
    f.sched.run();
  };
  advance(2.0);
  f.register_node();  // 2 s in: the window (3 s) now ends 3 s from here
  advance(1.5);       // past the first end, and the window's own message
  CHECK(f.status()["recovering"] == true);
  CHECK(f.spawned->specs.empty());
  advance(1.0);
  CHECK(f.status()["recovering"] == true);
  advance(0.6);
  CHECK(f.status()["recovering"] == false);
  REQUIRE(f.spawned->specs.size() == 1);
  CHECK(f.spawned->specs.front().deployment == "D");
}

TEST_CASE("wiring: a proxy failing its health checks is killed after the limit") {
  Fixture f;
  f.start();
  f.register_node();
  auto healthy = std::make_shared<bool>(true);
  auto proxy = f.sys.spawn(fake_proxy, healthy);
  f.self->send(f.controller, subscribe_atom::value, caf::actor_cast<ProxyActor>(proxy),
               uint64_t{0}, uint64_t{0},
               std::string("n1"));
  f.sched.run();
  CHECK(f.proxy_column() == "STARTING");
  f.tick();  // the first check, answered at once
  CHECK(f.proxy_column() == "HEALTHY");
  f.self->monitor(proxy);
  *healthy = false;
  // One check per period (1 s; the last one settled at 0.25 s): the
  // failures at 1.25 s and 2.25 s stay below the limit of three.
  for (int i = 0; i < 8; ++i)
    f.tick();
  CHECK(f.proxy_column() == "HEALTHY");
  for (int i = 0; i < 3; ++i)
    f.tick();
  CHECK(f.proxy_column() == "HEALTHY");
  f.tick();  // 3.25 s: the third failure
  bool down = false;
  f.self->receive([&](caf::down_msg& dm) { down = dm.reason == caf::exit_reason::kill; },
                  caf::after(std::chrono::seconds(0)) >> [] {});
  CHECK(down);
  CHECK(f.proxy_column() == "NONE");
}

TEST_CASE("wiring: a replica that dies is reported to the core and replaced") {
  Fixture f;
  f.start();
  f.register_node();
  f.deploy(make_app("a", "/a", {make_deployment("D", 1)}));
  REQUIRE(f.spawned->replicas.size() == 1);
  auto first = f.spawned->specs.front().replica_id;
  // Its node was told to health-check it, with the deployment's period.
  f.tick();
  REQUIRE(f.spawned->watches.size() == 1);
  CHECK(std::get<0>(f.spawned->watches[0]) == first);
  CHECK(std::get<2>(f.spawned->watches[0]) == 10.0);
  caf::anon_send_exit(f.spawned->replicas.front(), caf::exit_reason::kill);
  f.sched.run();  // the controller's down handler reports the crash and reconciles
  f.tick();       // the core replaces it at once or at the next tick
  REQUIRE(f.spawned->specs.size() == 2);
  CHECK(f.spawned->specs.back().replica_id != first);
  auto replicas = f.status()["applications"]["a"]["deployments"]["D"]["replicas"];
  REQUIRE(replicas.size() == 1);
  CHECK(replicas.at(0)["id"] == f.spawned->specs.back().replica_id);
  CHECK(replicas.at(0)["state"] == "RUNNING");
}

TEST_CASE("wiring: an agent that dies alone leaves its node ALIVE - a lost connection does not") {
  Fixture f;
  f.start();
  f.register_node();
  caf::anon_send_exit(f.agent, caf::exit_reason::kill);
  f.sched.run();  // the down notice
  CHECK(f.node_state() == "ALIVE");
  // The node's keeper starts a new agent, which registers again.
  f.agent = f.sys.spawn(fake_agent, f.spawned);
  REQUIRE(f.register_node().match_elements<uint64_t>());
  caf::anon_send_exit(f.agent, caf::exit_reason::remote_link_unreachable);
  f.sched.run();
  CHECK(f.node_state() == "DEAD");
}

TEST_CASE("wiring: kill answers what it cannot find and kills what it can") {
  Fixture f;
  f.start();
  f.register_node();
  CHECK(error_of(f.call(kill_atom::value, std::string("node"), std::string("n1"), Credential{})) ==
        "kill: unknown kind 'node'; expected replica, proxy, agent or controller");
  CHECK(error_of(f.call(kill_atom::value, std::string("replica"), std::string("a#D#1"),
                        Credential{})) == "no replica 'a#D#1'");
  f.self->monitor(f.agent);
  f.self->send(f.controller, kill_atom::value, std::string("agent"), std::string("n1"),
               Credential{});
  f.sched.run();
  bool ok = false;
  bool killed = false;
  for (int i = 0; i < 2; ++i) {
    f.self->receive([&](caf::ok_atom) { ok = true; },
                    [&](caf::down_msg& dm) { killed = dm.reason == caf::exit_reason::kill; },
                    caf::after(std::chrono::seconds(0)) >> [] {});
  }
  CHECK(ok);
  CHECK(killed);
}

TEST_CASE("wiring: a rollback deploys the last good declaration again") {
  Fixture f;
  f.start();
  f.register_node();
  const auto v1 = make_app("a", "/a", {make_deployment("D", 1)});
  REQUIRE(f.deploy(v1).match_elements<bool, uint64_t>());
  for (int i = 0; i < 40 && !(f.store->saved && f.store->saved->last_running.count("a")); ++i)
    f.tick();
  REQUIRE(f.store->saved->last_running.count("a") == 1);
  CHECK(error_of(f.call(rollback_atom::value, std::string("a"), Credential{})) ==
        "applications[a]: application 'a' is already at its last good declaration (generation "
        "1): there is nothing to roll back");

  auto v2 = v1;
  v2.deployments[0].code_version = "v2";
  v2.deployments[0].init_args = "fail";  // never runs
  REQUIRE(f.deploy(v2).match_elements<bool, uint64_t>());
  f.tick();
  const auto spawns = f.spawned->specs.size();
  auto answer = f.call(rollback_atom::value, std::string("a"), Credential{});
  REQUIRE_MESSAGE((answer.match_elements<uint64_t, uint64_t>()), error_of(answer));
  CHECK(answer.get_as<uint64_t>(0) == 3);  // the new generation
  CHECK(answer.get_as<uint64_t>(1) == 1);  // the last good declaration's
  CHECK(f.store->saved->generation == 3);
  CHECK(f.store->saved->applications.at("a") == v1);
  // The first replica kept running; none of v2 is asked for again.
  for (size_t i = spawns; i < f.spawned->specs.size(); ++i)
    CHECK(f.spawned->specs[i].code_version.rfind("v1-", 0) == 0);
  CHECK(f.status()["generation"] == 3);

  CHECK(error_of(f.call(rollback_atom::value, std::string("nope"), Credential{})) ==
        "applications[nope]: \"nope\" is not a known application");
}
