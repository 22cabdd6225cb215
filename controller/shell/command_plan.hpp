// How the actor shell executes the core's Commands, decided as plain code:
// which message goes where, or which event the core gets back at once when
// the actor a command needs is not there. The shell does the sending and
// feeds the answers back (see CommandKind for which event answers which).
#pragma once

#include "controller/core/commands.hpp"
#include "runtime/wire.hpp"

namespace troupe::controller {

enum class CommandAction {
  spawn,           // start: ask the node's agent to spawn the replica (then initialize it)
  no_agent,        // start on a node with no agent connected: on_replica_start_failed now
  reconfigure,     // ask the replica to apply the new user_config
  watch_health,    // ask the replica's node to health-check it
  query_version,   // recover: ask the replica what it runs
  replica_gone,    // reconfigure / recover of no known replica actor:
                   // on_replica_crashed now
  already_gone,    // stop / kill of a replica never spawned or already gone: forget it,
                   // on_replica_stopped now
  exit_replica,    // stop / kill on a node whose agent is gone: an exit(kill) to the
                   // replica (it dies with its node's connection anyway)
  stop_via_agent,  // the agent stops the replica gracefully (exit(kill) if that fails)
  kill_via_agent,  // the agent kills the replica process (exit(kill) if that fails)
  awaiting_node,   // reconfigure / recover of a replica whose handle went down with its
                   // node's connection in the controller's pause, before the node
                   // registered again, or watch_health for a node with no agent
                   // connected: nothing is sent (the node's registration sends the
                   // watches again)
};

const char* to_string(CommandAction a);

// `agent_connected`: the command's node has an agent; `replica_known`: the
// shell holds an actor handle for the command's replica.
CommandAction plan_command(const Command& cmd, bool agent_connected, bool replica_known);

// What a node agent needs to spawn the replica of a start command.
// `request_timeout_s`: the one in force (0: none), from which the replica's
// stuck threshold is derived unless the deployment sets stuck_after_s.
ReplicaSpec wire_spec(const Command& cmd, double request_timeout_s = 0);

// A deployment's batching fields as a replica takes them (at its start, and
// in place with a reconfigure).
BatchSettings batch_settings(const DeploymentConfig& config);

}  // namespace troupe::controller
