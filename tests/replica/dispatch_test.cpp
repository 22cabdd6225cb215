// Dispatch: a replica's admission (CAF request threads claimed and released,
// max_ongoing_requests for a data channel's threads), the stopping flag, the
// time-weighted average of requests in flight, and the tokens of requests
// queued into a data channel. Time is passed in: no clock, no sleeps, and no
// actor is running.
#include <doctest/doctest.h>

#include <chrono>

#include <caf/all.hpp>

#include "replica/dispatch.hpp"

using namespace troupe::replica;
using Clock = Dispatch::Clock;
using std::chrono::seconds;
using troupe::Status;

namespace {

const Clock::time_point t0{};

// A dispatch with `n` CAF request threads (no actors behind them: claim and
// release only look at the busy flags).
void with_workers(Dispatch& d, size_t n) {
  d.workers.resize(n);
  d.busy = std::make_unique<std::atomic<bool>[]>(n);
  for (size_t i = 0; i < n; ++i)
    d.busy[i].store(false);
  d.limit = static_cast<uint32_t>(n);
}

}  // namespace

TEST_CASE("replica/dispatch: admission stops at max_ongoing_requests") {
  Dispatch d(t0);
  d.limit = 2;
  CHECK(d.admit(t0));
  CHECK(d.admit(t0));
  CHECK_FALSE(d.admit(t0));
  CHECK(d.in_flight() == 2);
  CHECK_FALSE(d.finish(t0));
  CHECK(d.in_flight() == 1);
  CHECK(d.admit(t0));
  CHECK_FALSE(d.admit(t0));
}

TEST_CASE("replica/dispatch: a request thread is claimed once and free again after release") {
  Dispatch d(t0);
  with_workers(d, 2);
  size_t first = 99, second = 99, third = 99;
  CHECK(d.claim(first, t0));
  CHECK(d.claim(second, t0));
  CHECK(first != second);
  CHECK(first < 2);
  CHECK(second < 2);
  CHECK_FALSE(d.claim(third, t0));
  CHECK(third == 99);
  CHECK(d.in_flight() == 2);
  CHECK_FALSE(d.release(second, t0));
  CHECK(d.in_flight() == 1);
  CHECK(d.claim(third, t0));
  CHECK(third == second);
  CHECK_FALSE(d.claim(third, t0));
}

TEST_CASE("replica/dispatch: the last request of a stopping replica is reported") {
  Dispatch d(t0);
  with_workers(d, 2);
  size_t a = 0, b = 0;
  REQUIRE(d.claim(a, t0));
  REQUIRE(d.claim(b, t0));
  d.stopping.store(true);
  CHECK_FALSE(d.release(a, t0));  // b still runs
  CHECK(d.release(b, t0));        // the last one: the replica actor may exit

  // Not stopping: the last one is nothing special.
  Dispatch e(t0);
  with_workers(e, 1);
  REQUIRE(e.claim(a, t0));
  CHECK_FALSE(e.release(a, t0));
}

TEST_CASE(
    "replica/dispatch: over a data channel the last request of a stopping replica is reported") {
  Dispatch d(t0);
  d.limit = 3;
  REQUIRE(d.admit(t0));
  REQUIRE(d.admit(t0));
  CHECK_FALSE(d.finish(t0));
  d.stopping.store(true);
  // No replica actor to tell here (the weak handle is empty): still reported.
  CHECK(d.finish(t0));
  CHECK(d.in_flight() == 0);
}

TEST_CASE("replica/dispatch: the average of requests in flight is weighted by time") {
  Dispatch d(t0);
  d.limit = 10;
  // 0 in flight for 1 s, 1 for 2 s, 2 for 1 s: (0 + 2 + 2) / 4.
  REQUIRE(d.admit(t0 + seconds(1)));
  REQUIRE(d.admit(t0 + seconds(3)));
  CHECK(d.take_average(t0, t0 + seconds(4)) == doctest::Approx(1.0));
  // The next window starts where the last ended: 2 in flight for 1 s, then 1
  // for 3 s.
  CHECK_FALSE(d.finish(t0 + seconds(5)));
  CHECK(d.take_average(t0 + seconds(4), t0 + seconds(8)) == doctest::Approx(5.0 / 4));
  // Nothing changes in a window: the number in flight.
  CHECK(d.take_average(t0 + seconds(8), t0 + seconds(18)) == doctest::Approx(1.0));
  // An empty window: the number in flight now.
  CHECK(d.take_average(t0 + seconds(18), t0 + seconds(18)) == doctest::Approx(1.0));
}

TEST_CASE("replica/dispatch: claimed request threads count in the average") {
  Dispatch d(t0);
  with_workers(d, 2);
  size_t a = 0, b = 0;
  REQUIRE(d.claim(a, t0));
  REQUIRE(d.claim(b, t0 + seconds(2)));
  CHECK_FALSE(d.release(a, t0 + seconds(3)));
  CHECK_FALSE(d.release(b, t0 + seconds(4)));
  // 1 for 2 s, 2 for 1 s, 1 for 1 s, over 5 s.
  CHECK(d.take_average(t0, t0 + seconds(5)) == doctest::Approx(5.0 / 5));
  CHECK(d.take_average(t0 + seconds(5), t0 + seconds(6)) == doctest::Approx(0.0));
}

TEST_CASE("replica/dispatch: a parked request is taken once by its token") {
  Dispatch d(t0);
  auto msg = [](int i) {
    return caf::make_mailbox_element(nullptr, caf::make_message_id(), {}, caf::make_message(i));
  };
  uint64_t t1 = d.park(msg(1));
  uint64_t t2 = d.park(msg(2));
  CHECK(t1 != t2);
  CHECK(d.take(t2 + 100) == nullptr);
  auto m2 = d.take(t2);
  REQUIRE(m2 != nullptr);
  CHECK(m2->content().get_as<int>(0) == 2);
  CHECK(d.take(t2) == nullptr);
  auto m1 = d.take(t1);
  REQUIRE(m1 != nullptr);
  CHECK(m1->content().get_as<int>(0) == 1);
  CHECK(d.take(t1) == nullptr);
  // Tokens are never reused.
  uint64_t t3 = d.park(msg(3));
  CHECK(t3 != t1);
  CHECK(t3 != t2);
}

TEST_CASE(
    "replica/dispatch: every request thread busy past the threshold with none finished is stuck") {
  Dispatch d(t0);
  with_workers(d, 2);
  const auto threshold = seconds(30);
  size_t a = 0, b = 0;
  CHECK(d.check_progress(threshold, t0).is_ok());
  REQUIRE(d.claim(a, t0));
  // One of two busy for ages: a long request, not a stuck replica.
  CHECK(d.check_progress(threshold, t0 + seconds(100)).is_ok());
  REQUIRE(d.claim(b, t0 + seconds(100)));
  // All busy since 100 s: not yet at 129.9 s, stuck at 130 s.
  CHECK(d.check_progress(threshold, t0 + std::chrono::milliseconds(129900)).is_ok());
  Status at_threshold = d.check_progress(threshold, t0 + seconds(130));
  CHECK(at_threshold.code() == troupe::errc::unavailable);
  Status later = d.check_progress(threshold, t0 + seconds(131));
  CHECK(later.message() == "stuck: all 2 request threads busy for 31.0 s with none finished");
  CHECK_FALSE(d.last_finished().has_value());

  // One finishes: progress, not stuck, even when its slot is taken again at
  // once; the all-busy period starts over.
  CHECK_FALSE(d.release(a, t0 + seconds(140)));
  CHECK(d.last_finished() == t0 + seconds(140));
  CHECK(d.check_progress(threshold, t0 + seconds(140)).is_ok());
  REQUIRE(d.claim(a, t0 + seconds(140)));
  CHECK(d.check_progress(threshold, t0 + seconds(169)).is_ok());
  CHECK_FALSE(d.check_progress(threshold, t0 + seconds(170)).is_ok());

  // A threshold of 0 turns the check off.
  CHECK(d.check_progress(Clock::duration::zero(), t0 + seconds(1000)).is_ok());
}

TEST_CASE(
    "replica/dispatch: over a data channel every admitted slot busy past the threshold is stuck") {
  Dispatch d(t0);
  d.limit = 3;
  const auto threshold = seconds(6);
  REQUIRE(d.admit(t0));
  REQUIRE(d.admit(t0 + seconds(1)));
  CHECK(d.check_progress(threshold, t0 + seconds(60)).is_ok());
  REQUIRE(d.admit(t0 + seconds(2)));
  CHECK_FALSE(d.admit(t0 + seconds(3)));  // refused: does not restart the period
  CHECK(d.check_progress(threshold, t0 + seconds(7)).is_ok());
  Status stuck = d.check_progress(threshold, t0 + seconds(8));
  CHECK(stuck.message() == "stuck: all 3 request threads busy for 6.0 s with none finished");
  // A request finishes: not stuck; the admission refills the last slot.
  CHECK_FALSE(d.finish(t0 + seconds(9)));
  CHECK(d.check_progress(threshold, t0 + seconds(100)).is_ok());
  REQUIRE(d.admit(t0 + seconds(100)));
  CHECK(d.check_progress(threshold, t0 + seconds(105)).is_ok());
  CHECK_FALSE(d.check_progress(threshold, t0 + seconds(106)).is_ok());
}
