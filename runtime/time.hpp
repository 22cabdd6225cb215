// Durations from seconds given as double (configuration and wire fields are
// seconds): the one helper every component uses.
#pragma once

#include <chrono>

namespace troupe {

// `s` seconds as `D` (nanoseconds, which is caf::timespan, by default),
// rounded toward zero.
template <class D = std::chrono::nanoseconds>
constexpr D seconds_as(double s) {
  return std::chrono::duration_cast<D>(std::chrono::duration<double>(s));
}

}  // namespace troupe
