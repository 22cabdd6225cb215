// The replica's control thread (internal to replica/): a detached actor that
// runs the user's constructor, reconfigure() and check_health(), so user code
// never blocks the replica actor.
//   (initialize)                 -> (Instance)  constructs it once (and
//                                   reconfigure(user_config)); idempotent
//   (reconfigure, string config) -> (ok)
//   (health)                     -> (ok)        error: unhealthy
// Errors: errc::unavailable before the constructor ran, errc::internal for
// what user code throws, errc::invalid_argument for malformed JSON.
#pragma once

#include <caf/stateful_actor.hpp>

#include "replica/instance.hpp"
#include "replica/replica_actor.hpp"

namespace troupe::replica {

struct ControlState {
  Instance instance;
  static inline const char* name = "troupe.replica.control";
};

caf::behavior control_worker(caf::stateful_actor<ControlState>* self, ReplicaOptions o);

}  // namespace troupe::replica
