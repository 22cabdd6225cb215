// The node agent's wiring (node/node_agent.cpp) under CAF's deterministic
// test scheduler: messages run only when the test says so and timers only
// when it fires them. A head's agent gets its controller from a fake
// supervisor; a fake controller records what the agent asks and answers as
// the test wants. Its decisions are unit-tested in controller_session_test
// and hosted_replicas_test; this checks that the actor acts on them: it
// registers with its controller, heartbeats on the clock, registers again
// when the controller does not know the node, tries again after a refused
// registration, and finds the next controller when its controller dies.
#define CAF_TEST_NO_MAIN
#include <caf/test/unit_test_impl.hpp>

#include <caf/test/dsl.hpp>

#include <memory>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "node/node_agent.hpp"
#include "runtime/status.hpp"
#include "runtime/wire.hpp"

using namespace troupe;

namespace {

struct WiringConfig : caf::actor_system_config {
  WiringConfig() { register_wire_types(*this); }
};

// What a fake controller saw, and how it answers.
struct Seen {
  std::vector<std::string> registered;  // node ids, in order
  std::vector<caf::actor> agents;       // the handle each registration sent
  int heartbeats = 0;
  // Per heartbeat, the replica ids of the loads it carried.
  std::vector<std::vector<std::string>> loads;
  // Per models message, the (replica, seq) of its lists.
  std::vector<std::vector<std::pair<std::string, uint64_t>>> models;
  bool refuse_register = false;       // answer registrations with an error
  bool forget_node = false;           // answer heartbeats with not_found
};

caf::behavior fake_controller(caf::event_based_actor* self, std::shared_ptr<Seen> seen,
                              uint64_t incarnation) {
  self->set_default_handler(caf::drop);
  return {
      [=](register_atom, const NodeInfo& info, const caf::actor& agent,
          const std::vector<HostedReplicaInfo>&, const Credential&) -> caf::result<uint64_t> {
        seen->registered.push_back(info.id);
        seen->agents.push_back(agent);
        if (seen->refuse_register)
          return to_caf_error(Status(errc::unavailable, "the controller is recovering"));
        return incarnation;
      },
      [=](heartbeat_atom, const std::string&, const std::vector<ReplicaLoad>& loads,
          const Credential&) -> caf::result<caf::ok_atom> {
        ++seen->heartbeats;
        std::vector<std::string> ids;
        for (const auto& l : loads)
          ids.push_back(l.replica_id);
        seen->loads.push_back(ids);
        if (seen->forget_node)
          return to_caf_error(Status(errc::not_found, "unknown node n1"));
        return caf::ok_atom::value;
      },
      [=](models_atom, const std::string&, const std::vector<ReplicaModels>& lists) {
        std::vector<std::pair<std::string, uint64_t>> got;
        for (const auto& l : lists)
          got.emplace_back(l.replica_id, l.seq);
        seen->models.push_back(got);
      },
  };
}

// The head's supervisor as the agent sees it: (get) -> the current
// controller, or an error while there is none.
caf::behavior fake_supervisor(caf::event_based_actor*, std::shared_ptr<caf::actor> current) {
  return {
      [=](caf::get_atom) -> caf::result<ControllerActor> {
        if (!*current)
          return to_caf_error(Status(errc::unavailable, "no controller runs"));
        return caf::actor_cast<ControllerActor>(*current);
      },
  };
}

struct Fixture : test_coordinator_fixture<WiringConfig> {
  std::shared_ptr<Seen> seen = std::make_shared<Seen>();
  std::shared_ptr<caf::actor> current = std::make_shared<caf::actor>();
  caf::actor supervisor;
  AgentKeeperActor keeper;

  Fixture() {
    *current = sys.spawn(fake_controller, seen, uint64_t{1});
    supervisor = sys.spawn(fake_supervisor, current);
  }

  void start_agent() {
    AgentOptions o;
    o.info.id = "n1";
    o.info.host = "127.0.0.1";
    o.local_supervisor = caf::actor_cast<ControllerSourceActor>(supervisor);
    o.heartbeat_interval_s = 1.0;
    o.initial_backoff_s = 0.1;
    o.max_backoff_s = 1.0;
    keeper = spawn_node_agent(sys, o);
    sched.run();
  }

  // Fires the timers that are due one after the other (each run to idle)
  // until `done`, at most `rounds` times.
  template <class F>
  bool fire_until(F done, int rounds = 20) {
    for (int i = 0; i < rounds && !done(); ++i) {
      sched.trigger_timeout();
      sched.run();
    }
    return done();
  }

  ~Fixture() override {
    if (keeper)
      caf::anon_send_exit(keeper, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(supervisor, caf::exit_reason::user_shutdown);
    if (*current)
      caf::anon_send_exit(*current, caf::exit_reason::user_shutdown);
    sched.run();
  }
};

}  // namespace

TEST_CASE_FIXTURE(Fixture, "agent wiring: it registers with its head's controller and then heartbeats on the clock") {
  start_agent();
  REQUIRE(seen->registered == std::vector<std::string>{"n1"});
  REQUIRE(seen->agents.size() == 1);
  CHECK(seen->agents[0]);  // its own handle, for the controller's requests
  CHECK(seen->heartbeats == 0);
  REQUIRE(fire_until([&] { return seen->heartbeats == 2; }));
  CHECK(seen->registered.size() == 1);  // registered once: heartbeats keep it
}

TEST_CASE_FIXTURE(Fixture, "agent wiring: a controller that does not know the node gets a registration again") {
  start_agent();
  REQUIRE(seen->registered.size() == 1);
  seen->forget_node = true;  // a controller that lost the node (restored an older state)
  REQUIRE(fire_until([&] { return seen->registered.size() == 2; }));
  CHECK(seen->heartbeats >= 1);
  CHECK(seen->registered[1] == "n1");
}

TEST_CASE_FIXTURE(Fixture, "agent wiring: a refused registration is tried again after the backoff") {
  seen->refuse_register = true;
  start_agent();
  REQUIRE(seen->registered.size() == 1);
  CHECK(seen->heartbeats == 0);  // not registered: no heartbeat
  seen->refuse_register = false;
  REQUIRE(fire_until([&] { return seen->registered.size() == 2; }));
  // Registered now: heartbeats follow.
  REQUIRE(fire_until([&] { return seen->heartbeats >= 1; }));
}

TEST_CASE_FIXTURE(Fixture, "agent wiring: when its controller dies it registers with the next one") {
  start_agent();
  REQUIRE(seen->registered.size() == 1);
  auto first = *current;
  auto next_seen = std::make_shared<Seen>();
  *current = caf::actor();  // none runs for a while: the agent keeps asking
  caf::anon_send_exit(first, caf::exit_reason::kill);
  sched.run();
  for (int i = 0; i < 3; ++i) {
    sched.trigger_timeout();
    sched.run();
  }
  CHECK(seen->registered.size() == 1);
  *current = sys.spawn(fake_controller, next_seen, uint64_t{2});
  REQUIRE(fire_until([&] { return next_seen->registered.size() == 1; }));
  CHECK(next_seen->registered[0] == "n1");
  REQUIRE(fire_until([&] { return next_seen->heartbeats >= 1; }));
}

TEST_CASE_FIXTURE(Fixture,
                  "agent wiring: its replicas' loads ride on the next heartbeat and their model "
                  "lists go together") {
  start_agent();
  REQUIRE(seen->registered.size() == 1);
  // Three load reports of two replicas between two heartbeats, as replicas
  // send them to the node (through its keeper).
  caf::anon_send(keeper, metrics_atom::value, ReplicaLoad{"a#D#1", 1.0, 10});
  caf::anon_send(keeper, metrics_atom::value, ReplicaLoad{"a#D#2", 2.0, 20});
  caf::anon_send(keeper, metrics_atom::value, ReplicaLoad{"a#D#1", 1.5, 30});
  sched.run();
  CHECK(seen->heartbeats == 0);  // nothing went to the controller on its own
  REQUIRE(fire_until([&] { return seen->heartbeats == 1; }));
  CHECK(seen->loads[0] == std::vector<std::string>{"a#D#1", "a#D#2", "a#D#1"});
  // The next heartbeat carries only what came after.
  REQUIRE(fire_until([&] { return seen->heartbeats == 2; }));
  CHECK(seen->loads[1].empty());
  // Model lists of two replicas (one of them twice): one message with the
  // newest list of each, after the short window.
  caf::anon_send(keeper, models_atom::value, std::string("a#D#1"), uint64_t{1},
                 std::vector<std::string>{"m1"});
  caf::anon_send(keeper, models_atom::value, std::string("a#D#2"), uint64_t{4},
                 std::vector<std::string>{"m2"});
  caf::anon_send(keeper, models_atom::value, std::string("a#D#1"), uint64_t{2},
                 std::vector<std::string>{"m1", "m3"});
  sched.run();
  CHECK(seen->models.empty());
  REQUIRE(fire_until([&] { return !seen->models.empty(); }));
  REQUIRE(seen->models.size() == 1);
  CHECK(seen->models[0] ==
        std::vector<std::pair<std::string, uint64_t>>{{"a#D#1", 2}, {"a#D#2", 4}});
}
