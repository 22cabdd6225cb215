// How a replica process reaches its node without a port: the node's CAF
// connection to each replica process runs over an unnamed Unix socket pair.
//
// When it starts a replica process the node makes a "doorbell" for it: a
// SOCK_SEQPACKET socket pair whose one end the process inherits and nothing
// else holds. Whenever the process needs a connection (at its start, and
// again when the node dropped the one it had: a process frozen past the
// node's connection timeout), it rings (one byte); the node then makes a
// SOCK_STREAM socket pair, hands its own end to its BASP broker as a
// connection on which it publishes the replica gate (the broker sends its
// server handshake at once), and passes the other end through the doorbell
// (SCM_RIGHTS). The process hands it to its own BASP broker as a
// connection to a server; the handshake names the gate. The node offers a
// connection only when asked, so the broker's connection timeout runs from
// the moment the process is ready to speak. Nothing listens: no TCP port,
// no Unix socket name, so no other local process can reach the gate
// (tests/integration/fault_containment_test.cpp checks /proc/net).
//
// These sockets are private to the two processes, so they carry BASP in
// plain text even when the node's other connections speak TLS: a replica
// process needs no certificate and no key of the node.
#pragma once

#include <chrono>
#include <set>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>

#include "runtime/doorbell.hpp"
#include "runtime/status.hpp"

namespace troupe::gate_link {

// The node's side, when the process rang: a new connection for the process
// at the other end of `doorbell`, on which `gate` is published with the
// message types `sigs`.
Status offer_connection(caf::actor_system& sys, const caf::actor& gate,
                        const std::set<std::string>& sigs, int doorbell);

// The process's side: the BASP handshake over a descriptor taken from the
// doorbell; the actor the node published on it, or why not.
Result<caf::strong_actor_ptr> connect(caf::actor_system& sys, caf::scoped_actor& self, Fd fd,
                                      std::chrono::milliseconds timeout);

}  // namespace troupe::gate_link
