#include "controller/controller_actor.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "controller/core/state_manager.hpp"
#include "controller/membership.hpp"
#include "controller/store/codec.hpp"
#include "controller/store/rocks_checkpoint_store.hpp"
#include "runtime/address.hpp"
#include "runtime/auth.hpp"
#include "runtime/log.hpp"
#include "runtime/wire.hpp"

namespace troupe::controller {

namespace {

caf::timespan seconds(double s) {
  return std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(s));
}

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

struct ControllerState {
  ControllerOptions options;
  Membership membership{5.0};
  SteadyClock clock;
  std::unique_ptr<SeededRandom> rng;
  std::shared_ptr<CheckpointStore> store;
  std::unique_ptr<StateManager> core;
  bool recovering = true;
  std::vector<HostedReplica> hosted_during_recovery;
  // Nodes that were alive before the restart; recovery ends early once all
  // of them registered again.
  std::set<std::string> expected_nodes;
  std::string written_nodes;                             // last content of <state_dir>/nodes
  std::unordered_map<caf::actor_addr, AgentRef> agents;  // monitored agent -> node
  std::unordered_map<std::string, caf::actor> agent_of;  // node id -> agent
  std::unordered_map<std::string, ReplicaRef> replicas;  // replica id -> handle
  std::unordered_map<caf::actor_addr, std::string> replica_of;
  // Latest ongoing-requests report per replica (for autoscaling and status).
  std::unordered_map<std::string, double> ongoing;
  // Pushed a snapshot whenever the published view changes.
  struct Subscriber {
    caf::actor handle;
    SnapshotId last;
    std::string node_id;
    // Health checks of the proxy (see ControllerOptions).
    std::string health = "STARTING";  // until its first answer
    double next_check = 0;
    bool checking = false;
    uint32_t failures = 0;
  };
  // From the deployed http_options; pushed to proxies with every snapshot.
  // Kept in memory only: after a controller restart it applies again with
  // the next deploy.
  double request_timeout_s = 0;
  // `troupectl shutdown --nodes`: stop the node processes once every replica
  // is gone.
  bool stop_nodes_when_empty = false;
  std::unordered_map<caf::actor_addr, Subscriber> subscribers;
  // Last logged status per deployment ("app/name"), to log transitions.
  std::unordered_map<std::string, DeploymentStatus> last_status;
  std::shared_ptr<spdlog::logger> log = troupe::log::get("controller");
  static inline const char* name = "troupe.controller";
};

using controller_actor = caf::stateful_actor<ControllerState>;

void log_transitions(ControllerState& st, const std::vector<NodeTransition>& ts) {
  for (const auto& t : ts) {
    st.log->warn("node {} {} -> {}: {}", t.id, to_string(t.from), to_string(t.to), t.reason);
  }
}

NodeStatus to_wire(const NodeRecord& n, double now) {
  NodeStatus s;
  s.id = n.id;
  s.address = n.host + ":" + std::to_string(n.http_port);
  s.state = to_string(n.state);
  s.resources = n.resources.to_string();
  s.last_heartbeat_age_ms = static_cast<int64_t>((now - n.last_heartbeat) * 1000);
  s.reason = n.reason;
  s.pid = n.pid;
  return s;
}

void save_live_nodes(ControllerState& st);

void push_nodes(ControllerState& st) {
  save_live_nodes(st);
  std::vector<controller::NodeInfo> view;
  for (const auto& [id, n] : st.membership.nodes())
    view.push_back({id, n.state, n.resources});
  st.core->set_nodes(view);
}

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

ReplicaSpec wire_spec(const Command& cmd) {
  ReplicaSpec spec;
  spec.replica_id = cmd.replica_id;
  spec.app = cmd.app;
  spec.deployment = cmd.deployment;
  spec.import_path = cmd.spec->import_path;
  spec.init_args = cmd.spec->init_args;
  spec.code_version = cmd.version.code;
  spec.user_config = cmd.version.user_config;
  spec.max_ongoing_requests = cmd.spec->config.max_ongoing_requests;
  spec.metrics_interval_s = cmd.spec->config.autoscaling_config
                                ? cmd.spec->config.autoscaling_config->metrics_interval_s
                                : 10.0;
  spec.isolation = to_string(cmd.spec->config.isolation);
  spec.memory_limit_bytes = cmd.spec->config.memory_limit_bytes;
  return spec;
}

void reconcile(controller_actor* self);

// The replica's outcome arrived: feed it to the core and act on it.
template <class F>
void feed(controller_actor* self, F&& event) {
  event(*self->state.core);
  reconcile(self);
}

void initialize_replica(controller_actor* self, const std::string& id, ReplicaVersion version) {
  auto& st = self->state;
  auto it = st.replicas.find(id);
  if (it == st.replicas.end())
    return;
  // Constructors may be slow; the core's slow-start logic watches the time.
  self->request(it->second.handle, caf::infinite, initialize_atom::value)
      .then(
          [=](const ReplicaMetadata& m) {
            auto it = self->state.replicas.find(id);
            if (it != self->state.replicas.end())
              it->second.started_at = m.start_time;
            feed(self, [&](StateManager& core) { core.on_replica_ready(id, version); });
          },
          [=](caf::error& err) {
            auto status = from_caf_error(err);
            feed(self,
                 [&](StateManager& core) { core.on_replica_start_failed(id, status.message()); });
          });
}

void execute(controller_actor* self, const Command& cmd) {
  auto& st = self->state;
  auto timeout = seconds(st.options.request_timeout_s);
  auto agent_it = st.agent_of.find(cmd.node_id);
  caf::actor agent = agent_it == st.agent_of.end() ? caf::actor{} : agent_it->second;
  auto replica_it = st.replicas.find(cmd.replica_id);
  caf::actor replica = replica_it == st.replicas.end() ? caf::actor{} : replica_it->second.handle;
  std::string id = cmd.replica_id;
  switch (cmd.kind) {
    case CommandKind::start: {
      if (!agent) {
        st.core->on_replica_start_failed(id, "node " + cmd.node_id + " has no agent connected");
        return;
      }
      auto version = cmd.version;
      auto node = cmd.node_id;
      self->request(agent, timeout, spawn_replica_atom::value, wire_spec(cmd))
          .then(
              [=](const caf::actor& handle) {
                remember_replica(self, id, node, handle);
                initialize_replica(self, id, version);
              },
              [=](caf::error& err) {
                auto status = from_caf_error(err);
                feed(self, [&](StateManager& core) {
                  core.on_replica_start_failed(id,
                                               "spawn on " + node + " failed: " + status.message());
                });
              });
      return;
    }
    case CommandKind::reconfigure: {
      if (!replica) {
        st.core->on_replica_crashed(id);
        return;
      }
      auto version = cmd.version;
      self->request(replica, caf::infinite, reconfigure_atom::value, cmd.version.user_config)
          .then(
              [=](const ReplicaMetadata&) {
                feed(self, [&](StateManager& core) { core.on_replica_ready(id, version); });
              },
              [=](caf::error& err) {
                auto status = from_caf_error(err);
                feed(self, [&](StateManager& core) {
                  core.on_replica_start_failed(id, status.message());
                });
              });
      return;
    }
    case CommandKind::check_health: {
      if (!replica) {
        st.core->on_replica_crashed(id);
        return;
      }
      // The core times checks out itself (health_check_timeout_s); this bound
      // only keeps the request from living forever.
      auto seq = cmd.check_seq;
      self->request(replica, seconds(600), health_atom::value)
          .then([=](caf::ok_atom) { self->state.core->on_health_check_result(id, true, seq); },
                [=](caf::error& err) {
                  self->state.log->info("health check of {} failed: {}", id,
                                        from_caf_error(err).message());
                  self->state.core->on_health_check_result(id, false, seq);
                });
      return;
    }
    case CommandKind::recover: {
      if (!replica) {
        st.core->on_replica_crashed(id);
        return;
      }
      self->request(replica, timeout, version_atom::value)
          .then(
              [=](const ReplicaMetadata& m) {
                auto it = self->state.replicas.find(id);
                if (it != self->state.replicas.end())
                  it->second.started_at = m.start_time;
                feed(self, [&](StateManager& core) {
                  core.on_replica_ready(id, ReplicaVersion{m.code_version, m.user_config});
                });
              },
              [=](caf::error&) {
                feed(self, [&](StateManager& core) { core.on_replica_crashed(id); });
              });
      return;
    }
    case CommandKind::stop:
    case CommandKind::kill: {
      if (replica_it != st.replicas.end())
        replica_it->second.stopping = true;
      if (!replica) {
        // Never spawned, or already gone.
        forget_replica(st, id);
        st.core->on_replica_stopped(id);
        return;
      }
      if (!agent) {
        // Its node is gone; so is the replica once the connection is.
        self->send_exit(replica, caf::exit_reason::kill);
        return;
      }
      if (cmd.kind == CommandKind::stop) {
        self->request(agent, timeout, stop_atom::value, id, cmd.timeout_s)
            .then([](caf::ok_atom) {},
                  [=](caf::error&) { self->send_exit(replica, caf::exit_reason::kill); });
      } else {
        self->request(agent, timeout, kill_replica_atom::value, id)
            .then([](caf::ok_atom) {},
                  [=](caf::error&) { self->send_exit(replica, caf::exit_reason::kill); });
      }
      return;
    }
  }
}

RoutingSnapshot to_wire(const ControllerState& st, const SnapshotDelta& d) {
  RoutingSnapshot out;
  out.epoch = d.id.epoch;
  out.seq = d.id.seq;
  out.full = d.full;
  out.routes_changed = d.routes_changed;
  out.request_timeout_s = st.request_timeout_s;
  for (const auto& r : d.routes)
    out.routes.push_back({r.prefix, r.app, r.ingress});
  for (const auto& dep : d.deployments) {
    DeploymentEndpoints e{dep.id.app, dep.id.name, {}, -1};
    auto app_it = st.core->target_state().applications.find(dep.id.app);
    if (app_it != st.core->target_state().applications.end()) {
      for (const auto& spec : app_it->second.deployments) {
        if (spec.name == dep.id.name)
          e.max_queued_requests = spec.config.max_queued_requests;
      }
    }
    for (const auto& r : dep.replicas) {
      auto it = st.replicas.find(r.replica_id);
      if (it == st.replicas.end() || !it->second.handle)
        continue;
      e.replicas.push_back({r.replica_id, r.node_id, r.max_ongoing_requests, it->second.handle});
    }
    out.deployments.push_back(std::move(e));
  }
  for (const auto& id : d.removed)
    out.removed.emplace_back(id.app, id.name);
  for (const auto& id : d.withheld)
    out.withheld.emplace_back(id.app, id.name);
  for (const auto& [id, n] : st.membership.nodes()) {
    if (n.state == NodeState::dead)
      out.dead_nodes.push_back(id);
  }
  return out;
}

void publish(controller_actor* self) {
  auto& st = self->state;
  for (auto& [addr, sub] : st.subscribers) {
    if (auto delta = st.core->changes_since(sub.last)) {
      self->send(sub.handle, snapshot_atom::value, to_wire(st, *delta));
      sub.last = delta->id;
    }
  }
}

// Health-checks every proxy whose check is due. A proxy that fails
// proxy_unhealthy_after checks in a row is UNHEALTHY and is killed: its node's
// keeper starts a fresh proxy actor, which subscribes again.
void check_proxies(controller_actor* self) {
  auto& st = self->state;
  double now = st.clock.now_s();
  for (auto& [addr, sub] : st.subscribers) {
    if (sub.checking || now < sub.next_check)
      continue;
    sub.checking = true;
    auto settle = [self, addr = addr](const caf::error* err) {
      auto& st = self->state;
      auto it = st.subscribers.find(addr);
      if (it == st.subscribers.end())
        return;  // gone meanwhile
      auto& sub = it->second;
      sub.checking = false;
      sub.next_check = st.clock.now_s() + st.options.proxy_health_period_s;
      if (err == nullptr) {
        if (sub.health != "HEALTHY" && sub.health != "STARTING")
          st.log->info("proxy of node {} is HEALTHY again", sub.node_id);
        sub.health = "HEALTHY";
        sub.failures = 0;
        return;
      }
      ++sub.failures;
      std::string why = from_caf_error(*err).message();
      if (sub.failures < st.options.proxy_unhealthy_after) {
        st.log->warn("proxy of node {} failed a health check ({} of {}): {}", sub.node_id,
                     sub.failures, st.options.proxy_unhealthy_after, why);
        return;
      }
      if (sub.health != "UNHEALTHY") {
        st.log->warn("proxy of node {} is UNHEALTHY after {} failed health checks ({}); "
                     "restarting it",
                     sub.node_id, sub.failures, why);
        sub.health = "UNHEALTHY";
        self->send_exit(sub.handle, caf::exit_reason::kill);
      }
    };
    self->request(sub.handle, seconds(st.options.proxy_health_timeout_s), health_atom::value)
        .then([settle](caf::ok_atom) { settle(nullptr); },
              [settle](caf::error& err) { settle(&err); });
  }
}

// What `troupectl nodes` shows for the proxy of `node`.
std::string proxy_health(const ControllerState& st, const std::string& node) {
  for (const auto& [addr, sub] : st.subscribers) {
    if (sub.node_id == node)
      return sub.health;
  }
  return "NONE";
}

// Logs every change of a deployment's status: the operator's event trail.
void log_status_changes(ControllerState& st) {
  std::unordered_map<std::string, DeploymentStatus> now;
  for (const auto& id : st.core->deployment_ids()) {
    auto info = st.core->deployment_status(id);
    if (!info)
      continue;
    auto key = id.to_string();
    now[key] = info->status;
    auto it = st.last_status.find(key);
    if (it != st.last_status.end() && it->second == info->status)
      continue;
    auto level = info->status == DeploymentStatus::unhealthy ||
                         info->status == DeploymentStatus::deploy_failed
                     ? spdlog::level::warn
                     : spdlog::level::info;
    st.log->log(level, "deployment {}: {} -> {} ({}){}{}", key,
                it == st.last_status.end() ? "NEW" : to_string(it->second), to_string(info->status),
                to_string(info->trigger), info->message.empty() ? "" : ": ", info->message);
  }
  st.last_status = std::move(now);
}

void reconcile(controller_actor* self) {
  auto& st = self->state;
  if (st.recovering)
    return;
  auto commands = st.core->update();
  for (const auto& cmd : commands)
    execute(self, cmd);
  log_status_changes(st);
  publish(self);
}

std::string nodes_file(const ControllerState& st) {
  return st.options.state_dir.empty() ? std::string() : st.options.state_dir + "/nodes";
}

// Keeps <state_dir>/nodes equal to the set of live nodes (written only when
// it changes; replaced atomically with a rename).
void save_live_nodes(ControllerState& st) {
  auto path = nodes_file(st);
  if (path.empty() || st.recovering)
    return;
  std::string content;
  for (const auto& [id, n] : st.membership.nodes()) {
    if (n.state != NodeState::dead)
      content += id + "\n";
  }
  if (content == st.written_nodes)
    return;
  {
    std::ofstream out(path + ".tmp", std::ios::trunc);
    out << content;
    if (!out.flush()) {
      st.log->warn("cannot write {}: the next controller restart waits its full recovery window",
                   path);
      return;
    }
  }
  if (std::rename((path + ".tmp").c_str(), path.c_str()) == 0)
    st.written_nodes = content;
}

void load_expected_nodes(ControllerState& st) {
  auto path = nodes_file(st);
  if (path.empty())
    return;
  std::ifstream in(path);
  std::string id;
  while (std::getline(in, id)) {
    if (!id.empty())
      st.expected_nodes.insert(id);
  }
}

void finish_recovery(controller_actor* self);

// During recovery: once every node that was alive before has registered
// again, there is nothing more to wait for.
void maybe_end_recovery_early(controller_actor* self) {
  auto& st = self->state;
  if (!st.recovering || st.expected_nodes.empty())
    return;
  for (const auto& id : st.expected_nodes) {
    auto it = st.membership.nodes().find(id);
    if (it == st.membership.nodes().end() || it->second.state == NodeState::dead)
      return;
  }
  st.log->info("every node known before the restart has registered again");
  finish_recovery(self);
}

void finish_recovery(controller_actor* self) {
  auto& st = self->state;
  if (!st.recovering)
    return;
  push_nodes(st);
  auto status = st.core->recover(st.hosted_during_recovery);
  if (!status) {
    st.log->critical("cannot recover: {}", status.to_string());
    self->quit(to_caf_error(status));
    return;
  }
  st.log->info("recovered {} applications; adopted {} replicas",
               st.core->target_state().applications.size(), st.hosted_during_recovery.size());
  st.hosted_during_recovery.clear();
  st.recovering = false;
  st.expected_nodes.clear();
  save_live_nodes(st);
  reconcile(self);
}

nlohmann::json status_json(const ControllerState& st) {
  using nlohmann::json;
  json apps = json::object();
  if (!st.core)
    return json{{"applications", apps}};
  for (const auto& [name, app] : st.core->target_state().applications) {
    json a;
    a["route_prefix"] = app.route_prefix;
    a["ingress"] = app.ingress;
    if (auto s = st.core->application_status(name)) {
      a["status"] = to_string(s->status);
      a["message"] = s->message;
    }
    json deps = json::object();
    for (const auto& spec : app.deployments) {
      DeploymentId id{name, spec.name};
      json d;
      if (auto s = st.core->deployment_status(id)) {
        d["status"] = to_string(s->status);
        d["trigger"] = to_string(s->trigger);
        d["message"] = s->message;
      }
      if (auto t = st.core->target_replicas(id))
        d["target_replicas"] = *t;
      d["isolation"] = to_string(spec.config.isolation);
      d["memory_limit_bytes"] = spec.config.memory_limit_bytes;
      json rows = json::array();
      for (const auto& r : st.core->replicas(id)) {
        auto ref = st.replicas.find(r.id);
        double started = ref == st.replicas.end() ? 0 : ref->second.started_at;
        rows.push_back({{"id", r.id},
                        {"node", r.node_id},
                        {"state", to_string(r.state)},
                        {"version", r.version.code},
                        {"pending_allocation", r.pending_allocation},
                        {"started", started}});
      }
      d["replicas"] = std::move(rows);
      deps[spec.name] = std::move(d);
    }
    a["deployments"] = std::move(deps);
    apps[name] = std::move(a);
  }
  return json{{"applications", apps}, {"recovering", st.recovering}};
}

Status require_ready(const ControllerState& st) {
  if (st.recovering) {
    return Status(errc::unavailable,
                  "the controller is recovering its state after a restart; retry in a few seconds");
  }
  return Status::ok();
}

// What every deploy call (one application or a whole config) must pass
// before its bytes are even decoded: the caller's role, a recovered
// controller, and the config size limit.
Status admit_deploy(const ControllerState& st, const Credential& cred, const std::string& encoded) {
  if (auto s = check_request(st.options.ca_pem, cred, "deploy", {encoded}); !s)
    return s;
  if (auto s = require_ready(st); !s)
    return s;
  return check_config_size(encoded.size(), st.options.limits);
}

caf::behavior controller(controller_actor* self, ControllerOptions options,
                         std::shared_ptr<CheckpointStore> store) {
  auto& st = self->state;
  st.options = options;
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
  st.core = std::make_unique<StateManager>(*st.store, st.clock, *st.rng, core_options);
  auto tick = seconds(options.tick_interval_s);

  // Nothing to recover: reconcile at once. Otherwise give nodes a window to
  // re-register and report the replicas they host.
  auto saved = st.store->load();
  bool empty = saved.has_value() && !saved->has_value();
  if (empty) {
    finish_recovery(self);
  } else {
    load_expected_nodes(st);
    st.log->info(
        "checkpoint found; collecting hosted replicas from {} known nodes for at most {:.1f} s",
        st.expected_nodes.size(), options.recovery_window_s);
    self->delayed_send(self, seconds(options.recovery_window_s), recover_atom::value);
  }

  self->set_down_handler([=](const caf::down_msg& dm) {
    auto& st = self->state;
    if (auto it = st.replica_of.find(dm.source); it != st.replica_of.end()) {
      auto id = it->second;
      bool stopping = st.replicas[id].stopping;
      forget_replica(st, id);
      if (st.recovering)
        return;
      if (stopping) {
        st.core->on_replica_stopped(id);
      } else {
        // A replica process's handle ends with the cause of its exit
        // ("replica X exited: killed by SIGSEGV"): that is the status message.
        std::string cause;
        if (dm.reason.category() == kErrorCategory)
          cause = from_caf_error(dm.reason).message();
        st.log->warn("replica {} went down: {}", id,
                     cause.empty() ? self->home_system().render(dm.reason) : cause);
        st.core->on_replica_crashed(id, cause);
      }
      reconcile(self);
      return;
    }
    if (st.subscribers.erase(dm.source) > 0)
      return;
    auto it = st.agents.find(dm.source);
    if (it == st.agents.end())
      return;
    st.log->warn("lost the node agent of {}: {}", it->second.node_id,
                 self->home_system().render(dm.reason));
    if (dm.reason != caf::exit_reason::remote_link_unreachable) {
      // The agent actor died but the connection to its node did not: the
      // node process lives and restarts its agent, which registers again
      // with the replicas it hosts (they keep serving meanwhile). Only the
      // heartbeat timeout declares the node DEAD if no agent comes back.
      st.log->info("node {} still connected; waiting for its new agent (node timeout {:.1f} s)",
                   it->second.node_id, st.membership.node_timeout_s());
      st.agent_of.erase(it->second.node_id);
      st.agents.erase(it);
      return;
    }
    auto ts =
        st.membership.connection_lost(it->second.node_id, it->second.incarnation, st.clock.now_s());
    log_transitions(st, ts);
    st.agent_of.erase(it->second.node_id);
    st.agents.erase(it);
    if (!ts.empty() && !st.recovering) {
      push_nodes(st);
      reconcile(self);
    }
  });
  self->delayed_send(self, tick, tick_atom::value);
  st.log->info("controller started (node timeout {:.1f} s)", options.node_timeout_s);
  return {
      [=](hello_atom, uint32_t version) -> caf::result<hello_atom, uint32_t, std::string> {
        if (version != kProtocolVersion) {
          return to_caf_error(Status(errc::version_mismatch,
                                     "the controller speaks protocol version " +
                                         std::to_string(kProtocolVersion) + ", the caller " +
                                         std::to_string(version) + "; upgrade one of them"));
        }
        return {hello_atom::value, kProtocolVersion, std::string("controller")};
      },
      [=](register_atom, const troupe::NodeInfo& info, const caf::actor& agent,
          const std::vector<HostedReplicaInfo>& hosted,
          const Credential& cred) -> caf::result<uint64_t> {
        auto& st = self->state;
        if (auto s = check_request(st.options.ca_pem, cred, "register", {info.id}, info.id); !s) {
          st.log->warn("refused registration of node {} (pid {}): {}", info.id, info.pid,
                       s.message());
          return to_caf_error(s);
        }
        if (info.protocol_version != kProtocolVersion) {
          st.log->error("refused node {} (pid {}): protocol version {}, controller speaks {}",
                        info.id, info.pid, info.protocol_version, kProtocolVersion);
          return to_caf_error(Status(errc::version_mismatch,
                                     "the controller speaks protocol version " +
                                         std::to_string(kProtocolVersion) + ", node '" + info.id +
                                         "' speaks " + std::to_string(info.protocol_version)));
        }
        if (auto st_id = validate_node_id(info.id); !st_id)
          return to_caf_error(st_id);
        auto resources = parse_resources(info.resources);
        if (!resources)
          return to_caf_error(resources.status());
        if (!agent)
          return to_caf_error(Status(errc::invalid_argument, "no agent handle given"));
        NodeRecord rec;
        rec.id = info.id;
        rec.host = info.host;
        rec.http_port = info.http_port;
        rec.resources = *resources;
        rec.pid = info.pid;
        bool known = st.membership.nodes().count(info.id) > 0;
        uint64_t incarnation = st.membership.register_node(std::move(rec), st.clock.now_s());
        for (auto it = st.agents.begin(); it != st.agents.end();) {
          if (it->second.node_id == info.id && it->first != agent.address()) {
            it = st.agents.erase(it);
          } else {
            ++it;
          }
        }
        st.agents[agent.address()] = AgentRef{info.id, incarnation};
        st.agent_of[info.id] = agent;
        self->monitor(agent);
        st.log->info("node {} {} (pid {}, {}:{}, {}, {} replicas)", info.id,
                     known ? "re-registered" : "registered", info.pid, info.host, info.http_port,
                     info.resources, hosted.size());
        std::vector<HostedReplica> adopt;
        for (const auto& h : hosted) {
          if (!h.handle)
            continue;
          bool known_handle =
              st.replicas.count(h.replica_id) && st.replicas[h.replica_id].handle == h.handle;
          if (!known_handle) {
            remember_replica(self, h.replica_id, info.id, h.handle);
            st.replicas[h.replica_id].stopping = h.stopping;
          } else if (st.recovering) {
            continue;  // already collected for the recovery
          }
          // Also a replica whose handle is known: the core may have given it
          // up while its node was DEAD (it still runs there). The core
          // ignores the replicas it still tracks; the others it adopts, and
          // stops if the deployment is above target meanwhile.
          adopt.push_back({h.replica_id, h.app, h.deployment, info.id, h.stopping});
        }
        if (st.recovering) {
          for (auto& a : adopt)
            st.hosted_during_recovery.push_back(std::move(a));
          maybe_end_recovery_early(self);
        } else {
          push_nodes(st);
          if (!adopt.empty())
            st.core->adopt_replicas(adopt);
          reconcile(self);
        }
        return incarnation;
      },
      [=](heartbeat_atom, const std::string& id,
          const Credential& cred) -> caf::result<caf::ok_atom> {
        if (auto s = check_request(self->state.options.ca_pem, cred, "heartbeat", {id}, id); !s)
          return to_caf_error(s);
        auto status = self->state.membership.heartbeat(id, self->state.clock.now_s());
        if (!status)
          return to_caf_error(status);
        return caf::ok_atom::value;
      },
      [=](deregister_atom, const std::string& id,
          const Credential& cred) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        if (auto s = check_request(st.options.ca_pem, cred, "deregister", {id}, id); !s)
          return to_caf_error(s);
        auto status = st.membership.deregister(id);
        if (!status)
          return to_caf_error(status);
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
        if (!st.recovering) {
          push_nodes(st);
          reconcile(self);
        }
        return caf::ok_atom::value;
      },
      [=](nodes_atom) {
        double now = self->state.clock.now_s();
        std::vector<NodeStatus> out;
        for (const auto& [id, node] : self->state.membership.nodes()) {
          out.push_back(to_wire(node, now));
          out.back().proxy = proxy_health(self->state, id);
        }
        return out;
      },
      [=](drain_atom, const std::string& id, const Credential& cred) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        if (auto s = check_request(st.options.ca_pem, cred, "drain", {id}); !s)
          return to_caf_error(s);
        auto status = st.membership.drain(id);
        if (!status)
          return to_caf_error(status);
        st.log->warn("node {} is DRAINING (operator request)", id);
        if (!st.recovering) {
          push_nodes(st);
          reconcile(self);
        }
        return caf::ok_atom::value;
      },
      [=](deploy_atom, const std::string& encoded,
          const Credential& cred) -> caf::result<bool, uint64_t> {
        auto& st = self->state;
        if (auto s = admit_deploy(st, cred, encoded); !s)
          return to_caf_error(s);
        auto app = decode_application(encoded);
        if (!app)
          return to_caf_error(app.status());
        {
          TargetState next = st.core->target_state();
          next.applications[app->name] = *app;
          if (auto s = check_limits(next, st.options.limits); !s)
            return to_caf_error(s);
        }
        auto result = st.core->deploy_application(*app);
        if (!result) {
          st.log->warn("deploy of {} refused: {}", app->name, result.status().to_string());
          return to_caf_error(result.status());
        }
        st.log->info("deploy of {}: {} (generation {})", app->name,
                     result->changed ? "accepted" : "unchanged", result->generation);
        reconcile(self);
        return {result->changed, result->generation};
      },
      [=](delete_atom, const std::string& app,
          const Credential& cred) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        if (auto s = check_request(st.options.ca_pem, cred, "delete", {app}); !s)
          return to_caf_error(s);
        if (auto s = require_ready(st); !s)
          return to_caf_error(s);
        auto status = st.core->delete_application(app);
        if (!status)
          return to_caf_error(status);
        st.log->info("application {} is being deleted", app);
        reconcile(self);
        return caf::ok_atom::value;
      },
      [=](status_atom) { return status_json(self->state).dump(); },
      [=](snapshot_atom, uint64_t epoch, uint64_t seq) -> caf::result<RoutingSnapshot> {
        auto& st = self->state;
        if (auto s = require_ready(st); !s)
          return to_caf_error(s);
        SnapshotId last{epoch, seq};
        auto delta = st.core->changes_since(last);
        if (!delta) {
          RoutingSnapshot same;
          same.epoch = epoch;
          same.seq = seq;
          return same;
        }
        return to_wire(st, *delta);
      },
      [=](subscribe_atom, const caf::actor& subscriber, uint64_t epoch, uint64_t seq,
          const std::string& node_id) {
        // The first push (or nothing, when the subscriber is current) follows
        // at once; later ones whenever the published view changes.
        auto& st = self->state;
        if (!subscriber)
          return;
        self->monitor(subscriber);
        auto& sub = st.subscribers[subscriber.address()];
        if (sub.handle != subscriber)
          sub = ControllerState::Subscriber{};  // a new proxy: a fresh health record
        sub.handle = subscriber;
        sub.last = SnapshotId{epoch, seq};
        sub.node_id = node_id;
        if (!st.recovering)
          publish(self);
      },
      [=](apply_atom, const std::string& encoded, double request_timeout_s,
          const Credential& cred) -> caf::result<std::string> {
        auto& st = self->state;
        if (auto s = admit_deploy(st, cred, encoded); !s)
          return to_caf_error(s);
        auto declared = decode_target_state(encoded);
        if (!declared)
          return to_caf_error(declared.status());
        if (auto s = check_limits(*declared, st.options.limits); !s)
          return to_caf_error(s);
        bool changed = false;
        auto results = st.core->apply(*declared, &changed);
        if (!results) {
          st.log->warn("deploy refused: {}", results.status().to_string());
          return to_caf_error(results.status());
        }
        nlohmann::json out;
        out["changed"] = changed;
        out["generation"] = st.core->target_state().generation;
        nlohmann::json apps = nlohmann::json::object();
        for (const auto& [name, r] : *results) {
          nlohmann::json deps = nlohmann::json::object();
          for (const auto& [dep, kind] : r.deployments)
            deps[dep] = to_string(kind);
          apps[name] = {{"deployments", deps}, {"removed", r.removed}};
        }
        out["applications"] = apps;
        st.log->info("deploy of {} applications: {} (generation {})", declared->applications.size(),
                     changed ? "accepted" : "unchanged", st.core->target_state().generation);
        if (request_timeout_s != st.request_timeout_s) {
          st.request_timeout_s = request_timeout_s;
          for (auto& [addr, sub] : st.subscribers)
            sub.last = SnapshotId{};  // push in full
        }
        reconcile(self);
        return out.dump();
      },
      [=](config_atom) -> caf::result<std::string> {
        auto& st = self->state;
        if (auto s = require_ready(st); !s)
          return to_caf_error(s);
        return encode_target_state(st.core->target_state());
      },
      [=](shutdown_atom, bool nodes, const Credential& cred) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        if (auto s = check_request(st.options.ca_pem, cred, "shutdown", {nodes ? "nodes" : ""}); !s)
          return to_caf_error(s);
        if (auto s = require_ready(st); !s)
          return to_caf_error(s);
        auto status = st.core->shutdown();
        if (!status)
          return to_caf_error(status);
        st.log->warn("shutdown requested: deleting every application{}",
                     nodes ? ", then stopping every node" : "");
        st.stop_nodes_when_empty = nodes;
        reconcile(self);
        return caf::ok_atom::value;
      },
      [=](kill_atom, const std::string& kind, const std::string& id,
          const Credential& cred) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        if (auto s = check_request(st.options.ca_pem, cred, "kill", {kind, id}); !s)
          return to_caf_error(s);
        auto not_found = [&](const std::string& what) {
          return to_caf_error(Status(errc::not_found, "no " + what + " '" + id + "'"));
        };
        if (kind == "replica") {
          auto it = st.replicas.find(id);
          if (it == st.replicas.end())
            return not_found("replica");
          st.log->warn("killing replica {} on operator request", id);
          self->send_exit(it->second.handle, caf::exit_reason::kill);
        } else if (kind == "agent") {
          auto it = st.agent_of.find(id);
          if (it == st.agent_of.end())
            return not_found("node agent of node");
          st.log->warn("killing the node agent of {} on operator request", id);
          self->send_exit(it->second, caf::exit_reason::kill);
        } else if (kind == "proxy") {
          auto it = std::find_if(st.subscribers.begin(), st.subscribers.end(),
                                 [&](const auto& kv) { return kv.second.node_id == id; });
          if (it == st.subscribers.end())
            return not_found("proxy on node");
          st.log->warn("killing the proxy of {} on operator request", id);
          self->send_exit(it->second.handle, caf::exit_reason::kill);
        } else if (kind == "controller") {
          st.log->warn("controller killed on operator request");
          self->quit(caf::exit_reason::kill);
        } else {
          return to_caf_error(Status(
              errc::invalid_argument,
              "kill: unknown kind '" + kind + "'; expected replica, proxy, agent or controller"));
        }
        return caf::ok_atom::value;
      },
      [=](metrics_atom, const std::string&, const std::string& replica, double ongoing) {
        auto& st = self->state;
        st.ongoing[replica] = ongoing;
        if (!st.recovering)
          st.core->record_replica_metrics(replica, ongoing);
      },
      [=](metrics_atom, const std::string& reporter, const std::string& app,
          const std::string& deployment, double queued_and_inflight) {
        // A proxy's (or handle's) view of one deployment: the only signal
        // when it has no replica (scale from zero).
        auto& st = self->state;
        if (st.recovering)
          return;
        st.core->record_handle_metrics(reporter, DeploymentId{app, deployment},
                                       queued_and_inflight);
        if (queued_and_inflight > 0 && st.core->replicas(DeploymentId{app, deployment}).empty())
          reconcile(self);  // cold start now, not at the next tick
      },
      [=](recover_atom) { finish_recovery(self); },
      [=](tick_atom) {
        auto& st = self->state;
        auto ts = st.membership.check(st.clock.now_s());
        log_transitions(st, ts);
        check_proxies(self);
        if (!st.recovering) {
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
                            std::shared_ptr<CheckpointStore> store) {
  return sys.spawn(controller, options, std::move(store));
}

}  // namespace troupe::controller
