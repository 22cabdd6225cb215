// Router: longest-prefix routes, power of two choices with local preference,
// the max_ongoing_requests cap, the bounded queue, retry exclusions and
// snapshot application. Deterministic: seeded randomness, no threads.
#include <doctest/doctest.h>

#include <cstdlib>
#include <map>
#include <set>

#include <caf/all.hpp>

#include "proxy/router.hpp"

using namespace troupe;
using namespace troupe::proxy;

namespace {

ReplicaEndpoint replica(const std::string& id, const std::string& node, uint32_t max) {
  ReplicaEndpoint e;
  e.replica_id = id;
  e.node_id = node;
  e.max_ongoing_requests = max;
  return e;
}

RoutingSnapshot full_snapshot(std::vector<ReplicaEndpoint> replicas, int32_t max_queued = -1) {
  RoutingSnapshot s;
  s.epoch = 1;
  s.seq = 1;
  s.full = true;
  s.routes = {{"/echo", "echo", "Echo"}};
  s.deployments = {{"echo", "Echo", std::move(replicas), max_queued}};
  return s;
}

const std::string kEcho = deployment_key("echo", "Echo");

}  // namespace

TEST_CASE("proxy/router: longest prefix wins and the rest of the path starts with '/'") {
  RouteTable t({{"/", "root", "R", {}},
                {"/api", "api", "A", {}},
                {"/api/v1", "v1", "V", {}},
                {"/echo", "echo", "E", {}}});
  auto m = t.match("/api/v1/users");
  REQUIRE(m.route);
  CHECK(m.route->app == "v1");
  CHECK(m.rest == "/users");
  m = t.match("/api/v2");
  CHECK(m.route->app == "api");
  CHECK(m.rest == "/v2");
  m = t.match("/api");
  CHECK(m.route->app == "api");
  CHECK(m.rest == "/");
  m = t.match("/api/");
  CHECK(m.route->app == "api");
  CHECK(m.rest == "/");
  // A prefix matches whole path segments only.
  m = t.match("/apix");
  CHECK(m.route->app == "root");
  CHECK(m.rest == "/apix");
  m = t.match("/echo?x");  // the caller strips the query; a '?' is just a character here
  CHECK(m.route->app == "root");
  CHECK(t.match("/").route->app == "root");
  CHECK(t.match("/api/v1").route->key == deployment_key("v1", "V"));
}

TEST_CASE("proxy/router: no route without a catch-all prefix") {
  RouteTable t({{"/b", "b", "B", {}}, {"/a", "a", "A", {}}});
  CHECK(t.match("/c").route == nullptr);
  CHECK(t.match("/").route == nullptr);
  CHECK(t.match("").route == nullptr);
  CHECK(t.match("/a/x").route->app == "a");
  // routes() is sorted by prefix.
  REQUIRE(t.routes().size() == 2);
  CHECK(t.routes()[0].prefix == "/a");
}

TEST_CASE("proxy/router: a prefix with a trailing slash") {
  RouteTable t({{"/api/", "api", "A", {}}});
  CHECK(t.match("/api/x").rest == "/x");
  CHECK(t.match("/api").rest == "/");
  CHECK(t.match("/apix").route == nullptr);
}

TEST_CASE("proxy/router: never more than max_ongoing_requests in flight per replica") {
  Router r({"n1", 42});
  r.apply(full_snapshot({replica("a", "n1", 2), replica("b", "n2", 3)}, 0));
  std::map<std::string, int> load;
  std::vector<SlotPtr> held;
  for (int i = 0; i < 5; ++i) {
    auto adm = r.admit(kEcho, {}, [](SlotPtr) {});
    REQUIRE(adm.kind == Router::Admit::assigned);
    load[adm.slot->replica_id]++;
    held.push_back(adm.slot);
  }
  CHECK(load == std::map<std::string, int>{{"a", 2}, {"b", 3}});
  // Full, and max_queued_requests 0: refused at once.
  CHECK(r.admit(kEcho, {}, [](SlotPtr) {}).kind == Router::Admit::queue_full);
  r.release(held[0], Outcome::answered);
  auto adm = r.admit(kEcho, {}, [](SlotPtr) {});
  REQUIRE(adm.kind == Router::Admit::assigned);
  CHECK(adm.slot->replica_id == held[0]->replica_id);
}

TEST_CASE("proxy/router: power of two choices picks the less loaded replica") {
  Router r({"n1", 7});
  r.apply(full_snapshot({replica("a", "n1", 100), replica("b", "n1", 100)}));
  // Load a with 10 requests by holding them; then every new request goes to b
  // until both are even (two replicas: both are always the two choices).
  std::vector<SlotPtr> held;
  while (held.size() < 10) {
    auto adm = r.admit(kEcho, {"b"}, [](SlotPtr) {});
    REQUIRE(adm.slot->replica_id == "a");
    held.push_back(adm.slot);
  }
  for (int i = 0; i < 10; ++i) {
    auto adm = r.admit(kEcho, {}, [](SlotPtr) {});
    CHECK(adm.slot->replica_id == "b");
  }
  auto view = r.deployments();
  REQUIRE(view.size() == 1);
  CHECK(view[0].replicas[0].in_flight == 10);
  CHECK(view[0].replicas[1].in_flight == 10);
  // The load report: both replicas' in-flight requests, nothing queued.
  auto loads = r.loads();
  REQUIRE(loads.size() == 1);
  CHECK(loads[0].app == "echo");
  CHECK(loads[0].deployment == "Echo");
  CHECK(loads[0].queued_and_inflight == 20);
}

TEST_CASE(
    "proxy/router: the load report counts queued requests with those in flight - per "
    "deployment in order") {
  Router r({"n1", 7});
  RoutingSnapshot s = full_snapshot({replica("a", "n1", 1)});
  s.routes.push_back({"/b", "b", "B"});
  s.deployments.push_back({"b", "B", {replica("x", "n1", 4)}, -1});
  r.apply(s);
  auto first = r.admit(kEcho, {}, [](SlotPtr) {});
  REQUIRE(first.kind == Router::Admit::assigned);
  // The only replica is at max_ongoing_requests 1: two more wait.
  CHECK(r.admit(kEcho, {}, [](SlotPtr) {}).kind == Router::Admit::queued);
  CHECK(r.admit(kEcho, {}, [](SlotPtr) {}).kind == Router::Admit::queued);
  auto loads = r.loads();
  REQUIRE(loads.size() == 2);
  CHECK(loads[0].app == "b");
  CHECK(loads[0].queued_and_inflight == 0);
  CHECK(loads[1].app == "echo");
  CHECK(loads[1].queued_and_inflight == 3);
}

TEST_CASE("proxy/router: equally loaded the local replica is preferred") {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    Router r({"here", seed});
    r.apply(full_snapshot({replica("a", "far", 10), replica("b", "here", 10)}));
    auto adm = r.admit(kEcho, {}, [](SlotPtr) {});
    REQUIRE(adm.kind == Router::Admit::assigned);
    CHECK(adm.slot->replica_id == "b");
    CHECK(adm.slot->local);
    // Now b has one more in flight: the remote one wins.
    auto next = r.admit(kEcho, {}, [](SlotPtr) {});
    CHECK(next.slot->replica_id == "a");
  }
}

TEST_CASE("proxy/router: a remote replica wins only when it is less loaded than every local one") {
  Router r({"here", 5});
  r.apply(full_snapshot({replica("l1", "here", 10), replica("l2", "here", 10),
                         replica("f1", "far", 10), replica("f2", "far", 10)}));
  auto take = [&] { return r.admit(kEcho, {}, [](SlotPtr) {}).slot; };
  // Idle: the local replicas take the first requests, one each.
  auto a = take();
  auto b = take();
  CHECK(a->local);
  CHECK(b->local);
  CHECK(a->replica_id != b->replica_id);
  // Every local one has 1 in flight, the remote ones none: remote now.
  auto c = take();
  auto d = take();
  CHECK_FALSE(c->local);
  CHECK_FALSE(d->local);
  CHECK(c->replica_id != d->replica_id);
  // All equally loaded again: local.
  CHECK(take()->local);
}

TEST_CASE("proxy/router: with many replicas the load spreads evenly") {
  Router r({"n1", 3});
  std::vector<ReplicaEndpoint> reps;
  for (int i = 0; i < 8; ++i)
    reps.push_back(replica("r" + std::to_string(i), "n1", 1000));
  r.apply(full_snapshot(reps));
  for (int i = 0; i < 800; ++i)
    r.admit(kEcho, {}, [](SlotPtr) {});
  uint32_t lo = UINT32_MAX, hi = 0;
  // Held by name: a range-for over a member of a temporary would read freed
  // memory (ThreadSanitizer's heap-use-after-free report).
  auto views = r.deployments();
  for (const auto& rep : views[0].replicas) {
    lo = std::min(lo, rep.in_flight);
    hi = std::max(hi, rep.in_flight);
  }
  // P2C keeps the spread small (a uniform random choice would not).
  CHECK(hi - lo <= 20);
  CHECK(lo > 0);
}

TEST_CASE("proxy/router: a bounded queue beyond the cap is served in order as slots free") {
  Router r({"n1", 1});
  r.apply(full_snapshot({replica("a", "n1", 1)}, 2));
  auto first = r.admit(kEcho, {}, [](SlotPtr) {});
  REQUIRE(first.kind == Router::Admit::assigned);
  std::vector<std::string> order;
  std::vector<SlotPtr> got;
  auto waiter = [&](const std::string& name) {
    return [&, name](SlotPtr s) {
      order.push_back(name);
      got.push_back(s);
    };
  };
  auto q1 = r.admit(kEcho, {}, waiter("q1"));
  auto q2 = r.admit(kEcho, {}, waiter("q2"));
  CHECK(q1.kind == Router::Admit::queued);
  CHECK(q2.kind == Router::Admit::queued);
  CHECK(r.admit(kEcho, {}, waiter("q3")).kind == Router::Admit::queue_full);
  CHECK(r.deployments()[0].queued == 2);
  CHECK(order.empty());  // never called synchronously
  auto ready = r.release(first.slot, Outcome::answered);
  REQUIRE(ready.size() == 1);
  for (auto& f : ready)
    f();
  CHECK(order == std::vector<std::string>{"q1"});
  REQUIRE(got.back());
  CHECK(got.back()->in_flight == 1);
  // A cancelled waiter (its deadline passed) is never called.
  CHECK(r.cancel(kEcho, q2.ticket));
  CHECK_FALSE(r.cancel(kEcho, q2.ticket));
  CHECK(r.release(got.back(), Outcome::answered).empty());
  CHECK(r.deployments()[0].queued == 0);
}

TEST_CASE("proxy/router: a new request waits behind queued ones") {
  Router r({"n1", 1});
  r.apply(full_snapshot({}, 5));
  CHECK(r.admit(kEcho, {}, [](SlotPtr) {}).kind == Router::Admit::queued);
  // A replica appears: the queued request gets it, with the in-flight count.
  std::vector<SlotPtr> got;
  auto snap = full_snapshot({replica("a", "n1", 1)}, 5);
  snap.full = false;
  snap.seq = 2;
  auto applied = r.apply(snap);
  REQUIRE(applied.ready.size() == 1);
  applied.ready[0]();
  CHECK(r.deployments()[0].replicas[0].in_flight == 1);
  CHECK(r.admit(kEcho, {}, [](SlotPtr) {}).kind == Router::Admit::queued);
}

TEST_CASE("proxy/router: a retry avoids the replicas already tried while others have room") {
  Router r({"n1", 5});
  r.apply(full_snapshot({replica("a", "n1", 5), replica("b", "n1", 5), replica("c", "n1", 5)}));
  for (int i = 0; i < 10; ++i) {
    auto adm = r.admit(kEcho, {"a", "b"}, [](SlotPtr) {});
    CHECK(adm.slot->replica_id == "c");
    r.release(adm.slot, Outcome::answered);
  }
  for (int i = 0; i < 5; ++i)
    CHECK(r.admit(kEcho, {"a", "b"}, [](SlotPtr) {}).slot->replica_id == "c");
  // c is full now: the tried ones are used as a last resort.
  auto adm = r.admit(kEcho, {"a", "b"}, [](SlotPtr) {});
  REQUIRE(adm.kind == Router::Admit::assigned);
  CHECK(adm.slot->replica_id != "c");
}

TEST_CASE("proxy/router: a replica that died is never chosen again") {
  Router r({"n1", 9});
  r.apply(full_snapshot({replica("a", "n1", 5), replica("b", "n1", 5)}));
  auto adm = r.admit(kEcho, {"b"}, [](SlotPtr) {});
  REQUIRE(adm.slot->replica_id == "a");
  r.release(adm.slot, Outcome::died);
  for (int i = 0; i < 5; ++i)
    CHECK(r.admit(kEcho, {}, [](SlotPtr) {}).slot->replica_id == "b");
  // b is full, a is dead: queue.
  CHECK(r.admit(kEcho, {}, [](SlotPtr) {}).kind == Router::Admit::queued);
  // The next snapshot still lists a (the controller has not noticed yet): it
  // stays dead; a replacement c takes the queued request.
  auto snap = full_snapshot({replica("a", "n1", 5), replica("b", "n1", 5), replica("c", "n1", 5)});
  snap.seq = 2;
  auto applied = r.apply(snap);
  REQUIRE(applied.ready.size() == 1);
  applied.ready[0]();
  auto view = r.deployments()[0];
  CHECK(view.replicas[2].replica_id == "c");
  CHECK(view.replicas[2].in_flight == 1);
}

TEST_CASE("proxy/router: has_replica - a known deployment with a replica that is not dead") {
  Router r({"n1", 9});
  CHECK_FALSE(r.has_replica(kEcho));  // no snapshot yet
  auto snap = full_snapshot({replica("a", "n1", 1), replica("b", "n1", 1)});
  snap.deployments.push_back({"empty", "None", {}, -1});
  r.apply(snap);
  CHECK(r.has_replica(kEcho));
  CHECK_FALSE(r.has_replica(deployment_key("echo", "Other")));  // unknown
  CHECK_FALSE(r.has_replica(deployment_key("empty", "None")));  // known, no replica
  // Busy replicas still count: only dead ones do not.
  auto first = r.admit(kEcho, {"b"}, [](SlotPtr) {});
  auto second = r.admit(kEcho, {"a"}, [](SlotPtr) {});
  REQUIRE(first.kind == Router::Admit::assigned);
  REQUIRE(second.kind == Router::Admit::assigned);
  CHECK(r.has_replica(kEcho));
  r.release(first.slot, Outcome::died);
  CHECK(r.has_replica(kEcho));  // b lives
  r.release(second.slot, Outcome::died);
  CHECK_FALSE(r.has_replica(kEcho));  // both dead
  // A replacement makes it live again; a deployment the snapshot drops is
  // unknown.
  auto next = full_snapshot({replica("a", "n1", 1), replica("b", "n1", 1), replica("c", "n1", 1)});
  next.seq = 2;
  r.apply(next);
  CHECK(r.has_replica(kEcho));
  CHECK_FALSE(r.has_replica(deployment_key("empty", "None")));
}

TEST_CASE("proxy/router: snapshots full and delta with withheld and removed deployments") {
  Router r({"n1", 11});
  CHECK_FALSE(r.has_routes());
  CHECK(r.admit(kEcho, {}, [](SlotPtr) {}).kind == Router::Admit::no_deployment);
  RoutingSnapshot s = full_snapshot({replica("a", "n1", 1)});
  s.routes.push_back({"/sleep", "sleep", "Sleep"});
  s.deployments.push_back({"sleep", "Sleep", {replica("s1", "n2", 1)}, -1});
  r.apply(s);
  CHECK(r.has_routes());
  CHECK(r.routes()->routes().size() == 2);
  // Keep a request in flight on a across updates.
  auto held = r.admit(kEcho, {}, [](SlotPtr) {});
  REQUIRE(held.kind == Router::Admit::assigned);

  // Delta without route change: replaces echo's set, keeps the in-flight count
  // of a replica that stays.
  RoutingSnapshot d;
  d.epoch = 1;
  d.seq = 2;
  d.deployments = {{"echo", "Echo", {replica("a", "n1", 1), replica("b", "n1", 1)}, -1}};
  r.apply(d);
  CHECK(r.routes()->routes().size() == 2);
  auto view = r.deployments();
  REQUIRE(view.size() == 2);
  CHECK(view[0].replicas.size() == 2);
  CHECK(view[0].replicas[0].in_flight == 1);

  // A queued request on sleep, then sleep is removed: the waiter gets nullptr.
  auto s1 = r.admit(deployment_key("sleep", "Sleep"), {}, [](SlotPtr) {});
  REQUIRE(s1.kind == Router::Admit::assigned);
  bool dropped = false;
  auto q = r.admit(deployment_key("sleep", "Sleep"), {}, [&](SlotPtr s) { dropped = !s; });
  REQUIRE(q.kind == Router::Admit::queued);
  RoutingSnapshot rm;
  rm.epoch = 1;
  rm.seq = 3;
  rm.routes_changed = true;
  rm.routes = {{"/echo", "echo", "Echo"}};
  rm.removed = {{"sleep", "Sleep"}};
  auto applied = r.apply(rm);
  REQUIRE(applied.ready.size() == 1);
  applied.ready[0]();
  CHECK(dropped);
  CHECK(r.routes()->match("/sleep").route == nullptr);
  CHECK(r.deployments().size() == 1);

  // A full snapshot after a controller restart: echo is withheld (still
  // recovering), so its replicas stay as they were.
  RoutingSnapshot f;
  f.epoch = 2;
  f.seq = 1;
  f.full = true;
  f.routes = {{"/echo", "echo", "Echo"}};
  f.withheld = {{"echo", "Echo"}};
  r.apply(f);
  CHECK(r.epoch() == 2);
  CHECK(r.seq() == 1);
  view = r.deployments();
  REQUIRE(view.size() == 1);
  CHECK(view[0].replicas.size() == 2);
  // A full snapshot without echo removes it.
  RoutingSnapshot g;
  g.epoch = 2;
  g.seq = 2;
  g.full = true;
  r.apply(g);
  CHECK(r.deployments().empty());
  CHECK(r.routes()->routes().empty());
  // The slot held across all this can still be given back.
  CHECK(r.release(held.slot, Outcome::answered).empty());
}

TEST_CASE("proxy/router: a partial delta changes only the replicas it names") {
  Router r({"n1", 11});
  r.apply(full_snapshot({replica("a", "n1", 1), replica("b", "n2", 1), replica("c", "n2", 1)}));
  auto held = r.admit(kEcho, {}, [](SlotPtr) {});
  REQUIRE(held.kind == Router::Admit::assigned);
  const std::string held_id = held.slot->replica_id;

  // One replica leaves, one comes, one changes its cap; the held one stays
  // with its request in flight.
  std::string gone = held_id == "b" ? "c" : "b";
  RoutingSnapshot d;
  d.epoch = 1;
  d.seq = 2;
  DeploymentEndpoints e{"echo", "Echo", {replica("a0", "n2", 1)}, -1, true, {gone}};
  if (held_id != "a")
    e.replicas.push_back(replica("a", "n1", 4));
  d.deployments = {e};
  auto applied = r.apply(d);
  CHECK(applied.added.empty());  // endpoints without handles here
  auto view = r.deployments();
  REQUIRE(view.size() == 1);
  std::map<std::string, Router::DeploymentView::Replica> by_id;
  for (const auto& rv : view[0].replicas)
    by_id[rv.replica_id] = rv;
  CHECK(by_id.size() == 3);
  CHECK(by_id.count(gone) == 0);
  CHECK(by_id.count("a0") == 1);
  CHECK(by_id.at(held_id).in_flight == 1);
  if (held_id != "a")
    CHECK(by_id.at("a").max_ongoing == 4);
  // Still sorted by id, as the controller lists them.
  std::vector<std::string> order;
  for (const auto& rv : view[0].replicas)
    order.push_back(rv.replica_id);
  CHECK(std::is_sorted(order.begin(), order.end()));
  // Removing an id it does not hold changes nothing.
  RoutingSnapshot d2;
  d2.epoch = 1;
  d2.seq = 3;
  d2.deployments = {{"echo", "Echo", {}, -1, true, {"zz"}}};
  r.apply(d2);
  CHECK(r.deployments()[0].replicas.size() == 3);
  CHECK(r.release(held.slot, Outcome::answered).empty());
}

TEST_CASE("proxy/router: a partial delta of its deployment brings back a replica without route") {
  Router r({"n1", 11});
  r.apply(full_snapshot({replica("a", "n2", 1)}));
  auto first = r.admit(kEcho, {}, [](SlotPtr) {});
  REQUIRE(first.kind == Router::Admit::assigned);
  r.release(first.slot, Outcome::unreachable);
  // No route to a: nothing to choose until a snapshot lists the deployment.
  SlotPtr waited;
  auto none = r.admit(kEcho, {}, [&](SlotPtr s) { waited = s; });
  CHECK(none.kind == Router::Admit::queued);
  // A delta that adds b and leaves a in place: both are choosable again.
  RoutingSnapshot d;
  d.epoch = 1;
  d.seq = 2;
  d.deployments = {{"echo", "Echo", {replica("b", "n2", 1)}, -1, true, {}}};
  auto applied = r.apply(d);
  for (auto& f : applied.ready)
    f();
  REQUIRE(waited);
  auto second = r.admit(kEcho, {}, [](SlotPtr) {});
  REQUIRE(second.kind == Router::Admit::assigned);
  CHECK(second.slot->replica_id != waited->replica_id);
  CHECK(r.admit(kEcho, {}, [](SlotPtr) {}).kind == Router::Admit::queued);  // both busy
  r.clear();
}

TEST_CASE("proxy/router: a request on a replica of a DEAD node is lost and retried elsewhere") {
  Router r({"n1", 13});
  r.apply(full_snapshot({replica("a", "n2", 5), replica("b", "n3", 5)}));
  // A request in flight on a, whose node then freezes.
  auto held = r.admit(kEcho, {"b"}, [](SlotPtr) {});
  REQUIRE(held.kind == Router::Admit::assigned);
  REQUIRE(held.slot->replica_id == "a");
  // The controller declares n2 DEAD: a leaves the set, and the snapshot
  // names the dead node.
  RoutingSnapshot d;
  d.epoch = 1;
  d.seq = 2;
  d.deployments = {{"echo", "Echo", {replica("b", "n3", 5)}, -1}};
  d.dead_nodes = {"n2"};
  auto applied = r.apply(d);
  REQUIRE(applied.lost.size() == 1);
  CHECK(applied.lost[0] == held.slot);
  CHECK(held.slot->dead);
  // What the proxy does with it: give the slot back as died and place the
  // request again, excluding a: it lands on b.
  r.release(held.slot, Outcome::died);
  auto retry = r.admit(kEcho, {"a"}, [](SlotPtr) {});
  REQUIRE(retry.kind == Router::Admit::assigned);
  CHECK(retry.slot->replica_id == "b");
  // Later snapshots still naming n2 DEAD do not report a again.
  RoutingSnapshot again;
  again.epoch = 1;
  again.seq = 3;
  again.deployments = {{"echo", "Echo", {replica("b", "n3", 5), replica("c", "n3", 5)}, -1}};
  again.dead_nodes = {"n2"};
  CHECK(r.apply(again).lost.empty());
}

TEST_CASE("proxy/router: a replica leaving the set on a live node is not lost") {
  Router r({"n1", 17});
  r.apply(full_snapshot({replica("a", "n2", 5), replica("b", "n3", 5)}));
  auto held = r.admit(kEcho, {"b"}, [](SlotPtr) {});
  REQUIRE(held.slot->replica_id == "a");
  // a is stopping gracefully (downscale): gone from the set, node alive.
  RoutingSnapshot d;
  d.epoch = 1;
  d.seq = 2;
  d.deployments = {{"echo", "Echo", {replica("b", "n3", 5)}, -1}};
  d.dead_nodes = {"n9"};  // some other node is dead
  auto applied = r.apply(d);
  CHECK(applied.lost.empty());
  // It is never chosen for a new request, and its answer still releases it.
  for (int i = 0; i < 3; ++i)
    CHECK(r.admit(kEcho, {}, [](SlotPtr) {}).slot->replica_id == "b");
  CHECK(r.release(held.slot, Outcome::answered).empty());
}

TEST_CASE("proxy/router: a replica cut off with its connection is live with a new handle") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto idle = []() -> caf::behavior { return {[](int) {}}; };
  // Two handles standing for the old and the new proxy of one remote replica.
  auto old_handle = sys.spawn(idle);
  auto new_handle = sys.spawn(idle);
  auto with = [](ReplicaEndpoint e, caf::actor h) {
    e.handle = caf::actor_cast<ReplicaActor>(std::move(h));
    return e;
  };
  Router r({"n1", 19});
  auto first =
      r.apply(full_snapshot({with(replica("a", "n2", 5), old_handle), replica("b", "n3", 100)}));
  CHECK(first.added.size() == 1);
  // The connection to n2 dropped: a request on a fails first (its slot is
  // given back as died), then a's handle goes down as unreachable.
  auto on_a = r.admit(kEcho, {"b"}, [](SlotPtr) {});
  REQUIRE(on_a.slot->replica_id == "a");
  r.release(on_a.slot, Outcome::died);
  r.mark_dead(old_handle.address(), /*link_lost=*/true);
  for (int i = 0; i < 3; ++i)
    CHECK(r.admit(kEcho, {}, [](SlotPtr) {}).slot->replica_id == "b");
  // The same handle again (no new connection yet): still dead.
  auto same = full_snapshot({with(replica("a", "n2", 5), old_handle), replica("b", "n3", 100)});
  same.seq = 2;
  CHECK(r.apply(same).added.empty());
  CHECK(r.admit(kEcho, {"b"}, [](SlotPtr) {}).slot->replica_id == "b");
  // After the reconnect the controller's full snapshot carries a new handle.
  auto fresh = full_snapshot({with(replica("a", "n2", 5), new_handle), replica("b", "n3", 100)});
  fresh.seq = 3;
  auto applied = r.apply(fresh);
  REQUIRE(applied.added.size() == 1);
  CHECK(applied.added[0] == new_handle);
  auto adm = r.admit(kEcho, {"b"}, [](SlotPtr) {});
  REQUIRE(adm.kind == Router::Admit::assigned);
  CHECK(adm.slot->replica_id == "a");
  CHECK(adm.slot->handle == new_handle);
  // A replica that died (not its connection) stays dead even with a new
  // handle: the controller will drop it.
  r.mark_dead(new_handle.address(), /*link_lost=*/false);
  auto other = full_snapshot({with(replica("a", "n2", 5), old_handle), replica("b", "n3", 100)});
  other.seq = 4;
  r.apply(other);
  for (int i = 0; i < 3; ++i)
    CHECK(r.admit(kEcho, {}, [](SlotPtr) {}).slot->replica_id == "b");
  r.clear();
  caf::anon_send_exit(old_handle, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(new_handle, caf::exit_reason::user_shutdown);
}

TEST_CASE("proxy/router: a lost node takes every replica handle on it out at once") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto idle = []() -> caf::behavior { return {[](int) {}}; };
  auto a = sys.spawn(idle);
  auto b = sys.spawn(idle);
  auto with = [](ReplicaEndpoint e, caf::actor h) {
    e.handle = caf::actor_cast<ReplicaActor>(std::move(h));
    return e;
  };
  Router r({"n1", 23});
  // a and b live on this actor system's node; c has no handle (another node).
  r.apply(full_snapshot(
      {with(replica("a", "n2", 5), a), with(replica("b", "n2", 5), b), replica("c", "n3", 5)}));
  // Another node lost: nothing changes.
  auto elsewhere = caf::make_node_id(42, "0123456789012345678901234567890123456789");
  REQUIRE(elsewhere);
  REQUIRE(*elsewhere != a.node());
  r.mark_node_lost(*elsewhere);
  std::set<std::string> chosen;
  for (int i = 0; i < 30; ++i) {
    auto adm = r.admit(kEcho, {}, [](SlotPtr) {});
    REQUIRE(adm.kind == Router::Admit::assigned);
    chosen.insert(adm.slot->replica_id);
    r.release(adm.slot, Outcome::answered);
  }
  CHECK(chosen == std::set<std::string>{"a", "b", "c"});
  // The connection to a's node dropped: b, on the same node, is out too.
  r.mark_node_lost(a.node());
  for (int i = 0; i < 5; ++i) {
    auto adm = r.admit(kEcho, {}, [](SlotPtr) {});
    REQUIRE(adm.kind == Router::Admit::assigned);
    CHECK(adm.slot->replica_id == "c");
  }
  // Both come back with new handles (a reconnect), like a lost handle.
  auto a2 = sys.spawn(idle);
  auto b2 = sys.spawn(idle);
  auto fresh = full_snapshot(
      {with(replica("a", "n2", 5), a2), with(replica("b", "n2", 5), b2), replica("c", "n3", 5)});
  fresh.seq = 2;
  CHECK(r.apply(fresh).added.size() == 2);
  chosen.clear();
  for (int i = 0; i < 30; ++i) {
    auto adm = r.admit(kEcho, {"c"}, [](SlotPtr) {});
    REQUIRE(adm.kind == Router::Admit::assigned);
    chosen.insert(adm.slot->replica_id);
    r.release(adm.slot, Outcome::answered);
  }
  CHECK(chosen == std::set<std::string>{"a", "b"});
  r.clear();
  for (auto& h : {a, b, a2, b2})
    caf::anon_send_exit(h, caf::exit_reason::user_shutdown);
}

// ---------------------------------------------------------------- traffic split

namespace {

// A route table for greet (ingress Hello) with `traffic`, as a snapshot
// pushes it.
std::shared_ptr<const RouteTable> split_table(TrafficWeights traffic,
                                              const std::string& key_header = "") {
  Router router(RouterOptions{});
  RoutingSnapshot s;
  s.epoch = 1;
  s.seq = 1;
  s.full = true;
  s.routes = {{"/greet", "greet", "Hello", std::move(traffic), key_header}};
  router.apply(s);
  return router.routes();
}

std::map<std::string, int> picks(const Route& route, const std::vector<double>& points) {
  std::map<std::string, int> out;
  for (double p : points)
    ++out[pick_target(route, p).deployment];
  return out;
}

}  // namespace

TEST_CASE("proxy/router: without a split every request goes to the ingress") {
  auto table = split_table({});
  const Route* r = table->match("/greet/x").route;
  REQUIRE(r);
  CHECK(r->split.empty());
  for (double p : {0.0, 0.5, 0.999999})
    CHECK(&pick_target(*r, p) == r);
  CHECK(table->find_app("greet") == r);
  CHECK(table->find_app("nope") == nullptr);
}

TEST_CASE("proxy/router: a split picks by cumulative weight - zero weights never") {
  auto table = split_table({{"Canary", 0.2}, {"Hello", 0.8}, {"Mirror", 0.0}}, "X-User");
  const Route* r = table->match("/greet").route;
  REQUIRE(r);
  REQUIRE(r->split.size() == 2);
  CHECK(r->split_key_header == "X-User");
  CHECK(r->split[0].route->deployment == "Canary");
  CHECK(r->split[1].upto == 1.0);
  const Route& canary = pick_target(*r, 0.0);
  CHECK(canary.deployment == "Canary");
  CHECK(canary.app == "greet");
  CHECK(canary.prefix == "/greet");
  CHECK(canary.key == deployment_key("greet", "Canary"));
  CHECK(canary.split.empty());
  CHECK(pick_target(*r, 0.1999).deployment == "Canary");
  CHECK(pick_target(*r, 0.2).deployment == "Hello");
  CHECK(pick_target(*r, 0.99999999).deployment == "Hello");

  // Seeded: 100,000 random points give the weights within 1 %.
  SplitRandom random(42);
  std::vector<double> points(100000);
  for (auto& p : points) {
    p = random.next();
    REQUIRE(p >= 0.0);
    REQUIRE(p < 1.0);
  }
  auto n = picks(*r, points);
  CHECK(n.count("Mirror") == 0);
  CHECK(n["Canary"] + n["Hello"] == 100000);
  CHECK(n["Canary"] == doctest::Approx(20000).epsilon(0.05));
}

TEST_CASE("proxy/router: a key picks the same deployment while the weights do not change") {
  auto before = split_table({{"Canary", 0.1}, {"Hello", 0.9}}, "X-User");
  auto after = split_table({{"Canary", 0.2}, {"Hello", 0.8}}, "X-User");
  const Route& b = *before->match("/greet").route;
  const Route& a = *after->match("/greet").route;
  std::map<std::string, int> shares;
  int moved = 0;
  for (int i = 0; i < 20000; ++i) {
    const std::string user = "user-" + std::to_string(i);
    const double p = key_point(user);
    CHECK(p == key_point(user));  // stable
    const std::string& was = pick_target(b, p).deployment;
    const std::string& now = pick_target(a, p).deployment;
    ++shares[now];
    // Raising the canary's weight only moves keys onto it, never off it.
    if (was == "Canary")
      CHECK(now == "Canary");
    moved += was != now ? 1 : 0;
  }
  // The hash spreads keys like the weights ...
  CHECK(shares["Canary"] == doctest::Approx(4000).epsilon(0.1));
  // ... and about a tenth of the keys move (0.1 of the weight did).
  CHECK(moved == doctest::Approx(2000).epsilon(0.15));
  // Pinned values: every node (and every build) maps a key to the same
  // point, so a user stays on one deployment whichever proxy it reaches.
  CHECK(key_point("alice") == 0.7727254287806008);
  CHECK(key_point("") == 0.95767342524205612);
}

// ---------------------------------------------------------------- shadow traffic

namespace {

// A route table for greet (ingress Hello) with `shadow`, as a snapshot pushes
// it.
std::shared_ptr<const RouteTable> shadow_table(TrafficWeights shadow, TrafficWeights traffic = {}) {
  Router router(RouterOptions{});
  RoutingSnapshot s;
  s.epoch = 1;
  s.seq = 1;
  s.full = true;
  s.routes = {{"/greet", "greet", "Hello", std::move(traffic), "", std::move(shadow)}};
  router.apply(s);
  return router.routes();
}

}  // namespace

TEST_CASE("proxy/router: shadow targets come with the route - no shadow no copies") {
  auto plain = shadow_table({});
  const Route* p = plain->match("/greet").route;
  REQUIRE(p);
  CHECK(p->shadow.empty());
  SplitRandom random(7);
  for (int i = 0; i < 100; ++i)
    CHECK(pick_shadows(*p, random).empty());

  auto table = shadow_table({{"Mirror", 0.5}, {"Never", 0.0}}, {{"Canary", 0.5}, {"Hello", 0.5}});
  const Route* r = table->match("/greet/x").route;
  REQUIRE(r);
  REQUIRE(r->shadow.size() == 2);
  const Route& mirror = *r->shadow[0].route;
  CHECK(r->shadow[0].probability == 0.5);
  CHECK(mirror.deployment == "Mirror");
  CHECK(mirror.app == "greet");
  CHECK(mirror.prefix == "/greet");
  CHECK(mirror.key == deployment_key("greet", "Mirror"));
  CHECK(mirror.split.empty());
  CHECK(mirror.shadow.empty());
  CHECK(r->shadow[1].route->deployment == "Never");
  // The split's targets carry no shadow of their own: copies are made once
  // per request, from the application's route.
  for (const auto& t : r->split)
    CHECK(t.route->shadow.empty());
}

TEST_CASE("proxy/router: open_inference comes with the application's route only") {
  Router router(RouterOptions{});
  RoutingSnapshot s;
  s.epoch = 1;
  s.seq = 1;
  s.full = true;
  s.routes = {
      {"/greet", "greet", "Hello", {{"Canary", 0.5}, {"Hello", 0.5}}, "", {{"Mirror", 0.5}}},
      {"/echo", "echo", "Echo"}};
  s.routes[0].open_inference = true;
  router.apply(s);
  auto table = router.routes();
  const Route* greet = table->find_app("greet");
  REQUIRE(greet);
  CHECK(greet->open_inference);
  // Its split and shadow targets do not carry it: the route decides.
  REQUIRE(greet->split.size() == 2);
  for (const auto& t : greet->split)
    CHECK_FALSE(t.route->open_inference);
  REQUIRE(greet->shadow.size() == 1);
  CHECK_FALSE(greet->shadow[0].route->open_inference);
  const Route* echo = table->find_app("echo");
  REQUIRE(echo);
  CHECK_FALSE(echo->open_inference);
  // A later snapshot that clears it clears it.
  s.seq = 2;
  s.routes[0].open_inference = false;
  router.apply(s);
  CHECK_FALSE(router.routes()->find_app("greet")->open_inference);
}

TEST_CASE("proxy/router: each shadow gets a copy with its probability - independently") {
  auto table = shadow_table({{"Always", 1.0}, {"Mirror", 0.5}, {"Never", 0.0}, {"Tenth", 0.1}});
  const Route& r = *table->match("/greet").route;
  SplitRandom random(42);
  std::map<std::string, int> copies;
  int both = 0;
  const int n = 10000;
  for (int i = 0; i < n; ++i) {
    auto picked = pick_shadows(r, random);
    bool mirror = false, tenth = false;
    for (const Route* s : picked) {
      ++copies[s->deployment];
      mirror = mirror || s->deployment == "Mirror";
      tenth = tenth || s->deployment == "Tenth";
    }
    both += mirror && tenth ? 1 : 0;
  }
  CHECK(copies["Always"] == n);
  CHECK(copies.count("Never") == 0);
  // 0.5 within 2 % (of the draws), 0.1 likewise.
  CHECK(std::abs(copies["Mirror"] - n / 2) <= n * 2 / 100);
  CHECK(std::abs(copies["Tenth"] - n / 10) <= n * 2 / 100);
  // Independent draws: both in about 0.5 x 0.1 of the requests.
  CHECK(std::abs(both - n / 20) <= n * 1 / 100);

  // Seeded: the same seed makes the same picks.
  SplitRandom a(9), b(9);
  for (int i = 0; i < 1000; ++i)
    CHECK(pick_shadows(r, a) == pick_shadows(r, b));
}

TEST_CASE("proxy/router: a shadow copy takes a free slot or none - never queues") {
  Router r({"n1", 1});
  r.apply(full_snapshot({replica("a", "n1", 2)}, 10));
  auto c1 = r.admit_if_free(kEcho);
  auto c2 = r.admit_if_free(kEcho);
  REQUIRE(c1.kind == Router::Admit::assigned);
  REQUIRE(c2.kind == Router::Admit::assigned);
  CHECK(c1.slot->in_flight == 2);
  // Full: the copy is dropped, nothing waits.
  CHECK(r.admit_if_free(kEcho).kind == Router::Admit::queue_full);
  CHECK(r.deployments()[0].queued == 0);
  // A request queued behind the full replica gets the next free slot, not a
  // copy.
  std::vector<SlotPtr> got;
  REQUIRE(r.admit(kEcho, {}, [&](SlotPtr s) { got.push_back(s); }).kind == Router::Admit::queued);
  auto ready = r.release(c1.slot, Outcome::answered);
  REQUIRE(ready.size() == 1);
  ready[0]();
  CHECK(r.admit_if_free(kEcho).kind == Router::Admit::queue_full);
  CHECK(r.release(c2.slot, Outcome::answered).empty());
  auto c3 = r.admit_if_free(kEcho);
  CHECK(c3.kind == Router::Admit::assigned);
  // An unknown deployment.
  CHECK(r.admit_if_free(deployment_key("echo", "Nope")).kind == Router::Admit::no_deployment);
}
