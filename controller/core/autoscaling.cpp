#include "controller/core/autoscaling.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace troupe::controller {

namespace {

// Averages such as (2 + 2 + 2) / 3 are not always exact in binary; without a
// tolerance ceil() would turn 12.000000000002 into 13.
constexpr double kEpsilon = 1e-9;
// Keeps absurd reports (1e300 requests) from overflowing the casts below; far
// above any replica limit validate() accepts.
constexpr double kMaxCount = 1e9;

uint32_t to_count(double v) {
  return static_cast<uint32_t>(std::clamp(v, 0.0, kMaxCount));
}

std::string format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

}  // namespace

// ---------------------------------------------------------------- metrics

void OngoingRequestMetrics::record(std::map<std::string, Samples>& reporters, const std::string& id,
                                   double value, double now, double oldest) {
  Samples& s = reporters[id];
  while (!s.empty() && s.front().first < oldest)
    s.pop_front();
  s.emplace_back(now, value);
}

void OngoingRequestMetrics::record_replica(const std::string& replica_id, double ongoing,
                                           double now) {
  record(replicas_, replica_id, std::max(ongoing, 0.0), now, now - look_back_s_);
}

void OngoingRequestMetrics::record_handle(const std::string& reporter_id,
                                          double queued_and_inflight, double now) {
  record(handles_, reporter_id, std::max(queued_and_inflight, 0.0), now, now - look_back_s_);
}

void OngoingRequestMetrics::prune(double now,
                                  const std::function<bool(const std::string&)>& is_running) {
  const double oldest = now - look_back_s_;
  auto trim = [oldest](std::map<std::string, Samples>& reporters, const auto& keep) {
    for (auto it = reporters.begin(); it != reporters.end();) {
      Samples& s = it->second;
      while (!s.empty() && s.front().first < oldest)
        s.pop_front();
      it = s.empty() || !keep(it->first) ? reporters.erase(it) : std::next(it);
    }
  };
  trim(replicas_, is_running);
  trim(handles_, [](const std::string&) { return true; });
}

double OngoingRequestMetrics::sum_of_means(const std::map<std::string, Samples>& reporters,
                                           double oldest) {
  double total = 0;
  for (const auto& [id, samples] : reporters) {
    double sum = 0;
    std::size_t n = 0;
    for (const auto& [t, v] : samples) {
      if (t < oldest)
        continue;
      sum += v;
      ++n;
    }
    if (n > 0)
      total += sum / static_cast<double>(n);
  }
  return total;
}

double OngoingRequestMetrics::replica_total(double now) const {
  return sum_of_means(replicas_, now - look_back_s_);
}

double OngoingRequestMetrics::handle_total(double now) const {
  return sum_of_means(handles_, now - look_back_s_);
}

double OngoingRequestMetrics::total(double now) const {
  return std::max(replica_total(now), handle_total(now));
}

void OngoingRequestMetrics::clear() {
  replicas_.clear();
  handles_.clear();
}

// ---------------------------------------------------------------- policy

const char* to_string(ScaleDirection d) {
  switch (d) {
    case ScaleDirection::none:
      return "none";
    case ScaleDirection::up:
      return "up";
    case ScaleDirection::down:
      return "down";
  }
  return "?";
}

void AutoscalingPolicy::reset(AutoscalingConfig config) {
  config_ = std::move(config);
  pending_ = ScaleDirection::none;
  pending_since_ = 0;
}

AutoscalingDecision AutoscalingPolicy::decide(const AutoscalingInput& in) {
  AutoscalingDecision d;
  const double per_replica = in.total_ongoing / config_.target_ongoing_requests;
  d.desired = in.total_ongoing > 0 ? to_count(std::ceil(per_replica - kEpsilon)) : 0;

  const double current = in.current;
  const double desired = d.desired;
  if (d.desired > in.current) {
    d.factor = config_.upscale_smoothing_factor.value_or(config_.smoothing_factor);
    const double moved = current + (desired - current) * d.factor;
    d.smoothed = std::min(to_count(std::ceil(moved - kEpsilon)), d.desired);
  } else if (d.desired < in.current) {
    d.factor = config_.downscale_smoothing_factor.value_or(config_.smoothing_factor);
    const double moved = current - (current - desired) * d.factor;
    d.smoothed = std::max(to_count(std::floor(moved + kEpsilon)), d.desired);
  } else {
    d.factor = config_.smoothing_factor;
    d.smoothed = in.current;
  }
  d.proposed = std::clamp(d.smoothed, in.lower, std::max(in.lower, in.upper));

  if (in.running == 0) {
    // Nothing measures the replicas' load. From zero, requests waiting at the
    // handles are served only once a replica exists: start one at once.
    // Otherwise the target's replicas are still starting: wait for them.
    if (in.current == 0 && in.total_ongoing > 0) {
      d.smoothed = std::max<uint32_t>(d.smoothed, 1);
      d.proposed = std::clamp(d.smoothed, in.lower, std::max(in.lower, in.upper));
    } else {
      d.proposed = in.current;
    }
    if (d.proposed > in.current) {
      d.direction = ScaleDirection::up;
      d.cold_start = true;
      d.since = d.due_at = in.now;
      d.apply = true;
    }
    pending_ = ScaleDirection::none;
    return d;
  }

  if (d.proposed > in.current) {
    d.direction = ScaleDirection::up;
  } else if (d.proposed < in.current) {
    d.direction = ScaleDirection::down;
  }
  if (d.direction == ScaleDirection::none) {
    pending_ = ScaleDirection::none;
    return d;
  }
  if (pending_ != d.direction) {
    pending_ = d.direction;
    pending_since_ = in.now;
  }
  const double delay =
      d.direction == ScaleDirection::up ? config_.upscale_delay_s : config_.downscale_delay_s;
  d.since = pending_since_;
  d.due_at = pending_since_ + delay;
  if (in.now >= d.due_at) {
    d.apply = true;
    pending_ = ScaleDirection::none;  // the next move waits a full delay again
  }
  return d;
}

std::string describe(const AutoscalingConfig& config, const AutoscalingInput& in,
                     const AutoscalingDecision& d) {
  std::string s = format("%.1f", in.total_ongoing);
  if (d.cold_start) {
    s += " requests queued at handles with no running replica";
  } else {
    s += " ongoing requests over " + std::to_string(in.running) + " running replica" +
         (in.running == 1 ? "" : "s");
  }
  s += " at a target of " + format("%g", config.target_ongoing_requests) + " per replica want " +
       std::to_string(d.desired) + "; smoothing factor " + format("%g", d.factor) + " gives " +
       std::to_string(d.smoothed) + ", bounds [" + std::to_string(in.lower) + ", " +
       std::to_string(in.upper) + "] give " + std::to_string(d.proposed);
  return s;
}

}  // namespace troupe::controller
