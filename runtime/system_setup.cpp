#include "runtime/system_setup.hpp"

#include <chrono>

#include <caf/io/middleman.hpp>
#include <caf/timespan.hpp>

#include "runtime/wire.hpp"

namespace troupe {

namespace {

caf::timespan seconds(double s) {
  return std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(s));
}

}  // namespace

void configure_actor_system(caf::actor_system_config& cfg, const TransportOptions& transport) {
  cfg.load<caf::io::middleman>();
  register_wire_types(cfg);
  cfg.set("middleman.heartbeat-interval", seconds(transport.heartbeat_interval_s));
  cfg.set("middleman.connection-timeout", seconds(transport.connection_timeout_s));
  // Debian's CAF has no logger compiled in; keep its console output quiet.
  cfg.set("logger.console", caf::atom("none"));
}

}  // namespace troupe
