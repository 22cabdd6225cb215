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
