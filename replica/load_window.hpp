// What a replica reports of its load besides requests in flight (plain C++,
// thread-safe): the answers of status >= 500 since it started, the streamed
// answers in progress, and the 99th percentile of handler time over the
// current report interval. Request threads record; the replica actor takes
// the interval's figures once per metrics report (ReplicaLoad,
// runtime/wire.hpp).
//
// Handler times go into log-scale buckets, eight per doubling from 1 us
// (each 9 % wider than the one before), so a percentile is known to within
// 9 % and recording is a few atomic increments, without a lock.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace troupe::replica {

class LoadWindow {
 public:
  // 8 buckets per doubling from 1 us to 2^27 us (134 s); longer goes in the last.
  static constexpr int kPerDoubling = 8;
  static constexpr int kBuckets = 27 * kPerDoubling + 1;

  // A handler returned after `seconds`; `error`: its answer is a 5xx (an
  // exception included).
  void record(bool error, double seconds);
  void stream_started() { streams_.fetch_add(1, std::memory_order_relaxed); }
  void stream_ended() { streams_.fetch_sub(1, std::memory_order_relaxed); }

  struct Taken {
    uint64_t errors = 0;   // since the replica started
    uint32_t streams = 0;  // in progress now
    double p99_s = -1;     // over the interval; < 0: no request finished in it
    uint64_t requests = 0; // finished in the interval
  };
  // The figures, and the next interval starts.
  Taken take();

  // The upper bound, in seconds, of bucket `i`.
  static double upper_bound_s(int i);
  static int bucket_of(double seconds);

 private:
  std::array<std::atomic<uint64_t>, kBuckets> counts_{};
  std::atomic<uint64_t> errors_{0};
  std::atomic<int64_t> streams_{0};
};

}  // namespace troupe::replica
