#include "controller/core/limits.hpp"

#include <algorithm>
#include <string>

namespace troupe::controller {

namespace {

// What a deployment may grow to: its fixed count, or its autoscaling ceiling.
uint32_t ceiling(const DeploymentSpec& d) {
  const auto& c = d.config;
  if (c.autoscaling_config)
    return std::max(c.autoscaling_config->max_replicas,
                    c.autoscaling_config->initial_replicas.value_or(0));
  return c.num_replicas;
}

}  // namespace

Status check_limits(const TargetState& state, const Limits& limits) {
  uint64_t total = 0;
  for (const auto& [name, app] : state.applications) {
    for (const auto& d : app.deployments) {
      uint32_t n = ceiling(d);
      if (n > limits.max_replicas_per_deployment) {
        return Status(errc::invalid_argument,
                      "applications[" + name + "].deployments[" + d.name + "] asks for " +
                          std::to_string(n) + " replicas; the cluster allows at most " +
                          std::to_string(limits.max_replicas_per_deployment) +
                          " per deployment (troupe-node --max-replicas-per-deployment)");
      }
      total += n;
    }
  }
  if (total > limits.max_replicas_total) {
    return Status(errc::invalid_argument,
                  "the config asks for " + std::to_string(total) +
                      " replicas in all; the cluster allows at most " +
                      std::to_string(limits.max_replicas_total) +
                      " (troupe-node --max-replicas-total)");
  }
  return Status::ok();
}

Status check_config_size(size_t bytes, const Limits& limits) {
  if (bytes > limits.max_config_bytes) {
    return Status(errc::invalid_argument,
                  "the config is " + std::to_string(bytes) + " bytes encoded; the cluster accepts " +
                      "at most " + std::to_string(limits.max_config_bytes) +
                      " (troupe-node --max-config-bytes)");
  }
  return Status::ok();
}

}  // namespace troupe::controller
