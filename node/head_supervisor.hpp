// The head node's supervisor of the controller actor. It spawns the
// controller and publishes it on the head's port; when the controller dies
// for any reason other than a requested shutdown it spawns a new one over the
// same checkpoint and publishes it on the same port. The new controller
// recovers from the checkpoint and adopts the replicas the re-registering
// nodes report: healthy replicas are never restarted. A controller that keeps
// dying (e.g. its recovery fails every time) is not restarted forever: past
// the restart policy the supervisor gives up (runtime/keeper.hpp).
//
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "controller/controller_actor.hpp"
#include "node/node_agent.hpp"
#include "runtime/keeper.hpp"
#include "runtime/status.hpp"

namespace troupe {

namespace controller {
class CheckpointStore;
}

// (get) -> the current controller, or an error while none runs (the head's
// node agent asks it); (shutdown) -> (ok) stops the controller for good.
using HeadSupervisorActor =
    ControllerSourceActor::extend<caf::replies_to<shutdown_atom>::with<caf::ok_atom>>;

struct SupervisorOptions {
  controller::ControllerOptions controller;
  std::shared_ptr<controller::CheckpointStore> store;
  std::string bind;
  uint16_t port = 0;
  // Restarts of a controller that died: at most restart_policy.max_restarts
  // within its window, at least min_interval apart. Then the supervisor gives
  // up: it logs the message (naming the controller and its last exit reason),
  // calls `on_give_up` with it (from the supervisor's thread; troupe-node
  // then stops and exits with an error) and quits.
  RestartPolicy restart_policy;
  std::function<void(const std::string&)> on_give_up;
};

// Spawns the supervisor and the first controller, and publishes it (blocking,
// for main). A port that cannot be opened is an error; nothing is left
// running then.
Result<HeadSupervisorActor> start_head_supervisor(caf::actor_system& sys, const SupervisorOptions& options);

}  // namespace troupe
