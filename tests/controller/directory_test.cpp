// The controller's directory of actor handles: replicas, agents and
// subscribers by id and address, the hosted replicas a registering node
// reports, the target of a kill, and what a down message was about.
//
// The handles come from actors that end as soon as they are spawned: only
// their identity matters, and nothing here waits for them.
#include "controller/shell/directory.hpp"

#include <algorithm>
#include <vector>

#include <doctest/doctest.h>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>

#include "tests/controller/fakes.hpp"
#include "tests/support/any_handle.hpp"

using namespace troupe;
using namespace troupe::controller;
using troupe::controller::testing::FakeClock;

namespace {

struct Fixture {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  std::vector<caf::actor> monitored;
  std::vector<caf::actor_addr> demonitored;
  ActorDirectory dir{[this](const caf::actor& a) { monitored.push_back(a); },
                     [this](const caf::actor_addr& a) { demonitored.push_back(a); }};

  // A distinct handle; the actor behind it has ended already.
  test::AnyHandle handle() {
    return test::AnyHandle(sys.spawn([] {}));
  }

  size_t times_monitored(const caf::actor& a) const {
    return static_cast<size_t>(std::count(monitored.begin(), monitored.end(), a));
  }
};

caf::error troupe_error(const std::string& message) {
  return to_caf_error(Status(errc::internal, message));
}

HostedReplicaInfo hosted(const std::string& id, const test::AnyHandle& handle,
                          bool stopping = false) {
  HostedReplicaInfo h;
  h.replica_id = id;
  h.app = "a";
  h.deployment = "D";
  h.code_version = "v1";
  h.stopping = stopping;
  h.handle = handle;
  return h;
}

std::vector<std::string> ids(const std::vector<HostedReplica>& rs) {
  std::vector<std::string> out;
  for (const auto& r : rs)
    out.push_back(r.replica_id);
  return out;
}

}  // namespace

TEST_CASE("directory: a replica is found by id and its down message by address") {
  Fixture f;
  auto r1 = f.handle();
  f.dir.remember_replica("a#D#1", "n1", r1);
  CHECK(f.dir.replica("a#D#1") == r1);
  CHECK_FALSE(f.dir.replica("a#D#2"));
  CHECK(f.times_monitored(r1) == 1);
  CHECK(f.dir.replica_count() == 1);

  auto ev = f.dir.on_down(r1.address(), caf::exit_reason::kill);
  CHECK(ev.kind == DownKind::replica_crashed);
  CHECK(ev.id == "a#D#1");
  CHECK(ev.cause.empty());  // not a troupe error: the shell logs CAF's rendering
  // Forgotten with its down message: a second notice is about nobody.
  CHECK_FALSE(f.dir.replica("a#D#1"));
  CHECK(f.dir.on_down(r1.address(), caf::exit_reason::kill).kind == DownKind::unknown);
}

TEST_CASE("directory: a replica process's exit cause becomes the crash's cause") {
  Fixture f;
  auto r1 = f.handle();
  f.dir.remember_replica("a#D#1", "n1", r1);
  auto ev = f.dir.on_down(r1.address(), troupe_error("replica a#D#1 exited: killed by SIGSEGV"));
  CHECK(ev.kind == DownKind::replica_crashed);
  CHECK(ev.cause == "replica a#D#1 exited: killed by SIGSEGV");
}

TEST_CASE("directory: a replica asked to stop goes down stopped whatever the reason") {
  Fixture f;
  auto r1 = f.handle();
  auto r2 = f.handle();
  f.dir.remember_replica("a#D#1", "n1", r1);
  f.dir.remember_replica("a#D#2", "n1", r2);
  f.dir.mark_stopping("a#D#1");
  f.dir.mark_stopping("a#D#9");  // unknown: nothing
  CHECK(f.dir.replica_count() == 2);
  auto ev = f.dir.on_down(r1.address(), troupe_error("replica a#D#1 exited: killed by SIGKILL"));
  CHECK(ev.kind == DownKind::replica_stopped);
  CHECK(ev.id == "a#D#1");
  CHECK(ev.cause.empty());
  CHECK(f.dir.on_down(r2.address(), caf::exit_reason::user_shutdown).kind ==
        DownKind::replica_crashed);
}

TEST_CASE("directory: a new handle for a replica id replaces the old one") {
  Fixture f;
  auto old_handle = f.handle();
  auto new_handle = f.handle();
  f.dir.remember_replica("a#D#1", "n1", old_handle);
  f.dir.mark_stopping("a#D#1");
  f.dir.remember_replica("a#D#1", "n2", new_handle);
  CHECK(f.dir.replica("a#D#1") == new_handle);
  CHECK(f.dir.replica_count() == 1);
  CHECK(f.times_monitored(new_handle) == 1);
  // The old handle's notice no longer counts; the replica lives on.
  CHECK(f.dir.on_down(old_handle.address(), caf::exit_reason::kill).kind == DownKind::unknown);
  CHECK(f.dir.replica("a#D#1") == new_handle);
  // The stopping flag belongs to the id, not the handle (a stop sent stays sent).
  CHECK(f.dir.on_down(new_handle.address(), caf::exit_reason::kill).kind ==
        DownKind::replica_stopped);
}

TEST_CASE("directory: the start time is kept per replica - 0 when unknown") {
  Fixture f;
  f.dir.remember_replica("a#D#1", "n1", f.handle());
  CHECK(f.dir.started_at("a#D#1") == 0);
  f.dir.set_started_at("a#D#1", 1700000000.5);
  f.dir.set_started_at("a#D#2", 42);  // unknown: not created
  CHECK(f.dir.started_at("a#D#1") == 1700000000.5);
  CHECK(f.dir.started_at("a#D#2") == 0);
  CHECK(f.dir.replica_count() == 1);
  f.dir.forget_replica("a#D#1");
  f.dir.forget_replica("a#D#1");  // twice: nothing
  CHECK(f.dir.started_at("a#D#1") == 0);
  CHECK(f.dir.replica_count() == 0);
}

TEST_CASE("directory: a node's agent replaces its older one") {
  Fixture f;
  auto old_agent = f.handle();
  auto new_agent = f.handle();
  auto other = f.handle();
  f.dir.attach_agent("n1", old_agent, 1);
  f.dir.attach_agent("n2", other, 2);
  f.dir.attach_agent("n1", new_agent, 3);
  CHECK(f.dir.agent("n1") == new_agent);
  CHECK(f.dir.agent("n2") == other);
  CHECK_FALSE(f.dir.agent("n3"));
  CHECK(f.times_monitored(new_agent) == 1);
  auto agents = f.dir.agents();
  CHECK(agents.size() == 2);
  CHECK(std::count(agents.begin(), agents.end(), new_agent) == 1);
  CHECK(std::count(agents.begin(), agents.end(), old_agent) == 0);
  // The older agent's late notice is about nobody: n1 keeps its new agent.
  CHECK(f.dir.on_down(old_agent.address(), caf::exit_reason::remote_link_unreachable).kind ==
        DownKind::unknown);
  CHECK(f.dir.agent("n1") == new_agent);
}

TEST_CASE("directory: an agent down with its connection means its node is gone") {
  Fixture f;
  auto agent = f.handle();
  f.dir.attach_agent("n1", agent, 7);
  auto ev = f.dir.on_down(agent.address(), caf::exit_reason::remote_link_unreachable);
  CHECK(ev.kind == DownKind::agent_link_lost);
  CHECK(ev.id == "n1");
  CHECK(ev.incarnation == 7);
  CHECK_FALSE(f.dir.agent("n1"));
}

TEST_CASE("directory: an agent that died alone leaves its node to its keeper") {
  Fixture f;
  for (caf::error reason :
       {caf::make_error(caf::exit_reason::kill), caf::make_error(caf::exit_reason::user_shutdown),
        troupe_error("agent failed")}) {
    auto agent = f.handle();
    f.dir.attach_agent("n1", agent, 4);
    auto ev = f.dir.on_down(agent.address(), reason);
    CHECK(ev.kind == DownKind::agent_died);
    CHECK(ev.id == "n1");
    CHECK(ev.incarnation == 4);
    CHECK_FALSE(f.dir.agent("n1"));  // until the new agent registers
  }
}

TEST_CASE("directory: a node that leaves has its agents forgotten and unmonitored") {
  Fixture f;
  auto agent = f.handle();
  auto other = f.handle();
  f.dir.attach_agent("n1", agent, 1);
  f.dir.attach_agent("n2", other, 2);
  f.dir.detach_node("n1");
  CHECK_FALSE(f.dir.agent("n1"));
  REQUIRE(f.demonitored.size() == 1);
  CHECK(f.demonitored.front() == agent.address());
  CHECK(f.dir.on_down(agent.address(), caf::exit_reason::remote_link_unreachable).kind ==
        DownKind::unknown);
  CHECK(f.dir.agent("n2") == other);
  f.dir.detach_node("n3");  // unknown: nothing
  CHECK(f.demonitored.size() == 1);
}

TEST_CASE("directory: subscribers keep their key when they subscribe again") {
  Fixture f;
  auto p1 = f.handle();
  auto p2 = f.handle();
  auto k1 = f.dir.add_subscriber(p1, SnapshotId{5, 1});
  auto k2 = f.dir.add_subscriber(p2, SnapshotId{});
  CHECK(k1 != k2);
  CHECK(f.dir.subscriber(k1) == p1);
  CHECK(f.dir.add_subscriber(p1, SnapshotId{5, 3}) == k1);
  CHECK(f.dir.subscribers().size() == 2);
  CHECK(f.dir.subscribers().at(k1).last == SnapshotId{5, 3});
  f.dir.mark_sent(k2, SnapshotId{5, 4});
  CHECK(f.dir.subscribers().at(k2).last == SnapshotId{5, 4});

  auto ev = f.dir.on_down(p1.address(), caf::exit_reason::kill);
  CHECK(ev.kind == DownKind::subscriber);
  CHECK(ev.subscriber == k1);
  CHECK_FALSE(f.dir.subscriber(k1));
  CHECK(f.dir.subscribers().size() == 1);
  // Back after its down: a new proxy as far as health goes.
  auto k3 = f.dir.add_subscriber(p1, SnapshotId{});
  CHECK(k3 != k1);
  CHECK(k3 != k2);
}

TEST_CASE("directory: new http settings make every subscriber due for a full push") {
  Fixture f;
  auto k1 = f.dir.add_subscriber(f.handle(), SnapshotId{5, 3});
  auto k2 = f.dir.add_subscriber(f.handle(), SnapshotId{5, 2});
  f.dir.set_http(HttpSettings{});  // unchanged: nothing to push
  CHECK(f.dir.subscribers().at(k1).last == SnapshotId{5, 3});
  HttpSettings http;
  http.request_timeout_s = 30;
  f.dir.set_http(http);
  CHECK(f.dir.subscribers().at(k1).last == SnapshotId{});
  CHECK(f.dir.subscribers().at(k2).last == SnapshotId{});
  f.dir.mark_sent(k1, SnapshotId{5, 4});
  f.dir.set_http(http);
  CHECK(f.dir.subscribers().at(k1).last == SnapshotId{5, 4});
  http.keep_alive_timeout_s = 75;  // the keep-alive timeout alone is a change too
  f.dir.set_http(http);
  CHECK(f.dir.subscribers().at(k1).last == SnapshotId{});
}

TEST_CASE("directory: a registering node's hosted replicas are remembered and adopted") {
  Fixture f;
  auto r1 = f.handle();
  auto r2 = f.handle();
  auto adopt = f.dir.take_hosted(
      "n1", {hosted("a#D#1", r1), hosted("a#D#2", r2, true), hosted("a#D#3", test::AnyHandle{})}, false);
  CHECK(ids(adopt) == std::vector<std::string>{"a#D#1", "a#D#2"});  // no handle: skipped
  REQUIRE(adopt.size() == 2);
  CHECK(adopt[0].app == "a");
  CHECK(adopt[0].deployment == "D");
  CHECK(adopt[0].node_id == "n1");
  CHECK_FALSE(adopt[0].stopping);
  CHECK(adopt[1].stopping);
  CHECK(f.dir.replica("a#D#1") == r1);
  CHECK_FALSE(f.dir.replica("a#D#3"));
  CHECK(f.times_monitored(r1) == 1);
  // The agent was stopping it: its down is a stop.
  CHECK(f.dir.on_down(r2.address(), caf::exit_reason::user_shutdown).kind ==
        DownKind::replica_stopped);
}

TEST_CASE("directory: a known replica reported again is offered again - not while recovering") {
  Fixture f;
  auto r1 = f.handle();
  f.dir.take_hosted("n1", {hosted("a#D#1", r1)}, false);
  // Re-registering after being DEAD: the core may have given it up, so it
  // is offered again (the core ignores what it still tracks).
  auto again = f.dir.take_hosted("n1", {hosted("a#D#1", r1)}, false);
  CHECK(ids(again) == std::vector<std::string>{"a#D#1"});
  CHECK(f.times_monitored(r1) == 1);  // known: not monitored twice
  // While recovering it has been collected already.
  CHECK(f.dir.take_hosted("n1", {hosted("a#D#1", r1)}, true).empty());
  // A new handle for the id is news even while recovering.
  auto r1b = f.handle();
  auto replaced = f.dir.take_hosted("n1", {hosted("a#D#1", r1b, true)}, true);
  CHECK(ids(replaced) == std::vector<std::string>{"a#D#1"});
  CHECK(f.dir.replica("a#D#1") == r1b);
  CHECK(f.dir.on_down(r1.address(), caf::exit_reason::kill).kind == DownKind::unknown);
  CHECK(f.dir.on_down(r1b.address(), caf::exit_reason::kill).kind == DownKind::replica_stopped);
}

TEST_CASE("directory: a kill reaches the replica - agent or proxy named") {
  Fixture f;
  FakeClock clock;
  ProxyHealthMonitor proxies(clock, ProxyHealthOptions{});
  auto replica = f.handle();
  auto agent = f.handle();
  auto proxy = f.handle();
  f.dir.remember_replica("a#D#1", "n1", replica);
  f.dir.attach_agent("n1", agent, 1);
  proxies.track(f.dir.add_subscriber(proxy, SnapshotId{}), "n1");

  auto t = f.dir.kill_target("replica", "a#D#1", proxies);
  REQUIRE(t);
  CHECK(t->actor == replica);
  CHECK_FALSE(t->controller);
  CHECK(t->log_line == "killing replica a#D#1 on operator request");
  t = f.dir.kill_target("agent", "n1", proxies);
  REQUIRE(t);
  CHECK(t->actor == agent);
  CHECK(t->log_line == "killing the node agent of n1 on operator request");
  t = f.dir.kill_target("proxy", "n1", proxies);
  REQUIRE(t);
  CHECK(t->actor == proxy);
  CHECK(t->log_line == "killing the proxy of n1 on operator request");
  t = f.dir.kill_target("controller", "", proxies);
  REQUIRE(t);
  CHECK(t->controller);
  CHECK_FALSE(t->actor);
  CHECK(t->log_line == "controller killed on operator request");
}

TEST_CASE("directory: a kill of nothing known says what is missing") {
  Fixture f;
  FakeClock clock;
  ProxyHealthMonitor proxies(clock, ProxyHealthOptions{});
  auto message = [&](const std::string& kind, const std::string& id) {
    auto t = f.dir.kill_target(kind, id, proxies);
    REQUIRE_FALSE(t);
    return t.status();
  };
  CHECK(message("replica", "a#D#1").message() == "no replica 'a#D#1'");
  CHECK(message("replica", "a#D#1").code() == errc::not_found);
  CHECK(message("agent", "n1").message() == "no node agent of node 'n1'");
  CHECK(message("proxy", "n1").message() == "no proxy on node 'n1'");
  auto unknown = message("node", "n1");
  CHECK(unknown.code() == errc::invalid_argument);
  CHECK(unknown.message() ==
        "kill: unknown kind 'node'; expected replica, proxy, agent or controller");
}
