// Request-based autoscaling, as in Ray Serve: replicas and handles (proxies)
// report their ongoing requests every metrics_interval_s; the controller
// averages each reporter over look_back_period_s, sums the reporters and moves
// the deployment's target towards ceil(total / target_ongoing_requests), after
// the decision held for upscale_delay_s / downscale_delay_s.
//
// Two small value classes, independent of DeploymentState so that tests drive
// them alone with plain numbers:
//   OngoingRequestMetrics  the reporters' timestamped samples of one deployment;
//   AutoscalingPolicy      the decision, with the "held since" state of the
//                          delays.
// DeploymentState owns one of each per autoscaled deployment; times are the
// injected Clock's seconds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "controller/core/model.hpp"

namespace troupe::controller {

// The latest reports of every reporter of one deployment, each kept for
// look_back_s. Replica reporters send the requests running and queued at the
// replica; handle reporters (proxies, deployment handles) the requests they
// queue or have in flight for the deployment, the only signal while the
// deployment has no running replica.
class OngoingRequestMetrics {
 public:
  explicit OngoingRequestMetrics(double look_back_s = 30.0) : look_back_s_(look_back_s) {}

  double look_back_s() const { return look_back_s_; }
  void set_look_back_s(double s) { look_back_s_ = s; }

  // Appends a sample taken at `now`. Samples of this reporter older than
  // look_back_s are dropped on the way, so a reporter costs O(samples in the
  // window) memory, i.e. about look_back_period_s / metrics_interval_s.
  void record_replica(const std::string& replica_id, double ongoing, double now);
  void record_handle(const std::string& reporter_id, double queued_and_inflight, double now);

  // Drops samples older than now - look_back_s, reporters left without any
  // (they stopped reporting), and replica reporters for which
  // `is_running(replica_id)` is false (stopped, crashed, updating, ...).
  void prune(double now, const std::function<bool(const std::string&)>& is_running);

  // Sum over the reporters of each one's mean over its samples taken within
  // [now - look_back_s, now]. A reporter without such a sample counts 0.
  double replica_total(double now) const;
  double handle_total(double now) const;
  // What the policy sees: max(replica_total, handle_total). Each is a lower
  // bound of the requests in the system (replicas do not see what handles
  // queue in front of saturated replicas; handles only see their own
  // requests), and adding them would count every in-flight request twice.
  double total(double now) const;

  std::size_t replica_reporters() const { return replicas_.size(); }
  std::size_t handle_reporters() const { return handles_.size(); }
  void clear();

 private:
  using Samples = std::deque<std::pair<double, double>>;  // (time, value), oldest first
  static void record(std::map<std::string, Samples>& reporters, const std::string& id, double value,
                     double now, double oldest);
  static double sum_of_means(const std::map<std::string, Samples>& reporters, double oldest);

  double look_back_s_;
  std::map<std::string, Samples> replicas_;
  std::map<std::string, Samples> handles_;
};

enum class ScaleDirection { none, up, down };

const char* to_string(ScaleDirection d);

// One evaluation of the policy.
struct AutoscalingInput {
  double now = 0;
  double total_ongoing = 0;  // OngoingRequestMetrics::total()
  uint32_t running = 0;      // RUNNING replicas
  uint32_t current = 0;      // the current target
  // Bounds under target_capacity: capacity_adjusted(min_replicas) and
  // capacity_adjusted(max_replicas).
  uint32_t lower = 0;
  uint32_t upper = 0;
};

struct AutoscalingDecision {
  // Where the metrics point, after smoothing and bounds; none when the
  // proposal equals the current target.
  ScaleDirection direction = ScaleDirection::none;
  uint32_t desired = 0;     // ceil(total_ongoing / target_ongoing_requests)
  uint32_t smoothed = 0;    // current moved towards `desired` by the smoothing factor
  uint32_t proposed = 0;    // `smoothed` within [lower, upper]: the target when applied
  double factor = 1.0;      // the smoothing factor used
  bool cold_start = false;  // scaling up from zero replicas on queued requests
  // The direction has held since `since`; it is applied at `due_at`
  // (since + upscale_delay_s or downscale_delay_s).
  double since = 0;
  double due_at = 0;
  // True when the target must become `proposed` now.
  bool apply = false;
};

// The numbers that led to a decision, for the deployment status:
// "24.0 ongoing requests over 3 running replicas, target 2 per replica: want 12,
// smoothing 1 -> 12, bounds [1, 6] -> 6".
std::string describe(const AutoscalingConfig& config, const AutoscalingInput& in,
                     const AutoscalingDecision& d);

// The decision, Ray Serve's:
//   desired  = ceil(total_ongoing / target_ongoing_requests);
//   smoothed = current + (desired - current) * factor, rounded up when scaling
//              up and down when scaling down, never beyond `desired`; factor
//              is upscale_smoothing_factor / downscale_smoothing_factor,
//              falling back to smoothing_factor;
//   proposed = smoothed within [lower, upper];
//   applied once the same direction held continuously for upscale_delay_s
//   (resp. downscale_delay_s): at the first evaluation with
//   now >= since + delay. After applying, a further move waits a full delay
//   again.
// With no running replica: a target of 0 and queued requests (> 0) scale up at
// once to at least 1 (cold start, no delay); a target above 0 waits for its
// replicas to start (no decision).
class AutoscalingPolicy {
 public:
  explicit AutoscalingPolicy(AutoscalingConfig config) : config_(std::move(config)) {}

  const AutoscalingConfig& config() const { return config_; }
  // A new config (or new bounds): forgets the pending decision.
  void reset(AutoscalingConfig config);

  AutoscalingDecision decide(const AutoscalingInput& in);

  // The direction pending since pending_since() (none when nothing pends).
  ScaleDirection pending() const { return pending_; }
  double pending_since() const { return pending_since_; }

 private:
  AutoscalingConfig config_;
  ScaleDirection pending_ = ScaleDirection::none;
  double pending_since_ = 0;
};

}  // namespace troupe::controller
