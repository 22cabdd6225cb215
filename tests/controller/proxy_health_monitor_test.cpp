// Proxy health as plain code: every transition the controller's proxy checks
// make, driven with a fake clock.
#include "controller/shell/proxy_health.hpp"

#include <doctest/doctest.h>

#include "tests/controller/fakes.hpp"

using namespace troupe::controller;
using troupe::controller::testing::FakeClock;
using Keys = std::vector<ProxyHealthMonitor::Key>;

namespace {

struct Fixture {
  FakeClock clock;
  ProxyHealthMonitor proxies{clock, ProxyHealthOptions{2.0, 3}};

  // Starts the due checks and settles each with `ok`; returns the verdict of
  // proxy `key` (gone when it was not due).
  ProxyVerdict check(ProxyHealthMonitor::Key key, bool ok) {
    ProxyVerdict v = ProxyVerdict::gone;
    for (auto k : proxies.start_due_checks()) {
      auto out = proxies.settle(k, ok);
      if (k == key)
        v = out.verdict;
    }
    return v;
  }
};

}  // namespace

TEST_CASE("proxy health: a node without a proxy shows NONE") {
  Fixture f;
  CHECK(f.proxies.node_health("n1") == "NONE");
  CHECK_FALSE(f.proxies.proxy_of("n1").has_value());
}

TEST_CASE("proxy health: a new proxy is STARTING and checked at once") {
  Fixture f;
  f.proxies.track(1, "n1");
  CHECK(f.proxies.node_health("n1") == "STARTING");
  CHECK(f.proxies.start_due_checks() == Keys{1});
  // Not twice at once, however long the answer takes.
  f.clock.advance(100);
  CHECK(f.proxies.start_due_checks() == Keys{});
  CHECK(f.proxies.node_health("n1") == "STARTING");
}

TEST_CASE("proxy health: an answer makes it HEALTHY and the next check is due one period later") {
  Fixture f;
  f.proxies.track(1, "n1");
  REQUIRE(f.proxies.start_due_checks() == Keys{1});
  f.clock.advance(0.5);
  auto out = f.proxies.settle(1, true);
  CHECK(out.verdict == ProxyVerdict::healthy);
  CHECK(out.node_id == "n1");
  CHECK(f.proxies.node_health("n1") == "HEALTHY");
  f.clock.advance(1.99);
  CHECK(f.proxies.start_due_checks() == Keys{});
  f.clock.advance(0.01);
  CHECK(f.proxies.start_due_checks() == Keys{1});
}

TEST_CASE("proxy health: failures below the limit keep it HEALTHY and a success resets them") {
  Fixture f;
  f.proxies.track(1, "n1");
  CHECK(f.check(1, true) == ProxyVerdict::healthy);
  f.clock.advance(2);
  REQUIRE(f.proxies.start_due_checks() == Keys{1});
  auto out = f.proxies.settle(1, false);
  CHECK(out.verdict == ProxyVerdict::failed);
  CHECK(out.failures == 1);
  f.clock.advance(2);
  REQUIRE(f.proxies.start_due_checks() == Keys{1});
  CHECK(f.proxies.settle(1, false).failures == 2);
  CHECK(f.proxies.node_health("n1") == "HEALTHY");
  f.clock.advance(2);
  CHECK(f.check(1, true) == ProxyVerdict::healthy);
  // Counted from zero again: two more failures are still below three.
  for (uint32_t i = 1; i <= 2; ++i) {
    f.clock.advance(2);
    REQUIRE(f.proxies.start_due_checks() == Keys{1});
    CHECK(f.proxies.settle(1, false).failures == i);
  }
  CHECK(f.proxies.node_health("n1") == "HEALTHY");
}

TEST_CASE("proxy health: the limit in a row makes it UNHEALTHY once") {
  Fixture f;
  f.proxies.track(1, "n1");
  CHECK(f.check(1, false) == ProxyVerdict::failed);
  CHECK(f.proxies.node_health("n1") == "STARTING");  // never answered yet
  f.clock.advance(2);
  CHECK(f.check(1, false) == ProxyVerdict::failed);
  f.clock.advance(2);
  REQUIRE(f.proxies.start_due_checks() == Keys{1});
  auto out = f.proxies.settle(1, false);
  CHECK(out.verdict == ProxyVerdict::became_unhealthy);  // the shell kills it now
  CHECK(out.failures == 3);
  CHECK(f.proxies.node_health("n1") == "UNHEALTHY");
  CHECK(f.proxies.health(1) == ProxyHealth::unhealthy);
  // Still failing (the kill takes a while to show): no second kill.
  f.clock.advance(2);
  CHECK(f.check(1, false) == ProxyVerdict::still_unhealthy);
  CHECK(f.proxies.node_health("n1") == "UNHEALTHY");
}

TEST_CASE("proxy health: an UNHEALTHY proxy that answers again has recovered") {
  Fixture f;
  f.proxies.track(1, "n1");
  for (int i = 0; i < 3; ++i) {
    f.check(1, false);
    f.clock.advance(2);
  }
  REQUIRE(f.proxies.node_health("n1") == "UNHEALTHY");
  CHECK(f.check(1, true) == ProxyVerdict::recovered);
  CHECK(f.proxies.node_health("n1") == "HEALTHY");
  f.clock.advance(2);
  CHECK(f.check(1, false) == ProxyVerdict::failed);  // counted from zero again
}

TEST_CASE("proxy health: a proxy that goes down no longer counts - nor does its late answer") {
  Fixture f;
  f.proxies.track(1, "n1");
  REQUIRE(f.proxies.start_due_checks() == Keys{1});
  f.proxies.forget(1);
  CHECK(f.proxies.node_health("n1") == "NONE");
  CHECK(f.proxies.settle(1, true).verdict == ProxyVerdict::gone);
  CHECK(f.proxies.node_health("n1") == "NONE");
  CHECK(f.proxies.size() == 0);
}

TEST_CASE("proxy health: a fresh proxy of the node starts over") {
  Fixture f;
  f.proxies.track(1, "n1");
  for (int i = 0; i < 3; ++i) {
    f.check(1, false);
    f.clock.advance(2);
  }
  REQUIRE(f.proxies.node_health("n1") == "UNHEALTHY");
  // The fresh proxy subscribes before the old one's down notice arrives: the
  // node shows the older one until then.
  f.proxies.track(2, "n1");
  CHECK(f.proxies.node_health("n1") == "UNHEALTHY");
  CHECK(f.proxies.proxy_of("n1") == ProxyHealthMonitor::Key{1});
  f.proxies.forget(1);
  CHECK(f.proxies.node_health("n1") == "STARTING");
  CHECK(f.check(2, true) == ProxyVerdict::healthy);
  CHECK(f.proxies.node_health("n1") == "HEALTHY");
}

TEST_CASE("proxy health: subscribing again keeps the record and takes the node id") {
  Fixture f;
  f.proxies.track(1, "n1");
  f.check(1, false);
  f.proxies.track(1, "n2");
  CHECK(f.proxies.node_health("n1") == "NONE");
  CHECK(f.proxies.node_health("n2") == "STARTING");
  f.clock.advance(2);
  f.check(1, false);
  f.clock.advance(2);
  CHECK(f.check(1, false) == ProxyVerdict::became_unhealthy);  // failures kept
}

TEST_CASE("proxy health: proxies of different nodes are checked independently") {
  Fixture f;
  f.proxies.track(1, "n1");
  f.proxies.track(2, "n2");
  CHECK(f.proxies.start_due_checks() == Keys{1, 2});
  f.proxies.settle(1, true);
  f.clock.advance(1);
  f.proxies.settle(2, false);
  f.clock.advance(1);
  CHECK(f.proxies.start_due_checks() == Keys{1});
  f.clock.advance(1);
  CHECK(f.proxies.start_due_checks() == Keys{2});
  CHECK(f.proxies.node_health("n1") == "HEALTHY");
  CHECK(f.proxies.node_health("n2") == "STARTING");
}
