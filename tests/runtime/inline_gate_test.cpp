// The gate that decides whether a blocking in-process handler is called
// inline (runtime/inline_gate.hpp), driven with explicit time points.
#include "runtime/inline_gate.hpp"

#include <doctest/doctest.h>

#include <chrono>

using troupe::local::InlineGate;
using namespace std::chrono_literals;

namespace {

const InlineGate::Clock::time_point gate_t0{std::chrono::hours(1)};

InlineGate::Options options() {
  InlineGate::Options o;
  o.fast = 100us;
  o.cap = 1ms;
  o.min_backoff = 1s;
  o.max_backoff = 8s;
  return o;
}

}  // namespace

TEST_CASE("inline gate: short calls keep it open - one long call alone does not close it - a run of them does - open again after the backoff") {
  InlineGate gate(options());
  auto t = gate_t0;
  CHECK(gate.open(t));
  for (int i = 0; i < 100; ++i) {
    gate.record(t, t + 10us);
    t += 10us;
  }
  CHECK(gate.open(t));
  CHECK(gate.average() <= 10us);
  // One call preempted for 5 ms, counted as 1 ms (the cap): the average
  // stays under `fast`.
  gate.record(t, t + 5ms);
  t += 5ms;
  CHECK(gate.average() < 100us);
  CHECK(gate.open(t));
  CHECK(gate.closes() == 0);

  for (int i = 0; i < 100; ++i) {
    gate.record(t, t + 10us);
    t += 10us;
  }
  CHECK(gate.average() <= 11us);

  // A handler that now computes for 1 ms each call: closed within a few.
  int calls = 0;
  while (gate.open(t) && calls < 10) {
    gate.record(t, t + 1ms);
    t += 1ms;
    ++calls;
  }
  CHECK(calls == 2);
  CHECK(gate.closes() == 1);
  CHECK(gate.backoff() == 1s);
  CHECK(gate.average() == 0s);  // afresh when it opens again
  CHECK_FALSE(gate.open(t + 999ms));
  CHECK(gate.open(t + 1s));
}

TEST_CASE("inline gate: a blocked call closes it at once - closed again soon doubles the backoff up to its most - open for that long starts it over") {
  InlineGate gate(options());
  auto t = gate_t0;
  gate.blocked(t, t + 3ms);
  t += 3ms;
  CHECK(gate.closes() == 1);
  CHECK(gate.backoff() == 1s);
  CHECK_FALSE(gate.open(t));
  // Each time it opens again, the next call blocks too.
  for (auto expected : {2s, 4s, 8s, 8s}) {
    t += gate.backoff();
    REQUIRE(gate.open(t));
    gate.blocked(t, t + 3ms);
    t += 3ms;
    CHECK(gate.backoff() == expected);
    CHECK_FALSE(gate.open(t));
  }
  CHECK(gate.closes() == 5);
  // Open again, and short calls for max_backoff: the next block closes it
  // for min_backoff again.
  t += gate.backoff();
  REQUIRE(gate.open(t));
  gate.record(t, t + 10us);
  t += 8s;
  gate.blocked(t, t + 3ms);
  t += 3ms;
  CHECK(gate.backoff() == 1s);
  // Closed again just short of max_backoff after it opened: doubled.
  t += 1s;
  REQUIRE(gate.open(t));
  t += 8s - 4ms;
  gate.blocked(t, t + 3ms);
  CHECK(gate.backoff() == 2s);
}
