// The one keeper of troupe: an actor that keeps another one running. It
// starts the kept actor, forwards it every message it does not handle itself
// (with the sender and the request id, so the answer goes straight back), and
// when the kept actor dies of anything but a requested stop, starts a new one
// under a RestartPolicy (runtime/keeper.hpp). When the policy gives up, the
// keeper logs why, calls `on_give_up` and quits with that error.
//
// The node agent (node/node_agent.cpp), the head's controller
// (node/head_supervisor.cpp) and the proxy actor (proxy/proxy_actor.cpp) run
// under it; what differs between them is given as options, not written again.
//
// Callers hold the keeper's handle, which stays valid across restarts: each
// use site casts it to its typed interface (AgentKeeperActor,
// HeadSupervisorActor, ProxyKeeperActor). A message the kept actor does not
// understand is answered by the kept actor, as if sent to it directly.
//
// While no kept actor runs (it died and the restart waits out the policy's
// interval), a request is answered with `unavailable` and the keeper's
// `unavailable` text; an asynchronous message is kept for the next kept actor
// when `hold` says so, and dropped otherwise.
//
// Stopping: an exit message to the keeper (e.g. user_shutdown) stops the kept
// actor with the same reason and the keeper quits. A kept actor that stops on
// its own with user_shutdown, or after `stop()`, is not restarted, and the
// keeper quits with it.
#pragma once

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/message.hpp>
#include <caf/message_handler.hpp>
#include <caf/stateful_actor.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/keeper.hpp"

namespace spdlog {
class logger;
}

namespace troupe {

class Keeper;

struct KeeperOptions {
  // What is kept, as the log lines and the give-up message name it
  // ("node agent", "controller", "proxy actor").
  std::string what = "actor";
  RestartPolicy policy;
  // Starts the kept actor: first (unless spawn_keeper is given one that runs
  // already) and after every death. Runs in the keeper. An empty actor means
  // "do not start one" (what it keeps is being stopped); the keeper then
  // waits for an exit message.
  std::function<caf::actor(Keeper&)> start;
  // The kept actor ended (died or stopped), before any restart.
  std::function<void()> on_gone;
  // Called with the give-up message, from the keeper's thread.
  std::function<void(const std::string&)> on_give_up;
  // The answer to a request while no kept actor runs.
  std::string unavailable = "restarting";
  // An asynchronous message while no kept actor runs: kept for the next one
  // when this returns true; dropped when it returns false or is empty.
  std::function<bool(const caf::message&)> hold;
  // The keeper's own messages, tried before forwarding. Built once the keeper
  // runs.
  std::function<caf::message_handler(Keeper&)> handlers;
  // The clock of the restart policy (steady_clock by default; tests drive it).
  std::function<RestartLimiter::time_point()> now;
  std::shared_ptr<spdlog::logger> log;
};

// What the options' functions see of the keeper.
class Keeper {
 public:
  Keeper(caf::event_based_actor* self, KeeperOptions options);

  caf::event_based_actor* self() const { return self_; }
  // The kept actor; empty while none runs.
  const caf::actor& current() const { return current_; }
  // How many times it was restarted.
  int restarts() const { return restarts_; }
  // Do not restart the kept actor any more (it is being stopped).
  void stop() { stopping_ = true; }
  bool stopping() const { return stopping_; }
  // Ends the kept actor with `reason`, neither restarting it nor quitting:
  // the keeper then runs none until start() is called again (the head
  // candidate that stopped leading, node/ha_head.cpp).
  void release(const caf::error& reason);

  // -- used by the keeper actor -------------------------------------------

  // Starts the kept actor (or adopts `running`) and hands it what was held.
  void start(caf::actor running = nullptr);
  void on_down(const caf::down_msg& dm);
  void on_exit(const caf::exit_msg& em);
  caf::result<caf::message> forward(caf::message msg);
  const KeeperOptions& options() const { return options_; }

 private:
  caf::event_based_actor* self_;
  KeeperOptions options_;
  RestartLimiter limiter_;
  caf::actor current_;
  bool stopping_ = false;
  int restarts_ = 0;
  std::vector<caf::message> held_;
};

// Spawns a keeper. With `running`, the keeper adopts that already running
// actor as its first; otherwise it calls options.start. `name` is the CAF
// name of the keeper actor (for logs and `troupectl kill`).
caf::actor spawn_keeper(caf::actor_system& sys, KeeperOptions options, const char* name,
                        caf::actor running = nullptr);

}  // namespace troupe
