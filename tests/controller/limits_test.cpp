#include "controller/core/limits.hpp"

#include <doctest/doctest.h>

#include "tests/controller/fakes.hpp"

using namespace troupe;
using namespace troupe::controller;
using namespace troupe::controller::testing;

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

// The state manager enforces the limits on every deploy path, before anything
// is validated or written.
TEST_CASE("limits: deploy_application counts the other applications too") {
  Harness h;
  h.options.limits.max_replicas_total = 3;
  h.start();
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {make_deployment("D", 2)})).has_value());
  int saves = h.store->saves;
  auto r = h.core->deploy_application(make_app("b", "/b", {make_deployment("E", 2)}));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().code() == errc::invalid_argument);
  CHECK(r.status().message() ==
        "the config asks for 4 replicas in all; the cluster allows at most 3 "
        "(troupe-node --max-replicas-total)");
  CHECK(h.store->saves == saves);
  CHECK(h.core->target_state().applications.count("b") == 0);
  // Replacing an application counts its new size only.
  CHECK(h.core->deploy_application(make_app("a", "/a", {make_deployment("D", 3)})).has_value());
}

TEST_CASE("limits: deploy_deployment goes through the same check") {
  Harness h;
  h.options.limits.max_replicas_per_deployment = 4;
  h.start();
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {make_deployment("D", 2)})).has_value());
  auto r = h.core->deploy_deployment("a", make_deployment("D", 5));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().message() ==
        "applications[a].deployments[D] asks for 5 replicas; the cluster allows at most 4 per "
        "deployment (troupe-node --max-replicas-per-deployment)");
  CHECK(h.core->target_replicas({"a", "D"}) == 2u);
}

TEST_CASE("limits: apply refuses a declaration above them and changes nothing") {
  Harness h;
  h.options.limits.max_replicas_per_deployment = 4;
  h.start();
  TargetState declared;
  declared.applications["a"] = make_app("a", "/a", {make_deployment("D", 5)});
  bool changed = true;
  auto r = h.core->apply(declared, &changed);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().code() == errc::invalid_argument);
  CHECK_FALSE(changed);
  CHECK(h.store->saves == 0);
  CHECK(h.core->target_state().applications.empty());
  declared.applications["a"] = make_app("a", "/a", {make_deployment("D", 4)});
  CHECK(h.core->apply(declared, &changed).has_value());
  CHECK(changed);
}

TEST_CASE("limits: the check comes before validation") {
  // An invalid spec that is also too big is refused for its size, as the
  // controller always did.
  Harness h;
  h.options.limits.max_replicas_per_deployment = 4;
  h.start();
  auto app = make_app("a", "/a", {make_deployment("D", 5)});
  app.ingress = "missing";
  auto r = h.core->deploy_application(app);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().message().find("asks for 5 replicas") != std::string::npos);
}
