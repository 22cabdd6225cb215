// node/health_checks.hpp: the health checks a node's agent runs for its
// replicas, with the time passed in and the period's jitter injected: the
// timings the controller kept before (Ray Serve's), checked exactly.
#include <doctest/doctest.h>

#include <optional>
#include <utility>
#include <vector>

#include "node/health_checks.hpp"

using troupe::node::HealthChecks;
using CheckSettings = HealthChecks::Settings;

namespace {

// The jitter: each draw answers lo + fraction × (hi - lo) and is recorded.
struct Jitter {
  double fraction = 0.5;
  std::vector<std::pair<double, double>> calls;
};

HealthChecks make(Jitter& j) {
  return HealthChecks([&j](double lo, double hi) {
    j.calls.emplace_back(lo, hi);
    return lo + j.fraction * (hi - lo);
  });
}

// The seeds' settings: period 10 s, timeout 30 s, threshold 3, jitter 10 %.
CheckSettings seeds() {
  CheckSettings s;
  s.period_s = 10;
  s.timeout_s = 30;
  s.threshold = 3;
  s.jitter = 0.1;
  return s;
}

std::vector<std::string> ids(const std::vector<HealthChecks::Check>& checks) {
  std::vector<std::string> out;
  for (const auto& c : checks)
    out.push_back(c.replica_id);
  return out;
}

}  // namespace

TEST_CASE("health checks: the first check at once - the next period x U(0.9 - 1.1) after it") {
  Jitter j;
  auto hc = make(j);
  hc.watch("r1", 1, seeds(), 100.0);
  CHECK(hc.next_event() == 100.0);
  auto first = hc.due(100.0);
  REQUIRE(ids(first) == std::vector<std::string>{"r1"});
  REQUIRE(j.calls.size() == 1);
  CHECK(j.calls[0] == std::make_pair(0.9, 1.1));
  // Outstanding: nothing more is due until its answer, whatever the time.
  CHECK(hc.due(100.0).empty());
  CHECK(hc.next_event() == 130.0);  // its timeout
  hc.result("r1", first[0].seq, true, "");
  // 10 s x 1.0 (the middle of the jitter) after the check was sent.
  CHECK(hc.next_event() == doctest::Approx(110.0));
  CHECK(hc.due(109.99).empty());
  CHECK(ids(hc.due(110.0)) == std::vector<std::string>{"r1"});
  // The ends of the jitter: 9 s and 11 s.
  Jitter low{0.0, {}}, high{1.0, {}};
  auto a = make(low), b = make(high);
  a.watch("r", 1, seeds(), 0.0);
  b.watch("r", 1, seeds(), 0.0);
  a.result("r", a.due(0.0).at(0).seq, true, "");
  b.result("r", b.due(0.0).at(0).seq, true, "");
  CHECK(a.next_event() == doctest::Approx(9.0));
  CHECK(b.next_event() == doctest::Approx(11.0));
  CHECK(a.due(8.99).empty());
  CHECK(a.due(9.0).size() == 1);
  CHECK(b.due(10.99).empty());
  CHECK(b.due(11.0).size() == 1);
}

TEST_CASE(
    "health checks: an answer not within the timeout is a failure - its late answer counts for "
    "nothing") {
  Jitter j;
  auto hc = make(j);
  auto s = seeds();
  s.timeout_s = 5;
  hc.watch("r1", 1, s, 0.0);
  hc.take_changes();
  auto c = hc.due(0.0).at(0);
  hc.expire(4.99);
  CHECK(hc.take_changes().empty());
  hc.expire(5.0);
  auto changes = hc.take_changes();
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].failures == 1);
  CHECK(changes[0].failure == "no answer within health_check_timeout_s");
  // The answer to the expired check arrives now, ok: it is not taken for
  // the next one.
  hc.result("r1", c.seq, true, "");
  CHECK(hc.take_changes().empty());
  auto next = hc.due(10.0).at(0);
  CHECK(next.seq == c.seq + 1);
  hc.result("r1", c.seq, true, "");  // still the old one
  hc.expire(15.0);
  changes = hc.take_changes();
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].failures == 2);
}

TEST_CASE(
    "health checks: failures in a row with the last one's words - a pass clears them - passes "
    "count up to the threshold") {
  Jitter j;
  auto hc = make(j);
  hc.watch("r1", 7, seeds(), 0.0);
  auto watched = hc.take_changes();
  REQUIRE(watched.size() == 1);  // a new watch reports its zeros
  CHECK(watched[0].watch == 7);
  CHECK(watched[0].passed == 0);
  double t = 0;
  auto answer = [&](bool ok, const std::string& why) {
    auto c = hc.due(t);
    REQUIRE(c.size() == 1);
    hc.result("r1", c[0].seq, ok, why);
    t += 10;
  };
  answer(false, "db down");
  auto r = hc.take_changes();
  REQUIRE(r.size() == 1);
  CHECK(r[0].failures == 1);
  CHECK(r[0].failure == "db down");
  CHECK(r[0].passed == 0);
  answer(false, "db still down");
  r = hc.take_changes();
  REQUIRE(r.size() == 1);
  CHECK(r[0].failures == 2);
  CHECK(r[0].failure == "db still down");
  answer(true, "");
  r = hc.take_changes();
  REQUIRE(r.size() == 1);
  CHECK(r[0].failures == 0);
  CHECK(r[0].failure.empty());
  CHECK(r[0].passed == 1);
  answer(true, "");
  answer(true, "");
  r = hc.take_changes();
  REQUIRE(r.size() == 1);
  CHECK(r[0].passed == 3);
  // Proven: more passes change nothing, so nothing is sent.
  answer(true, "");
  answer(true, "");
  CHECK(hc.take_changes().empty());
  // Three failures in a row: each is a change, the third the one the
  // controller acts on (threshold 3).
  answer(false, "a");
  answer(false, "b");
  answer(false, "c");
  r = hc.take_changes();
  REQUIRE(r.size() == 1);
  CHECK(r[0].failures == 3);
  CHECK(r[0].failure == "c");
  CHECK(r[0].passed == 3);
}

TEST_CASE(
    "health checks: a new watch starts afresh - the same watch takes new settings from the next "
    "check") {
  Jitter j;
  auto hc = make(j);
  hc.watch("r1", 1, seeds(), 0.0);
  auto c = hc.due(0.0).at(0);
  hc.result("r1", c.seq, false, "bad");
  hc.take_changes();
  // The controller watches it again (it ran again after a reconfigure, or a
  // new controller adopted it): nothing counted, the first check at once.
  hc.watch("r1", 2, seeds(), 3.0);
  auto r = hc.take_changes();
  REQUIRE(r.size() == 1);
  CHECK(r[0].watch == 2);
  CHECK(r[0].failures == 0);
  CHECK(r[0].failure.empty());
  auto c2 = hc.due(3.0).at(0);
  CHECK(c2.seq > c.seq);
  // An answer to a check of the earlier watch counts for nothing.
  auto s = seeds();
  s.period_s = 2;
  s.timeout_s = 1;
  hc.watch("r1", 2, s, 3.5);  // same watch: settings only
  CHECK(hc.take_changes().empty());
  // The outstanding check keeps its timeout (30 s) and the next its time
  // (3 + 10); the new period applies from the check after.
  CHECK(hc.next_event() == doctest::Approx(33.0));
  hc.result("r1", c2.seq, true, "");
  CHECK(hc.next_event() == doctest::Approx(13.0));
  auto c3 = hc.due(13.0).at(0);
  CHECK(hc.next_event() == doctest::Approx(14.0));  // the new timeout, 1 s
  hc.result("r1", c3.seq, true, "");
  CHECK(hc.next_event() == doctest::Approx(15.0));  // the new period, 2 s
}

TEST_CASE("health checks: several replicas - only the changed ones reported - forget - clear") {
  Jitter j;
  auto hc = make(j);
  for (const char* id : {"r1", "r2", "r3"})
    hc.watch(id, 1, seeds(), 0.0);
  CHECK(hc.watched() == 3);
  CHECK(hc.take_changes().size() == 3);
  auto checks = hc.due(0.0);
  REQUIRE(checks.size() == 3);
  for (const auto& c : checks)
    hc.result(c.replica_id, c.seq, c.replica_id != "r2", "r2 is sick");
  auto r = hc.take_changes();
  REQUIRE(r.size() == 3);  // r1 and r3 passed their first, r2 failed
  CHECK(r[1].replica_id == "r2");
  CHECK(r[1].failures == 1);
  CHECK(r[0].passed == 1);
  CHECK(r[1].failure == "r2 is sick");
  CHECK(r[2].passed == 1);
  hc.forget("r2");
  CHECK(hc.watched() == 2);
  // Its answer, had one been outstanding, finds nothing.
  hc.result("r2", 99, false, "gone");
  CHECK(hc.take_changes().empty());
  hc.forget("r1");
  CHECK(hc.watched() == 1);
  // A registration starts over: nothing watched, nothing due.
  hc.clear();
  CHECK(hc.watched() == 0);
  CHECK_FALSE(hc.next_event().has_value());
  CHECK(hc.due(100.0).empty());
}

TEST_CASE("health checks: one timer is armed only for an earlier event") {
  Jitter j;
  auto hc = make(j);
  std::optional<double> armed;
  CHECK_FALSE(hc.arm(armed));  // nothing watched
  CHECK_FALSE(armed);
  hc.watch("r1", 1, seeds(), 100.0);
  CHECK(hc.arm(armed) == 100.0);  // the first check, at once
  CHECK(armed == 100.0);
  CHECK_FALSE(hc.arm(armed));  // armed for it already
  armed = 120.0;               // armed later than what is due now
  CHECK(hc.arm(armed) == 100.0);
  CHECK(armed == 100.0);
}
