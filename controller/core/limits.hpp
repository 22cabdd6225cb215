// Cluster-wide limits that keep one bad config from taking the cluster down:
// checked on every state-changing call before anything is written.
#pragma once

#include <cstddef>
#include <cstdint>

#include "controller/core/model.hpp"
#include "runtime/status.hpp"

namespace troupe::controller {

struct Limits {
  // The most replicas one deployment may ask for (num_replicas, or
  // autoscaling max_replicas).
  uint32_t max_replicas_per_deployment = 1000;
  // The most replicas all deployments together may ask for.
  uint64_t max_replicas_total = 10000;
  // The largest encoded config (a whole declared target state) accepted.
  size_t max_config_bytes = 4 * 1024 * 1024;
};

// errc::invalid_argument naming the deployment, its count, the limit and the
// node option that raises it.
Status check_limits(const TargetState& state, const Limits& limits);

// The same for the size of an encoded config.
Status check_config_size(size_t bytes, const Limits& limits);

}  // namespace troupe::controller
