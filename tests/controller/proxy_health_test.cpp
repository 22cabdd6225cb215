// The controller health-checks every node's proxy: HEALTHY while it answers,
// UNHEALTHY and killed (its node then starts a fresh one) after repeated
// failures. A real controller actor in-process, fake node agent and proxies;
// every wait is bounded.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <caf/all.hpp>

#include "controller/controller_actor.hpp"
#include "runtime/status.hpp"
#include "runtime/system_setup.hpp"
#include "runtime/wire.hpp"
#include "tools/common/process.hpp"
#include "tests/controller/fakes.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

constexpr auto kDeadline = 10s;

// Answers health checks while `healthy` holds; takes route tables.
caf::behavior fake_proxy(caf::event_based_actor*, std::shared_ptr<std::atomic<bool>> healthy) {
  return {
      [=](health_atom) -> caf::result<caf::ok_atom> {
        if (healthy->load())
          return caf::ok_atom::value;
        return to_caf_error(Status(errc::unavailable, "io thread 0 has not run for 6.0 s"));
      },
      [](snapshot_atom, const RoutingSnapshot&) { return caf::ok_atom::value; },
  };
}

// A node agent that accepts whatever the controller sends it.
caf::behavior fake_agent(caf::event_based_actor* self) {
  self->set_default_handler(caf::drop);
  return {[](caf::ok_atom) {}};
}

struct Fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::actor controller;
  caf::actor agent;

  Fixture() {
    configure_actor_system(cfg, {});
    sys = std::make_unique<caf::actor_system>(cfg);
    controller::ControllerOptions o;
    o.tick_interval_s = 0.02;
    o.recovery_window_s = 0;
    o.proxy_health_period_s = 0.05;
    o.proxy_health_timeout_s = 0.5;
    o.proxy_unhealthy_after = 3;
    controller = caf::actor_cast<caf::actor>(
        controller::spawn_controller(*sys, o, std::make_shared<controller::testing::MemoryStore>()));
    agent = sys->spawn(fake_agent);
    NodeInfo info{"n1", "127.0.0.1", 8001, "cpu=1", 4242, kProtocolVersion};
    caf::scoped_actor self{*sys};
    bool registered = false;
    self->request(controller, caf::timespan(kDeadline), register_atom::value, info, agent,
                  std::vector<HostedReplicaInfo>{}, Credential{})
        .receive([&](uint64_t) { registered = true; },
                 [&](caf::error& err) { FAIL("register: " << sys->render(err)); });
    REQUIRE(registered);
  }
  ~Fixture() {
    caf::anon_send_exit(controller, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
  }

  void subscribe(const caf::actor& proxy) {
    caf::anon_send(controller, subscribe_atom::value, caf::actor_cast<ProxyActor>(proxy),
                   uint64_t{0}, uint64_t{0},
                   std::string("n1"));
  }

  // The proxy column of `troupectl nodes` for n1.
  std::string proxy_state() {
    caf::scoped_actor self{*sys};
    std::string out = "?";
    self->request(controller, caf::timespan(kDeadline), nodes_atom::value)
        .receive(
            [&](const std::vector<NodeStatus>& nodes) {
              for (const auto& n : nodes) {
                if (n.id == "n1")
                  out = n.proxy;
              }
            },
            [&](caf::error&) {});
    return out;
  }

  bool wait_proxy_state(const std::string& want) {
    return proc::wait_until([&] { return proxy_state() == want; },
                            std::chrono::duration_cast<std::chrono::milliseconds>(kDeadline), 10ms);
  }
};

}  // namespace

TEST_CASE("a node without a subscribed proxy shows NONE") {
  Fixture f;
  CHECK(f.proxy_state() == "NONE");
}

TEST_CASE("a proxy that answers its health checks is HEALTHY") {
  Fixture f;
  auto healthy = std::make_shared<std::atomic<bool>>(true);
  auto proxy = f.sys->spawn(fake_proxy, healthy);
  f.subscribe(proxy);
  CHECK(f.wait_proxy_state("HEALTHY"));
  caf::anon_send_exit(proxy, caf::exit_reason::user_shutdown);
}

TEST_CASE("a proxy that keeps failing its health checks is killed and replaced") {
  Fixture f;
  auto healthy = std::make_shared<std::atomic<bool>>(true);
  auto proxy = f.sys->spawn(fake_proxy, healthy);
  f.subscribe(proxy);
  REQUIRE(f.wait_proxy_state("HEALTHY"));

  caf::scoped_actor watcher{*f.sys};
  watcher->monitor(proxy);
  healthy->store(false);
  // After three failed checks the controller kills it.
  caf::error reason;
  bool down = false;
  watcher->receive(
      [&](caf::down_msg& dm) {
        down = true;
        reason = dm.reason;
      },
      caf::after(kDeadline) >> [] {});
  REQUIRE(down);
  CHECK(reason == caf::exit_reason::kill);
  CHECK(f.wait_proxy_state("NONE"));

  // The node's fresh proxy subscribes and is healthy.
  auto fresh = f.sys->spawn(fake_proxy, std::make_shared<std::atomic<bool>>(true));
  f.subscribe(fresh);
  CHECK(f.wait_proxy_state("HEALTHY"));
  caf::anon_send_exit(fresh, caf::exit_reason::user_shutdown);
}

TEST_CASE("a proxy that fails fewer checks in a row than the limit stays") {
  Fixture f;
  // One failed answer, then healthy ones: below the limit of three.
  std::atomic<int> failures_left{1};
  auto flaky = f.sys->spawn([&](caf::event_based_actor*) -> caf::behavior {
    return {
        [&](health_atom) -> caf::result<caf::ok_atom> {
          if (failures_left.fetch_sub(1) > 0)
            return to_caf_error(Status(errc::unavailable, "briefly stalled"));
          return caf::ok_atom::value;
        },
        [](snapshot_atom, const RoutingSnapshot&) { return caf::ok_atom::value; },
    };
  });
  f.subscribe(flaky);
  CHECK(f.wait_proxy_state("HEALTHY"));
  CHECK(failures_left.load() < 0);  // it was checked again after its failure
  // Not killed: it still answers.
  caf::scoped_actor self{*f.sys};
  bool alive = false;
  self->request(flaky, caf::timespan(kDeadline), health_atom::value)
      .receive([&](caf::ok_atom) { alive = true; }, [&](caf::error&) {});
  CHECK(alive);
  caf::anon_send_exit(flaky, caf::exit_reason::user_shutdown);
}
