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
#include <caf/atom.hpp>

#include "controller/controller_actor.hpp"
#include "node/node_agent.hpp"
#include "runtime/keeper.hpp"
#include "runtime/keeper_actor.hpp"
#include "runtime/status.hpp"

namespace spdlog {
class logger;
}

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
Result<HeadSupervisorActor> start_head_supervisor(caf::actor_system& sys,
                                                  const SupervisorOptions& options);

// -- shared with the highly available head (node/ha_head.cpp) --------------

// What a head publishes on its port, and what is said then.
struct Publisher {
  std::string what = "controller";  // for the log
  std::string bind;
  uint16_t port = 0;
  // What the port should hold now: the controller the keeper runs (a head
  // candidate: its follower while it does not lead, node/ha_head.hpp).
  std::function<caf::actor()> current;
  std::function<void(uint16_t port)> on_published;
  std::shared_ptr<spdlog::logger> log;
  // Each publish_again() is a new round; the retries of an older one stop.
  uint64_t round = 0;
};

// The options of a head's controller keeper (the single head's and a head
// candidate's): restarts under `policy`, `on_give_up` when it gives up.
KeeperOptions controller_keeper_options(const RestartPolicy& policy,
                                        std::function<void(const std::string&)> on_give_up,
                                        std::shared_ptr<spdlog::logger> log);

// The publishing actor's own message: publish again (round, attempt).
using publish_retry_atom = caf::atom_constant<caf::atom("republish")>;

// Closes the port (it holds a dead or replaced actor) and publishes
// pub->current() on it. The port closes asynchronously in the middleman:
// while it is still taken the actor gets (publish_retry_atom, round,
// attempt + 1) 20 ms later, for 2 s; its handler calls publish_attempt().
void publish_again(caf::event_based_actor* self, const std::shared_ptr<Publisher>& pub);
void publish_attempt(caf::event_based_actor* self, const std::shared_ptr<Publisher>& pub,
                     uint64_t round, int attempt);

}  // namespace troupe
