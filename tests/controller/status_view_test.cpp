// What the controller answers to `status`, `nodes` and `apply`, rendered from
// a constructed state: troupectl and the integration tests parse these, so
// field names and shapes are checked exactly.
#include "controller/shell/status_view.hpp"

#include <doctest/doctest.h>

#include <set>

#include <caf/all.hpp>

#include "tests/controller/fakes.hpp"

using namespace troupe;
using namespace troupe::controller;
using namespace troupe::controller::testing;
using nlohmann::json;

TEST_CASE("status: without a core there are no applications") {
  CHECK(render_status(nullptr, true, {}).dump() == R"({"applications":{}})");
}

TEST_CASE("status: an empty controller") {
  Harness h;
  CHECK(render_status(h.core.get(), false, {}).dump() ==
        R"({"applications":{},"generation":0,"recovering":false})");
  CHECK(render_status(h.core.get(), true, {}).dump() ==
        R"({"applications":{},"generation":0,"recovering":true})");
}

TEST_CASE("status: applications - deployments and replicas with every field") {
  Harness h;
  auto d = make_deployment("D", 1);
  d.config.memory_limit_bytes = uint64_t{256} << 20;
  REQUIRE(
      h.core->deploy_application(make_app("a", "/a", {d, make_deployment("E", 1)})).has_value());
  h.ticks(2);
  auto started = [](const std::string& id) { return id == "a#D#1" ? 1700000000.5 : 0.0; };
  json s = render_status(h.core.get(), false, started);
  // The code version as the core reports it (it carries a hash of the spec).
  std::string vd = h.replicas("a", "D").at(0).version.code;
  std::string ve = h.replicas("a", "E").at(0).version.code;
  CHECK(s.dump() ==
        R"({"applications":{"a":{"deployments":{)"
        R"("D":{"isolation":"process","memory_limit_bytes":268435456,"message":"",)"
        R"("replicas":[{"id":"a#D#1","models":[],"node":"n1","pending_allocation":false,)"
        R"("started":1700000000.5,"state":"RUNNING","version":")" +
            vd +
            R"("}],)"
            R"("status":"HEALTHY","target_replicas":1,"trigger":"CONFIG_UPDATE_COMPLETED"},)"
            R"("E":{"isolation":"process","memory_limit_bytes":0,"message":"",)"
            R"("replicas":[{"id":"a#E#2","models":[],"node":"n2","pending_allocation":false,)"
            R"("started":0.0,"state":"RUNNING","version":")" +
            ve +
            R"("}],)"
            R"("status":"HEALTHY","target_replicas":1,"trigger":"CONFIG_UPDATE_COMPLETED"}},)"
            R"("ingress":"D","message":"","route_prefix":"/a","status":"RUNNING"}},)"
            R"("generation":1,"recovering":false})");
}

TEST_CASE("status: a replica whose start time is unknown shows 0") {
  Harness h;
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {make_deployment("D", 1)})).has_value());
  h.tick();
  json s = render_status(h.core.get(), false, {});
  const auto& r = s["applications"]["a"]["deployments"]["D"]["replicas"].at(0);
  CHECK(r["started"].is_number_float());
  CHECK(r["started"].get<double>() == 0.0);
  CHECK(r["pending_allocation"] == false);
}

TEST_CASE("apply result: per application the change of each deployment and the removed ones") {
  std::map<std::string, DeployResult> results;
  results["a"].deployments = {{"D", ChangeKind::created}, {"E", ChangeKind::unchanged}};
  results["a"].removed = {"F"};
  results["b"].deployments = {{"G", ChangeKind::unchanged}};
  CHECK(render_apply_result(results, true, 7).dump() ==
        R"({"applications":{"a":{"deployments":{"D":"created","E":"unchanged"},"removed":["F"]},)"
        R"("b":{"deployments":{"G":"unchanged"},"removed":[]}},"changed":true,"generation":7})");
  CHECK(render_apply_result({}, false, 3).dump() ==
        R"({"applications":{},"changed":false,"generation":3})");
}

TEST_CASE("nodes: one row per node with its proxy's health") {
  Membership m(5.0);
  NodeRecord rec;
  rec.id = "n1";
  rec.host = "10.0.0.1";
  rec.http_port = 8001;
  rec.resources = *parse_resources("cpu=2");
  rec.pid = 4242;
  m.register_node(rec, 100.0);
  rec.id = "n2";
  m.register_node(rec, 100.0);
  REQUIRE(m.drain("n2").is_ok());
  FakeClock clock;
  ProxyHealthMonitor proxies(clock, ProxyHealthOptions{});
  proxies.track(1, "n1");
  auto rows = render_nodes(m, proxies, 101.25);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].id == "n1");
  CHECK(rows[0].address == "10.0.0.1:8001");
  CHECK(rows[0].state == "ALIVE");
  CHECK(rows[0].resources == rec.resources.to_string());
  CHECK(rows[0].last_heartbeat_age_ms == 1250);
  CHECK(rows[0].pid == 4242);
  CHECK(rows[0].proxy == "STARTING");
  CHECK(rows[1].state == "DRAINING");
  CHECK(rows[1].proxy == "NONE");
}

TEST_CASE("snapshot: routes - deployments with their queue limit - removed and DEAD nodes") {
  Harness h;
  auto d = make_deployment("D", 1);
  d.config.max_queued_requests = 7;
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {d})).has_value());
  h.ticks(2);
  auto delta = h.core->changes_since(SnapshotId{});
  REQUIRE(delta.has_value());
  Membership m(5.0);
  NodeRecord rec;
  rec.id = "n9";
  m.register_node(rec, 0.0);
  NodeRecord drained;
  drained.id = "n7";
  m.register_node(drained, 9.0);
  REQUIRE(m.drain("n7").is_ok());
  m.check(10.0);  // no heartbeat: n9 DEAD
  // No actor for the replica yet: it is left out.
  TargetState target = h.core->target_state();
  target.http.request_timeout_s = 2.5;
  auto out = render_snapshot(*delta, target, m, {});
  CHECK(out.epoch == delta->id.epoch);
  CHECK(out.seq == delta->id.seq);
  CHECK(out.full);
  CHECK(out.request_timeout_s == 2.5);
  CHECK(out.keep_alive_timeout_s == 0);  // none declared: the node's own
  REQUIRE(out.routes.size() == 1);
  CHECK(out.routes[0].prefix == "/a");
  CHECK(out.routes[0].app == "a");
  CHECK(out.routes[0].ingress == "D");
  REQUIRE(out.deployments.size() == 1);
  CHECK(out.deployments[0].app == "a");
  CHECK(out.deployments[0].deployment == "D");
  CHECK(out.deployments[0].max_queued_requests == 7);
  CHECK(out.deployments[0].replicas.empty());
  CHECK(out.dead_nodes == std::vector<std::string>{"n9"});
  CHECK(out.draining_nodes == std::vector<std::string>{"n7"});

  REQUIRE(h.core->delete_application("a").is_ok());
  h.ticks(2);
  auto gone = h.core->changes_since(delta->id);
  REQUIRE(gone.has_value());
  auto out2 = render_snapshot(*gone, h.core->target_state(), m, {});
  REQUIRE(out2.removed.size() == 1);
  CHECK(out2.removed[0] == std::make_pair(std::string("a"), std::string("D")));
}

TEST_CASE("status and snapshot: open_inference shown and pushed only when set") {
  Harness h;
  auto oip = make_app("m", "/m", {make_deployment("D", 1)});
  oip.open_inference = true;
  REQUIRE(h.core->deploy_application(oip).has_value());
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {make_deployment("E", 1)})).has_value());
  h.ticks(2);
  json s = render_status(h.core.get(), false, {});
  CHECK(s["applications"]["m"]["open_inference"] == true);
  CHECK_FALSE(s["applications"]["a"].contains("open_inference"));  // unchanged when false
  auto delta = h.core->changes_since(SnapshotId{});
  REQUIRE(delta.has_value());
  auto out = render_snapshot(*delta, h.core->target_state(), Membership(5.0), {});
  REQUIRE(out.routes.size() == 2);
  CHECK(out.routes[0].app == "a");
  CHECK_FALSE(out.routes[0].open_inference);
  CHECK(out.routes[1].app == "m");
  CHECK(out.routes[1].open_inference);
}

TEST_CASE("status changes: each deployment's transitions - once") {
  Harness h;
  StatusChangeLog log;
  CHECK(log.observe(*h.core).empty());
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {make_deployment("D", 1)})).has_value());
  auto first = log.observe(*h.core);
  REQUIRE(first.size() == 1);
  CHECK(first[0].deployment == "a/D");
  CHECK(first[0].from.empty());
  CHECK_FALSE(first[0].warn);
  CHECK(first[0].describe().rfind("deployment a/D: NEW -> ", 0) == 0);
  CHECK(log.observe(*h.core).empty());  // unchanged: nothing
  h.ticks(2);
  auto next = log.observe(*h.core);
  REQUIRE(next.size() == 1);
  CHECK(next[0].from == std::string(to_string(first[0].info.status)));
  CHECK(std::string(to_string(next[0].info.status)) == "HEALTHY");
  CHECK(log.observe(*h.core).empty());
}

TEST_CASE("status changes: a failing deployment is a warning") {
  Harness h;
  h.cluster.fail_start["D"] = "boom";
  h.options.max_constructor_retry_count = 1;
  h.start();
  StatusChangeLog log;
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {make_deployment("D", 1)})).has_value());
  log.observe(*h.core);
  bool warned = false;
  for (int i = 0; i < 10 && !warned; ++i) {
    h.tick();
    for (const auto& c : log.observe(*h.core))
      warned = warned || (c.warn && c.info.status == DeploymentStatus::deploy_failed);
  }
  CHECK(warned);
}

TEST_CASE("snapshot: the peer listeners of the live nodes that host a listed replica") {
  Harness h;
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {make_deployment("D", 3)})).has_value());
  h.ticks(2);
  auto delta = h.core->changes_since(SnapshotId{});
  REQUIRE(delta.has_value());
  std::set<std::string> hosts;
  for (const auto& r : h.replicas("a", "D"))
    hosts.insert(r.node_id);
  REQUIRE(hosts == std::set<std::string>{"n1", "n2", "n3"});
  // n1: a worker with a peer listener; n2: none (the head); n3: DEAD; n4:
  // a worker hosting none of these replicas.
  Membership m(5.0);
  auto add = [&](const std::string& id, uint16_t peer_port, double at) {
    NodeRecord rec;
    rec.id = id;
    rec.host = "10.0.0." + id.substr(1);
    rec.peer_port = peer_port;
    m.register_node(rec, at);
  };
  add("n3", 7403, 0.0);
  add("n1", 7401, 9.0);
  add("n2", 0, 9.0);
  add("n4", 7404, 9.0);
  m.check(10.0);  // no heartbeat: n3 DEAD
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto any = caf::actor_cast<ReplicaActor>(
      sys.spawn([]() -> caf::behavior { return {[](int) {}}; }));
  auto out = render_snapshot(*delta, h.core->target_state(), m,
                             [&](const std::string&) { return any; });
  REQUIRE(out.deployments.size() == 1);
  CHECK(out.deployments[0].replicas.size() == 3);
  CHECK(out.peers == std::vector<PeerEndpoint>{{"n1", "10.0.0.1", 7401}});
  caf::anon_send_exit(any, caf::exit_reason::user_shutdown);
}
