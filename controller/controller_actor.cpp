#include "controller/controller_actor.hpp"

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <set>

#include <caf/all.hpp>

#include "controller/controller_metrics.hpp"
#include "controller/core/version.hpp"
#include "controller/shell/command_plan.hpp"
#include "controller/shell/controller_logic.hpp"
#include "controller/store/rocks_checkpoint_store.hpp"
#include "runtime/log.hpp"
#include "runtime/time.hpp"
#include "runtime/wire.hpp"
#include "runtime/wire_rollback.hpp"

// The actor is wiring only. Every decision it acts on is made by plain code
// with an injected clock, each part tested without actors: ControllerLogic
// (controller/shell/controller_logic.hpp) holds the controller's state and
// decides what every call and event does to it, composing the reconciler
// (controller/core), node liveness (controller/membership) and the shell's
// parts (admission, the directory of actor handles, proxy health, recovery,
// rendering, command planning). What stays here turns each message into one
// call of ControllerLogic, sends the requests, pushes, health checks and
// exits it names, and feeds the answers back to the core.

namespace troupe::controller {

namespace {

// How long a subscriber may take to answer a snapshot push before it is
// sent the next one (in full).
constexpr auto kPushTimeout = std::chrono::seconds(10);

class SteadyClock final : public Clock {
 public:
  double now_s() const override {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
  }
};

struct ControllerState {
  std::unique_ptr<ControllerLogic> logic;
  // A reconcile is queued behind the messages in the mailbox (reconcile_soon).
  bool reconcile_queued = false;
  // Leave requests of stopping nodes, answered when their move is over.
  std::map<std::string, std::vector<caf::typed_response_promise<std::string>>> leaves;
  // When the controller metrics' gauges were last refreshed (on_tick).
  std::chrono::steady_clock::time_point metrics_refreshed{};
  // Pinned libraries being taken back from a node's cache (pull_libraries).
  std::set<std::string> pulling;
  // When taking one back last failed: not tried again for kPullAgainAfter.
  std::map<std::string, std::chrono::steady_clock::time_point> pull_failed;
  // The health watches of the reconcile under way, by node agent: one
  // message per node (reconcile()).
  std::map<caf::actor_addr, std::pair<AgentActor, std::vector<HealthWatch>>> watches;
  // The message of each snapshot the logic still shares (Push::snapshot):
  // later sends of the same snapshot reuse it, and with it the bytes of its
  // one serialization (publish()). Dropped once the logic let go of it.
  std::map<const RoutingSnapshot*, std::pair<std::weak_ptr<const RoutingSnapshot>, caf::message>>
      push_messages;
  // Requests for replicas awaiting their answers, and the commands' requests
  // that wait for their turn (ControllerOptions::max_replica_requests).
  size_t replica_requests = 0;
  std::deque<std::function<void()>> waiting_requests;
  static inline const char* name = "troupe.controller";
};

// Its own messages besides its interface: the recovery window is over; time
// for a tick.
using reconcile_atom = caf::atom_constant<caf::atom("reconcile")>;
using ControllerImpl =
    ControllerRollbackActor::extend<caf::reacts_to<recover_atom>, caf::reacts_to<tick_atom>,
                                    caf::reacts_to<reconcile_atom>>;
using controller_actor = ControllerImpl::stateful_base<ControllerState>;

ControllerLogic& logic(controller_actor* self) {
  return *self->state.logic;
}

void reconcile(controller_actor* self);

// One reconcile after the messages already in the mailbox, however many of
// them ask for one: a reconcile walks every replica, so one per answer of a
// replica would cost the square of the replicas when thousands start (a
// deploy, a controller's recovery) or go down with their node at once.
void reconcile_soon(controller_actor* self) {
  if (self->state.reconcile_queued)
    return;
  self->state.reconcile_queued = true;
  self->send(self, reconcile_atom::value);
}

// The answers of the requests below, fed back to the core, which acts on them.
void replica_ready(controller_actor* self, const std::string& id, const ReplicaVersion& version) {
  logic(self).core().on_replica_ready(id, version);
  reconcile_soon(self);
}

void start_failed(controller_actor* self, const std::string& id, const std::string& why) {
  logic(self).core().on_replica_start_failed(id, why);
  reconcile_soon(self);
}

caf::timespan request_timeout(controller_actor* self) {
  return seconds_as(logic(self).options().request_timeout_s);
}

// ---------------------------------------------------------------- commands

size_t replica_request_cap(controller_actor* self) {
  return std::max<size_t>(1, logic(self).options().max_replica_requests);
}

// An answer came: the commands waiting for their turn go, in order.
void replica_request_done(controller_actor* self) {
  auto& st = self->state;
  if (st.replica_requests > 0)
    --st.replica_requests;
  while (!st.waiting_requests.empty() && st.replica_requests < replica_request_cap(self)) {
    auto next = std::move(st.waiting_requests.front());
    st.waiting_requests.pop_front();
    next();
  }
}

// Runs `send` (which makes one request_for_replica) now, or after the
// requests in flight and those already waiting.
void when_requests_allow(controller_actor* self, std::function<void()> send) {
  auto& st = self->state;
  if (st.waiting_requests.empty() && st.replica_requests < replica_request_cap(self))
    return send();
  st.waiting_requests.push_back(std::move(send));
}

// Sends one request for a replica, counted until its answer or its error
// (ControllerOptions::max_replica_requests), which then go to `answered`
// or `failed`.
template <class Answer, class Handle, class Timeout, class... Ts>
void request_for_replica(controller_actor* self, const Handle& to, Timeout timeout,
                         std::function<void(const Answer&)> answered,
                         std::function<void(caf::error&)> failed, Ts... xs) {
  ++self->state.replica_requests;
  self->request(to, timeout, std::move(xs)...)
      .then(
          [=](const Answer& answer) {
            answered(answer);
            replica_request_done(self);
          },
          [=](caf::error& err) {
            failed(err);
            replica_request_done(self);
          });
}

void initialize_replica(controller_actor* self, const std::string& id, ReplicaVersion version) {
  auto replica = logic(self).actors().replica(id);
  if (!replica)
    return;
  // Constructors may be slow; the core's slow-start logic watches the time.
  // It follows its spawn's answer at once (no wait for a turn).
  request_for_replica<ReplicaMetadata>(
      self, replica, caf::infinite,
      [=](const ReplicaMetadata& m) {
        logic(self).actors().set_started_at(id, m.start_time);
        replica_ready(self, id, version);
      },
      [=](caf::error& err) { start_failed(self, id, from_caf_error(err).message()); },
      initialize_atom::value);
}

void spawn_replica(controller_actor* self, const AgentActor& agent, const Command& cmd) {
  auto id = cmd.replica_id;
  auto version = cmd.version;
  auto node = cmd.node_id;
  auto spec = wire_spec(cmd, logic(self).request_timeout_s());
  when_requests_allow(self, [=] {
    request_for_replica<ReplicaActor>(
        self, agent, request_timeout(self),
        [=](const ReplicaActor& handle) {
          logic(self).actors().remember_replica(id, node, handle);
          initialize_replica(self, id, version);
        },
        [=](caf::error& err) {
          start_failed(self, id, "spawn on " + node + " failed: " + from_caf_error(err).message());
        },
        spawn_replica_atom::value, spec);
  });
}

void reconfigure_replica(controller_actor* self, const ReplicaActor& replica, const Command& cmd) {
  auto id = cmd.replica_id;
  auto version = cmd.version;
  auto batch = batch_settings(cmd.spec->config);
  when_requests_allow(self, [=] {
    request_for_replica<ReplicaMetadata>(
        self, replica, caf::infinite,
        [=](const ReplicaMetadata&) { replica_ready(self, id, version); },
        [=](caf::error& err) { start_failed(self, id, from_caf_error(err).message()); },
        reconfigure_atom::value, version.user_config, batch);
  });
}

// The replica's node runs its health checks (node/health_checks.hpp) and
// sends what they come to (the health handler below). The watches of one
// reconcile go to each node in one message (reconcile()).
void watch_replica_health(controller_actor* self, const AgentActor& agent, const Command& cmd) {
  HealthSettings s;
  s.period_s = cmd.health.period_s;
  s.timeout_s = cmd.health.timeout_s;
  s.threshold = cmd.health.threshold;
  s.jitter = cmd.health.jitter;
  auto& [to, watches] = self->state.watches[agent.address()];
  to = agent;
  watches.push_back({cmd.replica_id, cmd.check_seq, s});
}

void query_replica_version(controller_actor* self, const ReplicaActor& replica,
                           const Command& cmd) {
  auto id = cmd.replica_id;
  when_requests_allow(self, [=] {
    request_for_replica<ReplicaMetadata>(
        self, replica, request_timeout(self),
        [=](const ReplicaMetadata& m) {
          logic(self).actors().set_started_at(id, m.start_time);
          replica_ready(
              self, id,
              ReplicaVersion{m.code_version, m.user_config,
                             batch_key(m.batch.max_batch_size, m.batch.wait_s, m.batch.adaptive)});
        },
        [=](caf::error&) {
          logic(self).core().on_replica_crashed(id);
          reconcile_soon(self);
        },
        version_atom::value);
  });
}

// The agent stops (or kills) the replica process; if it cannot, the replica
// actor gets an exit(kill).
void stop_via_agent(controller_actor* self, const AgentActor& agent, const ReplicaActor& replica,
                    const Command& cmd) {
  auto id = cmd.replica_id;
  auto kind = cmd.kind;
  auto timeout_s = cmd.timeout_s;
  when_requests_allow(self, [=] {
    auto stopped = [](const caf::ok_atom&) {};
    auto failed = [=](caf::error&) { self->send_exit(replica, caf::exit_reason::kill); };
    if (kind == CommandKind::stop) {
      request_for_replica<caf::ok_atom>(self, agent, request_timeout(self), stopped, failed,
                                        stop_atom::value, id, timeout_s);
    } else {
      request_for_replica<caf::ok_atom>(self, agent, request_timeout(self), stopped, failed,
                                        kill_replica_atom::value, id);
    }
  });
}

// Sends what ControllerLogic::plan names; what needs no message it has fed
// back to the core already.
void execute(controller_actor* self, const Command& cmd) {
  auto run = logic(self).plan(cmd);
  switch (run.action) {
    case CommandAction::spawn:
      return spawn_replica(self, run.agent, cmd);
    case CommandAction::reconfigure:
      return reconfigure_replica(self, run.replica, cmd);
    case CommandAction::watch_health:
      return watch_replica_health(self, run.agent, cmd);
    case CommandAction::query_version:
      return query_replica_version(self, run.replica, cmd);
    case CommandAction::exit_replica:
      // Its node is gone; so is the replica once the connection is.
      return self->send_exit(run.replica, caf::exit_reason::kill);
    case CommandAction::stop_via_agent:
    case CommandAction::kill_via_agent:
      return stop_via_agent(self, run.agent, run.replica, cmd);
    case CommandAction::no_agent:
    case CommandAction::replica_gone:
    case CommandAction::already_gone:
    case CommandAction::awaiting_node:
      return;
  }
}

// ---------------------------------------------------------------- reconcile

// One push in flight per subscriber: the next one, a delta of everything
// that changed meanwhile, follows its answer. A failed or timed-out push
// makes the next one full, sent by the next reconcile (not at once: the
// subscriber may be gone, and its down message not here yet).
void publish(controller_actor* self) {
  // One message per distinct snapshot, kept while the logic shares the
  // snapshot: CAF shares its content among the sends, and its encoding makes
  // the first connection that serializes it keep the bytes for the others
  // (runtime/wire.hpp, SnapshotEncoding).
  auto& messages = self->state.push_messages;
  for (auto it = messages.begin(); it != messages.end();)
    it = it->second.first.expired() ? messages.erase(it) : std::next(it);
  size_t local = 0, remote = 0, built = 0;
  for (auto& p : logic(self).due_pushes()) {
    auto key = p.key;
    auto push = p.push;
    // An entry left after the sweep above is this very snapshot (which
    // keeps its address taken while alive); a new one has no message yet.
    auto& [shared, msg] = messages[p.snapshot.get()];
    if (msg.empty()) {
      shared = p.snapshot;
      msg = caf::make_message(snapshot_atom::value, *p.snapshot);
      // Not shared yet: the snapshot in the message itself, not a copy.
      share_encoding(msg.get_mutable_as<RoutingSnapshot>(1));
      ++built;
    }
    ++(p.to.node() == self->node() ? local : remote);
    // Untyped, to send the shared message: ProxyActor takes
    // (snapshot, RoutingSnapshot) -> ok.
    self->request(caf::actor_cast<caf::actor>(p.to), kPushTimeout, msg)
        .then(
            [=](caf::ok_atom) {
              logic(self).push_done(key, push, true);
              publish(self);
            },
            [=](caf::error&) { logic(self).push_done(key, push, false); });
  }
  if (const auto& m = logic(self).options().metrics; m && local + remote > 0)
    m->pushed(built, local, remote);
}

void reconcile(controller_actor* self) {
  if (logic(self).recovering())
    return;
  auto started = std::chrono::steady_clock::now();
  for (const auto& cmd : logic(self).update())
    execute(self, cmd);
  for (auto& [addr, watches] : self->state.watches)
    self->send(watches.first, health_atom::value, std::move(watches.second));
  self->state.watches.clear();
  logic(self).log_status_changes();
  publish(self);
  for (auto& outcome : logic(self).settled_leaves()) {
    auto it = self->state.leaves.find(outcome.node_id);
    if (it == self->state.leaves.end())
      continue;
    for (auto& rp : it->second)
      rp.deliver(outcome.message);
    self->state.leaves.erase(it);
  }
  if (const auto& m = logic(self).options().metrics) {
    m->reconciled(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  }
}

caf::result<std::string> on_leave(controller_actor* self, const std::string& id,
                                  const Credential& cred) {
  if (auto s = logic(self).leave(id, cred); !s)
    return to_caf_error(s);
  auto rp = self->make_response_promise<std::string>();
  self->state.leaves[id].push_back(rp);
  reconcile(self);
  return rp;
}

// Takes a missing library back from the nodes' caches: asks each agent in
// turn for its size, then reads it from the first that has it, piece by
// piece, into the store (which keeps it only if it hashes to its pin).
void pull_library(controller_actor* self, const std::string& sha256,
                  std::vector<AgentActor> agents);

void pull_piece(controller_actor* self, const std::string& sha256, std::vector<AgentActor> agents,
                uint64_t total, uint64_t offset) {
  const AgentActor agent = agents.back();
  agents.pop_back();
  auto next = [=](const std::string& why) {
    logic(self).log().warn("taking library {} back from a node failed: {}", sha256, why);
    pull_library(self, sha256, agents);
  };
  self->request(agent, request_timeout(self), library_atom::value, sha256, offset)
      .then(
          [=](std::string& piece) {
            auto stored = logic(self).store_pulled_library(sha256, total, offset, piece);
            if (!stored)
              return next(stored.status().message());
            if (*stored < total) {
              auto again = agents;
              again.push_back(agent);
              return pull_piece(self, sha256, again, total, *stored);
            }
            self->state.pulling.erase(sha256);
            logic(self).log().info("library {} ({} bytes) taken back from a node's cache", sha256,
                                   total);
          },
          [=](caf::error& err) { next(from_caf_error(err).message()); });
}

void pull_library(controller_actor* self, const std::string& sha256,
                  std::vector<AgentActor> agents) {
  if (agents.empty()) {
    self->state.pulling.erase(sha256);
    self->state.pull_failed[sha256] = std::chrono::steady_clock::now();
    logic(self).log().error(
        "library {} is pinned by a deployment but neither this head nor any node has it: "
        "deploy its config again with troupectl (which uploads it)",
        sha256);
    return;
  }
  const AgentActor agent = agents.back();
  self->request(agent, request_timeout(self), library_atom::value, sha256)
      .then(
          [=](uint64_t size) {
            if (size == 0) {
              auto rest = agents;
              rest.pop_back();
              return pull_library(self, sha256, rest);
            }
            pull_piece(self, sha256, agents, size, 0);
          },
          [=](caf::error&) {
            auto rest = agents;
            rest.pop_back();
            pull_library(self, sha256, rest);
          });
}

// Every pinned library this controller cannot serve, taken back from the
// nodes (once at a time each): a new leader of highly available heads
// never had on its disk what was uploaded to another head.
constexpr std::chrono::seconds kPullAgainAfter{30};

void pull_libraries(controller_actor* self) {
  const auto now = std::chrono::steady_clock::now();
  for (const auto& sha256 : logic(self).missing_libraries()) {
    auto failed = self->state.pull_failed.find(sha256);
    if (failed != self->state.pull_failed.end() && now - failed->second < kPullAgainAfter)
      continue;
    if (!self->state.pulling.insert(sha256).second)
      continue;
    logic(self).log().info("library {} is not on this head: taking it back from a node's cache",
                           sha256);
    pull_library(self, sha256, logic(self).actors().agents());
  }
}

void finish_recovery(controller_actor* self) {
  auto finished = logic(self).finish_recovery();
  if (!finished)
    return self->quit(to_caf_error(finished.status()));
  if (*finished) {
    pull_libraries(self);
    reconcile(self);
  }
}

// Health-checks every proxy whose check is due; kills one that just became
// UNHEALTHY.
void check_proxies(controller_actor* self) {
  for (const auto& [key, proxy] : logic(self).due_proxy_checks()) {
    auto settle = [=](bool ok, const std::string& why) {
      if (auto unhealthy = logic(self).settle_proxy_check(key, ok, why))
        self->send_exit(unhealthy, caf::exit_reason::kill);
    };
    self->request(proxy, seconds_as(logic(self).options().proxy_health_timeout_s),
                  health_atom::value)
        .then([=](caf::ok_atom) { settle(true, ""); },
              [=](caf::error& err) { settle(false, from_caf_error(err).message()); });
  }
}

void on_tick(controller_actor* self) {
  check_proxies(self);
  if (logic(self).tick())
    finish_recovery(self);  // also ended by the window's own message; whichever comes first
  reconcile(self);
  for (const auto& agent : logic(self).nodes_to_stop())
    self->send(agent, stop_node_atom::value);
  // The gauges of deployments and nodes, at most once a second: they walk
  // every replica.
  auto now = std::chrono::steady_clock::now();
  if (const auto& m = logic(self).options().metrics;
      m && now - self->state.metrics_refreshed >= std::chrono::seconds(1)) {
    self->state.metrics_refreshed = now;
    m->refresh(&logic(self).core(), logic(self).nodes());
  }
}

// ---------------------------------------------------------------- answers

// A call's outcome as its answer: the value, or the error.
template <class T>
caf::result<T> answer(Result<T> r) {
  if (!r)
    return to_caf_error(r.status());
  return std::move(*r);
}

caf::result<caf::ok_atom> answer(const Status& s) {
  if (!s)
    return to_caf_error(s);
  return caf::ok_atom::value;
}

// A call that changed the target state or the nodes: reconcile, then answer.
caf::result<caf::ok_atom> reconciled(controller_actor* self, const Status& s) {
  if (s)
    reconcile(self);
  return answer(s);
}

caf::result<hello_atom, uint32_t, std::string> on_hello(uint32_t version) {
  if (auto s = check_protocol_version(version); !s)
    return to_caf_error(s);
  return {hello_atom::value, kProtocolVersion, std::string("controller")};
}

caf::result<uint64_t> on_register(controller_actor* self, const troupe::NodeInfo& info,
                                  const caf::actor& agent,
                                  const std::vector<HostedReplicaInfo>& hosted,
                                  const Credential& cred) {
  auto reg = logic(self).register_node(info, caf::actor_cast<AgentActor>(agent), hosted, cred);
  if (!reg)
    return to_caf_error(reg.status());
  if (reg->recovery_complete)
    finish_recovery(self);
  else
    reconcile(self);
  return reg->incarnation;
}

caf::result<bool, uint64_t> on_deploy(controller_actor* self, const std::string& encoded,
                                      const Credential& cred) {
  auto result = logic(self).deploy(encoded, cred);
  if (const auto& m = logic(self).options().metrics)
    m->deployed(result ? "ok" : "error");
  if (!result)
    return to_caf_error(result.status());
  reconcile(self);
  return {result->changed, result->generation};
}

caf::result<std::string> on_apply(controller_actor* self, const std::string& encoded,
                                  const Credential& cred,
                                  std::optional<uint64_t> if_generation = std::nullopt) {
  auto json = logic(self).apply(encoded, cred, if_generation);
  if (const auto& m = logic(self).options().metrics)
    m->deployed(json ? "ok" : "error");
  if (json)
    reconcile(self);
  return answer(std::move(json));
}

// The chaos primitive: an exit(kill) to one actor, or the controller itself.
caf::result<caf::ok_atom> on_kill(controller_actor* self, const std::string& kind,
                                  const std::string& id, const Credential& cred) {
  auto target = logic(self).kill(kind, id, cred);
  if (!target)
    return to_caf_error(target.status());
  if (target->controller)
    self->quit(caf::exit_reason::kill);
  else
    self->send_exit(target->actor, caf::exit_reason::kill);
  return caf::ok_atom::value;
}

// `troupectl logs`: asked of the replica's node, or of every node when the
// controller no longer knows where it ran (a replica that ended); the first
// node that has its log answers.
caf::result<std::string, uint64_t> on_logs(controller_actor* self, const std::string& id,
                                           uint64_t offset, uint32_t tail) {
  std::vector<AgentActor> asked;
  if (auto node = logic(self).actors().node_of(id); !node.empty()) {
    if (auto agent = logic(self).actors().agent(node))
      asked.push_back(agent);
  }
  if (asked.empty())
    asked = logic(self).actors().agents();
  if (asked.empty())
    return to_caf_error(Status(errc::unavailable, "no node is connected to the controller"));
  struct Pending {
    size_t left = 0;
    bool done = false;
    Status error;  // the last one other than not_found
  };
  auto pending = std::make_shared<Pending>();
  pending->left = asked.size();
  auto rp = self->make_response_promise<std::string, uint64_t>();
  for (const auto& agent : asked) {
    self->request(agent, request_timeout(self), logs_atom::value, id, offset, tail)
        .then(
            [=](std::string& text, uint64_t next) mutable {
              if (pending->done)
                return;
              pending->done = true;
              rp.deliver(std::move(text), next);
            },
            [=](caf::error& err) mutable {
              auto status = from_caf_error(err);
              if (status.code() != errc::not_found)
                pending->error = status;
              if (pending->done || --pending->left > 0)
                return;
              pending->done = true;
              if (!pending->error.is_ok() && asked.size() == 1) {
                rp.deliver(to_caf_error(pending->error));
                return;
              }
              rp.deliver(to_caf_error(Status(
                  errc::not_found, "no node has a log of replica " + id +
                                       " (unknown id, a replica that ran in process and ended, "
                                       "or its node is gone)")));
            });
  }
  return rp;
}

// The first push (or nothing, when the subscriber is current) follows at
// once; later ones whenever the published view changes.
void on_subscribe(controller_actor* self, const ProxyActor& subscriber, SnapshotId last,
                  const std::string& node_id, const std::string& lost_node = "") {
  if (logic(self).subscribe(subscriber, last, node_id, lost_node))
    publish(self);
}

void on_down(controller_actor* self, const caf::down_msg& dm) {
  if (logic(self).on_down(dm.source, dm.reason, self->home_system().render(dm.reason)))
    reconcile_soon(self);
}

// ---------------------------------------------------------------- startup

void init_state(controller_actor* self, const ControllerOptions& options,
                std::shared_ptr<CheckpointStore> store, std::shared_ptr<const Clock> clock) {
  std::random_device rd;
  uint64_t seed = (uint64_t{rd()} << 32) | rd();
  if (options.metrics)
    store = options.metrics->timed(std::move(store));
  self->state.logic = std::make_unique<ControllerLogic>(
      options, std::move(store), clock ? std::move(clock) : std::make_shared<SteadyClock>(), seed,
      [self](const caf::actor& a) { self->monitor(a); },
      [self](const caf::actor_addr& a) { self->demonitor(a); }, troupe::log::get("controller"));
}

// Nothing to recover: reconcile at once. Otherwise give nodes a window to
// re-register and report the replicas they host.
void start_recovery(controller_actor* self) {
  if (!logic(self).start())
    return finish_recovery(self);
  self->delayed_send(self, seconds_as(logic(self).options().recovery_window_s),
                     recover_atom::value);
}

ControllerImpl::behavior_type controller(controller_actor* self, ControllerOptions options,
                                         std::shared_ptr<CheckpointStore> store,
                                         std::shared_ptr<const Clock> clock) {
  init_state(self, options, std::move(store), std::move(clock));
  start_recovery(self);
  self->set_down_handler([=](const caf::down_msg& dm) { on_down(self, dm); });
  auto tick = seconds_as(options.tick_interval_s);
  self->delayed_send(self, tick, tick_atom::value);
  logic(self).log().info("controller started (node timeout {:.1f} s)", options.node_timeout_s);
  return {
      [=](hello_atom, uint32_t version) { return on_hello(version); },
      [=](register_atom, const troupe::NodeInfo& info, const caf::actor& agent,
          const std::vector<HostedReplicaInfo>& hosted,
          const Credential& cred) { return on_register(self, info, agent, hosted, cred); },
      [=](heartbeat_atom, const std::string& id, const std::vector<ReplicaLoad>& loads,
          const Credential& cred) { return answer(logic(self).heartbeat(id, loads, cred)); },
      [=](deregister_atom, const std::string& id, const Credential& cred) {
        return reconciled(self, logic(self).deregister(id, cred));
      },
      [=](nodes_atom) { return logic(self).nodes(); },
      [=](leave_atom, const std::string& id, const Credential& cred) {
        return on_leave(self, id, cred);
      },
      [=](drain_atom, const std::string& id, const Credential& cred) {
        return reconciled(self, logic(self).drain(id, cred));
      },
      [=](deploy_atom, const std::string& encoded, const Credential& cred) {
        return on_deploy(self, encoded, cred);
      },
      [=](delete_atom, const std::string& app, const Credential& cred) {
        return reconciled(self, logic(self).delete_application(app, cred));
      },
      [=](status_atom) { return logic(self).status(); },
      [=](leader_atom) -> std::string {
        return options.leadership ? options.leadership() : std::string(R"({"leading": true})");
      },
      [=](logs_atom, const std::string& id, uint64_t offset, uint32_t tail) {
        return on_logs(self, id, offset, tail);
      },
      [=](library_atom, const std::string& sha256) {
        auto size = logic(self).library_size(sha256);
        if (size == 0)
          pull_libraries(self);  // a node misses it: perhaps another has it
        return size;
      },
      [=](library_atom, const std::string& sha256, uint64_t offset) {
        return answer(logic(self).library_piece(sha256, offset));
      },
      [=](upload_atom, const std::string& sha256, uint64_t total, uint64_t offset,
          const std::string& piece, const Credential& cred) {
        return answer(logic(self).upload_library(sha256, total, offset, piece, cred));
      },
      [=](snapshot_atom, uint64_t epoch, uint64_t seq) {
        return answer(logic(self).snapshot(epoch, seq));
      },
      [=](subscribe_atom, const ProxyActor& subscriber, uint64_t epoch, uint64_t seq,
          const std::string& node_id) {
        on_subscribe(self, subscriber, SnapshotId{epoch, seq}, node_id);
      },
      [=](subscribe_atom, const ProxyActor& subscriber, uint64_t epoch, uint64_t seq,
          const std::string& node_id, const std::string& lost_node) {
        on_subscribe(self, subscriber, SnapshotId{epoch, seq}, node_id, lost_node);
      },
      [=](apply_atom, const std::string& encoded, const Credential& cred) {
        return on_apply(self, encoded, cred);
      },
      [=](apply_atom, const std::string& encoded, uint64_t if_generation, const Credential& cred) {
        return on_apply(self, encoded, cred, if_generation);
      },
      [=](config_atom) { return answer(logic(self).config()); },
      [=](delete_atom, const std::string& app, const std::string& deployment,
          const Credential& cred) {
        return reconciled(self, logic(self).delete_deployment(app, deployment, cred));
      },
      [=](scale_atom, const std::string& app, const std::string& deployment, uint32_t replicas,
          const Credential& cred) -> caf::result<bool, uint64_t> {
        auto result = logic(self).scale(app, deployment, replicas, cred);
        if (!result)
          return to_caf_error(result.status());
        reconcile(self);
        return {result->changed, result->generation};
      },
      [=](traffic_atom, const std::string& app, const TrafficWeights& weights,
          const Credential& cred) -> caf::result<uint64_t> {
        auto generation = logic(self).set_traffic(app, weights, cred);
        if (generation)
          reconcile(self);  // publishes the new routes at once
        return answer(std::move(generation));
      },
      [=](rollback_atom, const std::string& app,
          const Credential& cred) -> caf::result<uint64_t, uint64_t> {
        auto rolled = logic(self).rollback(app, cred);
        if (!rolled)
          return to_caf_error(rolled.status());
        reconcile(self);
        return {rolled->generation, rolled->from_generation};
      },
      [=](shutdown_atom, bool nodes, const Credential& cred) {
        return reconciled(self, logic(self).shutdown(nodes, cred));
      },
      [=](kill_atom, const std::string& kind, const std::string& id, const Credential& cred) {
        return on_kill(self, kind, id, cred);
      },
      [=](dashboard_atom) { return logic(self).dashboard(); },
      [=](metrics_atom, const std::string& reporter, const std::vector<DeploymentLoad>& loads) {
        bool cold_start = false;
        for (const auto& l : loads)
          cold_start |=
              logic(self).handle_metrics(reporter, l.app, l.deployment, l.queued_and_inflight);
        if (cold_start)
          reconcile(self);  // now, not at the next tick
      },
      [=](health_atom, const std::string& node, const std::vector<HealthReport>& reports) {
        logic(self).health_reports(node, reports);
      },
      [=](models_atom, const std::string&, std::vector<ReplicaModels>& lists) {
        // Replicas send at most one list per 100 ms each, and their node
        // gathers those of 50 ms into one message: pushing the changes at
        // once costs a delta per message.
        bool changed = false;
        for (auto& l : lists)
          changed |= logic(self).replica_models(l.replica_id, l.seq, std::move(l.model_ids));
        if (changed)
          reconcile(self);
      },
      [=](recover_atom) {
        // Nodes that registered meanwhile moved the window's end.
        if (double left = logic(self).recovery_left_s(); left > 0)
          return self->delayed_send(self, seconds_as(left), recover_atom::value);
        finish_recovery(self);
      },
      [=](reconcile_atom) {
        self->state.reconcile_queued = false;
        reconcile(self);
      },
      [=](tick_atom) {
        on_tick(self);
        self->delayed_send(self, tick, tick_atom::value);
      },
  };
}

}  // namespace

Result<std::unique_ptr<CheckpointStore>> open_checkpoint(const std::string& state_dir) {
  auto path = state_dir + "/checkpoint";
  RocksCheckpointStoreOptions options;
  options.log = troupe::log::get("checkpoint");
  auto store = RocksCheckpointStore::open(path, options);
  if (!store)
    return store.status();
  auto loaded = (*store)->load();
  if (!loaded)
    return loaded.status();
  return std::unique_ptr<CheckpointStore>(std::move(store.value()));
}

ControllerActor spawn_controller(caf::actor_system& sys, const ControllerOptions& options,
                                 std::shared_ptr<CheckpointStore> store,
                                 std::shared_ptr<const Clock> clock) {
  if (options.own_thread)
    return ControllerActor{
        sys.spawn<caf::detached>(controller, options, std::move(store), std::move(clock))};
  return ControllerActor{sys.spawn(controller, options, std::move(store), std::move(clock))};
}

}  // namespace troupe::controller
