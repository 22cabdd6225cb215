// The controller actor: the thin shell around the controller's plain-C++
// logic. Messages in -> logic -> messages out. It runs on the head node and
// is published there for node agents and troupectl.
//
// Interface (all requests answer with an error of category "troupe" on
// failure, see runtime/wire.hpp):
//   (hello, uint32 version)              -> (hello, uint32 version, string role)
//   (register, NodeInfo, actor agent)    -> (uint64 incarnation)
//   (heartbeat, string node_id)          -> (ok)
//   (deregister, string node_id)         -> (ok)
//   (nodes)                              -> (vector<NodeStatus>)
//   (drain, string node_id)              -> (ok)
#pragma once

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

namespace troupe::controller {

struct ControllerOptions {
  double node_timeout_s = 5.0;
  // How often liveness is checked; a node is declared DEAD at most this long
  // after its timeout expired.
  double check_interval_s = 0.25;
};

caf::actor spawn_controller(caf::actor_system& sys, const ControllerOptions& options);

}  // namespace troupe::controller
