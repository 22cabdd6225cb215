// A replica's handle (replica::spawn_replica: an actor pool around the
// replica actor) ends with the replica actor's own exit reason, so that
// whoever watches the handle tells a requested stop from a fault: a proxy
// does not count a request lost with a stopped replica as a crash of that
// request (proxy/call.cpp, on_error and replica_down).
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "replica/plugin/plugin_loader.hpp"
#include "replica/replica_actor.hpp"
#include "runtime/system_setup.hpp"

using namespace troupe;

namespace {

// The reason of the next down message `self` receives (at most 30 s).
caf::error next_down(caf::scoped_actor& self) {
  caf::error reason = caf::make_error(caf::sec::request_timeout);
  self->receive([&](const caf::down_msg& dm) { reason = dm.reason; },
                caf::after(std::chrono::seconds(30)) >> [] { FAIL("no down message"); });
  return reason;
}

struct Fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;

  Fixture() {
    configure_actor_system(cfg, TransportOptions{});
    sys = std::make_unique<caf::actor_system>(cfg);
  }

  // An initialized in-process replica of the example Echo.
  ReplicaActor start(const std::string& id) {
    replica::ReplicaOptions o;
    o.spec.replica_id = id;
    o.spec.app = "echo";
    o.spec.deployment = "Echo";
    o.spec.import_path = "libtroupe_examples.so:Echo";
    o.spec.init_args = "{}";
    o.spec.isolation = "in_process";
    o.spec.max_ongoing_requests = 2;
    o.node_id = "n1";
    o.loader = std::make_shared<PluginLoader>(std::vector<std::string>{TROUPE_TEST_PLUGIN_DIR});
    auto handle = replica::spawn_replica(*sys, std::move(o));
    caf::scoped_actor self{*sys};
    bool ready = false;
    self->request(handle, std::chrono::seconds(30), initialize_atom::value)
        .receive([&](const ReplicaMetadata& m) { ready = m.replica_id == id; },
                 [&](const caf::error& err) { FAIL("init failed: " << sys->render(err)); });
    REQUIRE(ready);
    return handle;
  }

  // The replica actor inside the handle.
  caf::actor inner_of(const ReplicaActor& handle) {
    caf::scoped_actor self{*sys};
    caf::actor inner;
    self->request(caf::actor_cast<caf::actor>(handle), std::chrono::seconds(10),
                  caf::sys_atom::value, caf::get_atom::value)
        .receive(
            [&](std::vector<caf::actor>& workers) {
              if (!workers.empty())
                inner = workers.front();
            },
            [&](const caf::error& err) { FAIL(sys->render(err)); });
    REQUIRE(inner);
    return inner;
  }
};

TEST_CASE("replica handle: a requested stop ends the handle with user_shutdown") {
  Fixture f;
  auto handle = f.start("echo#Echo#1");
  caf::scoped_actor self{*f.sys};
  self->monitor(handle);
  bool stopped = false;
  self->request(handle, std::chrono::seconds(30), stop_atom::value, 5.0)
      .receive([&](caf::ok_atom) { stopped = true; },
               [&](const caf::error& err) { FAIL("stop failed: " << f.sys->render(err)); });
  CHECK(stopped);
  CHECK(next_down(self) == caf::exit_reason::user_shutdown);
  // What a proxy reads when a request to the ended handle bounces.
  auto* actor = caf::actor_cast<caf::abstract_actor*>(handle);
  CHECK(static_cast<caf::monitorable_actor*>(actor)->fail_state() ==
        caf::exit_reason::user_shutdown);
}

TEST_CASE("replica handle: a replica actor that ends by itself ends the handle with its reason") {
  Fixture f;
  auto handle = f.start("echo#Echo#2");
  auto inner = f.inner_of(handle);
  caf::scoped_actor self{*f.sys};
  self->monitor(handle);
  // Not through the handle: the replica actor alone is told to end, as a
  // fault would end it. The handle does not end with the pool's own
  // out_of_workers.
  caf::anon_send_exit(inner, caf::exit_reason::unhandled_exception);
  auto reason = next_down(self);
  CHECK(reason == caf::exit_reason::unhandled_exception);
  CHECK(reason != caf::exit_reason::out_of_workers);
}

TEST_CASE("replica handle: an exit sent to the handle ends it and the replica with that reason") {
  Fixture f;
  auto handle = f.start("echo#Echo#3");
  auto inner = f.inner_of(handle);
  caf::scoped_actor self{*f.sys};
  self->monitor(handle);
  self->monitor(inner);
  caf::anon_send_exit(handle, caf::exit_reason::kill);
  CHECK(next_down(self) == caf::exit_reason::kill);
  CHECK(next_down(self) == caf::exit_reason::kill);
}

}  // namespace
