// The restart policy of every keeper (an actor that restarts another one when
// it dies): how fast it restarts, and when it gives up. Plain C++ with the
// time passed in, so the decision is tested tick by tick
// (tests/runtime/keeper_test.cpp); the one keeper actor
// (runtime/keeper_actor.hpp) runs it in its down handler.
//
// Giving up is the answer to a crash loop: an actor that dies again each time
// it starts (a controller whose recovery fails, an agent that cannot start)
// would otherwise be restarted forever while the node looks alive. The keeper
// that gives up reports it (RestartLimiter::give_up_message) and the process
// exits with an error, so whatever runs the node sees the failure.
#pragma once

#include <chrono>
#include <deque>
#include <string>

namespace troupe {

struct RestartPolicy {
  using duration = std::chrono::steady_clock::duration;
  // At most this many restarts within `window`; the next death within the
  // window gives up. Default: 10 within 60 s, far above what an operator's
  // kills or a chaos run cause (one every few seconds) and reached within
  // seconds by a crash loop.
  int max_restarts = 10;
  duration window = std::chrono::seconds(60);
  // Restarts are at least this far apart: a crash loop must not spin. A death
  // sooner after the previous restart is restarted when this has passed.
  duration min_interval = std::chrono::seconds(1);
};

class RestartLimiter {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using duration = std::chrono::steady_clock::duration;

  struct Decision {
    bool give_up = false;
    // When not giving up: how long to wait before the restart (0: now).
    duration delay{};
  };

  explicit RestartLimiter(RestartPolicy policy = {}) : policy_(policy) {}

  // The kept actor died at `now`: restart it (now or after `delay`), or give
  // up. A restart it answers is counted at the time it is due.
  Decision on_death(time_point now);

  // Restarts counted in the window ending at `now`.
  int restarts_within_window(time_point now) const;

  const RestartPolicy& policy() const { return policy_; }

  // "gave up on the controller: it was restarted 10 times within 60 s and
  // died again; last exit reason: <reason>".
  std::string give_up_message(const std::string& actor, const std::string& last_reason) const;

 private:
  RestartPolicy policy_;
  std::deque<time_point> restarts_;  // oldest first
};

}  // namespace troupe
