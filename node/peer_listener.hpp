// A worker's peer listener: the CAF port other workers connect to, so that
// their requests to this node's replicas travel over a direct connection
// instead of through the head (docs/architecture.md, "Worker to worker").
// The one actor published there answers the node's id and nothing else; the
// listener speaks TLS when the node does, like the head's port.
#pragma once

#include <cstdint>
#include <string>

#include <caf/actor_system.hpp>

#include "runtime/status.hpp"
#include "runtime/wire.hpp"

namespace troupe::node {

struct PeerListener {
  PeerActor actor;
  uint16_t port = 0;  // the port it got (the one asked for, or the kernel's)
};

// Spawns the peer actor and publishes it on bind:port (0: any free port).
// The actor answers data_port_atom with `data_port` and `data_token`: this
// node's proxy's data port (0: none) and the token it wants.
// Blocks the calling thread (not for actors). On failure nothing is left
// running and the status names the address.
Result<PeerListener> open_peer_listener(caf::actor_system& sys, const std::string& node_id,
                                        const std::string& bind, uint16_t port,
                                        uint16_t data_port = 0, std::string data_token = {});

}  // namespace troupe::node
