// How the controller executes the core's commands: which actor it asks, or
// which event the core gets back at once when that actor is not there.
#include "controller/shell/command_plan.hpp"

#include <doctest/doctest.h>

#include "tests/controller/fakes.hpp"

using namespace troupe;
using namespace troupe::controller;
using namespace troupe::controller::testing;

namespace {

Command command(CommandKind kind) {
  Command c;
  c.kind = kind;
  c.replica_id = "a#D#1";
  c.node_id = "n1";
  return c;
}

std::string plan(CommandKind kind, bool agent, bool replica) {
  return to_string(plan_command(command(kind), agent, replica));
}

}  // namespace

TEST_CASE("commands: start goes to the node's agent - or fails at once without one") {
  CHECK(plan(CommandKind::start, true, false) == std::string("spawn"));
  CHECK(plan(CommandKind::start, false, false) == std::string("no_agent"));
}

TEST_CASE("commands: requests to a replica need its actor - else it crashed") {
  CHECK(plan(CommandKind::reconfigure, true, true) == std::string("reconfigure"));
  CHECK(plan(CommandKind::recover, false, true) == std::string("query_version"));
  for (auto kind : {CommandKind::reconfigure, CommandKind::recover}) {
    CHECK(plan(kind, true, false) == std::string("replica_gone"));
    CHECK(plan(kind, false, false) == std::string("replica_gone"));
  }
}

TEST_CASE("commands: a health watch goes to the node's agent - without one it waits for the node") {
  // The node checks the replica, whether or not the controller holds its
  // handle; a node without an agent gets the watch again when it registers.
  for (bool replica : {true, false}) {
    CHECK(plan(CommandKind::watch_health, true, replica) == std::string("watch_health"));
    CHECK(plan(CommandKind::watch_health, false, replica) == std::string("awaiting_node"));
  }
}

TEST_CASE("commands: stop and kill go through the agent - else straight to the replica") {
  CHECK(plan(CommandKind::stop, true, true) == std::string("stop_via_agent"));
  CHECK(plan(CommandKind::kill, true, true) == std::string("kill_via_agent"));
  CHECK(plan(CommandKind::stop, false, true) == std::string("exit_replica"));
  CHECK(plan(CommandKind::kill, false, true) == std::string("exit_replica"));
  // Never spawned or gone already: stopped now, whether or not the agent is.
  for (bool agent : {true, false}) {
    CHECK(plan(CommandKind::stop, agent, false) == std::string("already_gone"));
    CHECK(plan(CommandKind::kill, agent, false) == std::string("already_gone"));
  }
}

TEST_CASE("commands: a start carries the deployment's spec to the agent") {
  auto d = make_deployment("D", 2, "v7");
  d.init_args = R"({"x":1})";
  d.config.max_ongoing_requests = 9;
  d.config.memory_limit_bytes = 1 << 20;
  Command c = command(CommandKind::start);
  c.app = "a";
  c.deployment = "D";
  c.spec = std::make_shared<const DeploymentSpec>(d);
  c.version = ReplicaVersion{"v7", R"({"k":2})", ""};
  ReplicaSpec s = wire_spec(c);
  CHECK(s.replica_id == "a#D#1");
  CHECK(s.app == "a");
  CHECK(s.deployment == "D");
  CHECK(s.import_path == "libexamples.so:D");
  CHECK(s.init_args == R"({"x":1})");
  CHECK(s.code_version == "v7");
  CHECK(s.user_config == R"({"k":2})");
  CHECK(s.max_ongoing_requests == 9);
  CHECK(s.metrics_interval_s == 10.0);  // no autoscaling
  CHECK(s.isolation == to_string(d.config.isolation));
  CHECK(s.memory_limit_bytes == (1u << 20));

  d.config.autoscaling_config = AutoscalingConfig{};
  d.config.autoscaling_config->metrics_interval_s = 0.5;
  c.spec = std::make_shared<const DeploymentSpec>(d);
  CHECK(wire_spec(c).metrics_interval_s == 0.5);
}

TEST_CASE("command plan: the stuck threshold a replica starts with") {
  auto d = make_deployment("D", 1);
  Command c = command(CommandKind::start);
  c.spec = std::make_shared<const DeploymentSpec>(d);
  // Derived: 3 request timeouts, at least 30 s; none without a request timeout.
  CHECK(wire_spec(c).stuck_after_s == 0);
  CHECK(wire_spec(c, 0).stuck_after_s == 0);
  CHECK(wire_spec(c, 2).stuck_after_s == 30);
  CHECK(wire_spec(c, 10).stuck_after_s == 30);
  CHECK(wire_spec(c, 25).stuck_after_s == 75);
  // Set by the deployment: as given, with or without a request timeout.
  d.config.stuck_after_s = 4;
  c.spec = std::make_shared<const DeploymentSpec>(d);
  CHECK(wire_spec(c).stuck_after_s == 4);
  CHECK(wire_spec(c, 25).stuck_after_s == 4);
}
