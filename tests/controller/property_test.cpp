// Property: random (seeded, reproducible) sequences of deploys, scales,
// crashes, health failures, deletions, target-capacity changes, draining nodes,
// versions that fail to start and controller restarts always converge
// to the target, and no deployment ever has more than target + rollout_size
// replicas alive (not stopping) after any tick.
#include <doctest/doctest.h>

#include <random>

#include "tests/controller/fakes.hpp"

using namespace troupe;
using namespace troupe::controller;
using namespace troupe::controller::testing;

namespace {

struct World {
  std::mt19937_64 gen;
  std::map<std::string, ApplicationSpec> apps;  // what we last asked for
  std::vector<std::string> broken;              // code versions that fail to start

  explicit World(uint64_t seed) : gen(seed) {}

  uint32_t pick(uint32_t n) { return static_cast<uint32_t>(gen() % n); }

  DeploymentSpec random_deployment(const std::string& name) {
    DeploymentSpec d = make_deployment(name, pick(11), "v" + std::to_string(pick(3)));
    d.config.health_check_period_s = 2;
    d.config.health_check_timeout_s = 1;
    d.config.graceful_shutdown_timeout_s = 3;
    if (pick(2))
      d.config.user_config = "{\"k\":" + std::to_string(pick(3)) + "}";
    if (pick(4) == 0)
      d.config.resources = *parse_resources("cpu=1");
    return d;
  }
};

// Replicas of each deployment that are alive and not shutting down.
std::map<DeploymentId, std::size_t> alive(const FakeCluster& c) {
  std::map<DeploymentId, std::size_t> out;
  for (const auto& [id, a] : c.actors) {
    if (!a.stopping)
      ++out[DeploymentId{a.app, a.deployment}];
  }
  return out;
}

void check_bound(Harness& h, uint64_t seed, int step) {
  for (const auto& [id, n] : alive(h.cluster)) {
    auto target = h.core->target_replicas(id);
    const uint32_t t = target ? *target : 0;
    const uint32_t rollout = std::max<uint32_t>(t / 5, 1);
    INFO("seed " << seed << " step " << step << " deployment " << id.to_string());
    CHECK(n <= t + rollout);
  }
}

// Returns how many replicas run at the end (to show the runs are not vacuous).
std::size_t run(uint64_t seed) {
  World w(seed);
  SeededRandom core_rng(seed);
  Harness h;
  h.random = &core_rng;
  h.nodes = make_nodes(4, "cpu=6");
  h.restart();

  const std::vector<std::string> app_names = {"a", "b"};
  for (int step = 0; step < 400; ++step) {
    const uint32_t action = w.pick(100);
    if (action < 12) {  // deploy or redeploy an application
      const std::string& name = app_names[w.pick(2)];
      std::vector<DeploymentSpec> deps = {w.random_deployment("D")};
      if (w.pick(2))
        deps.push_back(w.random_deployment("E"));
      if (w.pick(6) == 0) {
        deps[0].code_version = "broken";
        h.cluster.fail_codes.insert(code_identity(deps[0]));
      }
      auto app = make_app(name, "/" + name, deps);
      if (h.core->deploy_application(app).has_value())
        w.apps[name] = app;
    } else if (action < 20) {  // scale one deployment
      if (!w.apps.empty()) {
        auto it = w.apps.begin();
        std::advance(it, w.pick(static_cast<uint32_t>(w.apps.size())));
        auto d = it->second.deployments[0];
        d.config.num_replicas = w.pick(13);
        if (h.core->deploy_deployment(it->first, d).has_value()) {
          it->second.deployments[0] = d;
        }
      }
    } else if (action < 23) {  // delete an application
      const std::string& name = app_names[w.pick(2)];
      if (h.core->delete_application(name).is_ok())
        w.apps.erase(name);
    } else if (action < 30) {  // a replica crashes
      if (!h.cluster.actors.empty()) {
        auto it = h.cluster.actors.begin();
        std::advance(it, w.pick(static_cast<uint32_t>(h.cluster.actors.size())));
        h.cluster.crash(it->first);
      }
    } else if (action < 36) {  // a replica starts failing health checks
      if (!h.cluster.actors.empty()) {
        auto it = h.cluster.actors.begin();
        std::advance(it, w.pick(static_cast<uint32_t>(h.cluster.actors.size())));
        h.cluster.unhealthy.insert(it->first);
      }
    } else if (action < 38) {  // the controller crashes and restarts
      h.restart();
    } else if (action < 42) {  // the cluster-wide target capacity changes
      const std::optional<double> choices[] = {std::nullopt, 0.0, 30.0, 50.0, 100.0};
      REQUIRE(h.core->set_target_capacity(choices[w.pick(5)]).is_ok());
    } else if (action < 44) {  // a node drains, or comes back
      auto nodes = h.nodes;
      auto& n = nodes[w.pick(static_cast<uint32_t>(nodes.size()))];
      n.state = n.state == NodeState::alive ? NodeState::draining : NodeState::alive;
      h.set_nodes(nodes);
    }
    h.tick(0.5);
    check_bound(h, seed, step);
  }

  // Quiesce: no more faults, broken versions replaced, all nodes alive.
  h.cluster.unhealthy.clear();
  h.set_nodes(make_nodes(4, "cpu=6"));
  REQUIRE(h.core->set_target_capacity(std::nullopt).is_ok());
  for (auto& [name, app] : w.apps) {
    bool fixed = false;
    for (auto& d : app.deployments) {
      if (d.code_version == "broken") {
        d.code_version = "v9";
        fixed = true;
      }
    }
    if (fixed)
      REQUIRE(h.core->deploy_application(app).has_value());
  }
  for (int i = 0; i < 300; ++i) {
    h.tick(0.5);
    check_bound(h, seed, 400 + i);
  }

  INFO("seed " << seed);
  CHECK(h.core->target_state().applications == w.apps);
  std::size_t expected_actors = 0;
  for (const auto& [name, app] : w.apps) {
    CHECK(h.core->application_status(name)->status == ApplicationStatus::running);
    for (const auto& d : app.deployments) {
      DeploymentId id{name, d.name};
      INFO("deployment " << id.to_string());
      const uint32_t target = *h.core->target_replicas(id);
      CHECK(target == d.config.num_replicas);
      CHECK(h.status(name, d.name).status == DeploymentStatus::healthy);
      auto reps = h.replicas(name, d.name);
      CHECK(reps.size() == target);
      for (const auto& r : reps) {
        CHECK(r.state == ReplicaState::running);
        CHECK(r.version == version_of(d));
      }
      CHECK(h.cluster.alive_not_stopping(name, d.name) == target);
      expected_actors += target;
    }
  }
  // Nothing else is left running: no orphans, no replicas of deleted apps.
  CHECK(h.cluster.actors.size() == expected_actors);
  CHECK(h.core->orphans().empty());
  return expected_actors;
}

}  // namespace

TEST_CASE("property: random operations converge within target + rollout_size") {
  std::size_t replicas = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed)
    replicas += run(seed);
  MESSAGE("replicas running after the 40 runs: " << replicas);
  CHECK(replicas > 100);
}
