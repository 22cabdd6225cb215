// Validation of user input: an application spec or a whole target state. The
// state manager calls it before anything is written; a config loader can call
// it too. Errors name the field, the value and the rule, e.g.
//   applications[greeter].deployments[Hello].num_replicas: 200000 must be <= 100000
// Several problems are joined with "; ". errc::invalid_argument on failure.
#pragma once

#include <cmath>

#include "controller/core/model.hpp"
#include "runtime/status.hpp"

namespace troupe::controller {

// Limits beyond which a value is considered absurd.
constexpr uint32_t kMaxReplicas = 100000;
constexpr uint32_t kMaxOngoingRequests = 1000000;
// Request batching: the largest max_batch_size, and the longest
// batch_wait_timeout_s in seconds (0 is allowed).
constexpr uint32_t kMaxBatchSize = 10000;
constexpr double kMaxBatchWaitTimeoutS = 3600.0;
constexpr double kMaxTimeoutS = 86400.0;
// How far the weights of a traffic split may sum from 1: the seed's rule,
// np.isclose(sum, 1, atol=1e-8) with numpy's default rtol of 1e-5, that is
// |sum - 1| <= 1e-8 + 1e-5 * |1| (1.001e-05): 0.33333 x 3 (0.99999) passes,
// 0.999989 does not. The proxy ends the last share at exactly 1, so a sum a
// little off 1 still routes every request.
constexpr double kTrafficSumAbsTolerance = 1e-8;
constexpr double kTrafficSumRelTolerance = 1e-5;
constexpr double kTrafficSumTolerance = kTrafficSumAbsTolerance + kTrafficSumRelTolerance * 1.0;

// True when weights summing to `sum` make a valid split (the rule above, in
// numpy's arithmetic; NaN is not). Used by validate() and the config loader.
inline bool traffic_sum_is_one(double sum) {
  return std::fabs(sum - 1.0) <= kTrafficSumTolerance;
}

// Checks one application on its own (names, ingress, every deployment).
Status validate(const ApplicationSpec& app);

// Checks every application plus the cross-application rules: unique route
// prefixes, target_capacity in [0, 100], http timeouts in (0, 86400] s; a
// traffic split or shadow naming a deployment of another application says so.
Status validate(const TargetState& state);

// True when `name` can name an application or deployment: non-empty, at most
// 100 characters, no '#', '/', whitespace or control characters.
bool valid_name(const std::string& name);

// True when `name` can name an HTTP header field: 1-100 characters of the
// token alphabet (RFC 9110: letters, digits and !#$%&'*+-.^_`|~).
bool valid_header_name(const std::string& name);

}  // namespace troupe::controller
