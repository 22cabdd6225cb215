#include "replica/load_window.hpp"

#include <cmath>

namespace troupe::replica {

int LoadWindow::bucket_of(double seconds) {
  double us = seconds * 1e6;
  if (!(us > 1))  // also NaN
    return 0;
  int i = static_cast<int>(std::ceil(std::log2(us) * kPerDoubling));
  return i >= kBuckets ? kBuckets - 1 : i;
}

double LoadWindow::upper_bound_s(int i) {
  return std::exp2(static_cast<double>(i) / kPerDoubling) * 1e-6;
}

void LoadWindow::record(bool error, double seconds) {
  counts_[static_cast<size_t>(bucket_of(seconds))].fetch_add(1, std::memory_order_relaxed);
  if (error)
    errors_.fetch_add(1, std::memory_order_relaxed);
}

LoadWindow::Taken LoadWindow::take() {
  Taken out;
  std::array<uint64_t, kBuckets> counts{};
  for (int i = 0; i < kBuckets; ++i) {
    counts[static_cast<size_t>(i)] =
        counts_[static_cast<size_t>(i)].exchange(0, std::memory_order_relaxed);
    out.requests += counts[static_cast<size_t>(i)];
  }
  out.errors = errors_.load(std::memory_order_relaxed);
  auto streams = streams_.load(std::memory_order_relaxed);
  out.streams = streams > 0 ? static_cast<uint32_t>(streams) : 0;
  if (out.requests == 0)
    return out;
  // The smallest bucket below which at least 99 % of the interval's
  // requests finished.
  const uint64_t rank = (out.requests * 99 + 99) / 100;
  uint64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += counts[static_cast<size_t>(i)];
    if (seen >= rank) {
      out.p99_s = upper_bound_s(i);
      break;
    }
  }
  return out;
}

}  // namespace troupe::replica
