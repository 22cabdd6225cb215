#include "node/head_supervisor.hpp"

#include <chrono>
#include <functional>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "controller/controller_metrics.hpp"
#include "runtime/keeper_actor.hpp"
#include "runtime/log.hpp"
#include "runtime/security/tls.hpp"
#include "runtime/wire.hpp"

namespace troupe {

namespace {

// Its own message: publish the restarted controller again (attempt).
using publish_retry_atom = caf::atom_constant<caf::atom("republish")>;

struct Publisher {
  SupervisorOptions options;
  std::shared_ptr<spdlog::logger> log = troupe::log::get("supervisor");
};

// Publishes the controller `keeper` just started on the head's port. The
// port closes asynchronously in the middleman: retried for a few seconds.
void publish(Keeper& keeper, const std::shared_ptr<Publisher>& pub, int attempt) {
  auto* self = keeper.self();
  auto controller = keeper.current();
  if (!controller)
    return;
  auto mm = security::transport_actor(self->home_system());
  auto restarts = keeper.restarts();
  self->request(mm, std::chrono::seconds(10), caf::publish_atom::value, pub->options.port,
                caf::actor_cast<caf::strong_actor_ptr>(controller), std::set<std::string>{},
                pub->options.bind, true)
      .then(
          [pub, restarts](uint16_t port) {
            pub->log->warn("controller restarted (restart #{}) and published on {}:{}",
                           restarts, pub->options.bind, port);
            if (pub->options.controller.metrics)
              pub->options.controller.metrics->restarted();
          },
          [self, pub, attempt](caf::error& err) {
            if (attempt < 100) {
              self->delayed_send(self, std::chrono::milliseconds(20), publish_retry_atom::value,
                                 attempt + 1);
              return;
            }
            pub->log->critical("cannot publish the restarted controller on port {}: {}",
                               pub->options.port, self->home_system().render(err));
          });
}

caf::message_handler supervisor_handlers(Keeper& keeper, std::shared_ptr<Publisher> pub) {
  return {
      [&keeper](caf::get_atom) -> caf::result<ControllerActor> {
        if (!keeper.current())
          return to_caf_error(Status(errc::unavailable, "no controller is running"));
        return caf::actor_cast<ControllerActor>(keeper.current());
      },
      [&keeper, pub](publish_retry_atom, int attempt) { publish(keeper, pub, attempt); },
      [&keeper](shutdown_atom) -> caf::result<caf::ok_atom> {
        keeper.stop();
        if (keeper.current())
          keeper.self()->send_exit(keeper.current(), caf::exit_reason::user_shutdown);
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
  // A controller that dies is started again over the same checkpoint and
  // published on the same port (the first one was published above).
  auto pub = std::make_shared<Publisher>();
  pub->options = options;
  KeeperOptions k;
  k.what = "controller";
  k.policy = options.restart_policy;
  k.on_give_up = options.on_give_up;
  k.log = pub->log;
  k.unavailable = "no controller is running";
  k.start = [pub](Keeper& keeper) -> caf::actor {
    auto* self = keeper.self();
    auto controller = controller::spawn_controller(self->home_system(), pub->options.controller,
                                                   pub->options.store);
    // Free the port from the dead controller, then publish the new one (the
    // middleman handles both in the order sent).
    self->send(security::transport_actor(self->home_system()), caf::close_atom::value,
               pub->options.port);
    self->send(self, publish_retry_atom::value, 0);
    return caf::actor_cast<caf::actor>(controller);
  };
  k.handlers = [pub](Keeper& keeper) { return supervisor_handlers(keeper, pub); };
  return caf::actor_cast<HeadSupervisorActor>(spawn_keeper(
      sys, std::move(k), "troupe.supervisor", caf::actor_cast<caf::actor>(controller)));
}

}  // namespace troupe
