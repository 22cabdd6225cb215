#include "runtime/system_setup.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include <caf/io/middleman.hpp>
#include <caf/timespan.hpp>

#include "runtime/time.hpp"
#include "runtime/wire.hpp"

namespace troupe {

void configure_actor_system(caf::actor_system_config& cfg, const TransportOptions& transport) {
  cfg.load<caf::io::middleman>();
  register_wire_types(cfg);
  cfg.set("middleman.heartbeat-interval", seconds_as(transport.heartbeat_interval_s));
  cfg.set("middleman.connection-timeout", seconds_as(transport.connection_timeout_s));
  // CAF's default is max(4, cores) polling workers per process; on small
  // machines several troupe processes then fight over the cores (measured:
  // +40-50 % proxy throughput on 2 cores with one worker per core).
  cfg.set("scheduler.max-threads",
          static_cast<size_t>(std::max(2u, std::thread::hardware_concurrency())));
  // Work sharing: idle workers block on a condition variable instead of
  // polling (CAF's default work stealing polls, with 50 us sleeps for 25 ms
  // after each job). troupe's hot paths run on io, multiplexer and request
  // threads, so polling workers only take CPU from them: measured +10-20 %
  // proxy throughput on 2 cores (docs/benchmarks.md).
  cfg.set("scheduler.policy", caf::atom("sharing"));
  // BASP hands each received message to a deserialization worker on the
  // scheduler (CAF's default: one on up to 7 cores), one more thread hop per
  // message. troupe's messages are small: deserialize them on the
  // multiplexer thread that read them.
  cfg.set("middleman.workers", size_t{0});
  // Debian's CAF has no logger compiled in; keep its console output quiet.
  cfg.set("logger.console", caf::atom("none"));
}

}  // namespace troupe
