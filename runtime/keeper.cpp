#include "runtime/keeper.hpp"

#include <algorithm>
#include <cstdio>

namespace troupe {

RestartLimiter::Decision RestartLimiter::on_death(time_point now) {
  while (!restarts_.empty() && restarts_.front() <= now - policy_.window)
    restarts_.pop_front();
  if (static_cast<int>(restarts_.size()) >= policy_.max_restarts)
    return Decision{true, {}};
  auto at = now;
  if (!restarts_.empty())
    at = std::max(now, restarts_.back() + policy_.min_interval);
  restarts_.push_back(at);
  return Decision{false, at - now};
}

int RestartLimiter::restarts_within_window(time_point now) const {
  return static_cast<int>(std::count_if(restarts_.begin(), restarts_.end(),
                                        [&](time_point t) { return t > now - policy_.window; }));
}

std::string RestartLimiter::give_up_message(const std::string& actor,
                                            const std::string& last_reason) const {
  char window[32];
  std::snprintf(window, sizeof(window), "%g",
                std::chrono::duration<double>(policy_.window).count());
  return "gave up on the " + actor + ": it was restarted " + std::to_string(policy_.max_restarts) +
         " times within " + window + " s and died again; last exit reason: " + last_reason;
}

}  // namespace troupe
