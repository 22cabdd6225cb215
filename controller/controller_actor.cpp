#include "controller/controller_actor.hpp"

#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <unordered_map>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "controller/core/state_manager.hpp"
#include "controller/membership.hpp"
#include "controller/shell/command_plan.hpp"
#include "controller/shell/proxy_health.hpp"
#include "controller/shell/recovery_gate.hpp"
#include "controller/shell/status_view.hpp"
#include "controller/store/codec.hpp"
#include "controller/store/rocks_checkpoint_store.hpp"
#include "runtime/address.hpp"
#include "runtime/auth.hpp"
#include "runtime/log.hpp"
#include "runtime/time.hpp"
#include "runtime/wire.hpp"

// The actor is wiring only: every decision it acts on is made by plain code
// with an injected clock (controller/core: the reconciler; controller/
// membership: nodes; controller/shell: proxy health, recovery, rendering,
// command planning), each tested without actors. What stays here maps ids to
// actor handles, sends requests and feeds their answers back.

namespace troupe::controller {

namespace {

class SteadyClock final : public Clock {
 public:
  double now_s() const override {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
  }
};

struct AgentRef {
  std::string node_id;
  uint64_t incarnation = 0;
};

struct ReplicaRef {
  caf::actor handle;
  std::string node_id;
  bool stopping = false;  // a stop or kill was sent: its down is a stop, not a crash
  double started_at = 0;  // Unix seconds when it became ready; 0: not yet
};

// A route-table subscriber: every node's proxy. Its health lives in
// ControllerState::proxies under `key`.
struct Subscriber {
  caf::actor handle;
  SnapshotId last;
};

struct ControllerState {
  ControllerOptions options;
  std::shared_ptr<const Clock> clock;
  Membership membership{5.0};
  std::unique_ptr<SeededRandom> rng;
  std::shared_ptr<CheckpointStore> store;
  std::unique_ptr<StateManager> core;
  std::unique_ptr<RecoveryGate> recovery;
  std::unique_ptr<NodesFile> nodes_file;  // <state_dir>/nodes, for the next restart
  std::unique_ptr<ProxyHealthMonitor> proxies;
  std::unordered_map<caf::actor_addr, AgentRef> agents;  // monitored agent -> node
  std::unordered_map<std::string, caf::actor> agent_of;  // node id -> agent
  std::unordered_map<std::string, ReplicaRef> replicas;  // replica id -> handle
  std::unordered_map<caf::actor_addr, std::string> replica_of;
  // Latest ongoing-requests report per replica (for autoscaling and status).
  std::unordered_map<std::string, double> ongoing;
  // Pushed a snapshot whenever the published view changes; keyed like
  // `proxies`.
  std::map<ProxyHealthMonitor::Key, Subscriber> subscribers;
  std::unordered_map<caf::actor_addr, ProxyHealthMonitor::Key> subscriber_of;
  ProxyHealthMonitor::Key next_subscriber_key = 1;
  // From the deployed http_options; pushed to proxies with every snapshot.
  // Kept in memory only: after a controller restart it applies again with
  // the next deploy.
  double request_timeout_s = 0;
  // `troupectl shutdown --nodes`: stop the node processes once every replica
  // is gone.
  bool stop_nodes_when_empty = false;
  // Last logged status per deployment, to log transitions.
  StatusChangeLog status_log;
  std::shared_ptr<spdlog::logger> log = troupe::log::get("controller");
  static inline const char* name = "troupe.controller";

  bool recovering() const { return recovery->is_recovering(); }
  double now() const { return clock->now_s(); }
};

using controller_actor = caf::stateful_actor<ControllerState>;

// ---------------------------------------------------------------- nodes

void log_transitions(ControllerState& st, const std::vector<NodeTransition>& ts) {
  for (const auto& t : ts) {
    st.log->warn("node {} {} -> {}: {}", t.id, to_string(t.from), to_string(t.to), t.reason);
  }
}

// Keeps <state_dir>/nodes equal to the set of live nodes; not while
// recovering, when the membership is still filling up.
void save_live_nodes(ControllerState& st) {
  if (st.recovering())
    return;
  if (!st.nodes_file->save(st.membership.nodes())) {
    st.log->warn("cannot write {}: the next controller restart waits its full recovery window",
                 st.nodes_file->path());
  }
}

void push_nodes(ControllerState& st) {
  save_live_nodes(st);
  std::vector<controller::NodeInfo> view;
  for (const auto& [id, n] : st.membership.nodes())
    view.push_back({id, n.state, n.resources});
  st.core->set_nodes(view);
}

caf::actor agent_of(const ControllerState& st, const std::string& node) {
  auto it = st.agent_of.find(node);
  return it == st.agent_of.end() ? caf::actor{} : it->second;
}

// ---------------------------------------------------------------- replicas

void remember_replica(controller_actor* self, const std::string& id, const std::string& node,
                      const caf::actor& handle) {
  auto& st = self->state;
  auto& ref = st.replicas[id];
  if (ref.handle && ref.handle != handle)
    st.replica_of.erase(ref.handle.address());
  ref.handle = handle;
  ref.node_id = node;
  st.replica_of[handle.address()] = id;
  self->monitor(handle);
}

void forget_replica(ControllerState& st, const std::string& id) {
  auto it = st.replicas.find(id);
  if (it == st.replicas.end())
    return;
  if (it->second.handle)
    st.replica_of.erase(it->second.handle.address());
  st.replicas.erase(it);
  st.ongoing.erase(id);
}

void set_started_at(ControllerState& st, const std::string& id, double start_time) {
  if (auto it = st.replicas.find(id); it != st.replicas.end())
    it->second.started_at = start_time;
}

void reconcile(controller_actor* self);

// A replica's outcome arrived: feed it to the core and act on it.
template <class F>
void feed(controller_actor* self, F&& event) {
  event(*self->state.core);
  reconcile(self);
}

// ---------------------------------------------------------------- commands

void initialize_replica(controller_actor* self, const std::string& id, ReplicaVersion version) {
  auto it = self->state.replicas.find(id);
  if (it == self->state.replicas.end())
    return;
  // Constructors may be slow; the core's slow-start logic watches the time.
  self->request(it->second.handle, caf::infinite, initialize_atom::value)
      .then(
          [=](const ReplicaMetadata& m) {
            set_started_at(self->state, id, m.start_time);
            feed(self, [&](StateManager& core) { core.on_replica_ready(id, version); });
          },
          [=](caf::error& err) {
            auto status = from_caf_error(err);
            feed(self,
                 [&](StateManager& core) { core.on_replica_start_failed(id, status.message()); });
          });
}

void spawn_replica(controller_actor* self, const caf::actor& agent, const Command& cmd) {
  auto id = cmd.replica_id;
  auto version = cmd.version;
  auto node = cmd.node_id;
  self->request(agent, seconds_as(self->state.options.request_timeout_s), spawn_replica_atom::value,
                wire_spec(cmd))
      .then(
          [=](const caf::actor& handle) {
            remember_replica(self, id, node, handle);
            initialize_replica(self, id, version);
          },
          [=](caf::error& err) {
            auto status = from_caf_error(err);
            feed(self, [&](StateManager& core) {
              core.on_replica_start_failed(id, "spawn on " + node + " failed: " + status.message());
            });
          });
}

void reconfigure_replica(controller_actor* self, const caf::actor& replica, const Command& cmd) {
  auto id = cmd.replica_id;
  auto version = cmd.version;
  self->request(replica, caf::infinite, reconfigure_atom::value, cmd.version.user_config)
      .then(
          [=](const ReplicaMetadata&) {
            feed(self, [&](StateManager& core) { core.on_replica_ready(id, version); });
          },
          [=](caf::error& err) {
            auto status = from_caf_error(err);
            feed(self,
                 [&](StateManager& core) { core.on_replica_start_failed(id, status.message()); });
          });
}

void check_replica_health(controller_actor* self, const caf::actor& replica, const Command& cmd) {
  auto id = cmd.replica_id;
  auto seq = cmd.check_seq;
  // The core times checks out itself (health_check_timeout_s); this bound
  // only keeps the request from living forever.
  self->request(replica, seconds_as(600), health_atom::value)
      .then([=](caf::ok_atom) { self->state.core->on_health_check_result(id, true, seq); },
            [=](caf::error& err) {
              self->state.log->info("health check of {} failed: {}", id,
                                    from_caf_error(err).message());
              self->state.core->on_health_check_result(id, false, seq);
            });
}

void query_replica_version(controller_actor* self, const caf::actor& replica, const Command& cmd) {
  auto id = cmd.replica_id;
  self->request(replica, seconds_as(self->state.options.request_timeout_s), version_atom::value)
      .then(
          [=](const ReplicaMetadata& m) {
            set_started_at(self->state, id, m.start_time);
            feed(self, [&](StateManager& core) {
              core.on_replica_ready(id, ReplicaVersion{m.code_version, m.user_config});
            });
          },
          [=](caf::error&) {
            feed(self, [&](StateManager& core) { core.on_replica_crashed(id); });
          });
}

// The agent stops (or kills) the replica process; if it cannot, the replica
// actor gets an exit(kill).
void stop_via_agent(controller_actor* self, const caf::actor& agent, const caf::actor& replica,
                    const Command& cmd) {
  auto timeout = seconds_as(self->state.options.request_timeout_s);
  auto on_error = [=](caf::error&) { self->send_exit(replica, caf::exit_reason::kill); };
  if (cmd.kind == CommandKind::stop) {
    self->request(agent, timeout, stop_atom::value, cmd.replica_id, cmd.timeout_s)
        .then([](caf::ok_atom) {}, on_error);
  } else {
    self->request(agent, timeout, kill_replica_atom::value, cmd.replica_id)
        .then([](caf::ok_atom) {}, on_error);
  }
}

void execute(controller_actor* self, const Command& cmd) {
  auto& st = self->state;
  const std::string& id = cmd.replica_id;
  caf::actor agent = agent_of(st, cmd.node_id);
  auto replica_it = st.replicas.find(id);
  caf::actor replica = replica_it == st.replicas.end() ? caf::actor{} : replica_it->second.handle;
  if ((cmd.kind == CommandKind::stop || cmd.kind == CommandKind::kill) &&
      replica_it != st.replicas.end())
    replica_it->second.stopping = true;
  switch (plan_command(cmd, static_cast<bool>(agent), static_cast<bool>(replica))) {
    case CommandAction::spawn:
      return spawn_replica(self, agent, cmd);
    case CommandAction::no_agent:
      st.core->on_replica_start_failed(id, "node " + cmd.node_id + " has no agent connected");
      return;
    case CommandAction::reconfigure:
      return reconfigure_replica(self, replica, cmd);
    case CommandAction::check_health:
      return check_replica_health(self, replica, cmd);
    case CommandAction::query_version:
      return query_replica_version(self, replica, cmd);
    case CommandAction::replica_gone:
      st.core->on_replica_crashed(id);
      return;
    case CommandAction::already_gone:
      forget_replica(st, id);
      st.core->on_replica_stopped(id);
      return;
    case CommandAction::exit_replica:
      // Its node is gone; so is the replica once the connection is.
      self->send_exit(replica, caf::exit_reason::kill);
      return;
    case CommandAction::stop_via_agent:
    case CommandAction::kill_via_agent:
      return stop_via_agent(self, agent, replica, cmd);
  }
}

// ---------------------------------------------------------------- snapshots

RoutingSnapshot to_wire(const ControllerState& st, const SnapshotDelta& d) {
  auto handle_of = [&](const std::string& id) {
    auto it = st.replicas.find(id);
    return it == st.replicas.end() ? caf::actor{} : it->second.handle;
  };
  return render_snapshot(d, st.core->target_state(), st.membership, st.request_timeout_s,
                         handle_of);
}

void publish(controller_actor* self) {
  auto& st = self->state;
  for (auto& [key, sub] : st.subscribers) {
    if (auto delta = st.core->changes_since(sub.last)) {
      self->send(sub.handle, snapshot_atom::value, to_wire(st, *delta));
      sub.last = delta->id;
    }
  }
}

// ---------------------------------------------------------------- proxies

// Acts on a settled proxy check: logs what changed and kills a proxy that
// just became UNHEALTHY (its node's keeper starts a fresh one, which
// subscribes again).
void settle_proxy_check(controller_actor* self, ProxyHealthMonitor::Key key,
                        const caf::error* err) {
  auto& st = self->state;
  auto out = st.proxies->settle(key, err == nullptr);
  std::string why = err ? from_caf_error(*err).message() : std::string();
  switch (out.verdict) {
    case ProxyVerdict::gone:
    case ProxyVerdict::healthy:
    case ProxyVerdict::still_unhealthy:
      return;
    case ProxyVerdict::recovered:
      st.log->info("proxy of node {} is HEALTHY again", out.node_id);
      return;
    case ProxyVerdict::failed:
      st.log->warn("proxy of node {} failed a health check ({} of {}): {}", out.node_id,
                   out.failures, st.options.proxy_unhealthy_after, why);
      return;
    case ProxyVerdict::became_unhealthy:
      st.log->warn(
          "proxy of node {} is UNHEALTHY after {} failed health checks ({}); "
          "restarting it",
          out.node_id, out.failures, why);
      if (auto it = st.subscribers.find(key); it != st.subscribers.end())
        self->send_exit(it->second.handle, caf::exit_reason::kill);
      return;
  }
}

// Health-checks every proxy whose check is due.
void check_proxies(controller_actor* self) {
  auto& st = self->state;
  for (auto key : st.proxies->start_due_checks()) {
    auto it = st.subscribers.find(key);
    if (it == st.subscribers.end())
      continue;  // tracked together: cannot happen
    self->request(it->second.handle, seconds_as(st.options.proxy_health_timeout_s),
                  health_atom::value)
        .then([=](caf::ok_atom) { settle_proxy_check(self, key, nullptr); },
              [=](caf::error& err) { settle_proxy_check(self, key, &err); });
  }
}

void add_subscriber(controller_actor* self, const caf::actor& subscriber, SnapshotId last,
                    const std::string& node_id) {
  auto& st = self->state;
  self->monitor(subscriber);
  auto [it, fresh] = st.subscriber_of.emplace(subscriber.address(), st.next_subscriber_key);
  if (fresh)
    ++st.next_subscriber_key;  // a new proxy: a fresh health record
  st.subscribers[it->second] = Subscriber{subscriber, last};
  st.proxies->track(it->second, node_id);
}

// False when `addr` was no subscriber.
bool remove_subscriber(ControllerState& st, const caf::actor_addr& addr) {
  auto it = st.subscriber_of.find(addr);
  if (it == st.subscriber_of.end())
    return false;
  st.subscribers.erase(it->second);
  st.proxies->forget(it->second);
  st.subscriber_of.erase(it);
  return true;
}

// ---------------------------------------------------------------- reconcile

// Logs every change of a deployment's status: the operator's event trail.
void log_status_changes(ControllerState& st) {
  for (const auto& c : st.status_log.observe(*st.core))
    st.log->log(c.warn ? spdlog::level::warn : spdlog::level::info, "{}", c.describe());
}

void reconcile(controller_actor* self) {
  auto& st = self->state;
  if (st.recovering())
    return;
  auto commands = st.core->update();
  for (const auto& cmd : commands)
    execute(self, cmd);
  log_status_changes(st);
  publish(self);
}

// After a change of membership: the core learns of it and acts.
void nodes_changed(controller_actor* self) {
  if (self->state.recovering())
    return;
  push_nodes(self->state);
  reconcile(self);
}

// ---------------------------------------------------------------- recovery

void finish_recovery(controller_actor* self) {
  auto& st = self->state;
  if (!st.recovering())
    return;
  push_nodes(st);
  auto status = st.core->recover(st.recovery->collected());
  if (!status) {
    st.log->critical("cannot recover: {}", status.to_string());
    self->quit(to_caf_error(status));
    return;
  }
  st.log->info("recovered {} applications; adopted {} replicas",
               st.core->target_state().applications.size(), st.recovery->collected().size());
  st.recovery->finish();
  save_live_nodes(st);
  reconcile(self);
}

// During recovery: once every node that was alive before has registered
// again, there is nothing more to wait for.
void maybe_end_recovery_early(controller_actor* self) {
  auto& st = self->state;
  if (!st.recovery->all_expected_back(st.membership.nodes()))
    return;
  st.log->info("every node known before the restart has registered again");
  finish_recovery(self);
}

// What every deploy call (one application or a whole config) must pass
// before its bytes are even decoded: the caller's role, a recovered
// controller, and the config size limit. The core checks the replica limits.
// `signed_too`: further arguments the credential signs after the record.
Status admit_deploy(const ControllerState& st, const Credential& cred, const std::string& encoded,
                    const std::vector<std::string>& signed_too = {}) {
  std::vector<std::string> args = {encoded};
  args.insert(args.end(), signed_too.begin(), signed_too.end());
  if (auto s = check_request(st.options.ca_pem, cred, "deploy", args); !s)
    return s;
  if (auto s = st.recovery->require_ready(); !s)
    return s;
  return check_config_size(encoded.size(), st.options.limits);
}

// ---------------------------------------------------------------- node calls

caf::result<hello_atom, uint32_t, std::string> on_hello(uint32_t version) {
  if (version != kProtocolVersion) {
    return to_caf_error(
        Status(errc::version_mismatch, "the controller speaks protocol version " +
                                           std::to_string(kProtocolVersion) + ", the caller " +
                                           std::to_string(version) + "; upgrade one of them"));
  }
  return {hello_atom::value, kProtocolVersion, std::string("controller")};
}

// Everything a registration must pass before anything changes: the caller's
// credential, the protocol version, the node id, its resources, an agent.
Result<NodeRecord> admit_node(const ControllerState& st, const troupe::NodeInfo& info,
                              const caf::actor& agent, const Credential& cred) {
  if (auto s = check_request(st.options.ca_pem, cred, "register", {info.id}, info.id); !s) {
    st.log->warn("refused registration of node {} (pid {}): {}", info.id, info.pid, s.message());
    return s;
  }
  if (info.protocol_version != kProtocolVersion) {
    st.log->error("refused node {} (pid {}): protocol version {}, controller speaks {}", info.id,
                  info.pid, info.protocol_version, kProtocolVersion);
    return Status(errc::version_mismatch,
                  "the controller speaks protocol version " + std::to_string(kProtocolVersion) +
                      ", node '" + info.id + "' speaks " + std::to_string(info.protocol_version));
  }
  if (auto s = validate_node_id(info.id); !s)
    return s;
  auto resources = parse_resources(info.resources);
  if (!resources)
    return resources.status();
  if (!agent)
    return Status(errc::invalid_argument, "no agent handle given");
  NodeRecord rec;
  rec.id = info.id;
  rec.host = info.host;
  rec.http_port = info.http_port;
  rec.resources = *resources;
  rec.pid = info.pid;
  return rec;
}

// `agent` is now the node's agent; an older one of the node is forgotten.
void attach_agent(controller_actor* self, const std::string& node, const caf::actor& agent,
                  uint64_t incarnation) {
  auto& st = self->state;
  for (auto it = st.agents.begin(); it != st.agents.end();) {
    if (it->second.node_id == node && it->first != agent.address()) {
      it = st.agents.erase(it);
    } else {
      ++it;
    }
  }
  st.agents[agent.address()] = AgentRef{node, incarnation};
  st.agent_of[node] = agent;
  self->monitor(agent);
}

// Remembers the replicas a registering node hosts and returns those for the
// core to adopt (while recovering: those not collected yet).
std::vector<HostedReplica> take_hosted(controller_actor* self, const std::string& node,
                                       const std::vector<HostedReplicaInfo>& hosted) {
  auto& st = self->state;
  std::vector<HostedReplica> adopt;
  for (const auto& h : hosted) {
    if (!h.handle)
      continue;
    auto known = st.replicas.find(h.replica_id);
    if (known == st.replicas.end() || known->second.handle != h.handle) {
      remember_replica(self, h.replica_id, node, h.handle);
      st.replicas[h.replica_id].stopping = h.stopping;
    } else if (st.recovering()) {
      continue;  // already collected for the recovery
    }
    // Also a replica whose handle is known: the core may have given it up
    // while its node was DEAD (it still runs there). The core ignores the
    // replicas it still tracks; the others it adopts, and stops if the
    // deployment is above target meanwhile.
    adopt.push_back({h.replica_id, h.app, h.deployment, node, h.stopping});
  }
  return adopt;
}

caf::result<uint64_t> on_register(controller_actor* self, const troupe::NodeInfo& info,
                                  const caf::actor& agent,
                                  const std::vector<HostedReplicaInfo>& hosted,
                                  const Credential& cred) {
  auto& st = self->state;
  auto rec = admit_node(st, info, agent, cred);
  if (!rec)
    return to_caf_error(rec.status());
  bool known = st.membership.nodes().count(info.id) > 0;
  uint64_t incarnation = st.membership.register_node(std::move(*rec), st.now());
  attach_agent(self, info.id, agent, incarnation);
  st.log->info("node {} {} (pid {}, {}:{}, {}, {} replicas)", info.id,
               known ? "re-registered" : "registered", info.pid, info.host, info.http_port,
               info.resources, hosted.size());
  auto adopt = take_hosted(self, info.id, hosted);
  if (st.recovering()) {
    st.recovery->collect(std::move(adopt));
    maybe_end_recovery_early(self);
  } else {
    push_nodes(st);
    if (!adopt.empty())
      st.core->adopt_replicas(adopt);
    reconcile(self);
  }
  return incarnation;
}

caf::result<caf::ok_atom> on_heartbeat(controller_actor* self, const std::string& id,
                                       const Credential& cred) {
  auto& st = self->state;
  if (auto s = check_request(st.options.ca_pem, cred, "heartbeat", {id}, id); !s)
    return to_caf_error(s);
  if (auto s = st.membership.heartbeat(id, st.now()); !s)
    return to_caf_error(s);
  return caf::ok_atom::value;
}

caf::result<caf::ok_atom> on_deregister(controller_actor* self, const std::string& id,
                                        const Credential& cred) {
  auto& st = self->state;
  if (auto s = check_request(st.options.ca_pem, cred, "deregister", {id}, id); !s)
    return to_caf_error(s);
  if (auto s = st.membership.deregister(id); !s)
    return to_caf_error(s);
  for (auto it = st.agents.begin(); it != st.agents.end();) {
    if (it->second.node_id == id) {
      self->demonitor(it->first);
      it = st.agents.erase(it);
    } else {
      ++it;
    }
  }
  st.agent_of.erase(id);
  st.log->info("node {} left the cluster", id);
  nodes_changed(self);
  return caf::ok_atom::value;
}

caf::result<caf::ok_atom> on_drain(controller_actor* self, const std::string& id,
                                   const Credential& cred) {
  auto& st = self->state;
  if (auto s = check_request(st.options.ca_pem, cred, "drain", {id}); !s)
    return to_caf_error(s);
  if (auto s = st.membership.drain(id); !s)
    return to_caf_error(s);
  st.log->warn("node {} is DRAINING (operator request)", id);
  nodes_changed(self);
  return caf::ok_atom::value;
}

// ---------------------------------------------------------------- user calls

caf::result<bool, uint64_t> on_deploy(controller_actor* self, const std::string& encoded,
                                      const Credential& cred) {
  auto& st = self->state;
  if (auto s = admit_deploy(st, cred, encoded); !s)
    return to_caf_error(s);
  auto app = decode_application(encoded);
  if (!app)
    return to_caf_error(app.status());
  auto result = st.core->deploy_application(*app);
  if (!result) {
    st.log->warn("deploy of {} refused: {}", app->name, result.status().to_string());
    return to_caf_error(result.status());
  }
  st.log->info("deploy of {}: {} (generation {})", app->name,
               result->changed ? "accepted" : "unchanged", result->generation);
  reconcile(self);
  return {result->changed, result->generation};
}

// `if_generation`: optimistic concurrency (troupectl deploy --if-generation);
// its credential signs the generation too.
caf::result<std::string> on_apply(controller_actor* self, const std::string& encoded,
                                  double request_timeout_s, const Credential& cred,
                                  std::optional<uint64_t> if_generation = std::nullopt) {
  auto& st = self->state;
  std::vector<std::string> signed_too;
  if (if_generation)
    signed_too.push_back(std::to_string(*if_generation));
  if (auto s = admit_deploy(st, cred, encoded, signed_too); !s)
    return to_caf_error(s);
  auto declared = decode_target_state(encoded);
  if (!declared)
    return to_caf_error(declared.status());
  bool changed = false;
  auto results = st.core->apply(*declared, &changed, if_generation);
  if (!results) {
    st.log->warn("deploy refused: {}", results.status().to_string());
    return to_caf_error(results.status());
  }
  auto generation = st.core->target_state().generation;
  st.log->info("deploy of {} applications: {} (generation {})", declared->applications.size(),
               changed ? "accepted" : "unchanged", generation);
  if (request_timeout_s != st.request_timeout_s) {
    st.request_timeout_s = request_timeout_s;
    for (auto& [key, sub] : st.subscribers)
      sub.last = SnapshotId{};  // push in full
  }
  reconcile(self);
  return render_apply_result(*results, changed, generation).dump();
}

caf::result<caf::ok_atom> on_delete(controller_actor* self, const std::string& app,
                                    const Credential& cred) {
  auto& st = self->state;
  if (auto s = check_request(st.options.ca_pem, cred, "delete", {app}); !s)
    return to_caf_error(s);
  if (auto s = st.recovery->require_ready(); !s)
    return to_caf_error(s);
  if (auto s = st.core->delete_application(app); !s)
    return to_caf_error(s);
  st.log->info("application {} is being deleted", app);
  reconcile(self);
  return caf::ok_atom::value;
}

// One deployment of an application (troupectl delete APP/DEPLOYMENT).
caf::result<caf::ok_atom> on_delete_deployment(controller_actor* self, const std::string& app,
                                               const std::string& deployment,
                                               const Credential& cred) {
  auto& st = self->state;
  if (auto s = check_request(st.options.ca_pem, cred, "delete", {app, deployment}); !s)
    return to_caf_error(s);
  if (auto s = st.recovery->require_ready(); !s)
    return to_caf_error(s);
  if (auto s = st.core->delete_deployment(app, deployment); !s) {
    st.log->warn("delete of {}/{} refused: {}", app, deployment, s.to_string());
    return to_caf_error(s);
  }
  st.log->info("deployment {}/{} is being deleted", app, deployment);
  reconcile(self);
  return caf::ok_atom::value;
}

// troupectl scale APP/DEPLOYMENT N: the core refuses autoscaled deployments.
caf::result<bool, uint64_t> on_scale(controller_actor* self, const std::string& app,
                                     const std::string& deployment, uint32_t replicas,
                                     const Credential& cred) {
  auto& st = self->state;
  if (auto s = check_request(st.options.ca_pem, cred, "deploy",
                             {app, deployment, std::to_string(replicas)});
      !s)
    return to_caf_error(s);
  if (auto s = st.recovery->require_ready(); !s)
    return to_caf_error(s);
  auto result = st.core->scale_deployment(app, deployment, replicas);
  if (!result) {
    st.log->warn("scale of {}/{} refused: {}", app, deployment, result.status().to_string());
    return to_caf_error(result.status());
  }
  st.log->info("scale of {}/{} to {} replicas: {} (generation {})", app, deployment, replicas,
               result->changed ? "accepted" : "unchanged", result->generation);
  reconcile(self);
  return {result->changed, result->generation};
}

// troupectl traffic APP NAME=W ...: the split changes without a redeploy;
// reconcile() publishes the new routes to every proxy at once.
caf::result<uint64_t> on_traffic(controller_actor* self, const std::string& app,
                                 const TrafficWeights& weights, const Credential& cred) {
  auto& st = self->state;
  if (auto s = check_request(st.options.ca_pem, cred, "deploy", traffic_args(app, weights)); !s)
    return to_caf_error(s);
  if (auto s = st.recovery->require_ready(); !s)
    return to_caf_error(s);
  std::map<std::string, double> split;
  for (const auto& [name, weight] : weights) {
    if (!split.emplace(name, weight).second) {
      return to_caf_error(Status(errc::invalid_argument, "applications[" + app + "].traffic[" +
                                                             name + "]: given more than once"));
    }
  }
  auto generation = st.core->set_traffic(app, split);
  if (!generation) {
    st.log->warn("traffic of {} refused: {}", app, generation.status().to_string());
    return to_caf_error(generation.status());
  }
  std::string shown;
  for (const auto& [name, weight] : split)
    shown += (shown.empty() ? "" : " ") + name + "=" + std::to_string(weight);
  st.log->info("traffic of {} is now {} (generation {})", app, shown, *generation);
  reconcile(self);
  return *generation;
}

caf::result<caf::ok_atom> on_shutdown(controller_actor* self, bool nodes, const Credential& cred) {
  auto& st = self->state;
  if (auto s = check_request(st.options.ca_pem, cred, "shutdown", {nodes ? "nodes" : ""}); !s)
    return to_caf_error(s);
  if (auto s = st.recovery->require_ready(); !s)
    return to_caf_error(s);
  if (auto s = st.core->shutdown(); !s)
    return to_caf_error(s);
  st.log->warn("shutdown requested: deleting every application{}",
               nodes ? ", then stopping every node" : "");
  st.stop_nodes_when_empty = nodes;
  reconcile(self);
  return caf::ok_atom::value;
}

// The chaos primitive: an exit(kill) to one actor, or the controller itself.
caf::result<caf::ok_atom> on_kill(controller_actor* self, const std::string& kind,
                                  const std::string& id, const Credential& cred) {
  auto& st = self->state;
  if (auto s = check_request(st.options.ca_pem, cred, "kill", {kind, id}); !s)
    return to_caf_error(s);
  auto not_found = [&](const std::string& what) {
    return to_caf_error(Status(errc::not_found, "no " + what + " '" + id + "'"));
  };
  caf::actor target;
  if (kind == "replica") {
    auto it = st.replicas.find(id);
    if (it == st.replicas.end())
      return not_found("replica");
    st.log->warn("killing replica {} on operator request", id);
    target = it->second.handle;
  } else if (kind == "agent") {
    target = agent_of(st, id);
    if (!target)
      return not_found("node agent of node");
    st.log->warn("killing the node agent of {} on operator request", id);
  } else if (kind == "proxy") {
    auto key = st.proxies->proxy_of(id);
    if (!key)
      return not_found("proxy on node");
    st.log->warn("killing the proxy of {} on operator request", id);
    target = st.subscribers.at(*key).handle;
  } else if (kind == "controller") {
    st.log->warn("controller killed on operator request");
    self->quit(caf::exit_reason::kill);
    return caf::ok_atom::value;
  } else {
    return to_caf_error(
        Status(errc::invalid_argument,
               "kill: unknown kind '" + kind + "'; expected replica, proxy, agent or controller"));
  }
  self->send_exit(target, caf::exit_reason::kill);
  return caf::ok_atom::value;
}

// ---------------------------------------------------------------- queries

std::string on_status(const ControllerState& st) {
  auto started_at = [&](const std::string& id) {
    auto it = st.replicas.find(id);
    return it == st.replicas.end() ? 0.0 : it->second.started_at;
  };
  return render_status(st.core.get(), st.recovering(), started_at).dump();
}

caf::result<RoutingSnapshot> on_snapshot(const ControllerState& st, uint64_t epoch, uint64_t seq) {
  if (auto s = st.recovery->require_ready(); !s)
    return to_caf_error(s);
  auto delta = st.core->changes_since(SnapshotId{epoch, seq});
  if (!delta) {
    RoutingSnapshot same;
    same.epoch = epoch;
    same.seq = seq;
    return same;
  }
  return to_wire(st, *delta);
}

caf::result<std::string> on_config(const ControllerState& st) {
  if (auto s = st.recovery->require_ready(); !s)
    return to_caf_error(s);
  return encode_target_state(st.core->target_state());
}

// ---------------------------------------------------------------- reports

void on_replica_metrics(controller_actor* self, const std::string& replica, double ongoing) {
  auto& st = self->state;
  st.ongoing[replica] = ongoing;
  if (!st.recovering())
    st.core->record_replica_metrics(replica, ongoing);
}

// A proxy's (or handle's) view of one deployment: the only signal when it has
// no replica (scale from zero).
void on_handle_metrics(controller_actor* self, const std::string& reporter, const std::string& app,
                       const std::string& deployment, double queued_and_inflight) {
  auto& st = self->state;
  if (st.recovering())
    return;
  DeploymentId id{app, deployment};
  st.core->record_handle_metrics(reporter, id, queued_and_inflight);
  if (queued_and_inflight > 0 && st.core->replicas(id).empty())
    reconcile(self);  // cold start now, not at the next tick
}

void on_tick(controller_actor* self) {
  auto& st = self->state;
  auto ts = st.membership.check(st.now());
  log_transitions(st, ts);
  check_proxies(self);
  if (st.recovery->window_over())
    finish_recovery(self);  // also ended by the window's own message; whichever comes first
  if (st.recovering())
    return;
  if (!ts.empty())
    push_nodes(st);
  reconcile(self);
  if (st.stop_nodes_when_empty && st.core->is_shut_down()) {
    st.stop_nodes_when_empty = false;
    st.log->warn("every replica is gone; stopping {} nodes", st.agent_of.size());
    for (auto& [node, agent] : st.agent_of)
      self->send(agent, stop_node_atom::value);
  }
}

// ---------------------------------------------------------------- down

// `id` by value: forget_replica() erases the map entry a reference would point into.
void replica_down(controller_actor* self, std::string id, const caf::error& reason) {
  auto& st = self->state;
  bool stopping = st.replicas[id].stopping;
  forget_replica(st, id);
  if (st.recovering())
    return;
  if (stopping) {
    st.core->on_replica_stopped(id);
  } else {
    // A replica process's handle ends with the cause of its exit ("replica X
    // exited: killed by SIGSEGV"): that is the status message.
    std::string cause;
    if (reason.category() == kErrorCategory)
      cause = from_caf_error(reason).message();
    st.log->warn("replica {} went down: {}", id,
                 cause.empty() ? self->home_system().render(reason) : cause);
    st.core->on_replica_crashed(id, cause);
  }
  reconcile(self);
}

void agent_down(controller_actor* self, const caf::actor_addr& addr, const caf::error& reason) {
  auto& st = self->state;
  auto it = st.agents.find(addr);
  AgentRef ref = it->second;
  st.log->warn("lost the node agent of {}: {}", ref.node_id, self->home_system().render(reason));
  st.agent_of.erase(ref.node_id);
  st.agents.erase(it);
  if (reason != caf::exit_reason::remote_link_unreachable) {
    // The agent actor died but the connection to its node did not: the node
    // process lives and restarts its agent, which registers again with the
    // replicas it hosts (they keep serving meanwhile). Only the heartbeat
    // timeout declares the node DEAD if no agent comes back.
    st.log->info("node {} still connected; waiting for its new agent (node timeout {:.1f} s)",
                 ref.node_id, st.membership.node_timeout_s());
    return;
  }
  auto ts = st.membership.connection_lost(ref.node_id, ref.incarnation, st.now());
  log_transitions(st, ts);
  if (!ts.empty())
    nodes_changed(self);
}

void on_down(controller_actor* self, const caf::down_msg& dm) {
  auto& st = self->state;
  if (auto it = st.replica_of.find(dm.source); it != st.replica_of.end())
    return replica_down(self, it->second, dm.reason);
  if (remove_subscriber(st, dm.source))
    return;
  if (st.agents.count(dm.source) > 0)
    agent_down(self, dm.source, dm.reason);
}

// ---------------------------------------------------------------- startup

void init_state(controller_actor* self, const ControllerOptions& options,
                std::shared_ptr<CheckpointStore> store, std::shared_ptr<const Clock> clock) {
  auto& st = self->state;
  st.options = options;
  st.clock = clock ? std::move(clock) : std::make_shared<SteadyClock>();
  st.membership = Membership(options.node_timeout_s);
  std::random_device rd;
  uint64_t seed = (uint64_t{rd()} << 32) | rd();
  st.rng = std::make_unique<SeededRandom>(seed);
  st.store = std::move(store);
  CoreOptions core_options;
  core_options.snapshot_epoch = seed | 1;
  // Replica ids stay unique across controller incarnations: a restarted
  // controller must not reuse an id a not-yet-reported replica still holds.
  char tag[16];
  std::snprintf(tag, sizeof(tag), "%06x", static_cast<unsigned>(seed >> 40) & 0xffffff);
  core_options.replica_id_tag = tag;
  core_options.limits = options.limits;
  st.core = std::make_unique<StateManager>(*st.store, *st.clock, *st.rng, core_options);
  st.proxies = std::make_unique<ProxyHealthMonitor>(
      *st.clock, ProxyHealthOptions{options.proxy_health_period_s, options.proxy_unhealthy_after});
  st.nodes_file = std::make_unique<NodesFile>(options.state_dir);
}

// Nothing to recover: reconcile at once. Otherwise give nodes a window to
// re-register and report the replicas they host.
void start_recovery(controller_actor* self) {
  auto& st = self->state;
  auto saved = st.store->load();
  bool empty = saved.has_value() && !saved->has_value();
  auto expected = empty ? std::set<std::string>{} : st.nodes_file->load();
  st.recovery = std::make_unique<RecoveryGate>(*st.clock, st.options.recovery_window_s, expected);
  if (empty) {
    finish_recovery(self);
    return;
  }
  st.log->info(
      "checkpoint found; collecting hosted replicas from {} known nodes for at most {:.1f} s",
      expected.size(), st.options.recovery_window_s);
  self->delayed_send(self, seconds_as(st.options.recovery_window_s), recover_atom::value);
}

caf::behavior controller(controller_actor* self, ControllerOptions options,
                         std::shared_ptr<CheckpointStore> store,
                         std::shared_ptr<const Clock> clock) {
  init_state(self, options, std::move(store), std::move(clock));
  start_recovery(self);
  self->set_down_handler([=](const caf::down_msg& dm) { on_down(self, dm); });
  auto tick = seconds_as(options.tick_interval_s);
  self->delayed_send(self, tick, tick_atom::value);
  self->state.log->info("controller started (node timeout {:.1f} s)", options.node_timeout_s);
  return {
      [=](hello_atom, uint32_t version) { return on_hello(version); },
      [=](register_atom, const troupe::NodeInfo& info, const caf::actor& agent,
          const std::vector<HostedReplicaInfo>& hosted,
          const Credential& cred) { return on_register(self, info, agent, hosted, cred); },
      [=](heartbeat_atom, const std::string& id, const Credential& cred) {
        return on_heartbeat(self, id, cred);
      },
      [=](deregister_atom, const std::string& id, const Credential& cred) {
        return on_deregister(self, id, cred);
      },
      [=](nodes_atom) {
        auto& st = self->state;
        return render_nodes(st.membership, *st.proxies, st.now());
      },
      [=](drain_atom, const std::string& id, const Credential& cred) {
        return on_drain(self, id, cred);
      },
      [=](deploy_atom, const std::string& encoded, const Credential& cred) {
        return on_deploy(self, encoded, cred);
      },
      [=](delete_atom, const std::string& app, const Credential& cred) {
        return on_delete(self, app, cred);
      },
      [=](status_atom) { return on_status(self->state); },
      [=](snapshot_atom, uint64_t epoch, uint64_t seq) {
        return on_snapshot(self->state, epoch, seq);
      },
      [=](subscribe_atom, const caf::actor& subscriber, uint64_t epoch, uint64_t seq,
          const std::string& node_id) {
        // The first push (or nothing, when the subscriber is current) follows
        // at once; later ones whenever the published view changes.
        if (!subscriber)
          return;
        add_subscriber(self, subscriber, SnapshotId{epoch, seq}, node_id);
        if (!self->state.recovering())
          publish(self);
      },
      [=](apply_atom, const std::string& encoded, double request_timeout_s,
          const Credential& cred) { return on_apply(self, encoded, request_timeout_s, cred); },
      [=](config_atom) { return on_config(self->state); },
      [=](delete_atom, const std::string& app, const std::string& deployment,
          const Credential& cred) { return on_delete_deployment(self, app, deployment, cred); },
      [=](traffic_atom, const std::string& app, const TrafficWeights& weights,
          const Credential& cred) { return on_traffic(self, app, weights, cred); },
      [=](scale_atom, const std::string& app, const std::string& deployment, uint32_t replicas,
          const Credential& cred) { return on_scale(self, app, deployment, replicas, cred); },
      [=](apply_atom, const std::string& encoded, double request_timeout_s,
          uint64_t if_generation, const Credential& cred) {
        return on_apply(self, encoded, request_timeout_s, cred, if_generation);
      },
      [=](shutdown_atom, bool nodes, const Credential& cred) {
        return on_shutdown(self, nodes, cred);
      },
      [=](kill_atom, const std::string& kind, const std::string& id, const Credential& cred) {
        return on_kill(self, kind, id, cred);
      },
      [=](metrics_atom, const std::string&, const std::string& replica, double ongoing) {
        on_replica_metrics(self, replica, ongoing);
      },
      [=](metrics_atom, const std::string& reporter, const std::string& app,
          const std::string& deployment, double queued_and_inflight) {
        on_handle_metrics(self, reporter, app, deployment, queued_and_inflight);
      },
      [=](recover_atom) { finish_recovery(self); },
      [=](tick_atom) {
        on_tick(self);
        self->delayed_send(self, tick, tick_atom::value);
      },
  };
}

}  // namespace

Result<std::unique_ptr<CheckpointStore>> open_checkpoint(const std::string& state_dir) {
  auto path = state_dir + "/checkpoint";
  auto store = RocksCheckpointStore::open(path);
  if (!store)
    return store.status();
  auto loaded = (*store)->load();
  if (!loaded)
    return loaded.status();
  return std::unique_ptr<CheckpointStore>(std::move(store.value()));
}

caf::actor spawn_controller(caf::actor_system& sys, const ControllerOptions& options,
                            std::shared_ptr<CheckpointStore> store,
                            std::shared_ptr<const Clock> clock) {
  return sys.spawn(controller, options, std::move(store), std::move(clock));
}

}  // namespace troupe::controller
