// Whether a TCP connection can be opened, asked before CAF is asked to
// connect.
//
// CAF 0.17 connects from its middleman actor with a blocking connect(). To a
// host that does not answer (a partition, a host that is off) that call
// waits until the kernel gives up on its SYNs, about two minutes, and every
// other connect of the process (to the controller, to other workers) waits
// behind it; even after the network heals, the connect in progress only
// succeeds at the kernel's next SYN retry, seconds later. A probe with a
// short deadline, on a thread of its own, keeps all of that out of the
// middleman: CAF is asked only once the peer has just answered.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

namespace troupe {

// Opens a TCP connection to host:port and closes it at once: "" when it
// opened within `timeout`, else why not. Blocks the calling thread.
std::string tcp_probe(const std::string& host, uint16_t port, std::chrono::milliseconds timeout);

// A detached actor that answers one `probe_atom` with tcp_probe(host, port,
// timeout), then quits. Request it with a deadline above `timeout`.
caf::actor spawn_tcp_probe(caf::actor_system& sys, std::string host, uint16_t port,
                           std::chrono::milliseconds timeout);

}  // namespace troupe
