#include "controller/membership.hpp"

#include <doctest/doctest.h>

using namespace troupe;
using namespace troupe::controller;

namespace {

NodeRecord node(const std::string& id) {
  NodeRecord n;
  n.id = id;
  n.host = "127.0.0.1";
  n.http_port = 8000;
  return n;
}

NodeState state(const Membership& m, const std::string& id) {
  return m.nodes().at(id).state;
}

}  // namespace

TEST_CASE("nodes are ALIVE while they heartbeat and DEAD after the timeout") {
  Membership m(5.0);
  m.register_node(node("a"), 0.0);
  m.register_node(node("b"), 0.0);
  CHECK(m.heartbeat("a", 4.0).is_ok());
  CHECK(m.check(5.0).empty());  // b's silence is exactly the timeout: not yet
  auto ts = m.check(5.5);
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].id == "b");
  CHECK(ts[0].from == NodeState::alive);
  CHECK(ts[0].to == NodeState::dead);
  CHECK(ts[0].reason == "no heartbeat for 5.5 s (timeout 5.0 s)");
  CHECK(state(m, "a") == NodeState::alive);
  CHECK(state(m, "b") == NodeState::dead);
  CHECK(m.check(6.0).empty());  // reported once
  auto late = m.check(9.1);
  REQUIRE(late.size() == 1);
  CHECK(late[0].id == "a");
}

TEST_CASE("a DEAD or unknown node must register again - and then is ALIVE") {
  Membership m(1.0);
  CHECK(m.heartbeat("x", 0.0).code() == errc::not_found);
  m.register_node(node("x"), 0.0);
  m.check(2.0);
  REQUIRE(state(m, "x") == NodeState::dead);
  auto st = m.heartbeat("x", 2.1);
  CHECK(st.code() == errc::not_found);
  CHECK(st.message().find("declared DEAD") != std::string::npos);
  m.register_node(node("x"), 2.2);
  CHECK(state(m, "x") == NodeState::alive);
  CHECK(m.heartbeat("x", 2.3).is_ok());
}

TEST_CASE("a lost connection kills only the incarnation it belongs to") {
  Membership m(5.0);
  auto first = m.register_node(node("w"), 0.0);
  auto second = m.register_node(node("w"), 1.0);  // the process restarted
  CHECK(second > first);
  CHECK(m.connection_lost("w", first, 1.5).empty());
  CHECK(state(m, "w") == NodeState::alive);
  auto ts = m.connection_lost("w", second, 2.0);
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].reason == "connection to the node agent lost");
  CHECK(state(m, "w") == NodeState::dead);
}

TEST_CASE("drain survives re-registration - DEAD and unknown nodes cannot be drained") {
  Membership m(5.0);
  m.register_node(node("w"), 0.0);
  CHECK(m.drain("w").is_ok());
  CHECK(state(m, "w") == NodeState::draining);
  m.register_node(node("w"), 1.0);
  CHECK(state(m, "w") == NodeState::draining);
  CHECK(m.drain("nope").code() == errc::not_found);
  m.check(10.0);
  CHECK(state(m, "w") == NodeState::dead);
  CHECK(m.drain("w").code() == errc::invalid_argument);
  m.register_node(node("w"), 11.0);  // a drained node that died comes back drained
  CHECK(state(m, "w") == NodeState::draining);
}

TEST_CASE("deregistered nodes leave the table") {
  Membership m(5.0);
  m.register_node(node("w"), 0.0);
  CHECK(m.deregister("w").is_ok());
  CHECK(m.nodes().empty());
  CHECK(m.deregister("w").code() == errc::not_found);
}

TEST_CASE("after a pause deadlines start again - a connection lost in the grace waits for the node") {
  Membership m(5.0);
  m.register_node(node("a"), 0.0);
  m.register_node(node("b"), 0.0);
  auto c = m.register_node(node("c"), 0.0);
  m.register_node(node("gone"), 0.0);
  for (const char* id : {"a", "b", "c"})
    REQUIRE(m.heartbeat(id, 1.0).is_ok());
  REQUIRE(m.check(6.0).size() == 1);  // "gone" is DEAD before the pause
  // The controller stops at 1 s and runs again at 21 s: judged by its own
  // silence every node would be DEAD.
  m.resumed(21.0, 10.0);
  CHECK(m.in_pause_grace(21.0));
  CHECK(m.check(21.0).empty());
  CHECK(state(m, "gone") == NodeState::dead);  // a DEAD node stays DEAD
  // c's connection dropped in the pause: ALIVE until the grace ends.
  CHECK(m.connection_lost("c", c, 21.1).empty());
  CHECK(state(m, "c") == NodeState::alive);
  CHECK(m.nodes().at("c").reason.find("while the controller was paused") != std::string::npos);
  // a heartbeats; b does not and is DEAD one node timeout after the resume;
  // c neither heartbeats nor registers: DEAD when the grace ends, not before.
  CHECK(m.heartbeat("a", 24.0).is_ok());
  auto ts = m.check(26.5);
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].id == "b");
  CHECK(ts[0].reason == "no heartbeat for 5.5 s (timeout 5.0 s)");
  CHECK(m.heartbeat("a", 28.0).is_ok());
  CHECK(m.check(30.9).empty());
  ts = m.check(31.1);
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].id == "c");
  CHECK(ts[0].reason == "did not register again within 10.0 s of the controller's resume");
  CHECK(state(m, "a") == NodeState::alive);
  // After the grace a lost connection is a DEAD node at once again.
  CHECK_FALSE(m.in_pause_grace(31.1));
  auto a = m.register_node(node("a"), 31.2);
  ts = m.connection_lost("a", a, 31.3);
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].reason == "connection to the node agent lost");
}

TEST_CASE("a node that registers again in the grace is judged by its heartbeats") {
  Membership m(2.0);
  auto w = m.register_node(node("w"), 0.0);
  m.resumed(12.0, 10.0);
  CHECK(m.connection_lost("w", w, 12.1).empty());
  m.register_node(node("w"), 13.0);
  CHECK(m.check(14.9).empty());
  auto ts = m.check(15.1);  // silent for 2.1 s since it registered
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].reason == "no heartbeat for 2.1 s (timeout 2.0 s)");
}
