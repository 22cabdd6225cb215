// The replica gate: the one actor a node publishes for its replica processes,
// on 127.0.0.1 at a port the kernel picks. It takes exactly two messages and
// hands them to the node agent (through its keeper), which checks the
// one-time secret it wrote to the process's stdin (ReplicaGateActor,
// runtime/wire.hpp). Anything else is refused and logged. A local process that connects without
// the secret learns nothing and changes nothing (the agent logs the refusal).
// With --tls-dir the port speaks TLS, so a process without this cluster's
// certificate does not get through the handshake either (see
// docs/security.md for what CAF 0.17 exposes on a plain-text port).
#pragma once

#include <functional>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "runtime/wire.hpp"

namespace troupe::node {

// `agent_keeper` returns the node agent's keeper (empty while the node starts:
// the gate is published before the agent exists, to give it its port).
ReplicaGateActor spawn_replica_gate(caf::actor_system& sys,
                                    std::function<AgentKeeperActor()> agent_keeper);

}  // namespace troupe::node
