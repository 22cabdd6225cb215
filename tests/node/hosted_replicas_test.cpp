// The lifecycle of the replicas a node hosts (node/hosted_replicas.hpp),
// event by event: no actor (the handles stay empty), time passed in.
#include "node/hosted_replicas.hpp"

#include <doctest/doctest.h>

using namespace troupe;
using namespace std::chrono_literals;
using troupe::node::HostedReplicas;

namespace {

const HostedReplicas::time_point t0{std::chrono::hours(1)};

ReplicaSpec spec(const std::string& id) {
  ReplicaSpec s;
  s.replica_id = id;
  s.app = "app";
  s.deployment = "Dep";
  s.code_version = "v1";
  return s;
}

std::string refusal(HostedReplicas& table, const std::string& id, const std::string& secret) {
  auto admitted = table.admit(id, secret);
  return admitted ? std::string() : admitted.status().message();
}

}  // namespace

TEST_CASE("hosted replicas: a process is admitted with its own secret until it has attached") {
  HostedReplicas table;
  table.add_process(spec("r1"), 100, "s3cret", {});
  table.add_in_process(spec("r2"), ReplicaActor());
  CHECK(refusal(table, "r1", "s3cret").empty());
  CHECK(refusal(table, "r1", "s3creT") == "wrong secret");
  CHECK(refusal(table, "r1", "") == "wrong secret");
  CHECK(refusal(table, "r9", "s3cret") == "no such replica process");
  CHECK(refusal(table, "r2", "") == "no such replica process");  // in process: nothing attaches
  auto* h = table.find("r1");
  REQUIRE(h);
  CHECK(table.attach(*h, ReplicaActor()) == HostedReplicas::Attach::first);
  table.attached(*h, ReplicaActor());
  CHECK(refusal(table, "r1", "s3cret") == "it has attached already");
}

TEST_CASE("hosted replicas: only attached replicas are reported to the controller") {
  HostedReplicas table;
  table.add_process(spec("r1"), 100, "s", {});
  table.add_in_process(spec("r2"), ReplicaActor());
  auto listed = table.list();
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].replica_id == "r2");
  auto* h = table.find("r1");
  table.attach(*h, ReplicaActor());
  table.attached(*h, ReplicaActor());
  CHECK(table.list().size() == 2);
}

TEST_CASE("hosted replicas: a lost connection waits for the process to attach again - with the same secret") {
  HostedReplicas table;
  table.add_process(spec("r1"), 100, "s", {});
  auto* h = table.find("r1");
  table.attach(*h, ReplicaActor());
  table.attached(*h, ReplicaActor());
  CHECK(table.connection_lost("r1", false) == HostedReplicas::Lost::ignore);  // not the link
  CHECK(table.connection_lost("r1", true) == HostedReplicas::Lost::wait_reattach);
  CHECK(h->detached);
  CHECK(h->detaches == 1);
  CHECK(refusal(table, "r1", "s").empty());  // admitted again
  CHECK(table.reattach_overdue("r1", 100, 1));
  CHECK(table.attach(*h, ReplicaActor()) == HostedReplicas::Attach::again);
  CHECK_FALSE(h->detached);
  CHECK_FALSE(table.reattach_overdue("r1", 100, 1));  // back in time
  // A second loss: the first loss's deadline is not this one's.
  table.connection_lost("r1", true);
  CHECK_FALSE(table.reattach_overdue("r1", 100, 1));
  CHECK(table.reattach_overdue("r1", 100, 2));
  CHECK_FALSE(table.reattach_overdue("r1", 101, 2));  // another process
}

TEST_CASE("hosted replicas: a stopping process whose connection is lost is killed") {
  HostedReplicas table;
  table.add_process(spec("r1"), 100, "s", {});
  auto* h = table.find("r1");
  table.attach(*h, ReplicaActor());
  table.attached(*h, ReplicaActor());
  table.stop(*h, 10, t0);
  CHECK(table.connection_lost("r1", true) == HostedReplicas::Lost::kill);
  CHECK(table.connection_lost("r9", true) == HostedReplicas::Lost::ignore);
}

TEST_CASE("hosted replicas: the attach deadline holds only for the process that has not attached") {
  HostedReplicas table;
  table.add_process(spec("r1"), 100, "s", {});
  CHECK(table.attach_overdue("r1", 100));
  CHECK_FALSE(table.attach_overdue("r1", 99));  // an earlier process of the same id
  auto* h = table.find("r1");
  table.attach(*h, ReplicaActor());
  table.attached(*h, ReplicaActor());
  CHECK_FALSE(table.attach_overdue("r1", 100));
}

TEST_CASE("hosted replicas: a process's exit - stopped - crashed - or before it attached") {
  HostedReplicas table;
  table.add_process(spec("r1"), 100, "s", {});
  table.add_process(spec("r2"), 200, "s", {});
  table.add_process(spec("r3"), 300, "s", {});
  for (const char* id : {"r1", "r2"}) {
    auto* h = table.find(id);
    table.attach(*h, ReplicaActor());
    table.attached(*h, ReplicaActor());
  }
  table.stop(*table.find("r1"), 10, t0);
  std::vector<caf::typed_response_promise<ReplicaActor>> failed;
  CHECK(table.process_exited("r1", 999, true, &failed) == HostedReplicas::Exit::ignore);
  CHECK(table.process_exited("r1", 100, true, &failed) == HostedReplicas::Exit::stopped);
  CHECK(table.process_exited("r2", 200, true, &failed) == HostedReplicas::Exit::crashed);  // not asked to stop
  CHECK(table.find("r2") != nullptr);  // its handle's end removes it
  CHECK(table.process_exited("r3", 300, false, &failed) == HostedReplicas::Exit::never_attached);
  CHECK(table.find("r3") == nullptr);
}

TEST_CASE("hosted replicas: a stop tells an attached replica once and sets its kill deadline") {
  HostedReplicas table;
  table.add_in_process(spec("r1"), ReplicaActor());
  auto* h = table.find("r1");
  auto first = table.stop(*h, 10, t0);
  CHECK_FALSE(first.kill_now);
  CHECK(first.send_stop);
  CHECK(first.grace == 10500ms);
  CHECK(h->kill_at == t0 + 10500ms);
  auto again = table.stop(*h, 2, t0 + 1s);  // a shorter stop later: the deadline moves, no new stop
  CHECK_FALSE(again.send_stop);
  CHECK(h->kill_at == t0 + 1s + 2500ms);
}

TEST_CASE("hosted replicas: a process that has not attached - or is detached - is killed at once on stop") {
  HostedReplicas table;
  table.add_process(spec("r1"), 100, "s", {});
  CHECK(table.stop(*table.find("r1"), 10, t0).kill_now);
  CHECK(table.find("r1")->stopping);
  table.add_process(spec("r2"), 200, "s", {});
  auto* h = table.find("r2");
  table.attach(*h, ReplicaActor());
  table.attached(*h, ReplicaActor());
  table.connection_lost("r2", true);
  CHECK(table.stop(*h, 10, t0).kill_now);
}

TEST_CASE("hosted replicas: a handle that ends removes its replica - saying whether it was expected") {
  HostedReplicas table;
  table.add_process(spec("r1"), 100, "s", {});
  table.add_in_process(spec("r2"), ReplicaActor());
  table.stop(*table.find("r2"), 5, t0);
  auto r1 = table.handle_ended("r1");
  CHECK(r1.known);
  CHECK(r1.process);
  CHECK_FALSE(r1.expected);
  auto r2 = table.handle_ended("r2");
  CHECK(r2.known);
  CHECK_FALSE(r2.process);
  CHECK(r2.expected);
  CHECK(table.empty());
  CHECK_FALSE(table.handle_ended("r2").known);
}

TEST_CASE("hosted replicas: a restarted agent watches what its predecessor hosted - deadlines included") {
  HostedReplicas table;
  table.add_process(spec("r1"), 100, "s", {});  // not attached
  table.add_in_process(spec("r2"), ReplicaActor());
  table.add_in_process(spec("r3"), ReplicaActor());
  table.stop(*table.find("r3"), 10, t0);  // kill at t0 + 10.5 s
  auto watch = table.adopt(t0 + 4s);
  REQUIRE(watch.size() == 3);
  CHECK(watch[0].id == "r1");
  CHECK(watch[0].await_attach);
  CHECK(watch[0].pid == 100);
  CHECK_FALSE(watch[1].await_attach);
  CHECK_FALSE(watch[1].kill_in.has_value());
  REQUIRE(watch[2].kill_in.has_value());
  CHECK(*watch[2].kill_in == 6500ms);
  auto late = table.adopt(t0 + 20s);
  REQUIRE(late[2].kill_in.has_value());
  CHECK(*late[2].kill_in == HostedReplicas::duration::zero());  // overdue: at once
}

TEST_CASE("hosted replicas: secrets compare equal only when equal and not empty") {
  CHECK(node::same_secret("abc", "abc"));
  CHECK_FALSE(node::same_secret("abc", "abd"));
  CHECK_FALSE(node::same_secret("abc", "abcd"));
  CHECK_FALSE(node::same_secret("", ""));
}
