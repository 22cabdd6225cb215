// The traffic split in the controller core: validation (the seed's rules),
// set_traffic written ahead and published with the routes, deletes of
// deployments that carry weight, and a restart that keeps the weights.
#include <doctest/doctest.h>

#include "controller/core/validate.hpp"
#include "tests/controller/fakes.hpp"

using namespace troupe;
using namespace troupe::controller;
using namespace troupe::controller::testing;
using Weights = std::map<std::string, double>;

namespace {

// greet: Hello (the ingress) and Canary.
ApplicationSpec greet(Weights traffic = {}) {
  auto app = make_app("greet", "/greet", {make_deployment("Hello", 1), make_deployment("Canary", 1)});
  app.traffic = std::move(traffic);
  return app;
}

std::string problem(const ApplicationSpec& app) {
  Status s = validate(app);
  CHECK(s.code() == errc::invalid_argument);
  return s.message();
}

// The route of `app` in the last snapshot a subscriber at `last` gets.
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

TEST_CASE("traffic: valid splits - weights of the application's deployments summing to 1") {
  CHECK(validate(greet()).is_ok());  // no split: all to the ingress
  CHECK(validate(greet({{"Hello", 0.8}, {"Canary", 0.2}})).is_ok());
  CHECK(validate(greet({{"Hello", 0}, {"Canary", 1}})).is_ok());
  CHECK(validate(greet({{"Canary", 1}})).is_ok());
  CHECK(validate(greet({{"Hello", 0.7 + 5e-9}, {"Canary", 0.3}})).is_ok());
  auto keyed = greet({{"Hello", 0.5}, {"Canary", 0.5}});
  keyed.traffic_key_header = "X-User";
  CHECK(validate(keyed).is_ok());
}

TEST_CASE("traffic: every kind of bad split is refused naming the field") {
  CHECK(problem(greet({{"Hello", 0.8}, {"Canary", 0.1}})) ==
        "applications[greet].traffic: weights sum to 0.9, must sum to 1 (within 1.001e-05)");
  CHECK(problem(greet({{"Hello", 1.5}, {"Canary", -0.5}})) ==
        "applications[greet].traffic[Canary]: -0.5 must be a weight >= 0");
  CHECK(problem(greet({{"Hello", NAN}, {"Canary", 1}})) ==
        "applications[greet].traffic[Hello]: nan must be a weight >= 0");
  CHECK(problem(greet({{"Hello", 0.5}, {"Nope", 0.5}})) ==
        "applications[greet].traffic[Nope]: \"Nope\" must name a deployment of application "
        "\"greet\"");
  // With one deployment, naming another.
  auto single = make_app("solo", "/solo", {make_deployment("Hello", 1)});
  single.traffic = {{"Other", 1}};
  CHECK(problem(single) ==
        "applications[solo].traffic[Other]: \"Other\" must name a deployment of application "
        "\"solo\"");
  auto keyed = greet();
  keyed.traffic_key_header = "X-User";
  CHECK(problem(keyed) ==
        "applications[greet].traffic_key_header: \"X-User\" needs a traffic split (traffic is "
        "empty)");
  keyed.traffic = {{"Hello", 1}};
  keyed.traffic_key_header = "X User";
  CHECK(problem(keyed).find("applications[greet].traffic_key_header: \"X User\" must be an HTTP "
                            "header name") == 0);

  // A deployment of another application: the message says whose it is.
  TargetState state;
  state.applications["greet"] = greet({{"Hello", 0.5}, {"Mirror", 0.5}});
  state.applications["other"] = make_app("other", "/other", {make_deployment("Mirror", 1)});
  Status s = validate(state);
  CHECK(s.message() ==
        "applications[greet].traffic[Mirror]: \"Mirror\" must name a deployment of application "
        "\"greet\" (it is a deployment of application \"other\")");
}

// The seed's rule is np.isclose(sum, 1, atol=1e-8) with numpy's default
// rtol=1e-5: |sum - 1| <= 1e-8 + 1e-5 * 1, computed in doubles as numpy does.
TEST_CASE("traffic: weights sum to 1 within the seed's np.isclose tolerance (1.001e-05)") {
  CHECK(kTrafficSumTolerance == 1e-8 + 1e-5);
  // A Ray config with 0.33333 x 3 (sum 0.99999, 1e-05 from 1): accepted.
  auto thirds = make_app("thirds", "/thirds",
                         {make_deployment("A", 1), make_deployment("B", 1), make_deployment("C", 1)});
  thirds.traffic = {{"A", 0.33333}, {"B", 0.33333}, {"C", 0.33333}};
  CHECK(validate(thirds).is_ok());
  // 0.3 x 3 (0.8999999999999999 in doubles): refused, naming the sum.
  thirds.traffic = {{"A", 0.3}, {"B", 0.3}, {"C", 0.3}};
  CHECK(problem(thirds) ==
        "applications[thirds].traffic: weights sum to 0.9, must sum to 1 (within 1.001e-05)");
  // Just outside: 0.999989 is 1.1e-05 from 1.
  CHECK(problem(greet({{"Hello", 0}, {"Canary", 0.999989}})) ==
        "applications[greet].traffic: weights sum to 0.999989, must sum to 1 (within 1.001e-05)");
  CHECK(validate(greet({{"Hello", 0}, {"Canary", 0.99999}})).is_ok());
  CHECK(validate(greet({{"Hello", 0.5}, {"Canary", 0.50001}})).is_ok());
  CHECK(problem(greet({{"Hello", 0.5}, {"Canary", 0.500011}})) ==
        "applications[greet].traffic: weights sum to 1.000011, must sum to 1 (within 1.001e-05)");
  // The exact boundaries, in doubles: 1 - 1.001e-05 rounds to 0.99998999,
  // whose distance from 1 is 1.0010000000004737e-05 > the tolerance; the next
  // double up is inside. The same above 1.
  CHECK_FALSE(traffic_sum_is_one(0.99998999));
  CHECK(traffic_sum_is_one(std::nextafter(0.99998999, 1.0)));
  CHECK_FALSE(traffic_sum_is_one(1.00001001));
  CHECK(traffic_sum_is_one(std::nextafter(1.00001001, 1.0)));
  CHECK(problem(greet({{"Hello", 0}, {"Canary", 0.99998999}})) ==
        "applications[greet].traffic: weights sum to 0.99998999, must sum to 1 (within "
        "1.001e-05)");
  CHECK(validate(greet({{"Hello", 0}, {"Canary", std::nextafter(0.99998999, 1.0)}})).is_ok());
  CHECK_FALSE(traffic_sum_is_one(NAN));
}

TEST_CASE("traffic: set_traffic follows the same tolerance - 0.33333 x 3 taken - 0.3 x 3 refused") {
  Harness h;
  REQUIRE(h.core->deploy_application(make_app(
              "thirds", "/thirds",
              {make_deployment("A", 1), make_deployment("B", 1), make_deployment("C", 1)}))
              .has_value());
  const int saves = h.store->saves;
  auto r = h.core->set_traffic("thirds", {{"A", 0.3}, {"B", 0.3}, {"C", 0.3}});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().code() == errc::invalid_argument);
  CHECK(r.status().message() ==
        "applications[thirds].traffic: weights sum to 0.9, must sum to 1 (within 1.001e-05)");
  r = h.core->set_traffic("thirds", {{"A", 0}, {"B", 0}, {"C", 0.999989}});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().message() ==
        "applications[thirds].traffic: weights sum to 0.999989, must sum to 1 (within "
        "1.001e-05)");
  CHECK(h.store->saves == saves);
  r = h.core->set_traffic("thirds", {{"A", 0.33333}, {"B", 0.33333}, {"C", 0.33333}});
  REQUIRE(r.has_value());
  CHECK(h.store->saves == saves + 1);
  CHECK(h.core->target_state().applications.at("thirds").traffic ==
        Weights{{"A", 0.33333}, {"B", 0.33333}, {"C", 0.33333}});
}

TEST_CASE("traffic: set_traffic is written ahead - published with the routes - kept on restart") {
  Harness h;
  REQUIRE(h.core->deploy_application(greet()).has_value());
  h.ticks(2);
  const SnapshotId before = h.core->snapshot_id();
  auto route = published_route(*h.core, "greet");
  REQUIRE(route);
  CHECK(route->ingress == "Hello");
  CHECK(route->traffic.empty());

  const int saves = h.store->saves;
  const uint64_t generation = h.core->target_state().generation;
  auto r = h.core->set_traffic("greet", {{"Hello", 0.8}, {"Canary", 0.2}});
  REQUIRE(r.has_value());
  CHECK(*r == generation + 1);
  CHECK(h.store->saves == saves + 1);
  CHECK(h.store->saved->applications.at("greet").traffic == Weights{{"Hello", 0.8}, {"Canary", 0.2}});
  // No replica restarts: the deployments did not change.
  CHECK(h.tick() == std::vector<std::string>{});
  auto delta = h.core->changes_since(before);
  REQUIRE(delta);
  CHECK_FALSE(delta->full);
  CHECK(delta->routes_changed);
  CHECK(delta->deployments.empty());
  route = published_route(*h.core, "greet", before);
  REQUIRE(route);
  CHECK(route->traffic == Weights{{"Hello", 0.8}, {"Canary", 0.2}});

  // The same split again: nothing written, nothing published. (The tick
  // above wrote the new split ahead as the application's last good
  // declaration: it runs it.)
  CHECK(h.store->saved->last_running.at("greet").spec.traffic ==
        Weights{{"Hello", 0.8}, {"Canary", 0.2}});
  const int saves_now = h.store->saves;
  const SnapshotId current = h.core->snapshot_id();
  REQUIRE(h.core->set_traffic("greet", {{"Hello", 0.8}, {"Canary", 0.2}}).has_value());
  CHECK(h.store->saves == saves_now);
  h.tick();
  CHECK_FALSE(h.core->changes_since(current).has_value());

  // A controller restart reads the weights back and publishes them.
  h.restart();
  h.ticks(2);
  CHECK(h.core->target_state().applications.at("greet").traffic ==
        Weights{{"Hello", 0.8}, {"Canary", 0.2}});
  route = published_route(*h.core, "greet");
  REQUIRE(route);
  CHECK(route->traffic == Weights{{"Hello", 0.8}, {"Canary", 0.2}});
}

TEST_CASE("traffic: open_inference is published with the routes - no restarts - kept on restart") {
  Harness h;
  REQUIRE(h.core->deploy_application(greet()).has_value());
  h.ticks(2);
  SnapshotId before = h.core->snapshot_id();
  auto route = published_route(*h.core, "greet");
  REQUIRE(route);
  CHECK_FALSE(route->open_inference);

  auto oip = greet();
  oip.open_inference = true;
  const int saves = h.store->saves;
  REQUIRE(h.core->deploy_application(oip).has_value());
  CHECK(h.store->saves == saves + 1);
  CHECK(h.store->saved->applications.at("greet").open_inference);
  // No replica restarts: routing only.
  CHECK(h.tick() == std::vector<std::string>{});
  auto delta = h.core->changes_since(before);
  REQUIRE(delta);
  CHECK(delta->routes_changed);
  CHECK(delta->deployments.empty());
  route = published_route(*h.core, "greet", before);
  REQUIRE(route);
  CHECK(route->open_inference);
  CHECK(route->ingress == "Hello");
  CHECK(route->prefix == "/greet");

  // A controller restart reads it back and publishes it.
  h.restart();
  h.ticks(2);
  CHECK(h.core->target_state().applications.at("greet").open_inference);
  route = published_route(*h.core, "greet");
  REQUIRE(route);
  CHECK(route->open_inference);

  // Turned off again: published, still no restarts.
  before = h.core->snapshot_id();
  REQUIRE(h.core->deploy_application(greet()).has_value());
  CHECK(h.tick() == std::vector<std::string>{});
  route = published_route(*h.core, "greet", before);
  REQUIRE(route);
  CHECK_FALSE(route->open_inference);
}

TEST_CASE("traffic: set_traffic refuses bad weights and unknown names - nothing changes") {
  Harness h;
  REQUIRE(h.core->deploy_application(greet({{"Hello", 1}})).has_value());
  REQUIRE(h.core->deploy_application(make_app("other", "/other", {make_deployment("Mirror", 1)}))
              .has_value());
  const TargetState before = h.core->target_state();
  const int saves = h.store->saves;
  struct Bad {
    std::string app;
    Weights weights;
    errc code;
    std::string message;
  };
  for (const Bad& b : {
           Bad{"nope", {{"Hello", 1}}, errc::not_found,
               "applications[nope]: \"nope\" is not a known application"},
           Bad{"greet", {}, errc::invalid_argument,
               "applications[greet].traffic: {} must name at least one deployment"},
           Bad{"greet", {{"Hello", 0.5}, {"Canary", 0.4}}, errc::invalid_argument,
               "applications[greet].traffic: weights sum to 0.9, must sum to 1 (within 1.001e-05)"},
           Bad{"greet", {{"Hello", 1.2}, {"Canary", -0.2}}, errc::invalid_argument,
               "applications[greet].traffic[Canary]: -0.2 must be a weight >= 0"},
           Bad{"greet", {{"Hello", 0.5}, {"Mirror", 0.5}}, errc::invalid_argument,
               "applications[greet].traffic[Mirror]: \"Mirror\" must name a deployment of "
               "application \"greet\" (it is a deployment of application \"other\")"},
       }) {
    CAPTURE(b.message);
    auto r = h.core->set_traffic(b.app, b.weights);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.status().code() == b.code);
    CHECK(r.status().message() == b.message);
  }
  CHECK(h.core->target_state() == before);
  CHECK(h.store->saves == saves);
}

TEST_CASE("traffic: a deployment that carries weight cannot be deleted - at weight 0 it can") {
  Harness h;
  REQUIRE(h.core->deploy_application(greet({{"Hello", 0.9}, {"Canary", 0.1}})).has_value());
  h.ticks(2);
  const TargetState before = h.core->target_state();
  Status refused = h.core->delete_deployment("greet", "Canary");
  CHECK(refused.code() == errc::invalid_argument);
  CHECK(refused.message() ==
        "applications[greet].deployments[Canary]: \"Canary\" carries traffic "
        "(applications[greet].traffic[Canary] = 0.1) and cannot be deleted; give its weight to "
        "other deployments first");
  CHECK(h.core->target_state() == before);
  // A redeploy without it is refused too: the split would name a missing
  // deployment.
  auto without = greet({{"Hello", 0.9}, {"Canary", 0.1}});
  without.deployments.pop_back();
  auto r = h.core->deploy_application(without);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().message().find("traffic[Canary]") != std::string::npos);

  REQUIRE(h.core->set_traffic("greet", {{"Hello", 1}, {"Canary", 0}}).has_value());
  REQUIRE(h.core->delete_deployment("greet", "Canary").is_ok());
  CHECK(h.core->target_state().applications.at("greet").traffic == Weights{{"Hello", 1}});
  CHECK(h.core->target_state().applications.at("greet").deployments.size() == 1);
}
