// The proxy actor (snapshots from the controller, replica monitoring, health,
// handle calls from other processes) and the keeper that restarts it; see
// proxy.hpp for their interface.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>

#include <caf/all.hpp>

#include "proxy/core.hpp"
#include "proxy/handle_calls.hpp"
#include "runtime/keeper_actor.hpp"

namespace troupe::proxy {

namespace {

constexpr auto kReportInterval = std::chrono::seconds(1);
// An io thread whose once-a-second sweep has not run for this long is
// reported by the health check.
constexpr double kIoStallLimit = 5.0;

// The declared keep-alive timeout of a snapshot (0: none, the node's
// --proxy-idle-timeout) becomes the server's idle timeout between requests.
// The server outlives the proxy actor (stop() waits for the actor first).
void apply_keep_alive(Proxy::Core& core, double declared_s) {
  double s = declared_s > 0 ? declared_s : core.options.server.idle_timeout_s;
  if (!core.server || core.server->idle_timeout_s() == s)
    return;
  core.server->set_idle_timeout(s);
  core.log->info("keep-alive idle timeout {} s{}", s,
                 declared_s > 0 ? " (http_options)" : " (this node's default)");
}

}  // namespace

// The proxy actor: applies snapshots, monitors replicas, answers health.
ProxyImpl::behavior_type proxy_actor(ProxyImpl::pointer self, core_ptr core) {
  // The controller this actor monitors: its handle going down with the
  // connection means this node lost its route to every other node.
  auto watched = std::make_shared<caf::actor_addr>();
  auto watch = [self, watched](const ControllerActor& controller) {
    if (!controller || controller.address() == *watched)
      return;
    *watched = controller.address();
    self->monitor(controller);
  };
  self->set_down_handler([self, core, watched](caf::down_msg& dm) {
    bool link_lost = dm.reason == caf::exit_reason::remote_link_unreachable;
    if (dm.source == *watched) {
      *watched = caf::actor_addr();
      if (link_lost)
        core->hub_lost(core->direct_nodes());
      return;
    }
    if (peer_down(self, core, dm.source))
      return;
    core->replica_down(dm.source, dm.reason);
  });
  // A restarted proxy: watch the replicas it already knows, and ask the last
  // controller for what changed since the snapshot it holds.
  for (const auto& h : core->router.handles())
    self->monitor(h);
  watch_peers(self, core);
  ControllerActor controller;
  {
    std::lock_guard<std::mutex> lock(core->actor_mutex);
    controller = core->controller;
  }
  if (controller) {
    watch(controller);
    self->send(controller, subscribe_atom::value, caf::actor_cast<ProxyActor>(self),
               core->router.epoch(), core->router.seq(), core->options.node_id);
  }
  self->delayed_send(self, kReportInterval, tick_atom::value);
  return {
      [=](snapshot_atom, RoutingSnapshot& snap) -> caf::ok_atom {
        // CAF deserializes the handle of an actor of this node that is
        // already gone as an empty one: a replica here that died while the
        // snapshot naming it was on its way. It is not routable; the next
        // snapshot that names it with a handle brings it back.
        for (auto& d : snap.deployments) {
          d.replicas.erase(std::remove_if(d.replicas.begin(), d.replicas.end(),
                                          [](const ReplicaEndpoint& ep) { return !ep.handle; }),
                           d.replicas.end());
        }
        // Only the controller pushes snapshots.
        if (auto sender = caf::actor_cast<ControllerActor>(self->current_sender())) {
          watch(sender);
          std::lock_guard<std::mutex> lock(core->actor_mutex);
          core->controller = sender;
        }
        bool first = !core->router.has_routes();
        auto applied = core->router.apply(snap);
        bool draining = std::find(snap.draining_nodes.begin(), snap.draining_nodes.end(),
                                  core->options.node_id) != snap.draining_nodes.end();
        if (draining != core->draining.exchange(draining)) {
          core->log->info("node {} is {}", core->options.node_id,
                          draining ? "draining: not ready (/-/readyz 503)" : "no longer draining");
        }
        core->snapshot_timeout_s.store(snap.request_timeout_s, std::memory_order_relaxed);
        apply_keep_alive(*core, snap.keep_alive_timeout_s);
        for (const auto& h : applied.added)
          self->monitor(h);
        core->run(applied.ready);
        core->replicas_lost(applied.lost);
        peers_from_snapshot(self, core, snap);
        auto level = first || snap.full ? spdlog::level::info : spdlog::level::debug;
        core->log->log(level, "route table {}.{} ({}; {} routes, {} deployments changed)",
                       snap.epoch, snap.seq, snap.full ? "full" : "delta",
                       core->router.routes()->routes().size(), snap.deployments.size());
        // Applied: the controller sends the next one.
        return caf::ok_atom::value;
      },
      [=](reconnect_atom, const std::string& node_id) { peer_retry(self, core, node_id); },
      // Healthy while every io thread runs its sweep (at least once a
      // second): a stalled event loop serves nobody.
      [=](health_atom) -> caf::result<caf::ok_atom> {
        auto now =
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
                .count();
        for (const auto& w : core->workers) {
          int64_t last = w->last_sweep_ns.load(std::memory_order_relaxed);
          double stalled_s = (now - last) / 1e9;
          if (last != 0 && stalled_s > kIoStallLimit) {
            return to_caf_error(Status(
                errc::unavailable, "io thread " + std::to_string(w->index) + " has not run for " +
                                       fmt::format("{:.1f}", stalled_s) + " s"));
          }
        }
        return caf::ok_atom::value;
      },
      [=](tick_atom) {
        // Every deployment's queued + in-flight requests as this proxy sees
        // them (the controller averages each reporter's samples).
        for (const auto& d : core->router.deployments()) {
          double load = static_cast<double>(d.queued);
          for (const auto& r : d.replicas)
            load += r.in_flight;
          core->report_load(d.app, d.deployment, load);
        }
        self->delayed_send(self, kReportInterval, tick_atom::value);
      },
      // A deployment handle's call from another process (a replica process:
      // replica/handle_transport.hpp, make_remote_proxy_call), usually
      // delegated by the keeper: Core::call, exactly as Proxy::caller(). Its
      // bounds are Core::call's (the call's timeout, retries, 503 when the
      // proxy stops: `done` always runs once); the caller's request carries a
      // timeout of its own. The answer is sent from the io thread that gets
      // it, see ReplyTo.
      [=](call_atom, std::string& app, std::string& deployment, HttpRequest& request,
          double timeout_s) -> caf::result<HttpResponse> {
        auto reply = std::make_shared<ReplyTo>(*self->current_mailbox_element());
        core->call(app, deployment, std::move(request), timeout_s,
                   [reply](HttpResponse answer) { reply->send(std::move(answer)); });
        return caf::delegated<HttpResponse>{};
      },
      // The same, its answer relayed as the callee streams it
      // (make_remote_proxy_stream; handle_calls.hpp: relay_call).
      [=](call_atom, std::string& app, std::string& deployment, HttpRequest& request,
          double timeout_s, bool) -> caf::result<HttpResponse> {
        relay_call(*core, app, deployment, std::move(request), timeout_s,
                   *self->current_mailbox_element());
        return caf::delegated<HttpResponse>{};
      },
      [=](cancel_atom, uint64_t key) { core->cancel_handle_call(key); },
  };
}

// Restarts the proxy actor when it dies of anything but a shutdown
// (runtime/keeper_actor.hpp). Callers hold the keeper: deployment handles'
// calls are forwarded to the current proxy actor, which answers the caller
// directly.
ProxyKeeperActor spawn_proxy_keeper(caf::actor_system& sys, const core_ptr& core) {
  KeeperOptions k;
  k.what = "proxy actor";
  k.policy = core->options.restart_policy;
  k.on_give_up = core->options.on_give_up;
  k.log = core->log;
  k.unavailable = "the proxy of this node is restarting";
  k.start = [core](Keeper& keeper) -> caf::actor {
    std::lock_guard<std::mutex> lock(core->actor_mutex);
    if (core->stopped)
      return nullptr;
    core->actor = keeper.self()->home_system().spawn(proxy_actor, core);
    return caf::actor_cast<caf::actor>(core->actor);
  };
  k.on_gone = [core] {
    std::lock_guard<std::mutex> lock(core->actor_mutex);
    core->actor = nullptr;
  };
  k.handlers = [core](Keeper& keeper) -> caf::message_handler {
    return {
        // From the node agent after each (re-)registration: subscribe the
        // current proxy actor (a restarted one too) for a full snapshot.
        [core, &keeper](subscribe_atom, const ControllerActor& controller) {
          if (controller && keeper.current()) {
            keeper.self()->send(controller, subscribe_atom::value,
                                caf::actor_cast<ProxyActor>(keeper.current()), uint64_t{0},
                                uint64_t{0}, core->options.node_id);
          }
        },
        // Calls live in the proxy's io threads, which outlive its actor.
        [core](cancel_atom, uint64_t key) { core->cancel_handle_call(key); },
    };
  };
  caf::actor first;
  {
    std::lock_guard<std::mutex> lock(core->actor_mutex);
    first = caf::actor_cast<caf::actor>(core->actor);
  }
  return caf::actor_cast<ProxyKeeperActor>(
      spawn_keeper(sys, std::move(k), "troupe.proxy-keeper", std::move(first)));
}

}  // namespace troupe::proxy
