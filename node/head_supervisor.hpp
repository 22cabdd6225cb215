// The head node's supervisor of the controller actor. It spawns the
// controller and publishes it on the head's port; when the controller dies
// for any reason other than a requested shutdown it spawns a new one over the
// same checkpoint and publishes it on the same port. The new controller
// recovers from the checkpoint and adopts the replicas the re-registering
// nodes report: healthy replicas are never restarted.
//
// Interface:
//   (get)                      -> (actor controller)  the current one, or an
//                                 error while none runs
//   (shutdown)                 -> (ok)  stops the controller for good
#pragma once

#include <memory>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "controller/controller_actor.hpp"
#include "runtime/status.hpp"

namespace troupe {

namespace controller {
class CheckpointStore;
}

struct SupervisorOptions {
  controller::ControllerOptions controller;
  std::shared_ptr<controller::CheckpointStore> store;
  std::string bind;
  uint16_t port = 0;
};

// Spawns the supervisor and the first controller, and publishes it (blocking,
// for main). A port that cannot be opened is an error; nothing is left
// running then.
Result<caf::actor> start_head_supervisor(caf::actor_system& sys, const SupervisorOptions& options);

}  // namespace troupe
