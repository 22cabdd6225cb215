// The node agent: one per troupe-node process. It registers the node with the
// controller (sending its own handle), heartbeats, and reconnects with
// exponential backoff whenever the controller goes away. Later it also
// spawns, lists and stops the replicas of its node.
//
// Interface:
//   (shutdown) -> (ok)   deregisters (bounded by the request timeout), then
//                        answers; the caller then stops the actor.
#pragma once

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "runtime/address.hpp"
#include "runtime/wire.hpp"

namespace troupe {

struct AgentOptions {
  NodeInfo info;
  // Exactly one of: the controller in this process (head node), or the
  // endpoint where it is published (worker node).
  caf::actor local_controller;
  Endpoint controller_endpoint;
  double heartbeat_interval_s = 1.0;
  double request_timeout_s = 2.0;
  double initial_backoff_s = 0.1;
  double max_backoff_s = 5.0;
};

caf::actor spawn_node_agent(caf::actor_system& sys, const AgentOptions& options);

}  // namespace troupe
