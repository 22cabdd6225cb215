// The controller actor: the thin shell around the controller's plain-C++
// logic (controller/core: the reconciler; controller/membership: nodes).
// Messages in -> logic -> messages out; one core update() per tick and after
// every state change. It runs on the head node and is published there for
// node agents and troupectl.
//
// Its interface is ControllerActor (runtime/wire.hpp) with the rollback call
// (ControllerRollbackActor, runtime/wire_rollback.hpp): every message it
// takes and answers, checked by the compiler at both ends.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "controller/controller_options.hpp"
#include "controller/core/clock.hpp"
#include "runtime/status.hpp"
#include "runtime/wire.hpp"

namespace troupe::controller {

class CheckpointStore;


// Opens the checkpoint under `state_dir` and checks that it can be read. A
// corrupt or unreadable checkpoint is an error naming the file: the
// controller must not start over it.
Result<std::unique_ptr<CheckpointStore>> open_checkpoint(const std::string& state_dir);

// `clock`: what liveness, proxy health checks and the recovery window are
// measured on; nullptr is the steady clock. Tests pass a fake one (with CAF's
// test scheduler, which runs timers on its own clock).
ControllerActor spawn_controller(caf::actor_system& sys, const ControllerOptions& options,
                                 std::shared_ptr<CheckpointStore> store,
                                 std::shared_ptr<const Clock> clock = nullptr);

}  // namespace troupe::controller
