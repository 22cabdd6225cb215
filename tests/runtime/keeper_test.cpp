// The keepers' restart policy, driven with an explicit clock.
#include "runtime/keeper.hpp"

#include <doctest/doctest.h>

using namespace troupe;
using namespace std::chrono_literals;

namespace {

const RestartLimiter::time_point t0{std::chrono::hours(1)};

RestartPolicy policy(int max_restarts, RestartPolicy::duration window,
                     RestartPolicy::duration min_interval) {
  RestartPolicy p;
  p.max_restarts = max_restarts;
  p.window = window;
  p.min_interval = min_interval;
  return p;
}

}  // namespace

TEST_CASE("keeper: the first death is restarted at once") {
  RestartLimiter limiter;
  auto d = limiter.on_death(t0);
  CHECK_FALSE(d.give_up);
  CHECK(d.delay == RestartLimiter::duration::zero());
  CHECK(limiter.restarts_within_window(t0) == 1);
}

TEST_CASE("keeper: a death sooner than min_interval after a restart waits for the rest of it") {
  RestartLimiter limiter(policy(10, 60s, 1s));
  REQUIRE(limiter.on_death(t0).delay == 0s);
  auto d = limiter.on_death(t0 + 300ms);
  CHECK_FALSE(d.give_up);
  CHECK(d.delay == 700ms);
  // The delayed restart counts at the time it is due (t0 + 1 s): the next
  // one is not before t0 + 2 s.
  auto d2 = limiter.on_death(t0 + 1100ms);
  CHECK_FALSE(d2.give_up);
  CHECK(d2.delay == 900ms);
  // Past min_interval: at once.
  CHECK(limiter.on_death(t0 + 5s).delay == 0s);
}

TEST_CASE("keeper: max_restarts within the window - then it gives up") {
  RestartLimiter limiter(policy(3, 10s, 0s));
  CHECK_FALSE(limiter.on_death(t0).give_up);
  CHECK_FALSE(limiter.on_death(t0 + 1s).give_up);
  CHECK_FALSE(limiter.on_death(t0 + 2s).give_up);
  CHECK(limiter.restarts_within_window(t0 + 2s) == 3);
  CHECK(limiter.on_death(t0 + 3s).give_up);
  // Giving up is not counted as a restart.
  CHECK(limiter.restarts_within_window(t0 + 3s) == 3);
}

TEST_CASE("keeper: restarts older than the window no longer count") {
  RestartLimiter limiter(policy(3, 10s, 0s));
  for (auto at : {0s, 1s, 2s})
    REQUIRE_FALSE(limiter.on_death(t0 + at).give_up);
  // The restart at t0 leaves the window at t0 + 10 s.
  CHECK(limiter.on_death(t0 + 9s).give_up);
  CHECK_FALSE(limiter.on_death(t0 + 10s).give_up);
  CHECK(limiter.restarts_within_window(t0 + 10s) == 3);
  CHECK(limiter.on_death(t0 + 10s + 500ms).give_up);
  // Deaths far apart are restarted forever.
  for (int i = 1; i <= 20; ++i)
    CHECK_FALSE(limiter.on_death(t0 + 100s + i * 4s).give_up);
}

TEST_CASE("keeper: a crash loop with the default policy gives up within seconds") {
  RestartLimiter limiter;
  auto now = t0;
  int restarts = 0;
  for (;;) {
    auto d = limiter.on_death(now);
    if (d.give_up)
      break;
    ++restarts;
    now += d.delay + 10ms;  // restarted, and dead again 10 ms later
    REQUIRE(restarts <= 100);
  }
  CHECK(restarts == RestartPolicy{}.max_restarts);
  CHECK(now - t0 < 15s);
}

TEST_CASE("keeper: the give-up message names the actor and the last exit reason") {
  RestartLimiter limiter(policy(2, 30s, 0s));
  CHECK(limiter.give_up_message("controller", "runtime_error: recovery failed") ==
        "gave up on the controller: it was restarted 2 times within 30 s and died again; "
        "last exit reason: runtime_error: recovery failed");
}
