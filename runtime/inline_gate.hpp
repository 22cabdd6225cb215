// Whether the proxy runs an in-process replica's blocking handler on its io
// thread right now ("inline") or hands the request to the replica's request
// threads. Plain C++ with the clock given by the caller (unit-tested in
// tests/runtime/inline_gate_test.cpp).
//
// A handler declared blocking (the default) may wait, but most answer in
// microseconds, and for those the hand-off to a request thread and back (two
// thread wake-ups) costs more than the handler itself (docs/benchmarks.md,
// issue 43). So the proxy calls such a handler inline while its calls are
// short, and sends the replica's requests to its request threads (which run
// as many at once as max_ongoing_requests allows, on every core) for a
// while when they are not:
//
//   - the gate keeps a moving average of the inline calls' durations (each
//     counted up to `cap`, weight 1/16: one call that was only preempted,
//     on a busy machine, does not close it); when it passes `fast`, the
//     gate closes for the backoff;
//   - a call that blocks its io thread long enough for the loop to be taken
//     over (runtime/loop_takeover.hpp) closes it at once (blocked());
//   - closed, the replica's requests go to its request threads until the
//     backoff is over; then calls run inline again, the average starting
//     afresh;
//   - closed again within `max_backoff` of reopening: twice the backoff (at
//     most `max_backoff`); later: `min_backoff` again.
//
// So a handler that computes for long is called inline a few times per
// backoff, and one that sleeps once per backoff (at most one per
// `max_backoff` once it keeps doing it); the rest of the time they have the
// parallelism of their request threads.
//
// Thread-safe: several io threads call one replica's gate. Races between
// them lose an update of the average at worst.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace troupe::local {

class InlineGate {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    Clock::duration fast = std::chrono::microseconds(100);
    Clock::duration cap = std::chrono::milliseconds(1);
    Clock::duration min_backoff = std::chrono::seconds(1);
    Clock::duration max_backoff = std::chrono::seconds(30);
  };

  InlineGate() : InlineGate(Options{}) {}
  explicit InlineGate(Options o) : o_(o), backoff_(o.min_backoff.count()) {}

  // May a request run inline at `now`?
  bool open(Clock::time_point now) const {
    return now.time_since_epoch().count() >= closed_until_.load(std::memory_order_relaxed);
  }

  // An inline call that began at `began` ended at `ended`.
  void record(Clock::time_point began, Clock::time_point ended) {
    const int64_t d = std::min<int64_t>((ended - began).count(), o_.cap.count());
    int64_t avg = average_.load(std::memory_order_relaxed);
    avg += (d - avg) / 16;
    average_.store(avg, std::memory_order_relaxed);
    if (avg > o_.fast.count())
      close(ended);
  }

  // A call that began at `began` still blocked its io thread at `now` (its
  // loop was taken over).
  void blocked(Clock::time_point /*began*/, Clock::time_point now) { close(now); }

  // How long the last close was for.
  Clock::duration backoff() const { return Clock::duration(backoff_.load()); }
  // Times it closed.
  uint64_t closes() const { return closes_.load(std::memory_order_relaxed); }
  // The moving average of the calls' durations (capped).
  Clock::duration average() const { return Clock::duration(average_.load()); }

 private:
  void close(Clock::time_point at) {
    const int64_t now = at.time_since_epoch().count();
    const int64_t last = last_closed_.load(std::memory_order_relaxed);
    int64_t backoff = backoff_.load(std::memory_order_relaxed);
    // Open for max_backoff since it last opened: the backoff starts over;
    // closed again sooner: twice the backoff.
    if (last == kNever || now - (last + backoff) >= o_.max_backoff.count())
      backoff = o_.min_backoff.count();
    else
      backoff = std::min<int64_t>(backoff * 2, o_.max_backoff.count());
    backoff_.store(backoff, std::memory_order_relaxed);
    last_closed_.store(now, std::memory_order_relaxed);
    closed_until_.store(now + backoff, std::memory_order_relaxed);
    average_.store(0, std::memory_order_relaxed);
    closes_.fetch_add(1, std::memory_order_relaxed);
  }

  static constexpr int64_t kNever = INT64_MIN;
  const Options o_;
  std::atomic<int64_t> closed_until_{INT64_MIN};  // steady clock ticks
  std::atomic<int64_t> last_closed_{kNever};
  std::atomic<int64_t> backoff_;
  std::atomic<int64_t> average_{0};
  std::atomic<uint64_t> closes_{0};
};

}  // namespace troupe::local
