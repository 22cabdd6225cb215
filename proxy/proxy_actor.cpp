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

// What the proxy actor does with each of its messages; its behaviour
// (proxy_actor) is a table of one-line handlers over these.
class ProxyActorLogic {
 public:
  ProxyActorLogic(ProxyImpl::pointer self, core_ptr core) : self_(self), core_(std::move(core)) {}

  // A (re)started proxy: watch the replicas and peers it already knows, ask
  // the last controller for what changed since the snapshot it holds, and
  // start the load reports.
  void start() {
    for (const auto& h : core_->router.handles())
      self_->monitor(h);
    watch_peers(self_, core_);
    ControllerActor controller;
    {
      std::lock_guard<std::mutex> lock(core_->actor_mutex);
      controller = core_->controller;
    }
    if (controller) {
      watch(controller);
      self_->send(controller, subscribe_atom::value, caf::actor_cast<ProxyActor>(self_),
                  core_->router.epoch(), core_->router.seq(), core_->options.node_id);
    }
    self_->delayed_send(self_, kReportInterval, tick_atom::value);
  }

  // The controller's handle going down with the connection: this node lost
  // its route to every node it has no direct connection to. Else a peer
  // actor, or a replica.
  void down(const caf::down_msg& dm) {
    if (dm.source == watched_) {
      watched_ = caf::actor_addr();
      if (dm.reason == caf::exit_reason::remote_link_unreachable)
        core_->hub_lost(core_->direct_nodes());
      return;
    }
    if (peer_down(self_, core_, dm.source))
      return;
    core_->replica_down(dm.source, dm.reason);
  }

  caf::ok_atom snapshot(RoutingSnapshot& snap) {
    drop_empty_handles(snap);
    // Only the controller pushes snapshots.
    if (auto sender = caf::actor_cast<ControllerActor>(self_->current_sender())) {
      watch(sender);
      std::lock_guard<std::mutex> lock(core_->actor_mutex);
      core_->controller = sender;
    }
    bool first = !core_->router.has_routes();
    auto applied = core_->router.apply(snap);
    note_draining(snap);
    core_->snapshot_timeout_s.store(snap.request_timeout_s, std::memory_order_relaxed);
    apply_keep_alive(*core_, snap.keep_alive_timeout_s);
    for (const auto& h : applied.added)
      self_->monitor(h);
    core_->run(applied.ready);
    core_->replicas_lost(applied.lost);
    peers_from_snapshot(self_, core_, snap);
    auto level = first || snap.full ? spdlog::level::info : spdlog::level::debug;
    core_->log->log(level, "route table {}.{} ({}; {} routes, {} deployments changed)", snap.epoch,
                    snap.seq, snap.full ? "full" : "delta",
                    core_->router.routes()->routes().size(), snap.deployments.size());
    // Applied: the controller sends the next one.
    return caf::ok_atom::value;
  }

  void reconnect(const std::string& node_id) { peer_retry(self_, core_, node_id); }

  // Healthy while every io thread runs its sweep (at least once a second): a
  // stalled event loop serves nobody.
  caf::result<caf::ok_atom> health() const {
    auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                   Clock::now().time_since_epoch())
                   .count();
    for (const auto& w : core_->workers) {
      int64_t last = w->last_sweep_ns.load(std::memory_order_relaxed);
      double stalled_s = (now - last) / 1e9;
      if (last != 0 && stalled_s > kIoStallLimit) {
        return to_caf_error(Status(errc::unavailable, "io thread " + std::to_string(w->index) +
                                                          " has not run for " +
                                                          fmt::format("{:.1f}", stalled_s) + " s"));
      }
    }
    return caf::ok_atom::value;
  }

  // Every deployment's queued + in-flight requests as this proxy sees them
  // (the controller averages each reporter's samples).
  void tick() {
    core_->report_load(core_->router.loads());
    self_->delayed_send(self_, kReportInterval, tick_atom::value);
  }

  // A deployment handle's call from another process (a replica process:
  // replica/handle_transport.hpp, make_remote_proxy_call), usually delegated
  // by the keeper: Core::call, exactly as Proxy::caller(). Its bounds are
  // Core::call's (the call's timeout, retries, 503 when the proxy stops:
  // `done` always runs once); the caller's request carries a timeout of its
  // own. The answer is sent from the io thread that gets it, see ReplyTo.
  caf::result<HttpResponse> call(const std::string& app, const std::string& deployment,
                                 HttpRequest& request, double timeout_s) {
    auto reply = std::make_shared<ReplyTo>(*self_->current_mailbox_element());
    core_->call(app, deployment, std::move(request), timeout_s,
                [reply](HttpResponse answer) { reply->send(std::move(answer)); });
    return caf::delegated<HttpResponse>{};
  }

  // The same, its answer relayed as the callee streams it
  // (make_remote_proxy_stream; handle_calls.hpp: relay_call).
  caf::result<HttpResponse> relay(const std::string& app, const std::string& deployment,
                                  HttpRequest& request, double timeout_s) {
    relay_call(*core_, app, deployment, std::move(request), timeout_s,
               *self_->current_mailbox_element());
    return caf::delegated<HttpResponse>{};
  }

  void cancel(uint64_t key) { core_->cancel_handle_call(key); }

 private:
  // The controller this actor monitors (see down()).
  void watch(const ControllerActor& controller) {
    if (!controller || controller.address() == watched_)
      return;
    watched_ = controller.address();
    self_->monitor(controller);
  }

  // CAF deserializes the handle of an actor of this node that is already gone
  // as an empty one: a replica here that died while the snapshot naming it
  // was on its way. It is not routable; the next snapshot that names it with
  // a handle brings it back.
  static void drop_empty_handles(RoutingSnapshot& snap) {
    for (auto& d : snap.deployments) {
      d.replicas.erase(std::remove_if(d.replicas.begin(), d.replicas.end(),
                                      [](const ReplicaEndpoint& ep) { return !ep.handle; }),
                       d.replicas.end());
    }
  }

  void note_draining(const RoutingSnapshot& snap) {
    bool draining = std::find(snap.draining_nodes.begin(), snap.draining_nodes.end(),
                              core_->options.node_id) != snap.draining_nodes.end();
    if (draining != core_->draining.exchange(draining)) {
      core_->log->info("node {} is {}", core_->options.node_id,
                       draining ? "draining: not ready (/-/readyz 503)" : "no longer draining");
    }
  }

  ProxyImpl::pointer self_;
  core_ptr core_;
  caf::actor_addr watched_;
};

}  // namespace

// The proxy actor: applies snapshots, monitors replicas, answers health.
ProxyImpl::behavior_type proxy_actor(ProxyImpl::pointer self, core_ptr core) {
  auto p = std::make_shared<ProxyActorLogic>(self, std::move(core));
  self->set_down_handler([p](caf::down_msg& dm) { p->down(dm); });
  p->start();
  return {
      [p](snapshot_atom, RoutingSnapshot& snap) -> caf::ok_atom { return p->snapshot(snap); },
      [p](reconnect_atom, const std::string& node_id) { p->reconnect(node_id); },
      [p](health_atom) -> caf::result<caf::ok_atom> { return p->health(); },
      [p](tick_atom) { p->tick(); },
      [p](call_atom, std::string& app, std::string& deployment, HttpRequest& request,
          double timeout_s) -> caf::result<HttpResponse> {
        return p->call(app, deployment, request, timeout_s);
      },
      [p](call_atom, std::string& app, std::string& deployment, HttpRequest& request,
          double timeout_s, bool) -> caf::result<HttpResponse> {
        return p->relay(app, deployment, request, timeout_s);
      },
      [p](cancel_atom, uint64_t key) { p->cancel(key); },
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
