// The values of troupectl's arguments that CLI11 takes as text: an
// application name, an APP/DEPLOYMENT reference, counts, and traffic weights
// (NAME=W). Plain C++, tested without a cluster
// (tests/tools/troupectl_args_test.cpp).
//
// Every error is errc::invalid_argument with one line that starts with the
// argument's name and quotes the value, e.g.
//   N: "-2" must be a whole number from 0 to 100000
// troupectl prints it and exits 1 without contacting the controller.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/status.hpp"

namespace troupe::ctl {

struct DeploymentRef {
  std::string app;
  std::string deployment;
};

// An application's name (controller::valid_name), e.g. rollback's APP.
Result<std::string> parse_app_name(const std::string& text, const std::string& arg);

// "greet/Canary" -> {greet, Canary}. Both parts must be valid names
// (controller::valid_name), so there is exactly one '/'.
Result<DeploymentRef> parse_deployment_ref(const std::string& text, const std::string& arg);

// A whole number in [0, max], decimal digits only ("3", not "+3", "3.0" or "0x3").
Result<uint64_t> parse_count(const std::string& text, const std::string& arg, uint64_t max);

// "Hello=0.8" "Canary=0.2" -> {Hello: 0.8, Canary: 0.2}. Each item is
// NAME=W with a valid deployment name and a finite number; a name given
// twice is refused. Whether the weights are >= 0 and sum to 1 is the
// controller's rule (controller::validate), checked there: one source of truth.
Result<std::map<std::string, double>> parse_weights(const std::vector<std::string>& items);

}  // namespace troupe::ctl
