#include "controller/core/limits.hpp"

#include <doctest/doctest.h>

using namespace troupe;
using namespace troupe::controller;

namespace {

DeploymentSpec dep(const std::string& name, uint32_t n) {
  DeploymentSpec d;
  d.name = name;
  d.config.num_replicas = n;
  return d;
}

TargetState state(std::vector<DeploymentSpec> deps) {
  TargetState s;
  ApplicationSpec a;
  a.name = "app";
  a.route_prefix = "/";
  a.deployments = std::move(deps);
  a.ingress = a.deployments.front().name;
  s.applications["app"] = a;
  return s;
}

}  // namespace

TEST_CASE("limits: replicas per deployment - counting the autoscaling ceiling") {
  Limits limits;
  limits.max_replicas_per_deployment = 10;
  CHECK(check_limits(state({dep("A", 10)}), limits).is_ok());
  auto st = check_limits(state({dep("A", 11)}), limits);
  CHECK(st.code() == errc::invalid_argument);
  CHECK(st.message() ==
        "applications[app].deployments[A] asks for 11 replicas; the cluster allows at most 10 per "
        "deployment (troupe-node --max-replicas-per-deployment)");
  auto scaled = dep("A", 1);
  scaled.config.autoscaling_config = AutoscalingConfig{};
  scaled.config.autoscaling_config->max_replicas = 50;
  CHECK(check_limits(state({scaled}), limits).code() == errc::invalid_argument);
}

TEST_CASE("limits: replicas of the whole cluster") {
  Limits limits;
  limits.max_replicas_total = 15;
  CHECK(check_limits(state({dep("A", 10), dep("B", 5)}), limits).is_ok());
  auto st = check_limits(state({dep("A", 10), dep("B", 6)}), limits);
  CHECK(st.code() == errc::invalid_argument);
  CHECK(st.message() ==
        "the config asks for 16 replicas in all; the cluster allows at most 15 "
        "(troupe-node --max-replicas-total)");
}

TEST_CASE("limits: config size") {
  Limits limits;
  limits.max_config_bytes = 100;
  CHECK(check_config_size(100, limits).is_ok());
  CHECK(check_config_size(101, limits).message().find("101 bytes") != std::string::npos);
}
