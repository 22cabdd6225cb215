#include "proxy/attempts.hpp"

#include <algorithm>

namespace troupe::proxy {

Attempts::Loss Attempts::lost(bool crash) {
  if (crash && ++crashes_ >= kMaxCrashes)
    return Loss::crashed;
  if (++losses_ >= max_attempts_)
    return Loss::give_up;
  return Loss::retry;
}

Attempts::Refusal Attempts::refused() {
  if (++refusals_ > kMaxRefusals)
    return {Refusal::give_up};
  // The first time another replica may well have room. After that every
  // replica may be busy with other routers' requests: back off 1, 2, 4 ... ms.
  if (refusals_ == 1)
    return {Refusal::again};
  auto delay = std::chrono::milliseconds(
      std::min<uint32_t>(kMaxBackoff.count(), 1u << std::min<uint32_t>(refusals_ - 2, 6)));
  return {Refusal::after_delay, delay};
}

}  // namespace troupe::proxy
