// Time and randomness, injected into the controller core so that tests drive
// it tick by tick with exact expectations. The core never reads the wall clock
// and never calls a global random generator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>

namespace troupe::controller {

// A monotonic clock in seconds. Only differences matter; the origin is
// arbitrary (the actor shell uses steady_clock, tests a FakeClock).
class Clock {
 public:
  virtual ~Clock() = default;
  virtual double now_s() const = 0;
};

// Every random choice the core makes goes through this interface: health-check
// jitter, start-retry backoff jitter and scheduling ties.
class Random {
 public:
  virtual ~Random() = default;
  // A value in [lo, hi].
  virtual double uniform(double lo, double hi) = 0;
  // An index in [0, n); n > 0.
  virtual std::size_t index(std::size_t n) = 0;
};

// The production implementation: a seeded Mersenne twister, reproducible for a
// given seed.
class SeededRandom final : public Random {
 public:
  explicit SeededRandom(uint64_t seed) : engine_(seed) {}
  double uniform(double lo, double hi) override {
    return std::uniform_real_distribution<double>(lo, hi)(engine_);
  }
  std::size_t index(std::size_t n) override {
    return std::uniform_int_distribution<std::size_t>(0, n - 1)(engine_);
  }

 private:
  std::mt19937_64 engine_;
};

}  // namespace troupe::controller
