// The actor system configuration every troupe binary starts from.
#pragma once

#include <caf/actor_system_config.hpp>

namespace troupe {

struct TransportOptions {
  // CAF's BASP heartbeats are off by default, so a frozen peer would go
  // unnoticed for minutes; troupe always turns them on.
  double heartbeat_interval_s = 1.0;
  double connection_timeout_s = 5.0;  // 0: never time a connection out
};

// Loads the network layer, registers every wire type and sets the transport's
// heartbeat and connection timeout.
void configure_actor_system(caf::actor_system_config& cfg, const TransportOptions& transport);

}  // namespace troupe
