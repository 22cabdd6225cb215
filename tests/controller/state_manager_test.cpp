// The state manager: deletion and shutdown, write-ahead checkpoints,
// recovery after a controller crash, and versioned snapshots.
#include <doctest/doctest.h>

#include "controller/core/validate.hpp"
#include "tests/controller/fakes.hpp"

using namespace troupe;
using namespace troupe::controller;
using namespace troupe::controller::testing;
using V = std::vector<std::string>;

namespace {

ApplicationSpec two_deployments() {
  return make_app("a", "/a", {make_deployment("D", 2), make_deployment("E", 1)});
}

}  // namespace

// ---------------------------------------------------------------- delete

TEST_CASE("delete: a deployment is stopped gracefully and removed once all replicas are gone") {
  Harness h;
  REQUIRE(h.core->deploy_application(two_deployments()).has_value());
  h.ticks(2);
  CHECK(h.core->delete_deployment("a", "D").code() == errc::invalid_argument);  // the ingress
  REQUIRE(h.core->delete_deployment("a", "E").is_ok());
  // Ray Serve's names: a deployment being deleted is UPDATING, trigger DELETING.
  CHECK(h.status("a", "E").status == DeploymentStatus::updating);
  CHECK(h.status("a", "E").trigger == DeploymentTrigger::deleting);
  CHECK(h.tick() == V{"stop a#E#3 20"});
  CHECK(h.core->deployment_status({"a", "E"}).has_value());
  CHECK(h.tick() == V{});
  CHECK_FALSE(h.core->deployment_status({"a", "E"}).has_value());
  CHECK(h.core->target_state().applications.at("a").deployments.size() == 1);
  CHECK(h.core->application_status("a")->status == ApplicationStatus::running);
}

TEST_CASE("delete: an application and everything in it") {
  Harness h;
  REQUIRE(h.core->deploy_application(two_deployments()).has_value());
  h.ticks(2);
  REQUIRE(h.core->delete_application("a").is_ok());
  CHECK(h.core->application_status("a")->status == ApplicationStatus::deleting);
  // One replica per node: newest first.
  CHECK(h.tick() == V{"stop a#D#2 20", "stop a#D#1 20", "stop a#E#3 20"});
  CHECK(h.core->application_status("a")->status == ApplicationStatus::deleting);
  CHECK(h.tick() == V{});
  CHECK_FALSE(h.core->application_status("a").has_value());
  CHECK(h.core->deployment_ids().empty());
  CHECK(h.cluster.actors.empty());
}

TEST_CASE("delete: asked again while under way it is ok - an unknown name is an error") {
  Harness h;
  REQUIRE(h.core->deploy_application(two_deployments()).has_value());
  h.ticks(2);
  REQUIRE(h.core->delete_deployment("a", "E").is_ok());
  const uint64_t generation = h.core->target_state().generation;
  const int saves = h.store->saves;
  // A client retrying a call whose answer it lost: the delete is under way.
  CHECK(h.core->delete_deployment("a", "E").is_ok());
  CHECK(h.core->target_state().generation == generation);
  CHECK(h.store->saves == saves);
  CHECK(h.core->delete_deployment("a", "X").code() == errc::not_found);
  REQUIRE(h.core->delete_application("a").is_ok());
  CHECK(h.core->delete_application("a").is_ok());
  CHECK(h.core->target_state().generation == generation + 1);
  CHECK(h.core->delete_application("nope").code() == errc::not_found);
  // Once every replica is gone the name is unknown again.
  h.ticks(3);
  CHECK_FALSE(h.core->application_status("a").has_value());
  CHECK(h.core->delete_application("a").code() == errc::not_found);
}

TEST_CASE("delete: dropping a deployment from the application spec deletes it") {
  Harness h;
  REQUIRE(h.core->deploy_application(two_deployments()).has_value());
  h.ticks(2);
  auto r = h.core->deploy_application(make_app("a", "/a", {make_deployment("D", 2)}));
  REQUIRE(r.has_value());
  CHECK(r->removed == V{"E"});
  CHECK(h.tick() == V{"stop a#E#3 20"});
  h.tick();
  CHECK(h.core->deployment_ids().size() == 1);
}

TEST_CASE("shutdown: writes an empty target - stops everything") {
  Harness h;
  REQUIRE(h.core->deploy_application(two_deployments()).has_value());
  REQUIRE(h.core->deploy_application(make_app("b", "/b", {make_deployment("F", 1)})).has_value());
  h.ticks(2);
  REQUIRE(h.core->shutdown().is_ok());
  CHECK(h.store->saved->applications.empty());
  CHECK_FALSE(h.core->is_shut_down());
  CHECK(h.tick().size() == 4);
  CHECK(h.tick() == V{});
  CHECK(h.core->is_shut_down());
  CHECK(h.cluster.actors.empty());
}

// ---------------------------------------------------------------- checkpoint

TEST_CASE("checkpoint: the target state is saved before it is applied") {
  Harness h;
  int observed = 0;
  h.store->on_save = [&](const TargetState& next) {
    ++observed;
    // At save time memory still holds the previous state.
    CHECK(h.core->target_state().generation + 1 == next.generation);
    CHECK(h.core->deployment_ids().size() == (observed == 1 ? 0u : 2u));
  };
  auto r = h.core->deploy_application(two_deployments());
  REQUIRE(r.has_value());
  CHECK(observed == 1);
  CHECK(h.store->saved == h.core->target_state());
  CHECK(h.core->deployment_ids().size() == 2);
  REQUIRE(h.core->delete_deployment("a", "E").is_ok());
  CHECK(observed == 2);
  CHECK(h.store->saved == h.core->target_state());
}

TEST_CASE("checkpoint: a failed write changes nothing") {
  Harness h;
  REQUIRE(h.core->deploy_application(two_deployments()).has_value());
  h.ticks(2);
  const TargetState before = h.core->target_state();
  auto failing = std::make_unique<FailingStore>();
  FailingStore* store = failing.get();
  failing->saved = before;
  h.replace_store(std::move(failing));  // controller restart over the same checkpoint
  h.ticks(3);
  CHECK(h.status("a", "D").status == DeploymentStatus::healthy);

  auto v2 = two_deployments();
  v2.deployments[0].code_version = "v2";
  auto r = h.core->deploy_application(v2);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().code() == errc::io_error);
  CHECK(r.status().message() == "write /var/lib/troupe/checkpoint: No space left on device");
  CHECK(h.core->delete_application("a").code() == errc::io_error);
  CHECK(h.core->delete_deployment("a", "E").code() == errc::io_error);
  CHECK(h.core->set_target_capacity(10.0).code() == errc::io_error);
  CHECK(h.core->shutdown().code() == errc::io_error);
  CHECK(store->attempts == 5);
  CHECK(h.core->target_state() == before);
  CHECK(h.tick() == V{});  // nothing to do: no rollout, no stop
  CHECK(h.status("a", "D").status == DeploymentStatus::healthy);
  CHECK(h.core->application_status("a")->status == ApplicationStatus::running);
}

TEST_CASE("checkpoint: an accepted change survives a controller crash") {
  Harness h;
  REQUIRE(h.core->deploy_application(two_deployments()).has_value());
  REQUIRE(h.core->set_target_capacity(50.0).is_ok());
  const TargetState accepted = h.core->target_state();
  h.restart();  // crash before even one tick
  CHECK(h.core->target_state() == accepted);
  CHECK(h.core->target_replicas({"a", "D"}) == 1u);
  CHECK(h.tick() == V{"start a#D#r1-1@n1", "start a#E#r1-2@n2"});
}

// ---------------------------------------------------------------- recovery

TEST_CASE("recovery: live - dead - wrong-version and orphan replicas") {
  Harness h;
  auto d = make_deployment("D", 3);
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {d})).has_value());
  h.ticks(2);
  auto before = h.core->changes_since({});
  REQUIRE(before);

  // The controller dies. Meanwhile: an orphan of a deleted application is on
  // n1, and replica 3 runs an older code version than the checkpoint says.
  h.cluster.actors["old#Gone#77"] = FakeActor{"old#Gone#77", "old", "Gone", "n1", {}, false};
  auto old = make_deployment("D", 3, "v0");
  h.cluster.actors["a#D#3"].version = version_of(old);
  auto hosted = h.cluster.hosted();
  h.cluster.actors.erase("a#D#2");  // listed, but dead by the time we ask it

  h.options.replica_id_tag = "r1";
  h.core = std::make_unique<StateManager>(*h.store, h.clock, h.rng, h.options);
  h.core->set_nodes(h.nodes);
  REQUIRE(h.core->recover(hosted).is_ok());
  CHECK(h.tick() == V{"recover a#D#1", "recover a#D#2", "recover a#D#3", "stop old#Gone#77 20"});
  CHECK(h.count("a", "D", ReplicaState::recovering) == 3);
  CHECK(h.core->orphans() == V{"old#Gone#77"});
  // Nothing is published for D while its replicas are RECOVERING.
  auto snap = h.core->changes_since({});
  REQUIRE(snap);
  CHECK(snap->full);
  CHECK(snap->deployments.empty());
  REQUIRE(snap->withheld.size() == 1);
  CHECK(snap->withheld[0] == DeploymentId{"a", "D"});
  // A subscriber presenting an id of the previous incarnation (here: a seq
  // beyond the current one) also gets a full snapshot that withholds D.
  auto again = h.core->changes_since(before->id);
  REQUIRE(again);
  CHECK(again->full);
  CHECK(again->withheld.size() == 1);

  // 1 answers, 2 is dead (replaced), 3 reports v0 (joins the rolling update).
  CHECK(h.tick() == V{"kill a#D#2", "start a#D#r1-78@n2"});
  CHECK(h.core->orphans().empty());
  auto reps = h.replicas("a", "D");
  REQUIRE(reps.size() == 3);
  CHECK(reps[1].id == "a#D#3");
  CHECK(reps[1].state == ReplicaState::running);
  CHECK(reps[1].version == version_of(old));
  snap = h.core->changes_since({});
  REQUIRE(snap->deployments.size() == 1);
  CHECK(snap->deployments[0].replicas.size() == 2);

  // 78 runs: the old-version one is replaced, its replacement first.
  CHECK(without_nodes(h.tick()) == V{"start a#D#r1-79"});
  CHECK(h.tick() == V{"stop a#D#3 20"});
  CHECK(h.tick() == V{});
  CHECK(h.status("a", "D").status == DeploymentStatus::healthy);
  for (const auto& r : h.replicas("a", "D"))
    CHECK(r.version == version_of(d));
  CHECK(h.cluster.actors.size() == 3);
}

TEST_CASE("recovery: replicas that never answer are replaced after the slow-start threshold") {
  Harness h;
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {make_deployment("D", 1)})).has_value());
  h.ticks(2);
  auto hosted = h.cluster.hosted();
  h.core = std::make_unique<StateManager>(*h.store, h.clock, h.rng, h.options);
  h.core->set_nodes(h.nodes);
  REQUIRE(h.core->recover(hosted).is_ok());
  h.core->update();  // the recover command is lost
  h.ticks(30);
  CHECK(h.count("a", "D", ReplicaState::recovering) == 1);
  CHECK(h.tick() == V{"kill a#D#1"});
  CHECK(h.tick() == V{"start a#D#2@n1"});
}

TEST_CASE("recovery: a corrupt checkpoint stops the controller with an error naming the file") {
  FakeClock clock;
  FakeRandom rng;
  CorruptStore store;
  StateManager core(store, clock, rng);
  Status s = core.recover({});
  REQUIRE_FALSE(s.is_ok());
  CHECK(s.code() == errc::corrupt);
  CHECK(s.message() ==
        "/var/lib/troupe/checkpoint: cannot decode the target state (bad segment size)");
  CHECK_FALSE(core.recovered());
  auto r = core.deploy_application(make_app("a", "/a", {make_deployment("D", 1)}));
  CHECK(r.status().code() == errc::unavailable);
  CHECK(core.update().empty());
}

// ---------------------------------------------------------------- snapshots

TEST_CASE("snapshots: numbered - and a subscriber gets only newer state") {
  Harness h;
  CHECK_FALSE(h.core->changes_since({}).has_value());  // nothing published yet
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {make_deployment("D", 2)})).has_value());
  h.tick();
  auto s1 = h.core->changes_since({});
  REQUIRE(s1);
  CHECK(s1->id.seq == 1);
  CHECK(s1->full);
  CHECK(s1->routes == std::vector<Route>{{"/a", "a", "D"}});
  REQUIRE(s1->deployments.size() == 1);
  CHECK(s1->deployments[0].replicas.empty());
  CHECK_FALSE(h.core->changes_since(s1->id).has_value());  // current: nothing

  h.tick();  // replicas run
  auto s2 = h.core->changes_since(s1->id);
  REQUIRE(s2);
  CHECK(s2->id.seq == 2);
  CHECK_FALSE(s2->full);
  CHECK_FALSE(s2->routes_changed);
  REQUIRE(s2->deployments.size() == 1);
  CHECK(s2->deployments[0].replicas ==
        std::vector<RunningReplicaInfo>{{"a#D#1", "n1", 5}, {"a#D#2", "n2", 5}});
  h.ticks(5);
  CHECK(h.core->snapshot_id().seq == 2);  // steady state publishes nothing

  // A second application: only its route and deployment are new.
  REQUIRE(h.core->deploy_application(make_app("b", "/b", {make_deployment("E", 1)})).has_value());
  h.tick();
  auto s3 = h.core->changes_since(s2->id);
  REQUIRE(s3);
  CHECK(s3->routes_changed);
  CHECK(s3->routes.size() == 2);
  REQUIRE(s3->deployments.size() == 1);
  CHECK(s3->deployments[0].id == DeploymentId{"b", "E"});

  // Deleting removes the route at once and the deployment when it is gone.
  REQUIRE(h.core->delete_application("b").is_ok());
  h.ticks(3);
  auto s4 = h.core->changes_since(s3->id);
  REQUIRE(s4);
  CHECK(s4->routes == std::vector<Route>{{"/a", "a", "D"}});
  CHECK(s4->removed == std::vector<DeploymentId>{{"b", "E"}});

  // An id from another controller incarnation gets everything.
  auto other = h.core->changes_since({99, 3});
  REQUIRE(other);
  CHECK(other->full);
  CHECK(other->deployments.size() == 1);
}

TEST_CASE("snapshots: a delta names only the replicas that came or left - not the whole set") {
  Harness h;
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {make_deployment("D", 3)})).has_value());
  h.ticks(2);
  auto s = h.core->changes_since({});
  REQUIRE(s);
  REQUIRE(s->deployments.size() == 1);
  CHECK_FALSE(s->deployments[0].partial);  // a full snapshot has whole sets
  CHECK(s->deployments[0].replicas.size() == 3);

  h.cluster.crash("a#D#2");
  h.ticks(3);  // the crash, the replacement's start, its first health check
  auto d = h.core->changes_since(s->id);
  REQUIRE(d);
  CHECK_FALSE(d->full);
  REQUIRE(d->deployments.size() == 1);
  CHECK(d->deployments[0].partial);
  REQUIRE(d->deployments[0].replicas.size() == 1);
  CHECK(d->deployments[0].replicas[0].replica_id == "a#D#4");
  CHECK(d->deployments[0].removed_replicas == V{"a#D#2"});
  // A subscriber that already saw the removal gets only the newcomer.
  h.cluster.crash("a#D#1");
  h.tick();
  auto after_removal = h.core->snapshot_id();
  h.ticks(2);
  auto d2 = h.core->changes_since(after_removal);
  REQUIRE(d2);
  REQUIRE(d2->deployments.size() == 1);
  CHECK(d2->deployments[0].partial);
  CHECK(d2->deployments[0].removed_replicas.empty());
  REQUIRE(d2->deployments[0].replicas.size() == 1);
  CHECK(d2->deployments[0].replicas[0].replica_id == "a#D#5");
}

TEST_CASE("snapshots: tombstones are bounded - a subscriber from before them gets the whole set") {
  Harness h;
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {make_deployment("D", 1)})).has_value());
  h.ticks(2);
  auto s = h.core->changes_since({});
  REQUIRE(s);
  // 200 replacements: more tombstones than kept for a one-replica deployment
  // (at least 64, at most twice that).
  for (int i = 0; i < 200; ++i) {
    auto reps = h.replicas("a", "D");
    REQUIRE(reps.size() == 1);
    h.cluster.crash(reps[0].id);
    h.ticks(3);
  }
  auto old = h.core->changes_since(s->id);
  REQUIRE(old);
  REQUIRE(old->deployments.size() == 1);
  CHECK_FALSE(old->deployments[0].partial);
  CHECK(old->deployments[0].replicas.size() == 1);
  CHECK(old->deployments[0].removed_replicas.empty());
  // One change back is still a delta.
  auto recent = h.core->snapshot_id();
  auto reps = h.replicas("a", "D");
  h.cluster.crash(reps[0].id);
  h.ticks(3);
  auto d = h.core->changes_since(recent);
  REQUIRE(d);
  REQUIRE(d->deployments.size() == 1);
  CHECK(d->deployments[0].partial);
  CHECK(d->deployments[0].removed_replicas == V{reps[0].id});
}

TEST_CASE("snapshots: a max_ongoing_requests change is published without restarting replicas") {
  Harness h;
  auto d = make_deployment("D", 1);
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {d})).has_value());
  h.ticks(2);
  auto s = h.core->changes_since({});
  REQUIRE(s);
  d.config.max_ongoing_requests = 9;
  auto r = h.core->deploy_deployment("a", d);
  REQUIRE(r.has_value());
  CHECK(r->deployments.at("D") == ChangeKind::config_only);
  CHECK(h.tick() == V{});
  auto delta = h.core->changes_since(s->id);
  REQUIRE(delta);
  REQUIRE(delta->deployments.size() == 1);
  CHECK(delta->deployments[0].replicas == std::vector<RunningReplicaInfo>{{"a#D#1", "n1", 9}});
  CHECK(h.status("a", "D").status == DeploymentStatus::healthy);
}

TEST_CASE("rolling update: a change of isolation or memory_limit_bytes replaces the replicas") {
  Harness h;
  auto d = make_deployment("D", 1);
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {d})).has_value());
  h.ticks(2);
  REQUIRE(h.status("a", "D").status == DeploymentStatus::healthy);
  const int starts = h.cluster.starts;

  auto limited = d;
  limited.config.memory_limit_bytes = 512ULL << 20;
  auto r = h.core->deploy_deployment("a", limited);
  REQUIRE(r.has_value());
  CHECK(r->deployments.at("D") == ChangeKind::restart);
  h.ticks(4);
  CHECK(h.status("a", "D").status == DeploymentStatus::healthy);
  CHECK(h.cluster.starts == starts + 1);
  REQUIRE(h.replicas("a", "D").size() == 1);
  CHECK(h.replicas("a", "D")[0].id != "a#D#1");
  CHECK(h.replicas("a", "D")[0].version == version_of(limited));

  auto trusted = d;  // no limit: in_process is allowed
  trusted.config.isolation = Isolation::in_process;
  r = h.core->deploy_deployment("a", trusted);
  REQUIRE(r.has_value());
  CHECK(r->deployments.at("D") == ChangeKind::restart);
  h.ticks(4);
  CHECK(h.status("a", "D").status == DeploymentStatus::healthy);
  CHECK(h.cluster.starts == starts + 2);
  REQUIRE(h.replicas("a", "D").size() == 1);
  CHECK(h.replicas("a", "D")[0].version == version_of(trusted));
}

TEST_CASE("recovery: a replica already shutting down is adopted as STOPPING and killed on time") {
  Harness h;
  auto d = make_deployment("D", 2);
  d.config.graceful_shutdown_timeout_s = 4;
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {d})).has_value());
  h.ticks(2);
  h.cluster.ignore_stop.insert("a#D#2");
  REQUIRE(h.core
              ->deploy_deployment("a",
                                  [&] {
                                    auto one = d;
                                    one.config.num_replicas = 1;
                                    return one;
                                  }())
              .has_value());
  CHECK(h.tick() == V{"stop a#D#2 4"});   // t = 3
  h.restart();                            // the kill timer is lost with the controller
  CHECK(h.tick() == V{"recover a#D#1"});  // t = 4; a#D#2 is STOPPING, not recovering
  CHECK(h.count("a", "D", ReplicaState::stopping) == 1);
  CHECK(h.tick() == V{});
  CHECK(h.tick() == V{});
  CHECK(h.tick() == V{"kill a#D#2"});  // t = 7: 4 s after adoption at t = 3
  CHECK(h.tick() == V{});
  CHECK(h.replicas("a", "D").size() == 1);
  CHECK(h.status("a", "D").status == DeploymentStatus::healthy);
}

TEST_CASE("recovery: replicas reported later by a re-registering node are adopted") {
  Harness h;
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {make_deployment("D", 2)})).has_value());
  h.ticks(2);
  // A node that was unreachable during recovery hosts a#D#2.
  auto all = h.cluster.hosted();
  std::vector<HostedReplica> first = {all[0]};
  h.options.replica_id_tag = "x";  // this incarnation's ids cannot collide with a#D#2
  h.core = std::make_unique<StateManager>(*h.store, h.clock, h.rng, h.options);
  h.core->set_nodes(h.nodes);
  REQUIRE(h.core->recover(first).is_ok());
  CHECK(h.tick() == V{"recover a#D#1", "start a#D#x-2@n2"});
  h.core->adopt_replicas(all);  // a#D#1 is known: ignored
  // One too many: the adopted one, not yet running, is stopped first.
  CHECK(h.tick() == V{"recover a#D#2", "stop a#D#2 20"});
  CHECK(h.tick() == V{});
  CHECK(h.replicas("a", "D").size() == 2);
}

TEST_CASE("delete: redeploying an application that is being deleted revives it") {
  Harness h;
  auto app = make_app("a", "/a", {make_deployment("D", 2)});
  REQUIRE(h.core->deploy_application(app).has_value());
  h.ticks(2);
  h.cluster.ignore_stop.insert("a#D#1");
  h.cluster.ignore_stop.insert("a#D#2");
  REQUIRE(h.core->delete_application("a").is_ok());
  CHECK(h.tick() == V{"stop a#D#2 20", "stop a#D#1 20"});
  auto r = h.core->deploy_application(app);
  REQUIRE(r.has_value());
  CHECK(r->changed);
  CHECK(h.core->application_status("a")->status == ApplicationStatus::deploying);
  CHECK(h.status("a", "D").status == DeploymentStatus::updating);
  CHECK(h.tick() == V{});  // both slots are held by STOPPING replicas
  h.cluster.ignore_stop.clear();
  h.ticks(19);  // grace period over at t = 23
  CHECK(h.tick() == V{"start a#D#3@n1", "start a#D#4@n2"});
  h.tick();
  CHECK(h.status("a", "D").status == DeploymentStatus::healthy);
}

TEST_CASE("apply: a declared set of applications is written in one commit - absent ones deleted") {
  Harness h;
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {make_deployment("D", 2)})).has_value());
  REQUIRE(h.core->deploy_application(make_app("b", "/b", {make_deployment("D", 1)})).has_value());
  h.ticks(3);
  const int saves_before = h.store->saves;

  TargetState declared;
  declared.applications["b"] = make_app("b", "/b", {make_deployment("D", 3)});
  declared.applications["c"] = make_app("c", "/c", {make_deployment("D", 1)});
  bool changed = false;
  auto r = h.core->apply(declared, &changed);
  REQUIRE(r.has_value());
  CHECK(changed);
  CHECK(h.store->saves == saves_before + 1);  // one write for the whole declaration
  CHECK(h.store->saved->applications.count("a") == 0);
  CHECK(h.store->saved->applications.at("b") == declared.applications.at("b"));
  CHECK(h.store->saved->applications.at("c") == declared.applications.at("c"));
  CHECK(h.core->application_status("a")->status == ApplicationStatus::deleting);

  // The same declaration again is a no-op: nothing written.
  auto again = h.core->apply(declared, &changed);
  REQUIRE(again.has_value());
  CHECK_FALSE(changed);
  CHECK(h.store->saves == saves_before + 1);
}

TEST_CASE("apply: one invalid application rejects the whole declaration") {
  Harness h;
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {make_deployment("D", 2)})).has_value());
  const TargetState before = h.core->target_state();
  const int saves_before = h.store->saves;
  TargetState declared;
  declared.applications["a"] = make_app("a", "/a", {make_deployment("D", 5)});
  declared.applications["b"] =
      make_app("b", "/a", {make_deployment("D", 1)});  // collides with a's prefix
  auto r = h.core->apply(declared);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().code() == errc::invalid_argument);
  CHECK(r.status().message().find("/a") != std::string::npos);
  CHECK(h.core->target_state() == before);
  CHECK(h.store->saves == saves_before);
}

// ---------------------------------------------------------------- per-deployment operations

TEST_CASE("scale: one deployment's replica count changes - written ahead - the rest of it kept") {
  Harness h;
  REQUIRE(h.core->deploy_application(two_deployments()).has_value());
  h.ticks(2);
  const uint64_t generation = h.core->target_state().generation;
  const int saves_before = h.store->saves;
  auto r = h.core->scale_deployment("a", "E", 3);
  REQUIRE(r.has_value());
  CHECK(r->changed);
  CHECK(r->generation == generation + 1);
  CHECK(r->deployments == std::map<std::string, ChangeKind>{{"E", ChangeKind::scaled}});
  CHECK(h.store->saves == saves_before + 1);
  const auto& saved = h.store->saved->applications.at("a").deployments;
  CHECK(saved[1].config.num_replicas == 3);
  CHECK(saved[0] == two_deployments().deployments[0]);  // D untouched
  auto started = without_nodes(h.tick());
  CHECK(started == V{"start a#E#4", "start a#E#5"});
  CHECK(h.core->target_replicas({"a", "E"}) == 3u);

  // The same count again: unchanged, nothing written.
  auto same = h.core->scale_deployment("a", "E", 3);
  REQUIRE(same.has_value());
  CHECK_FALSE(same->changed);
  CHECK(h.store->saves == saves_before + 1);
}

TEST_CASE("scale: refused for an unknown name - an autoscaled deployment - above the limits") {
  Harness h;
  auto app = two_deployments();
  AutoscalingConfig scaling;
  scaling.max_replicas = 4;
  app.deployments[1].config.autoscaling_config = scaling;
  REQUIRE(h.core->deploy_application(app).has_value());
  const TargetState before = h.core->target_state();
  const int saves_before = h.store->saves;

  auto no_app = h.core->scale_deployment("b", "D", 2);
  REQUIRE_FALSE(no_app.has_value());
  CHECK(no_app.status().code() == errc::not_found);
  CHECK(no_app.status().message() == "applications[b]: \"b\" is not a known application");

  auto no_dep = h.core->scale_deployment("a", "X", 2);
  REQUIRE_FALSE(no_dep.has_value());
  CHECK(no_dep.status().code() == errc::not_found);
  CHECK(no_dep.status().message() ==
        "applications[a].deployments[X]: \"X\" is not a known deployment");

  auto autoscaled = h.core->scale_deployment("a", "E", 2);
  REQUIRE_FALSE(autoscaled.has_value());
  CHECK(autoscaled.status().code() == errc::invalid_argument);
  CHECK(autoscaled.status().message().find("applications[a].deployments[E].num_replicas: the "
                                           "deployment is autoscaled") == 0);

  auto huge = h.core->scale_deployment("a", "D", kMaxReplicas + 1);
  REQUIRE_FALSE(huge.has_value());
  CHECK(huge.status().code() == errc::invalid_argument);
  INFO(huge.status().message());
  CHECK(huge.status().message().find("applications[a].deployments[D] asks for 100001 replicas") ==
        0);

  CHECK(h.core->target_state() == before);
  CHECK(h.store->saves == saves_before);
}

TEST_CASE("apply: if_generation - accepted at the current generation - refused naming it otherwise") {
  Harness h;
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {make_deployment("D", 1)})).has_value());
  const uint64_t current = h.core->target_state().generation;
  REQUIRE(current == 1);
  TargetState declared;
  declared.applications["a"] = make_app("a", "/a", {make_deployment("D", 2)});

  const int saves_before = h.store->saves;
  auto stale = h.core->apply(declared, nullptr, current - 1);
  REQUIRE_FALSE(stale.has_value());
  CHECK(stale.status().code() == errc::conflict);
  CHECK(stale.status().message().find("if_generation: 0 is not the current generation 1") == 0);
  auto future = h.core->apply(declared, nullptr, current + 5);
  REQUIRE_FALSE(future.has_value());
  CHECK(future.status().code() == errc::conflict);
  CHECK(h.store->saves == saves_before);
  CHECK(h.core->target_replicas({"a", "D"}) == 1u);

  bool changed = false;
  auto ok = h.core->apply(declared, &changed, current);
  REQUIRE(ok.has_value());
  CHECK(changed);
  CHECK(h.core->target_state().generation == current + 1);
  CHECK(h.core->target_replicas({"a", "D"}) == 2u);
  // The generation it was given is now stale: a second writer with it loses.
  auto lost = h.core->apply(declared, &changed, current);
  REQUIRE_FALSE(lost.has_value());
  CHECK(lost.status().message().find("current generation 2") != std::string::npos);
}

TEST_CASE("snapshots: a replica's model list is recorded by seq and pushed as a delta") {
  Harness h;
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {make_deployment("D", 2)})).has_value());
  h.ticks(2);
  auto s = h.core->changes_since({});
  REQUIRE(s);
  // A new list: a delta with the replica's models; the other replica, which
  // did not change, is not repeated.
  CHECK(h.core->record_multiplexed_replica_info("a#D#1", 1, {"m1"}));
  h.tick();
  auto d1 = h.core->changes_since(s->id);
  REQUIRE(d1);
  CHECK_FALSE(d1->full);
  REQUIRE(d1->deployments.size() == 1);
  CHECK(d1->deployments[0].partial);
  CHECK(d1->deployments[0].removed_replicas.empty());
  CHECK(d1->deployments[0].replicas ==
        std::vector<RunningReplicaInfo>{{"a#D#1", "n1", 5, {"m1"}, 1}});
  // The same list again (the periodic report), or an older one: nothing new.
  CHECK_FALSE(h.core->record_multiplexed_replica_info("a#D#1", 1, {"m1"}));
  CHECK_FALSE(h.core->record_multiplexed_replica_info("a#D#1", 2, {"m1"}));
  CHECK_FALSE(h.core->record_multiplexed_replica_info("a#D#1", 1, {"old"}));
  h.tick();
  CHECK_FALSE(h.core->changes_since(d1->id).has_value());
  // A change: another delta.
  CHECK(h.core->record_multiplexed_replica_info("a#D#1", 3, {"m2", "m1"}));
  h.tick();
  auto d2 = h.core->changes_since(d1->id);
  REQUIRE(d2);
  CHECK(d2->deployments[0].replicas[0].model_ids == std::vector<std::string>{"m2", "m1"});
  CHECK(d2->deployments[0].replicas[0].model_ids_seq == 3);
  // Unknown replicas are ignored.
  CHECK_FALSE(h.core->record_multiplexed_replica_info("nope", 1, {"m1"}));
}

// ---------------------------------------------------------------- settled

namespace {

bool settled(const Harness& h, const std::string& dep) {
  return h.core->deployment({"a", dep})->settled();
}

// Ticks until deployment `dep` of "a" is settled (at most 60 s).
void tick_until_settled(Harness& h, const std::string& dep) {
  for (int i = 0; i < 60 && !settled(h, dep); ++i)
    h.tick();
  REQUIRE(settled(h, dep));
}

bool starts_one(const std::vector<std::string>& ops) {
  return std::count_if(ops.begin(), ops.end(),
                       [](const std::string& op) { return op.rfind("start ", 0) == 0; }) == 1;
}

}  // namespace

TEST_CASE(
    "settled: a deployment running its target proven is skipped - time alone changes "
    "nothing and each event wakes it") {
  Harness h;
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {make_deployment("D", 2)})).has_value());
  h.tick();
  CHECK_FALSE(settled(h, "D"));  // starting
  tick_until_settled(h, "D");
  CHECK(h.status("a", "D").status == DeploymentStatus::healthy);
  for (const auto& r : h.replicas("a", "D"))
    CHECK(r.state == ReplicaState::running);
  CHECK(h.core->deployment({"a", "D"})->running_count() == 2);

  SUBCASE("time alone: nothing to do, and it stays settled") {
    for (int i = 0; i < 120; ++i)
      CHECK(h.tick(1.0, /*with_checks=*/true) == V{});
    CHECK(settled(h, "D"));
    CHECK(h.status("a", "D").status == DeploymentStatus::healthy);
  }
  SUBCASE("a replica failing its checks: replaced") {
    const std::string sick = h.replicas("a", "D")[0].id;
    h.cluster.unhealthy.insert(sick);
    bool stopped = false;
    for (int i = 0; i < 60 && !stopped; ++i) {
      auto ops = h.tick();
      stopped = std::find(ops.begin(), ops.end(), "stop " + sick + " 20") != ops.end();
    }
    CHECK(stopped);
    CHECK(h.status("a", "D").status == DeploymentStatus::unhealthy);
  }
  SUBCASE("a replica crashing: replaced at the next tick") {
    h.cluster.crash(h.replicas("a", "D")[0].id);
    CHECK(starts_one(h.tick()));
  }
  SUBCASE("its node dead: its replica replaced at the next tick") {
    auto nodes = h.nodes;
    const std::string node = h.replicas("a", "D")[0].node_id;
    for (auto& n : nodes)
      if (n.id == node)
        n.state = NodeState::dead;
    h.set_nodes(nodes);
    CHECK(starts_one(h.tick()));
  }
  SUBCASE("scaled up: one more starts at the next tick") {
    REQUIRE(h.core->deploy_deployment("a", make_deployment("D", 3)).has_value());
    CHECK_FALSE(settled(h, "D"));
    CHECK(starts_one(h.tick()));
  }
  SUBCASE("its node registered again: the watch goes to it again") {
    const auto r = h.replicas("a", "D")[0];
    h.core->rewatch_node(r.node_id);
    const auto ops = h.tick(1.0, /*with_checks=*/true);
    REQUIRE(ops.size() == 1);
    CHECK(ops[0] == "watch " + r.id);
  }
  tick_until_settled(h, "D");
}
