// How often a request may be placed again before the proxy answers it
// itself: the retry decisions of the call state machine (call.cpp: retry(),
// refused()) as plain code, with no clock, socket or actor, so tests can
// drive them directly. One per Call; touched only on its io thread.
//
// Three counts, kept apart because they mean different things:
//   - crashes: replicas that died while they had the request in flight. The
//     request may be what killed them (user code that crashes on it, a
//     "query of death"), so it is retried once; the second crash answers
//     502 and the request is never sent anywhere again.
//   - losses: every replica lost with the request, crashed or not (a bounce
//     for lack of a route, the connection to the head lost, a node declared
//     DEAD, a replica that had exited before the request reached it). At
//     ProxyOptions::max_attempts the request is answered 503.
//   - refusals: replicas at their max_ongoing_requests (other proxies use
//     them too) or stopping. Not counted against the request: placed again
//     at once the first time, then after a backoff of 1, 2, 4 ... 50 ms; after
//     kMaxRefusals, 503.
#pragma once

#include <chrono>
#include <cstdint>

namespace troupe::proxy {

class Attempts {
 public:
  // The crash that reaches this count answers 502.
  static constexpr uint32_t kMaxCrashes = 2;
  // The refusal beyond this count answers 503.
  static constexpr uint32_t kMaxRefusals = 40;
  // The longest wait between two placements after refusals.
  static constexpr std::chrono::milliseconds kMaxBackoff{50};

  // `max_attempts`: ProxyOptions::max_attempts.
  explicit Attempts(uint32_t max_attempts = 5) : max_attempts_(max_attempts) {}

  enum class Loss {
    retry,    // place the request on another replica
    crashed,  // it crashed kMaxCrashes replicas: 502, never sent again
    give_up,  // max_attempts replicas lost with it: 503
  };
  // A replica was lost before it answered. `crash`: it died while it had the
  // request in flight. A crash that answers 502 is not counted as a loss.
  Loss lost(bool crash);

  struct Refusal {
    enum Kind {
      again,        // place it again at once
      after_delay,  // place it again after `delay`
      give_up,      // more than kMaxRefusals: 503
    } kind;
    std::chrono::milliseconds delay{0};
  };
  // A replica refused the request (at its limit, or stopping).
  Refusal refused();

  uint32_t crashes() const { return crashes_; }
  uint32_t losses() const { return losses_; }
  uint32_t refusals() const { return refusals_; }

 private:
  uint32_t max_attempts_;
  uint32_t crashes_ = 0;
  uint32_t losses_ = 0;
  uint32_t refusals_ = 0;
};

}  // namespace troupe::proxy
