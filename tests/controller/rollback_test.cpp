// Rollback (issue 39, item 3): the last good declaration of each application
// (TargetState::last_running) is written ahead when the application runs its
// declaration, dropped with the application, and deployed again by
// StateManager::rollback like any deploy. The tests look at targets, statuses
// and saves, not at which replicas a failed rollout keeps.
#include <doctest/doctest.h>

#include "controller/core/state_manager.hpp"
#include "controller/core/version.hpp"
#include "tests/controller/fakes.hpp"

using namespace troupe;
using namespace troupe::controller;
using namespace troupe::controller::testing;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

ApplicationSpec app_at(const std::string& code_version, uint32_t replicas = 2) {
  return make_app("a", "/a", {make_deployment("D", replicas, code_version)});
}

// Ticks until a/D is HEALTHY; false when it is not within `limit` ticks.
bool tick_until_healthy(Harness& h, int limit = 30) {
  for (int i = 0; i < limit; ++i) {
    h.tick();
    if (h.status("a", "D").status == DeploymentStatus::healthy)
      return true;
  }
  return false;
}

// A store whose saves fail while `fail` is set (a full disk that comes back).
class FlakyStore final : public MemoryStore {
 public:
  bool fail = false;
  int attempts = 0;
  Status save(const TargetState& state) override {
    ++attempts;
    if (fail)
      return Status(errc::io_error, "write /var/lib/troupe/checkpoint: No space left on device");
    return MemoryStore::save(state);
  }
};

// v1 deployed and RUNNING: its declaration is the last good one.
void run_v1(Harness& h) {
  REQUIRE(h.core->deploy_application(app_at("v1")).has_value());
  REQUIRE(tick_until_healthy(h));
  REQUIRE(h.core->target_state().last_running.count("a") == 1);
}

}  // namespace

TEST_CASE("rollback: running its declaration writes it ahead as the last good one") {
  Harness h;
  const auto v1 = app_at("v1");
  REQUIRE(h.core->deploy_application(v1).has_value());
  REQUIRE(h.store->saved.has_value());
  CHECK(h.store->saved->last_running.empty());
  // Written ahead: when the store is asked to save it, memory does not hold it.
  std::vector<bool> held_when_saved;
  h.store->on_save = [&](const TargetState& s) {
    if (s.last_running.count("a"))
      held_when_saved.push_back(h.core->target_state().last_running.count("a") > 0);
  };
  h.tick();  // replicas starting: not RUNNING yet
  CHECK(h.core->target_state().last_running.empty());
  REQUIRE(tick_until_healthy(h));
  CHECK(h.core->application_status("a")->status == ApplicationStatus::running);

  REQUIRE(h.store->saved->last_running.count("a") == 1);
  const RunningDeclaration& saved = h.store->saved->last_running.at("a");
  CHECK(saved.spec == v1);
  CHECK(saved.generation == 1);
  CHECK(h.store->saved->generation == 1);  // no new generation for it
  CHECK(held_when_saved == std::vector<bool>{false});
  CHECK(h.core->target_state().last_running == h.store->saved->last_running);
  CHECK(*h.store->saved == h.core->target_state());

  // Recorded once; a deploy or apply that changes nothing stays a no-op.
  const int saves = h.store->saves;
  h.ticks(5);
  CHECK(h.store->saves == saves);
  auto same = h.core->deploy_application(v1);
  REQUIRE(same.has_value());
  CHECK_FALSE(same->changed);
  TargetState declared;
  declared.applications["a"] = v1;
  bool changed = true;
  REQUIRE(h.core->apply(declared, &changed).has_value());
  CHECK_FALSE(changed);
  CHECK(h.store->saves == saves);
  CHECK(h.core->target_state().generation == 1);

  // A restarted controller reads it back from the checkpoint.
  h.restart();
  CHECK(h.core->target_state().last_running.at("a").spec == v1);
  h.ticks(5);
  CHECK(h.store->saves == saves);
}

TEST_CASE("rollback: a release that failed to start is rolled back - written ahead") {
  Harness h;
  run_v1(h);
  const auto v1 = app_at("v1");
  const auto v2 = app_at("v2");
  h.cluster.fail_codes.insert(code_identity(v2.deployments[0]));  // its constructor fails
  auto deployed = h.core->deploy_application(v2);
  REQUIRE(deployed.has_value());
  CHECK(deployed->generation == 2);
  for (int i = 0; i < 30; ++i) {
    h.tick();
    CHECK(h.status("a", "D").status != DeploymentStatus::healthy);
  }
  // v2 never ran: v1 is still the last good declaration.
  CHECK(h.core->target_state().last_running.at("a").spec == v1);
  CHECK(h.core->target_state().last_running.at("a").generation == 1);
  CHECK(h.core->application_status("a")->status != ApplicationStatus::running);

  // The rollback is saved while memory still holds v2.
  std::optional<ApplicationSpec> declared_when_saved;
  uint64_t generation_when_saved = 0;
  h.store->on_save = [&](const TargetState&) {
    declared_when_saved = h.core->target_state().applications.at("a");
    generation_when_saved = h.core->target_state().generation;
  };
  const int saves = h.store->saves;
  auto rolled = h.core->rollback("a");
  REQUIRE_MESSAGE(rolled.has_value(), rolled.status().to_string());
  CHECK(rolled->changed);
  CHECK(rolled->generation == 3);
  CHECK(rolled->deployments.at("D") == ChangeKind::restart);
  CHECK(h.store->saves == saves + 1);
  CHECK(declared_when_saved == v2);
  CHECK(generation_when_saved == 2);
  CHECK(h.store->saved->applications.at("a") == v1);
  CHECK(h.store->saved->generation == 3);
  CHECK(h.store->saved->last_running.at("a").generation == 1);  // kept as it was
  CHECK(h.core->target_state().applications.at("a") == v1);
  CHECK(h.core->target_state().generation == 3);
  CHECK(h.core->deployment({"a", "D"})->target_version() == version_of(v1.deployments[0]));

  h.store->on_save = nullptr;
  REQUIRE(tick_until_healthy(h, 60));
  CHECK(h.core->application_status("a")->status == ApplicationStatus::running);
  CHECK(h.count("a", "D", ReplicaState::running) == 2);
  for (const auto& r : h.replicas("a", "D")) {
    if (r.state == ReplicaState::running)
      CHECK(r.version == version_of(v1.deployments[0]));
  }
  // Back at its last good declaration: nothing new to record, nothing to
  // roll back to.
  h.ticks(3);
  CHECK(h.store->saves == saves + 1);
  auto again = h.core->rollback("a");
  REQUIRE_FALSE(again.has_value());
  CHECK(again.status().code() == errc::conflict);
  CHECK(again.status().message() ==
        "applications[a]: application 'a' is already at its last good declaration "
        "(generation 1): there is nothing to roll back");
}

TEST_CASE("rollback: refused with a reason - changing nothing") {
  Harness h;
  auto unknown = h.core->rollback("nope");
  REQUIRE_FALSE(unknown.has_value());
  CHECK(unknown.status().code() == errc::not_found);
  CHECK(contains(unknown.status().message(), "\"nope\" is not a known application"));

  // Never ran its declaration: no last good one.
  REQUIRE(h.core->deploy_application(app_at("v1")).has_value());
  auto never = h.core->rollback("a");
  REQUIRE_FALSE(never.has_value());
  CHECK(never.status().code() == errc::conflict);
  CHECK(never.status().message() ==
        "applications[a]: application 'a' has no last good declaration to roll back to: it has "
        "not run with every deployment HEALTHY since it was deployed");

  // Already at it.
  REQUIRE(tick_until_healthy(h));
  auto already = h.core->rollback("a");
  REQUIRE_FALSE(already.has_value());
  CHECK(already.status().code() == errc::conflict);
  CHECK(
      contains(already.status().message(), "already at its last good declaration (generation 1)"));
  CHECK(h.core->target_state().generation == 1);

  // Being deleted: not a known application any more.
  REQUIRE(h.core->delete_application("a").is_ok());
  auto deleting = h.core->rollback("a");
  REQUIRE_FALSE(deleting.has_value());
  CHECK(deleting.status().code() == errc::not_found);
}

TEST_CASE("rollback: a store that fails leaves everything as it was") {
  Harness h;
  run_v1(h);
  const auto v2 = app_at("v2", 3);
  h.cluster.fail_codes.insert(code_identity(v2.deployments[0]));
  REQUIRE(h.core->deploy_application(v2).has_value());
  h.ticks(5);

  // The same checkpoint, on a disk that is now full.
  auto failing = std::make_unique<FailingStore>();
  failing->saved = h.store->saved;
  FailingStore* store = failing.get();
  h.replace_store(std::move(failing));
  h.ticks(3);
  const TargetState before = h.core->target_state();
  const auto target = h.core->target_replicas({"a", "D"});
  const auto version = h.core->deployment({"a", "D"})->target_version();
  const int attempts = store->attempts;
  auto rolled = h.core->rollback("a");
  REQUIRE_FALSE(rolled.has_value());
  CHECK(rolled.status().code() == errc::io_error);
  CHECK(store->attempts == attempts + 1);
  CHECK(h.core->target_state() == before);
  CHECK(h.core->target_state().applications.at("a") == v2);
  CHECK(h.core->target_replicas({"a", "D"}) == target);
  CHECK(h.core->deployment({"a", "D"})->target_version() == version);
}

TEST_CASE("rollback: a last good declaration whose save fails is tried again later") {
  Harness h;
  auto flaky = std::make_unique<FlakyStore>();
  FlakyStore* store = flaky.get();
  h.replace_store(std::move(flaky));
  const auto v1 = app_at("v1");
  REQUIRE(h.core->deploy_application(v1).has_value());
  store->fail = true;
  REQUIRE(tick_until_healthy(h));
  // Each tick tries once; memory keeps what the store has.
  const int attempts = store->attempts;
  CHECK(attempts >= 1);
  h.ticks(4);
  CHECK(store->attempts == attempts + 4);
  CHECK(h.core->target_state().last_running.empty());
  CHECK(store->saved->last_running.empty());

  store->fail = false;
  h.tick();
  CHECK(h.core->target_state().last_running.at("a").spec == v1);
  CHECK(store->saved->last_running.at("a").spec == v1);
  const int saved_at = store->attempts;
  h.ticks(3);
  CHECK(store->attempts == saved_at);
}

TEST_CASE("rollback: a deleted application's last good declaration goes in the same commit") {
  Harness h;
  run_v1(h);
  std::vector<TargetState> saved;
  h.store->on_save = [&](const TargetState& s) { saved.push_back(s); };
  REQUIRE(h.core->delete_application("a").is_ok());
  REQUIRE(saved.size() == 1);
  CHECK(saved[0].applications.count("a") == 0);
  CHECK(saved[0].last_running.count("a") == 0);
  CHECK(h.core->target_state().last_running.empty());

  // Deployed again under the same name: no last good declaration until it
  // runs.
  h.ticks(5);
  REQUIRE(h.core->deploy_application(app_at("v2")).has_value());
  CHECK(h.core->target_state().last_running.empty());
  CHECK(h.core->rollback("a").status().code() == errc::conflict);

  // A declarative deploy that leaves an application out, and a shutdown,
  // drop it the same way.
  REQUIRE(tick_until_healthy(h));
  REQUIRE(h.core->target_state().last_running.count("a") == 1);
  auto b = make_app("b", "/b", {make_deployment("E", 1)});
  REQUIRE(h.core->deploy_application(b).has_value());
  for (int i = 0; i < 30 && h.core->target_state().last_running.count("b") == 0; ++i)
    h.tick();
  REQUIRE(h.core->target_state().last_running.count("b") == 1);
  saved.clear();
  TargetState only_b;
  only_b.applications["b"] = b;
  REQUIRE(h.core->apply(only_b).has_value());
  REQUIRE(saved.size() == 1);
  CHECK(saved[0].last_running.count("a") == 0);
  CHECK(saved[0].last_running.count("b") == 1);
  saved.clear();
  REQUIRE(h.core->shutdown().is_ok());
  REQUIRE(saved.size() == 1);
  CHECK(saved[0].last_running.empty());
}
