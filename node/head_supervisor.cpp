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

caf::message_handler supervisor_handlers(Keeper& keeper, std::shared_ptr<Publisher> pub) {
  return {
      [&keeper](caf::get_atom) -> caf::result<ControllerActor> {
        if (!keeper.current())
          return to_caf_error(Status(errc::unavailable, "no controller is running"));
        return caf::actor_cast<ControllerActor>(keeper.current());
      },
      [&keeper, pub](publish_retry_atom, uint64_t round, int attempt) {
        publish_attempt(keeper.self(), pub, round, attempt);
      },
      [&keeper](shutdown_atom) -> caf::result<caf::ok_atom> {
        keeper.stop();
        if (keeper.current())
          keeper.self()->send_exit(keeper.current(), caf::exit_reason::user_shutdown);
        return caf::ok_atom::value;
      },
  };
}

}  // namespace

void publish_attempt(caf::event_based_actor* self, const std::shared_ptr<Publisher>& pub,
                     uint64_t round, int attempt) {
  auto what = pub->current ? pub->current() : caf::actor();
  if (round != pub->round || !what)
    return;  // a later round publishes what the port holds now
  auto mm = security::transport_actor(self->home_system());
  self->request(mm, std::chrono::seconds(10), caf::publish_atom::value, pub->port,
                caf::actor_cast<caf::strong_actor_ptr>(what), std::set<std::string>{}, pub->bind,
                true)
      .then(
          [pub, round](uint16_t port) {
            if (round == pub->round && pub->on_published)
              pub->on_published(port);
          },
          [self, pub, round, attempt](caf::error& err) {
            if (round != pub->round)
              return;
            if (attempt < 100) {
              self->delayed_send(self, std::chrono::milliseconds(20), publish_retry_atom::value,
                                 round, attempt + 1);
              return;
            }
            pub->log->critical("cannot publish the {} on port {}: {}", pub->what, pub->port,
                               self->home_system().render(err));
          });
}

KeeperOptions controller_keeper_options(const RestartPolicy& policy,
                                        std::function<void(const std::string&)> on_give_up,
                                        std::shared_ptr<spdlog::logger> log) {
  KeeperOptions k;
  k.what = "controller";
  k.policy = policy;
  k.on_give_up = std::move(on_give_up);
  k.log = std::move(log);
  k.unavailable = "no controller is running";
  return k;
}

void publish_again(caf::event_based_actor* self, const std::shared_ptr<Publisher>& pub) {
  ++pub->round;
  // A request: a port that is not open is answered with an error, which as
  // a plain message would end the actor. The middleman handles it before
  // the publish sent after it.
  self->request(security::transport_actor(self->home_system()), std::chrono::seconds(10),
                caf::close_atom::value, pub->port)
      .then([] {}, [](caf::error&) {});
  self->send(self, publish_retry_atom::value, pub->round, 0);
}

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
  pub->bind = options.bind;
  pub->port = options.port;
  pub->log = troupe::log::get("supervisor");
  auto k = controller_keeper_options(options.restart_policy, options.on_give_up, pub->log);
  k.start = [pub, options](Keeper& keeper) -> caf::actor {
    auto* self = keeper.self();
    auto controller =
        controller::spawn_controller(self->home_system(), options.controller, options.store);
    pub->on_published = [log = pub->log, bind = pub->bind, metrics = options.controller.metrics,
                         restarts = keeper.restarts()](uint16_t port) {
      log->warn("controller restarted (restart #{}) and published on {}:{}", restarts, bind, port);
      if (metrics)
        metrics->restarted();
    };
    // Free the port from the dead controller, then publish the new one.
    auto started = caf::actor_cast<caf::actor>(controller);
    pub->current = [started] { return started; };
    publish_again(self, pub);
    return started;
  };
  k.handlers = [pub](Keeper& keeper) { return supervisor_handlers(keeper, pub); };
  return caf::actor_cast<HeadSupervisorActor>(spawn_keeper(
      sys, std::move(k), "troupe.supervisor", caf::actor_cast<caf::actor>(controller)));
}

}  // namespace troupe
