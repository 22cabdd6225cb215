// A local handle that forwards every message, in its sender's context, to a
// target that can change.
//
// CAF ends every remote handle that rode on a connection when the connection
// is lost, and the handles of the next connection to the same process are
// new ones. A node and its replica processes hold such a forwarder for each
// other's actors instead of the remote handles: when the connection is made
// again, the forwarder is pointed at the new remote handle, and everyone who
// holds the forwarder (the controller, the proxies, a replica's metrics and
// deployment handles) keeps working with the handle they have.
//
// Messages that arrive while the target is a dead remote handle are handled
// as CAF handles a dead actor: a request gets its error answer at once.
// Answers to requests that were on the lost connection are lost with it; the
// requesters' own deadlines end those.
#pragma once

#include <memory>
#include <mutex>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

namespace troupe {

class ForwardTarget {
 public:
  explicit ForwardTarget(caf::actor target) : target_(std::move(target)) {}
  void set(caf::actor target) {
    std::lock_guard<std::mutex> lock(mutex_);
    target_ = std::move(target);
  }
  caf::actor get() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return target_;
  }

 private:
  mutable std::mutex mutex_;
  caf::actor target_;
};

// The forwarder: an actor pool whose only worker is a local anchor, so it
// lives until it is sent an exit message (which ends it without reaching the
// target), whatever happens to its target.
caf::actor spawn_forwarder(caf::actor_system& sys, std::shared_ptr<ForwardTarget> target);

}  // namespace troupe
