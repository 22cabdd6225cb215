#include "node/head_supervisor.hpp"

#include <chrono>
#include <functional>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "runtime/log.hpp"
#include "runtime/security/tls.hpp"
#include "runtime/wire.hpp"

namespace troupe {

namespace {

// Its own messages: publish the restarted controller again (attempt); the
// restart policy's delay passed, start the controller that died.
using publish_retry_atom = caf::atom_constant<caf::atom("republish")>;
using SupervisorImpl = HeadSupervisorActor::extend<caf::reacts_to<restart_atom>,
                                                   caf::reacts_to<publish_retry_atom, int>>;

struct SupervisorState {
  SupervisorOptions options;
  ControllerActor controller;  // empty while none runs
  bool stopping = false;
  int restarts = 0;
  RestartLimiter limiter;
  std::shared_ptr<std::function<void(int)>> publish;
  std::shared_ptr<spdlog::logger> log = troupe::log::get("supervisor");
  static inline const char* name = "troupe.supervisor";
};

using supervisor_actor = SupervisorImpl::stateful_base<SupervisorState>;

// Starts a controller in place of the one that died, and publishes it.
void restart_controller(supervisor_actor* self) {
  auto& st = self->state;
  st.controller = caf::actor_cast<ControllerActor>(
      controller::spawn_controller(self->home_system(), st.options.controller, st.options.store));
  self->monitor(st.controller);
  auto mm = security::transport_actor(self->home_system());
  // The port closes asynchronously in the middleman: retry the publish for
  // a few seconds.
  auto publish = std::make_shared<std::function<void(int)>>();
  *publish = [=](int attempt) {
    auto& st = self->state;
    self->request(mm, std::chrono::seconds(10), caf::publish_atom::value, st.options.port,
                  caf::actor_cast<caf::strong_actor_ptr>(st.controller), std::set<std::string>{},
                  st.options.bind, true)
        .then(
            [=](uint16_t port) {
              self->state.log->warn("controller restarted (restart #{}) and published on {}:{}",
                                    self->state.restarts, self->state.options.bind, port);
            },
            [=](caf::error& err) {
              if (attempt < 100) {
                self->delayed_send(self, std::chrono::milliseconds(20), publish_retry_atom::value,
                                   attempt + 1);
                return;
              }
              self->state.log->critical("cannot publish the restarted controller on port {}: {}",
                                        self->state.options.port, self->home_system().render(err));
            });
  };
  self->state.publish = publish;
  // Free the port from the dead controller, then publish the new one (the
  // middleman handles both in the order sent).
  self->send(mm, caf::close_atom::value, st.options.port);
  (*publish)(0);
}

SupervisorImpl::behavior_type supervisor(supervisor_actor* self, SupervisorOptions options,
                                         ControllerActor first_controller) {
  auto& st = self->state;
  st.options = std::move(options);
  st.limiter = RestartLimiter(st.options.restart_policy);
  st.controller = first_controller;
  self->monitor(first_controller);
  self->set_down_handler([=](const caf::down_msg& dm) {
    auto& st = self->state;
    if (!st.controller || dm.source != st.controller.address())
      return;
    if (st.stopping || dm.reason == caf::exit_reason::user_shutdown) {
      st.log->info("controller stopped");
      st.controller = nullptr;
      return;
    }
    auto reason = self->home_system().render(dm.reason);
    st.controller = nullptr;
    auto decision = st.limiter.on_death(std::chrono::steady_clock::now());
    if (decision.give_up) {
      auto message = st.limiter.give_up_message("controller", reason);
      st.log->critical("{}", message);
      if (st.options.on_give_up)
        st.options.on_give_up(message);
      self->quit(to_caf_error(Status(errc::unavailable, message)));
      return;
    }
    ++st.restarts;
    st.log->error("controller died ({}); starting a new one over the checkpoint", reason);
    if (decision.delay > RestartLimiter::duration::zero()) {
      self->delayed_send(self, std::chrono::duration_cast<caf::timespan>(decision.delay),
                         restart_atom::value);
      return;
    }
    restart_controller(self);
  });
  return {
      [=](caf::get_atom) -> caf::result<ControllerActor> {
        auto& st = self->state;
        if (!st.controller) {
          return to_caf_error(Status(errc::unavailable, "no controller is running"));
        }
        return st.controller;
      },
      [=](restart_atom) {
        if (!self->state.stopping && !self->state.controller)
          restart_controller(self);
      },
      [=](publish_retry_atom, int attempt) {
        if (self->state.publish)
          (*self->state.publish)(attempt);
      },
      [=](shutdown_atom) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        st.stopping = true;
        if (st.controller)
          self->send_exit(st.controller, caf::exit_reason::user_shutdown);
        return caf::ok_atom::value;
      },
  };
}

}  // namespace

Result<HeadSupervisorActor> start_head_supervisor(caf::actor_system& sys,
                                                 const SupervisorOptions& options) {
  auto controller = caf::actor_cast<ControllerActor>(
      controller::spawn_controller(sys, options.controller, options.store));
  // Over TLS when the system runs CAF's OpenSSL module.
  auto port = security::publish(caf::actor_cast<caf::actor>(controller), options.port,
                                options.bind.c_str(), true);
  if (!port) {
    caf::anon_send_exit(controller, caf::exit_reason::kill);
    return Status(errc::unavailable, "cannot listen on " + options.bind + ":" +
                                         std::to_string(options.port) + ": " +
                                         sys.render(port.error()));
  }
  return HeadSupervisorActor{sys.spawn(supervisor, options, controller)};
}

}  // namespace troupe
