#include "controller/core/model.hpp"

#include <algorithm>
#include <tuple>

namespace troupe::controller {

const char* to_string(Isolation isolation) {
  switch (isolation) {
    case Isolation::process:
      return "process";
    case Isolation::in_process:
      return "in_process";
  }
  return "?";
}

const char* to_string(CapacityDirection d) {
  switch (d) {
    case CapacityDirection::none:
      return "none";
    case CapacityDirection::up:
      return "up";
    case CapacityDirection::down:
      return "down";
  }
  return "?";
}

CapacityDirection next_capacity_direction(const TargetState& current, const TargetState& next) {
  bool same_apps = current.applications.size() == next.applications.size();
  for (auto a = current.applications.begin(), b = next.applications.begin();
       same_apps && a != current.applications.end(); ++a, ++b) {
    same_apps = a->first == b->first;
  }
  if (!same_apps)
    return next.target_capacity ? CapacityDirection::up : CapacityDirection::none;
  if (current.target_capacity == next.target_capacity)
    return current.target_capacity_direction;
  if (!next.target_capacity)
    return CapacityDirection::none;
  if (!current.target_capacity)
    return CapacityDirection::down;
  return *current.target_capacity < *next.target_capacity ? CapacityDirection::up
                                                          : CapacityDirection::down;
}

std::optional<Isolation> parse_isolation(const std::string& text) {
  if (text == "process")
    return Isolation::process;
  if (text == "in_process")
    return Isolation::in_process;
  return std::nullopt;
}

bool operator==(const AutoscalingConfig& a, const AutoscalingConfig& b) {
  auto tie = [](const AutoscalingConfig& x) {
    return std::tie(x.min_replicas, x.max_replicas, x.initial_replicas, x.target_ongoing_requests,
                    x.metrics_interval_s, x.look_back_period_s, x.smoothing_factor,
                    x.upscale_smoothing_factor, x.downscale_smoothing_factor, x.upscale_delay_s,
                    x.downscale_delay_s);
  };
  return tie(a) == tie(b);
}

bool operator==(const DeploymentConfig& a, const DeploymentConfig& b) {
  auto tie = [](const DeploymentConfig& x) {
    return std::tie(x.num_replicas, x.max_ongoing_requests, x.max_queued_requests, x.user_config,
                    x.autoscaling_config, x.health_check_period_s, x.health_check_timeout_s,
                    x.graceful_shutdown_wait_loop_s, x.graceful_shutdown_timeout_s, x.resources,
                    x.max_replicas_per_node, x.isolation, x.memory_limit_bytes, x.stuck_after_s,
                    x.max_num_models_per_replica, x.force_stop_unhealthy_replicas, x.max_batch_size,
                    x.batch_wait_timeout_s, x.batch_wait_auto);
  };
  return tie(a) == tie(b);
}

double effective_stuck_after_s(double configured, double request_timeout_s) {
  if (configured > 0)
    return configured;
  if (!(request_timeout_s > 0))
    return 0;
  return std::max(kStuckAfterFactor * request_timeout_s, kMinStuckAfterS);
}

bool operator==(const DeploymentSpec& a, const DeploymentSpec& b) {
  auto tie = [](const DeploymentSpec& x) {
    return std::tie(x.name, x.import_path, x.init_args, x.code_version, x.config,
                    x.library_sha256);
  };
  return tie(a) == tie(b);
}

bool operator==(const ApplicationSpec& a, const ApplicationSpec& b) {
  auto tie = [](const ApplicationSpec& x) {
    return std::tie(x.name, x.route_prefix, x.ingress, x.deployments, x.traffic,
                    x.traffic_key_header, x.shadow, x.open_inference);
  };
  return tie(a) == tie(b);
}

bool operator==(const HttpSettings& a, const HttpSettings& b) {
  return a.request_timeout_s == b.request_timeout_s &&
         a.keep_alive_timeout_s == b.keep_alive_timeout_s;
}

bool operator==(const RunningDeclaration& a, const RunningDeclaration& b) {
  return a.spec == b.spec && a.generation == b.generation;
}

bool operator==(const TargetState& a, const TargetState& b) {
  return a.applications == b.applications && a.target_capacity == b.target_capacity &&
         a.target_capacity_direction == b.target_capacity_direction &&
         a.generation == b.generation && a.http == b.http &&
         a.autoscaled_replicas == b.autoscaled_replicas && a.last_running == b.last_running;
}

}  // namespace troupe::controller
