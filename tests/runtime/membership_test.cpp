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
    REQUIRE(m.heartbeat(id, 5.0).is_ok());
  REQUIRE(m.check(6.0).size() == 1);  // "gone" is DEAD before the pause
  CHECK(state(m, "gone") == NodeState::dead);
  // The controller stops at 6 s and runs again at 21 s: judged by its own
  // silence every node would be lost.
  m.resumed(21.0, 12.0);
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
  CHECK(ts[0].to == NodeState::dead);
  CHECK(ts[0].reason == "no heartbeat for 5.5 s (timeout 5.0 s)");
  CHECK(m.heartbeat("a", 28.0).is_ok());
  CHECK(m.heartbeat("a", 32.0).is_ok());
  CHECK(m.check(32.9).empty());
  ts = m.check(33.1);
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].id == "c");
  CHECK(ts[0].to == NodeState::dead);
  CHECK(ts[0].reason == "did not register again within 12.0 s of the controller's resume");
  CHECK(state(m, "a") == NodeState::alive);
  // After the grace a lost connection is a DEAD node at once again.
  CHECK_FALSE(m.in_pause_grace(33.1));
  auto a = m.register_node(node("a"), 40.0);
  ts = m.connection_lost("a", a, 40.1);
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].to == NodeState::dead);
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

// Eviction with judgement (LossJudgement): a head and two workers that
// heartbeat every second, as troupe-node does by default.
namespace {

Membership three_nodes(LossJudgement j = {}) {
  Membership m(5.0, j);
  for (const char* id : {"head", "w1", "w2"})
    m.register_node(node(id), 0.0);
  for (double t = 1.0; t <= 10.0; t += 1.0) {
    for (const char* id : {"head", "w1", "w2"})
      REQUIRE(m.heartbeat(id, t).is_ok());
  }
  return m;
}

}  // namespace

TEST_CASE("judgement: two of three nodes lost together turn UNREACHABLE - not DEAD") {
  Membership m = three_nodes();
  // Both workers fall silent at 10 s (w2's last heartbeat came 0.6 s after
  // w1's); the head goes on.
  REQUIRE(m.heartbeat("w2", 10.6).is_ok());
  for (double t = 11.0; t <= 20.0; t += 1.0)
    REQUIRE(m.heartbeat("head", t).is_ok());
  CHECK(m.check(15.0).empty());
  auto ts = m.check(15.1);  // w1 times out; w2 is silent for 4.5 s of 5
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].id == "w1");
  CHECK(ts[0].from == NodeState::alive);
  CHECK(ts[0].to == NodeState::unreachable);
  CHECK(ts[0].reason ==
        "no heartbeat for 5.1 s (timeout 5.0 s); 2 of 3 nodes lost within one node timeout "
        "(more than 50 %): the controller is the likely one cut off, so the node's replicas "
        "stay where they are until it is back, lost for 60 s, or drained");
  CHECK(m.nodes().at("w1").reason == ts[0].reason);
  ts = m.check(15.7);
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].id == "w2");
  CHECK(ts[0].to == NodeState::unreachable);
  CHECK(state(m, "head") == NodeState::alive);
  CHECK(m.check(16.0).empty());  // reported once
  // An UNREACHABLE node's heartbeat asks it to register again (with the
  // replicas it hosts), which makes it ALIVE.
  auto st = m.heartbeat("w1", 30.0);
  CHECK(st.code() == errc::not_found);
  CHECK(st.message() == "node 'w1' was UNREACHABLE; register again with its replicas");
  m.register_node(node("w1"), 30.1);
  CHECK(state(m, "w1") == NodeState::alive);
  CHECK(m.nodes().at("w1").lost_at == -1);
  CHECK(state(m, "w2") == NodeState::unreachable);
}

TEST_CASE("judgement: one node of three lost alone is DEAD at once") {
  Membership m = three_nodes();
  for (double t = 11.0; t <= 20.0; t += 1.0) {
    REQUIRE(m.heartbeat("head", t).is_ok());
    REQUIRE(m.heartbeat("w2", t).is_ok());
  }
  auto ts = m.check(15.1);
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].id == "w1");
  CHECK(ts[0].to == NodeState::dead);
  CHECK(ts[0].reason == "no heartbeat for 5.1 s (timeout 5.0 s)");
  // Its dropped connection, alone too.
  Membership n = three_nodes();
  auto inc = n.register_node(node("w1"), 10.0);
  REQUIRE(n.heartbeat("w2", 10.5).is_ok());
  ts = n.connection_lost("w1", inc, 10.6);
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].to == NodeState::dead);
  CHECK(ts[0].reason == "connection to the node agent lost");
}

TEST_CASE("judgement: a dropped connection while the others are silent is a mass loss") {
  Membership m = three_nodes();
  auto inc = m.register_node(node("w2"), 10.0);
  REQUIRE(m.heartbeat("head", 13.0).is_ok());
  // w1 silent since 10 s (more than half the timeout): w2's connection drops.
  auto ts = m.connection_lost("w2", inc, 13.0);
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].to == NodeState::unreachable);
  CHECK(ts[0].reason.rfind("connection to the node agent lost; 2 of 3 nodes lost", 0) == 0);
  // A later drop of an UNREACHABLE node's connection changes nothing.
  CHECK(m.connection_lost("w2", inc, 14.0).empty());
  CHECK(state(m, "w2") == NodeState::unreachable);
  ts = m.check(15.1);
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].id == "w1");
  CHECK(ts[0].to == NodeState::unreachable);
}

TEST_CASE("judgement: a node lost within one node timeout of another counts with it") {
  Membership m = three_nodes();
  REQUIRE(m.heartbeat("w2", 13.0).is_ok());  // w2 goes on until 13 s
  REQUIRE(m.heartbeat("head", 14.0).is_ok());
  auto ts = m.check(15.1);  // w1 alone: w2 heartbeat 2.1 s ago
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].to == NodeState::dead);
  REQUIRE(m.heartbeat("head", 17.0).is_ok());
  ts = m.check(18.1);  // w2, 3 s after w1: two of three within one timeout
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].id == "w2");
  CHECK(ts[0].to == NodeState::unreachable);
  // A node lost more than one timeout after the last is judged alone again.
  Membership n = three_nodes();
  REQUIRE(n.heartbeat("w2", 14.0).is_ok());
  for (double t = 11.0; t <= 20.0; t += 1.0)
    REQUIRE(n.heartbeat("head", t).is_ok());
  REQUIRE(n.check(15.1).size() == 1);  // w1 DEAD
  ts = n.check(20.2);                  // w2, 5.1 s after w1
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].to == NodeState::dead);
}

TEST_CASE(
    "judgement: an UNREACHABLE node is DEAD after the unreachable timeout - or when drained") {
  Membership m = three_nodes(LossJudgement{0.5, 2, 30.0});
  for (double t = 11.0; t <= 60.0; t += 1.0)
    REQUIRE(m.heartbeat("head", t).is_ok());
  auto ts = m.check(15.1);
  REQUIRE(ts.size() == 2);
  CHECK(ts[0].to == NodeState::unreachable);
  CHECK(ts[1].to == NodeState::unreachable);
  CHECK(ts[0].reason.find("lost for 30 s, or drained") != std::string::npos);
  // The operator decides for w2: DEAD now, DRAINING when it comes back.
  CHECK(m.drain("w2").is_ok());
  CHECK(state(m, "w2") == NodeState::dead);
  CHECK(m.nodes().at("w2").reason ==
        "drained by operator while UNREACHABLE: its replicas are replaced on other nodes");
  CHECK(m.check(45.1).empty());
  ts = m.check(45.2);
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].id == "w1");
  CHECK(ts[0].from == NodeState::unreachable);
  CHECK(ts[0].to == NodeState::dead);
  CHECK(ts[0].reason ==
        "UNREACHABLE for 30.1 s (unreachable timeout 30.0 s): its replicas are replaced on "
        "other nodes");
  m.register_node(node("w2"), 50.0);
  CHECK(state(m, "w2") == NodeState::draining);
}

TEST_CASE("judgement: the share and the least count are the operator's") {
  // Two of three lost, but at least three are needed.
  Membership m = three_nodes(LossJudgement{0.5, 3, 60.0});
  REQUIRE(m.heartbeat("head", 15.0).is_ok());
  auto ts = m.check(15.1);
  REQUIRE(ts.size() == 2);
  for (const auto& t : ts)
    CHECK(t.to == NodeState::dead);
  // A share of 1: never UNREACHABLE, even when every node is lost.
  Membership n = three_nodes(LossJudgement{1.0, 2, 60.0});
  ts = n.check(15.1);
  REQUIRE(ts.size() == 3);
  for (const auto& t : ts)
    CHECK(t.to == NodeState::dead);
  // Two of four is not more than half.
  Membership k(5.0);
  for (const char* id : {"a", "b", "c", "d"})
    k.register_node(node(id), 0.0);
  for (const char* id : {"a", "b"})
    REQUIRE(k.heartbeat(id, 4.0).is_ok());
  ts = k.check(5.1);
  REQUIRE(ts.size() == 2);
  CHECK(ts[0].to == NodeState::dead);
  CHECK(ts[1].to == NodeState::dead);
}

TEST_CASE("judgement: after the controller's pause an UNREACHABLE node's wait starts again") {
  Membership m = three_nodes(LossJudgement{0.5, 2, 30.0});
  REQUIRE(m.check(15.1).size() == 3);  // the head too: every node silent
  CHECK(state(m, "head") == NodeState::unreachable);
  m.resumed(40.0, 10.0);  // stopped from 15.1 s to 40 s
  CHECK(m.check(40.0).empty());
  CHECK(m.check(70.0).empty());
  auto ts = m.check(70.1);
  CHECK(ts.size() == 3);
}
