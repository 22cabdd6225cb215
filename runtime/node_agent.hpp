// The node agent: one per troupe-node process. It registers the node with the
// controller (sending its own handle and the replicas it hosts), heartbeats,
// reconnects with exponential backoff whenever the controller goes away, and
// spawns, lists and stops the replicas of its node.
//
// Interface:
//   (spawnrep, ReplicaSpec)            -> (actor)  spawns the replica (not yet
//                                         initialized); idempotent per id
//   (listrep)                          -> (vector<HostedReplicaInfo>)
//   (stop, string replica_id, double timeout_s) -> (ok)  graceful stop; the
//                                         agent kills it after the timeout,
//                                         even if the controller is gone
//   (killrep, string replica_id)       -> (ok)  terminate at once
//   (shutdown, double grace_s)         -> (ok)  stops every replica
//                                         gracefully, then deregisters
//   (metrics, string replica_id, double) from replicas: forwarded to the
//                                         controller with the node id
#pragma once

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <memory>
#include <optional>

#include "runtime/address.hpp"
#include "runtime/security/credentials.hpp"
#include "runtime/wire.hpp"

namespace troupe {

class HandleTransport;
class PluginLoader;

struct AgentOptions {
  NodeInfo info;
  // Exactly one of: the head's controller supervisor in this process (asked
  // for the current controller with `get`), or the endpoint where the
  // controller is published (worker node).
  caf::actor local_supervisor;
  Endpoint controller_endpoint;
  double heartbeat_interval_s = 1.0;
  double request_timeout_s = 2.0;
  double initial_backoff_s = 0.1;
  double max_backoff_s = 5.0;
  // Resolves import paths for the replicas of this node.
  std::shared_ptr<PluginLoader> loader;
  // The keeper of this node's HTTP proxy (may be empty). Every time the node
  // registers, the agent sends it (subscribe, controller), and the keeper
  // subscribes the current proxy actor, so the proxy gets a full snapshot
  // after every controller restart, also after a restart of the proxy actor.
  caf::actor proxy;
  // With TLS: this node's certificate, to sign register/heartbeat/deregister.
  std::optional<security::Identity> identity;
  // Given to every replica for its deployment handles (through this node's
  // proxy, see replica/handle_transport.hpp). May be empty.
  std::shared_ptr<const HandleTransport> handles;
};

// Spawns the agent under a keeper and returns the keeper: when the agent
// actor dies of anything but a requested stop (e.g. `troupectl kill agent`),
// the keeper starts a new one with the replicas the old one hosted (they keep
// running; the new agent monitors them, registers and reports them, so the
// controller adopts them). The keeper takes (shutdown, grace_s) -> (ok) and
// forwards it to the current agent; an exit message to the keeper stops the
// agent too; (get) -> the current agent (tests).
caf::actor spawn_node_agent(caf::actor_system& sys, const AgentOptions& options);

}  // namespace troupe
