// Shadow traffic in the controller core: validation (probabilities, names,
// and the rule that a shadow never receives real traffic), the shadow
// published with the routes, written ahead and kept on restart, and deletes
// of shadow deployments.
#include <doctest/doctest.h>

#include <cmath>

#include "controller/core/validate.hpp"
#include "tests/controller/fakes.hpp"

using namespace troupe;
using namespace troupe::controller;
using namespace troupe::controller::testing;
using Weights = std::map<std::string, double>;

namespace {

// greet: Hello (the ingress), Canary and Mirror.
ApplicationSpec greet(Weights shadow = {}, Weights traffic = {}) {
  auto app = make_app(
      "greet", "/greet",
      {make_deployment("Hello", 1), make_deployment("Canary", 1), make_deployment("Mirror", 1)});
  app.shadow = std::move(shadow);
  app.traffic = std::move(traffic);
  return app;
}

std::string problem(const ApplicationSpec& app) {
  Status s = validate(app);
  CHECK(s.code() == errc::invalid_argument);
  return s.message();
}

std::optional<Route> published_route(const StateManager& core, const std::string& app,
                                     SnapshotId last = {}) {
  auto d = core.changes_since(last);
  if (!d || !d->routes_changed)
    return std::nullopt;
  for (const auto& r : d->routes) {
    if (r.app == app)
      return r;
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("shadow: valid shadows - probabilities from 0 to 1 on deployments without traffic") {
  CHECK(validate(greet()).is_ok());
  CHECK(validate(greet({{"Mirror", 0.5}})).is_ok());
  CHECK(validate(greet({{"Mirror", 0}, {"Canary", 1}})).is_ok());
  // With a split: any deployment without weight, the ingress too.
  CHECK(validate(greet({{"Mirror", 0.25}}, {{"Hello", 0.5}, {"Canary", 0.5}})).is_ok());
  CHECK(validate(greet({{"Mirror", 1}, {"Hello", 0.5}}, {{"Canary", 1}})).is_ok());
  CHECK(validate(greet({{"Mirror", 1}}, {{"Hello", 1}, {"Mirror", 0}})).is_ok());
}

TEST_CASE("shadow: every kind of bad shadow is refused naming the field") {
  CHECK(problem(greet({{"Mirror", 1.5}})) ==
        "applications[greet].shadow[Mirror]: 1.5 must be a probability from 0 to 1");
  CHECK(problem(greet({{"Mirror", -0.1}})) ==
        "applications[greet].shadow[Mirror]: -0.1 must be a probability from 0 to 1");
  CHECK(problem(greet({{"Mirror", NAN}})) ==
        "applications[greet].shadow[Mirror]: nan must be a probability from 0 to 1");
  CHECK(problem(greet({{"Nope", 0.5}})) ==
        "applications[greet].shadow[Nope]: \"Nope\" must name a deployment of application "
        "\"greet\"");
  // The ingress of an application without a split receives every request.
  CHECK(problem(greet({{"Hello", 0.5}})) ==
        "applications[greet].shadow[Hello]: \"Hello\" is the ingress, which receives the "
        "application's requests (there is no traffic split); a shadow cannot also receive real "
        "traffic");
  // A deployment that carries weight.
  CHECK(problem(greet({{"Canary", 0.5}}, {{"Hello", 0.9}, {"Canary", 0.1}})) ==
        "applications[greet].shadow[Canary]: \"Canary\" carries traffic "
        "(applications[greet].traffic[Canary] = 0.1); a shadow cannot also receive real traffic");
  CHECK(
      problem(greet({{"Hello", 0.5}}, {{"Hello", 0.9}, {"Canary", 0.1}})).find("carries traffic") !=
      std::string::npos);

  // A deployment of another application: the message says whose it is.
  TargetState state;
  state.applications["greet"] = greet({{"Echo", 0.5}});
  state.applications["other"] = make_app("other", "/other", {make_deployment("Echo", 1)});
  CHECK(validate(state).message() ==
        "applications[greet].shadow[Echo]: \"Echo\" must name a deployment of application "
        "\"greet\" (it is a deployment of application \"other\")");
}

TEST_CASE("shadow: deployed with the application - published with the routes - kept on restart") {
  Harness h;
  REQUIRE(h.core->deploy_application(greet()).has_value());
  h.ticks(2);
  const SnapshotId before = h.core->snapshot_id();
  auto route = published_route(*h.core, "greet");
  REQUIRE(route);
  CHECK(route->shadow.empty());

  const int saves = h.store->saves;
  REQUIRE(h.core->deploy_application(greet({{"Mirror", 0.5}})).has_value());
  CHECK(h.store->saves == saves + 1);
  CHECK(h.store->saved->applications.at("greet").shadow == Weights{{"Mirror", 0.5}});
  // No replica restarts: the deployments did not change.
  CHECK(h.tick() == std::vector<std::string>{});
  route = published_route(*h.core, "greet", before);
  REQUIRE(route);
  CHECK(route->shadow == Weights{{"Mirror", 0.5}});
  CHECK(route->ingress == "Hello");

  h.restart();
  h.ticks(2);
  CHECK(h.core->target_state().applications.at("greet").shadow == Weights{{"Mirror", 0.5}});
  route = published_route(*h.core, "greet");
  REQUIRE(route);
  CHECK(route->shadow == Weights{{"Mirror", 0.5}});
}

TEST_CASE("shadow: refused deploys and traffic changes leave everything as it was") {
  Harness h;
  REQUIRE(h.core->deploy_application(greet({{"Mirror", 0.5}})).has_value());
  h.ticks(2);
  const TargetState before = h.core->target_state();
  const int saves = h.store->saves;
  auto r = h.core->deploy_application(greet({{"Mirror", 2}}));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().code() == errc::invalid_argument);
  // Weight for the shadow through `troupectl traffic`.
  auto t = h.core->set_traffic("greet", {{"Hello", 0.5}, {"Mirror", 0.5}});
  REQUIRE_FALSE(t.has_value());
  CHECK(t.status().message() ==
        "applications[greet].shadow[Mirror]: \"Mirror\" carries traffic "
        "(applications[greet].traffic[Mirror] = 0.5); a shadow cannot also receive real traffic");
  CHECK(h.core->target_state() == before);
  CHECK(h.store->saves == saves);
}

TEST_CASE("shadow: a shadow deployment cannot be deleted - once out of shadow it can") {
  Harness h;
  REQUIRE(h.core->deploy_application(greet({{"Mirror", 0.5}})).has_value());
  h.ticks(2);
  const TargetState before = h.core->target_state();
  Status refused = h.core->delete_deployment("greet", "Mirror");
  CHECK(refused.code() == errc::invalid_argument);
  CHECK(refused.message() ==
        "applications[greet].deployments[Mirror]: \"Mirror\" is a shadow of the application "
        "(applications[greet].shadow[Mirror] = 0.5) and cannot be deleted; deploy the "
        "application without it in shadow first");
  CHECK(h.core->target_state() == before);
  // A redeploy without the deployment is refused too: the shadow would name
  // a missing deployment.
  auto without = greet({{"Mirror", 0.5}});
  without.deployments.pop_back();
  auto r = h.core->deploy_application(without);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().message().find("shadow[Mirror]") != std::string::npos);

  REQUIRE(h.core->deploy_application(greet()).has_value());
  REQUIRE(h.core->delete_deployment("greet", "Mirror").is_ok());
  CHECK(h.core->target_state().applications.at("greet").deployments.size() == 2);
}

TEST_CASE("shadow: a shadow at probability 0 does not keep its deployment - it leaves with it") {
  Harness h;
  REQUIRE(h.core->deploy_application(greet({{"Mirror", 0}})).has_value());
  h.ticks(2);
  const int saves = h.store->saves;
  // As in the seed, whose set_shadow(backend, 0) removes the entry: nothing
  // is mirrored to it, so nothing keeps it.
  REQUIRE(h.core->delete_deployment("greet", "Mirror").is_ok());
  CHECK(h.store->saves == saves + 1);  // one write-ahead commit for both
  const auto& app = h.core->target_state().applications.at("greet");
  CHECK(app.shadow.empty());
  CHECK(app.deployments.size() == 2);
  CHECK(validate(app).is_ok());
}
