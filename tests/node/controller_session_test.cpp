// The node agent's session with the controller (node/controller_session.hpp),
// driven event by event: no actor, no time.
#include "node/controller_session.hpp"

#include <doctest/doctest.h>

using troupe::node::ControllerSession;
using Registered = ControllerSession::Registered;
using HeartbeatFailure = ControllerSession::HeartbeatFailure;

namespace {

ControllerSession session(double jitter = 1.0) {
  ControllerSession::Options o;
  o.initial_backoff_s = 0.1;
  o.max_backoff_s = 1.0;
  return ControllerSession(o, [jitter] { return jitter; });
}

}  // namespace

TEST_CASE("controller session: connect - register - heartbeat") {
  auto s = session();
  CHECK(s.should_connect());
  s.connect_started();
  CHECK_FALSE(s.should_connect());  // one attempt at a time
  auto link = s.connected();
  CHECK_FALSE(s.should_connect());
  CHECK_FALSE(s.heartbeat_due());  // not registered yet
  CHECK(s.registered(link, 7) == Registered::first);
  CHECK(s.incarnation() == 7);
  CHECK(s.heartbeat_due());
  CHECK(s.is_registered());
}

TEST_CASE("controller session: failed attempts back off 0.1 - 0.2 - 0.4 ... up to 1 s - with the jitter") {
  auto s = session(1.2);
  std::vector<double> delays;
  for (int i = 0; i < 6; ++i) {
    s.connect_started();
    auto d = s.connect_failed();
    REQUIRE(d);
    delays.push_back(*d);
    CHECK(s.should_connect());
  }
  std::vector<double> expected{0.12, 0.24, 0.48, 0.96, 1.2, 1.2};
  REQUIRE(delays.size() == expected.size());
  for (size_t i = 0; i < delays.size(); ++i)
    CHECK(delays[i] == doctest::Approx(expected[i]));
}

TEST_CASE("controller session: a registration resets the backoff") {
  auto s = session();
  s.connect_started();
  s.connect_failed();
  s.connect_started();
  s.connect_failed();
  CHECK(s.backoff_s() == doctest::Approx(0.2));
  auto link = s.connected();
  s.registered(link, 1);
  CHECK(s.backoff_s() == 0);
  auto d = s.lost();
  REQUIRE(d);
  CHECK(*d == doctest::Approx(0.1));  // from the start again
}

TEST_CASE("controller session: the answer of an older link is stale and changes nothing") {
  auto s = session();
  auto old_link = s.connected();
  s.lost();
  auto link = s.connected();
  CHECK(s.registered(old_link, 5) == Registered::stale);
  CHECK_FALSE(s.heartbeat_due());
  CHECK_FALSE(s.register_failed(old_link).has_value());
  CHECK(s.heartbeat_failed(old_link, true) == HeartbeatFailure::ignore);
  CHECK(s.registered(link, 6) == Registered::first);
  CHECK(s.incarnation() == 6);
}

TEST_CASE("controller session: the controller lost - no heartbeats - and a new attempt after the backoff") {
  auto s = session();
  auto link = s.connected();
  s.registered(link, 1);
  auto d = s.lost();
  REQUIRE(d);
  CHECK_FALSE(s.heartbeat_due());
  CHECK(s.should_connect());
  CHECK(s.registered(link, 1) == Registered::stale);  // its late answer
}

TEST_CASE("controller session: a failed registration is tried again through a new attempt") {
  auto s = session();
  auto link = s.connected();
  auto d = s.register_failed(link);
  REQUIRE(d);
  CHECK(*d == doctest::Approx(0.1));
  CHECK(s.should_connect());  // the retry reaches the controller again
  auto again = s.connected();
  CHECK(again != link);
  CHECK(s.registered(again, 2) == Registered::first);
}

TEST_CASE("controller session: a follower's refusal is followed by the next head after the initial backoff") {
  auto s = session();
  // A dead leader first: the backoff grows while it cannot be reached.
  s.connect_started();
  CHECK(*s.connect_failed() == doctest::Approx(0.1));
  s.connect_started();
  CHECK(*s.connect_failed() == doctest::Approx(0.2));
  s.connect_started();
  CHECK(*s.connect_failed() == doctest::Approx(0.4));
  // A follower answers: the next head is asked soon, not 0.8 s later.
  auto link = s.connected();
  auto d = s.register_refused_by_follower(link);
  REQUIRE(d);
  CHECK(*d == doctest::Approx(0.1));
  CHECK(s.should_connect());
  // A stale refusal changes nothing.
  CHECK_FALSE(s.register_refused_by_follower(link).has_value());
  s.stop();
  auto again = s.connected();
  CHECK_FALSE(s.register_refused_by_follower(again).has_value());
}

TEST_CASE("controller session: a heartbeat the controller does not know registers again - other failures are reported") {
  auto s = session();
  auto link = s.connected();
  s.registered(link, 1);
  CHECK(s.heartbeat_failed(link, false) == HeartbeatFailure::report);
  CHECK(s.heartbeat_due());
  CHECK(s.heartbeat_failed(link, true) == HeartbeatFailure::reregister);
  CHECK_FALSE(s.heartbeat_due());
  CHECK(s.registered(link, 2) == Registered::first);
}

TEST_CASE("controller session: stopping - no new attempts - and once deregistered no heartbeats") {
  auto s = session();
  auto link = s.connected();
  s.registered(link, 1);
  s.stop();
  CHECK(s.heartbeat_due());  // it heartbeats until it has deregistered
  CHECK(s.heartbeat_failed(link, true) == HeartbeatFailure::ignore);
  s.deregistered();
  CHECK_FALSE(s.heartbeat_due());
  CHECK_FALSE(s.lost().has_value());
  CHECK_FALSE(s.should_connect());
  CHECK_FALSE(s.connect_failed().has_value());
}
