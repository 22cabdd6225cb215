#include "runtime/node_agent.hpp"

#include <algorithm>
#include <chrono>
#include <optional>
#include <random>

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>

#include "runtime/log.hpp"

namespace troupe {

namespace {

caf::timespan seconds(double s) {
  return std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(s));
}

struct AgentState {
  caf::actor controller;
  bool registered = false;
  bool connecting = false;
  bool stopping = false;
  double backoff_s = 0;
  uint64_t incarnation = 0;
  // Answered once the node has deregistered, or the controller is gone.
  std::optional<caf::response_promise> shutdown_promise;
  std::minstd_rand rng{std::random_device{}()};
  std::shared_ptr<spdlog::logger> log = troupe::log::get("agent");
  static inline const char* name = "troupe.agent";
};

using agent_actor = caf::stateful_actor<AgentState>;

void schedule_reconnect(agent_actor* self, const AgentOptions& o) {
  auto& st = self->state;
  if (st.stopping)
    return;
  st.backoff_s =
      st.backoff_s == 0 ? o.initial_backoff_s : std::min(st.backoff_s * 2, o.max_backoff_s);
  // +-20 % jitter so that a restarted head is not hit by every node at once.
  std::uniform_real_distribution<double> jitter(0.8, 1.2);
  self->delayed_send(self, seconds(st.backoff_s * jitter(st.rng)), reconnect_atom::value);
}

void send_register(agent_actor* self, const AgentOptions& o) {
  auto& st = self->state;
  auto controller = st.controller;
  self->request(controller, seconds(o.request_timeout_s), register_atom::value, o.info,
                caf::actor_cast<caf::actor>(self))
      .then(
          [=](uint64_t incarnation) {
            auto& st = self->state;
            if (st.controller != controller)
              return;  // superseded by a reconnect
            if (!st.registered)
              st.log->info("registered with the controller as {}", o.info.id);
            st.registered = true;
            st.backoff_s = 0;
            st.incarnation = incarnation;
          },
          [=](caf::error& err) {
            auto& st = self->state;
            if (st.controller != controller)
              return;
            auto status = from_caf_error(err);
            st.log->error("registration as {} failed: {}", o.info.id, status.to_string());
            // Keep trying: the controller may be restarting or being upgraded.
            schedule_reconnect(self, o);
          });
}

void adopt_controller(agent_actor* self, const AgentOptions& o, caf::actor controller) {
  auto& st = self->state;
  st.controller = std::move(controller);
  st.registered = false;
  self->monitor(st.controller);
  send_register(self, o);
}

void connect(agent_actor* self, const AgentOptions& o) {
  auto& st = self->state;
  if (st.stopping || st.connecting)
    return;
  if (o.local_controller) {
    adopt_controller(self, o, o.local_controller);
    return;
  }
  st.connecting = true;
  auto mm = self->home_system().middleman().actor_handle();
  const auto& ep = o.controller_endpoint;
  self->request(mm, seconds(o.request_timeout_s), caf::connect_atom::value, ep.host, ep.port)
      .then(
          [=](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
            auto& st = self->state;
            st.connecting = false;
            if (!ptr) {
              st.log->warn("{} answers but publishes no controller; retrying",
                           o.controller_endpoint.to_string());
              schedule_reconnect(self, o);
              return;
            }
            st.log->info("connected to the controller at {}", o.controller_endpoint.to_string());
            adopt_controller(self, o, caf::actor_cast<caf::actor>(ptr));
          },
          [=](caf::error& err) {
            auto& st = self->state;
            st.connecting = false;
            st.log->warn("cannot reach the controller at {}: {}; retrying",
                         o.controller_endpoint.to_string(), self->home_system().render(err));
            schedule_reconnect(self, o);
          });
}

caf::behavior agent(agent_actor* self, AgentOptions o) {
  self->set_down_handler([=](const caf::down_msg& dm) {
    auto& st = self->state;
    if (!st.controller || dm.source != st.controller.address())
      return;
    if (st.stopping) {
      if (st.shutdown_promise)
        st.shutdown_promise->deliver(caf::ok_atom::value);
      st.shutdown_promise.reset();
      st.controller = nullptr;
      return;
    }
    st.log->warn("connection to the controller lost ({}); reconnecting",
                 self->home_system().render(dm.reason));
    st.controller = nullptr;
    st.registered = false;
    schedule_reconnect(self, o);
  });
  connect(self, o);
  self->delayed_send(self, seconds(o.heartbeat_interval_s), tick_atom::value);
  return {
      [=](reconnect_atom) { connect(self, o); },
      [=](tick_atom) {
        auto& st = self->state;
        if (st.stopping)
          return;
        self->delayed_send(self, seconds(o.heartbeat_interval_s), tick_atom::value);
        if (!st.registered || !st.controller)
          return;
        auto controller = st.controller;
        self->request(controller, seconds(o.request_timeout_s), heartbeat_atom::value, o.info.id)
            .then([](caf::ok_atom) {},
                  [=](caf::error& err) {
                    auto& st = self->state;
                    if (st.controller != controller || st.stopping)
                      return;
                    auto status = from_caf_error(err);
                    if (status.code() == errc::not_found) {
                      st.log->warn("controller does not know this node ({}); registering again",
                                   status.message());
                      st.registered = false;
                      send_register(self, o);
                    } else {
                      st.log->warn("heartbeat failed: {}", status.to_string());
                    }
                  });
      },
      [=](shutdown_atom) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        st.stopping = true;
        auto rp = self->make_response_promise<caf::ok_atom>();
        if (!st.registered || !st.controller) {
          rp.deliver(caf::ok_atom::value);
          return rp;
        }
        st.shutdown_promise = rp;
        auto finish = [=] {
          auto& st = self->state;
          if (st.shutdown_promise)
            st.shutdown_promise->deliver(caf::ok_atom::value);
          st.shutdown_promise.reset();
        };
        self->request(st.controller, seconds(o.request_timeout_s), deregister_atom::value,
                      o.info.id)
            .then(
                [=](caf::ok_atom) {
                  self->state.log->info("deregistered from the controller");
                  finish();
                },
                [=](caf::error& err) {
                  self->state.log->warn("deregistration failed: {}",
                                        from_caf_error(err).to_string());
                  finish();
                });
        return rp;
      },
  };
}

}  // namespace

caf::actor spawn_node_agent(caf::actor_system& sys, const AgentOptions& options) {
  return sys.spawn(agent, options);
}

}  // namespace troupe
