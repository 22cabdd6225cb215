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

// One seeded run: the world's choices, the core's randomness and the harness.
struct Run {
  World w;
  SeededRandom core_rng;
  Harness h;

  Run(uint64_t seed, bool update_settled) : w(seed), core_rng(seed) {
    h.random = &core_rng;
    h.nodes = make_nodes(4, "cpu=6");
    h.options.update_settled = update_settled;
    h.restart();
  }
};

// One random operation, then a tick; returns that tick's commands (health
// watches included).
std::vector<std::string> random_step(World& w, Harness& h) {
  const std::vector<std::string> app_names = {"a", "b"};
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
  return h.tick(0.5, /*with_checks=*/true);
}

// Quiesce: no more faults, broken versions replaced, all nodes alive.
void quiesce(World& w, Harness& h) {
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
}

// Returns how many replicas run at the end (to show the runs are not vacuous).
std::size_t run(uint64_t seed) {
  Run run(seed, /*update_settled=*/false);
  World& w = run.w;
  Harness& h = run.h;
  for (int step = 0; step < 400; ++step) {
    random_step(w, h);
    check_bound(h, seed, step);
  }
  quiesce(w, h);
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

namespace {

// What a test can see of a deployment after a tick.
std::string observed(const Harness& h) {
  std::string out;
  for (const auto& id : h.core->deployment_ids()) {
    const auto st = *h.core->deployment_status(id);
    out += id.to_string() + " " + to_string(st.status) + " " + st.message + " target " +
           std::to_string(*h.core->target_replicas(id)) + ":";
    for (const auto& r : h.core->replicas(id))
      out += " " + r.id + "/" + to_string(r.state) + "/" + r.node_id + "/" + r.version.code;
    out += "\n";
  }
  return out;
}

std::size_t settled_count(const Harness& h) {
  std::size_t n = 0;
  for (const auto& id : h.core->deployment_ids())
    n += h.core->deployment(id)->settled();
  return n;
}

}  // namespace

// The same seeded runs twice: one skips settled deployments (the default),
// the reference updates every deployment every tick. Every tick's commands
// (health watches included) and every deployment's status and replicas must
// be the same, so the skipping is invisible.
TEST_CASE(
    "property: skipping settled deployments is invisible - the same commands and states "
    "as updating every deployment every tick") {
  std::size_t skipped_ticks = 0;
  for (uint64_t seed = 1; seed <= 25; ++seed) {
    Run skipping(seed, /*update_settled=*/false);
    Run reference(seed, /*update_settled=*/true);
    REQUIRE(skipping.h.options.update_settled == false);
    for (int step = 0; step < 700; ++step) {
      INFO("seed " << seed << " step " << step);
      std::vector<std::string> a, b;
      if (step < 400) {
        a = random_step(skipping.w, skipping.h);
        b = random_step(reference.w, reference.h);
      } else {
        if (step == 400) {
          quiesce(skipping.w, skipping.h);
          quiesce(reference.w, reference.h);
        }
        a = skipping.h.tick(0.5, /*with_checks=*/true);
        b = reference.h.tick(0.5, /*with_checks=*/true);
      }
      REQUIRE(a == b);
      REQUIRE(observed(skipping.h) == observed(reference.h));
      skipped_ticks += settled_count(skipping.h);
      // The reference never settles a deployment it then skips, but it
      // computes the same flag.
      REQUIRE(settled_count(skipping.h) == settled_count(reference.h));
    }
    // Converged: every deployment is settled.
    INFO("seed " << seed);
    CHECK(settled_count(skipping.h) == skipping.h.core->deployment_ids().size());
  }
  MESSAGE("deployment-ticks settled across the 25 runs: " << skipped_ticks);
  CHECK(skipped_ticks > 1000);
}
