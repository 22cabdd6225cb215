#include "controller/shell/controller_logic.hpp"

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include <caf/exit_reason.hpp>

#include "controller/shell/admission.hpp"
#include "controller/shell/startup.hpp"
#include "controller/store/codec.hpp"
#include "runtime/auth.hpp"

namespace troupe::controller {

ControllerLogic::ControllerLogic(const ControllerOptions& options,
                                 std::shared_ptr<CheckpointStore> store,
                                 std::shared_ptr<const Clock> clock, uint64_t seed,
                                 ActorDirectory::Monitor monitor,
                                 ActorDirectory::Demonitor demonitor,
                                 std::shared_ptr<spdlog::logger> log)
    : options_(options),
      clock_(std::move(clock)),
      log_(std::move(log)),
      membership_(options.node_timeout_s,
                  LossJudgement{options.unreachable_share, options.unreachable_min_nodes,
                                options.unreachable_timeout_s}),
      rng_(seed),
      store_(std::move(store)),
      core_(std::make_unique<StateManager>(*store_, *clock_, rng_,
                                           incarnation_options(seed, options.limits))),
      // Recovering until start() has looked at the checkpoint.
      recovery_(std::make_unique<RecoveryGate>(*clock_, options.recovery_window_s,
                                               std::set<std::string>{})),
      nodes_file_(options.nodes_list
                      ? NodesFile(options.nodes_list->where, options.nodes_list->read,
                                  options.nodes_list->write)
                      : NodesFile(options.state_dir)),
      proxies_(*clock_,
               ProxyHealthOptions{options.proxy_health_period_s, options.proxy_unhealthy_after}),
      actors_(std::move(monitor), std::move(demonitor)),
      libraries_(options.state_dir.empty()
                     ? std::string()
                     : (std::filesystem::path(options.state_dir) / "libraries").string(),
                 options.plugin_dirs, options.library_retention_s, log_) {}

// ---------------------------------------------------------------- startup

bool ControllerLogic::start() {
  auto expected = nodes_to_await(store_->load(), nodes_file_);
  recovery_ = std::make_unique<RecoveryGate>(*clock_, options_.recovery_window_s,
                                             expected.value_or(std::set<std::string>{}));
  if (!expected)
    return false;
  log_->info(
      "checkpoint found; collecting hosted replicas from {} known nodes until {:.1f} s pass "
      "with none registering (at most {:.1f} s)",
      expected->size(), options_.recovery_window_s,
      RecoveryGate::kMaxWindows * options_.recovery_window_s);
  return true;
}

double ControllerLogic::recovery_left_s() const {
  return recovering() ? std::max(0.0, recovery_->deadline() - now()) : 0.0;
}

Result<bool> ControllerLogic::finish_recovery() {
  if (!recovering())
    return false;
  push_nodes();
  auto status = core_->recover(recovery_->collected());
  if (!status) {
    log_->critical("cannot recover: {}", status.to_string());
    return status;
  }
  log_->info("recovered {} applications; adopted {} replicas",
             core_->target_state().applications.size(), recovery_->collected().size());
  recovery_->finish();
  // The durable http settings go out with the first publish: every proxy
  // subscribed during the recovery is due for a full push anyway.
  actors_.set_http(core_->target_state().http);
  save_live_nodes();
  return true;
}

// ---------------------------------------------------------------- nodes

void ControllerLogic::log_transitions(const std::vector<NodeTransition>& ts) {
  for (const auto& t : ts) {
    log_->warn("node {} {} -> {}: {}", t.id, to_string(t.from), to_string(t.to), t.reason);
    activity_.record(now(), "node", t.id,
                     "node " + t.id + " " + to_string(t.from) + " -> " + to_string(t.to) + ": " +
                         t.reason,
                     t.to == NodeState::dead);
  }
}

// Keeps <state_dir>/nodes equal to the set of live nodes; not while
// recovering, when the membership is still filling up (finish_recovery()
// writes it, with the nodes that registered meanwhile). A write that fails
// (etcd without a quorum, a full disk) is tried again by tick() until one
// succeeds: a list left stale would name fewer nodes than host replicas, and
// the next controller would end its recovery before they reported them.
void ControllerLogic::save_live_nodes() {
  if (recovering())
    return;
  if (nodes_file_.save(membership_.nodes())) {
    if (nodes_unsaved_) {
      const auto& nodes = membership_.nodes();
      log_->info("wrote {} again: {} live nodes", nodes_file_.path(),
                 std::count_if(nodes.begin(), nodes.end(),
                               [](const auto& n) { return n.second.state != NodeState::dead; }));
    }
    nodes_unsaved_ = false;
    return;
  }
  if (!nodes_unsaved_) {
    log_->warn(
        "cannot write {}: tried again every {:.0f} s; until it is written a restarted controller "
        "waits for the nodes listed before",
        nodes_file_.path(), kNodesRetryInterval_s);
  }
  nodes_unsaved_ = true;
  nodes_retry_at_ = now() + kNodesRetryInterval_s;
}

void ControllerLogic::retry_live_nodes() {
  if (nodes_unsaved_ && now() >= nodes_retry_at_)
    save_live_nodes();
}

void ControllerLogic::push_nodes() {
  save_live_nodes();
  // Every snapshot lists the DEAD and the draining nodes: a change of those
  // lists is a new snapshot also when no replica moves (a registration that
  // changes neither is not: no push to every subscriber per node).
  std::vector<std::pair<std::string, NodeState>> flagged;
  for (const auto& [id, n] : membership_.nodes()) {
    if (n.state != NodeState::alive)
      flagged.emplace_back(id, n.state);
  }
  if (flagged != flagged_nodes_) {
    flagged_nodes_ = std::move(flagged);
    core_->touch_snapshot();
  }
  std::vector<controller::NodeInfo> view;
  for (const auto& [id, n] : membership_.nodes())
    view.push_back({id, n.state, n.resources});
  core_->set_nodes(view);
}

void ControllerLogic::nodes_changed() {
  if (!recovering())
    push_nodes();
}

Result<ControllerLogic::Registration> ControllerLogic::register_node(
    const troupe::NodeInfo& info, const AgentActor& agent,
    const std::vector<HostedReplicaInfo>& hosted, const Credential& cred) {
  auto rec = admit_node(options_.ca_pem, info, static_cast<bool>(agent), cred, *log_);
  if (!rec)
    return rec.status();
  if (auto s = check_head_mode(options_.highly_available, info); !s) {
    log_->error("refused registration of node {} (pid {}): {}", info.id, info.pid, s.message());
    return s;
  }
  if (auto s = once(Status::ok(), cred, Operation::register_node); !s) {
    log_->warn("refused registration of node {} (pid {}): {}", info.id, info.pid, s.message());
    return s;
  }
  bool known = membership_.nodes().count(info.id) > 0;
  Registration out;
  out.incarnation = membership_.register_node(std::move(*rec), now());
  actors_.attach_agent(info.id, agent, out.incarnation);
  log_->info("node {} {} (pid {}, {}:{}, {}, {} replicas)", info.id,
             known ? "re-registered" : "registered", info.pid, info.host, info.http_port,
             info.resources, hosted.size());
  activity_.record(now(), "node", info.id,
                   "node " + info.id + (known ? " registered again" : " joined") + " (" +
                       std::to_string(hosted.size()) + " replicas)");
  auto adopt = actors_.take_hosted(info.id, hosted, recovering());
  settle_unreachable(info.id, hosted);
  if (recovering()) {
    recovery_->arrived();
    recovery_->collect(std::move(adopt));
    // Once every node that was alive before has registered again, there is
    // nothing more to wait for.
    out.recovery_complete = recovery_->all_expected_back(membership_.nodes());
    if (out.recovery_complete)
      log_->info("every node known before the restart has registered again");
  } else {
    push_nodes();
    if (!adopt.empty())
      core_->adopt_replicas(adopt);
    // Its agent may have lost the watches (it restarted) or its reports may
    // have been lost (it was cut off): its agent starts its checks over, and
    // the watches go to it again.
    core_->rewatch_node(info.id);
  }
  return out;
}

Status ControllerLogic::once(Status checked, const Credential& cred, Operation op) {
  if (!checked || options_.ca_pem.empty())
    return checked;
  return replay_.admit(cred, op, static_cast<int64_t>(std::time(nullptr)));
}

Status ControllerLogic::heartbeat(const std::string& node_id, const std::vector<ReplicaLoad>& loads,
                                  const Credential& cred) {
  if (auto s = once(check_request(options_.ca_pem, cred, Operation::heartbeat, {node_id}, node_id),
                    cred, Operation::heartbeat);
      !s)
    return s;
  if (auto s = membership_.heartbeat(node_id, now()); !s)
    return s;
  for (const auto& load : loads)
    replica_metrics(load);
  return Status::ok();
}

Status ControllerLogic::deregister(const std::string& node_id, const Credential& cred) {
  if (auto s = once(check_request(options_.ca_pem, cred, Operation::deregister, {node_id}, node_id),
                    cred, Operation::deregister);
      !s)
    return s;
  if (auto s = membership_.deregister(node_id); !s)
    return s;
  actors_.detach_node(node_id);
  log_->info("node {} left the cluster", node_id);
  activity_.record(now(), "node", node_id, "node " + node_id + " left the cluster");
  nodes_changed();
  return Status::ok();
}

Status ControllerLogic::drain(const std::string& node_id, const Credential& cred) {
  if (auto s = once(check_request(options_.ca_pem, cred, Operation::drain, {node_id}), cred,
                    Operation::drain);
      !s)
    return s;
  const bool unreachable = membership_.state(node_id) == NodeState::unreachable;
  if (auto s = membership_.drain(node_id); !s)
    return s;
  if (unreachable) {
    const std::vector<NodeTransition> ts{{node_id, NodeState::unreachable, NodeState::dead,
                                          membership_.nodes().at(node_id).reason}};
    log_transitions(ts);
    drop_unreachable(ts);
    nodes_changed();
    return Status::ok();
  }
  log_->warn("node {} is DRAINING (operator request)", node_id);
  activity_.record(now(), "node", node_id, "node " + node_id + " is DRAINING (operator request)");
  nodes_changed();
  return Status::ok();
}

Status ControllerLogic::leave(const std::string& node_id, const Credential& cred) {
  if (auto s = once(check_request(options_.ca_pem, cred, Operation::leave, {node_id}, node_id),
                    cred, Operation::leave);
      !s)
    return s;
  if (auto s = membership_.leave(node_id); !s)
    return s;
  log_->warn("node {} is stopping: DRAINING, its replicas move to other nodes", node_id);
  activity_.record(now(), "node", node_id,
                   "node " + node_id + " is stopping: DRAINING, its replicas move to other nodes");
  leaving_.insert(node_id);
  nodes_changed();
  return Status::ok();
}

std::vector<ControllerLogic::LeaveOutcome> ControllerLogic::settled_leaves() {
  std::vector<LeaveOutcome> out;
  if (leaving_.empty() || recovering())
    return out;
  // Per leaving node: replicas still there (not being stopped), and those of
  // them whose deployment has a replica no node has room for.
  std::map<std::string, std::pair<size_t, size_t>> left;
  for (const auto& id : core_->deployment_ids()) {
    auto replicas = core_->replicas(id);
    bool unplaceable = false;
    for (const auto& r : replicas)
      unplaceable = unplaceable || r.pending_allocation;
    for (const auto& r : replicas) {
      if (r.pending_allocation || r.state == ReplicaState::stopping || !leaving_.count(r.node_id))
        continue;
      auto& [n, stuck] = left[r.node_id];
      ++n;
      if (unplaceable)
        ++stuck;
    }
  }
  for (auto it = leaving_.begin(); it != leaving_.end();) {
    auto node = membership_.nodes().find(*it);
    std::string message;
    if (node == membership_.nodes().end() || node->second.state != NodeState::draining) {
      message = "the node is no longer leaving";
    } else if (auto l = left.find(*it); l == left.end()) {
      message = "every replica runs on another node";
    } else if (l->second.second == l->second.first) {
      message = std::to_string(l->second.first) +
                " replicas cannot move: no other node has room for their replacements";
    }
    if (message.empty()) {
      ++it;
      continue;
    }
    log_->info("node {} may stop: {}", *it, message);
    out.push_back({*it, std::move(message)});
    it = leaving_.erase(it);
  }
  return out;
}

// ---------------------------------------------------------------- user calls

Result<DeployResult> ControllerLogic::deploy(const std::string& encoded, const Credential& cred) {
  if (auto s = once(admit_deploy(options_.ca_pem, cred, encoded, *recovery_, options_.limits), cred,
                    Operation::deploy);
      !s)
    return s;
  auto app = decode_application(encoded);
  if (!app)
    return app.status();
  if (auto pinned = libraries_.pin(*app); !pinned) {
    log_->warn("deploy of {} refused: {}", app->name, pinned.to_string());
    return pinned;
  }
  auto result = core_->deploy_application(*app);
  if (!result) {
    log_->warn("deploy of {} refused: {}", app->name, result.status().to_string());
    return result.status();
  }
  log_->info("deploy of {}: {} (generation {})", app->name,
             result->changed ? "accepted" : "unchanged", result->generation);
  if (result->changed)
    activity_.record(now(), "deploy", app->name,
                     "deploy of " + app->name + " (generation " +
                         std::to_string(result->generation) + ")");
  return result;
}

Result<std::string> ControllerLogic::apply(const std::string& encoded, const Credential& cred,
                                           std::optional<uint64_t> if_generation) {
  std::vector<std::string> signed_too;
  if (if_generation)
    signed_too.push_back(std::to_string(*if_generation));
  if (auto s = once(
          admit_deploy(options_.ca_pem, cred, encoded, *recovery_, options_.limits, signed_too),
          cred, Operation::deploy);
      !s)
    return s;
  auto declared = decode_target_state(encoded);
  if (!declared)
    return declared.status();
  for (auto& [name, app] : declared->applications) {
    if (auto pinned = libraries_.pin(app); !pinned) {
      log_->warn("deploy refused: {}", pinned.to_string());
      return pinned;
    }
  }
  bool changed = false;
  auto results = core_->apply(*declared, &changed, if_generation);
  if (!results) {
    log_->warn("deploy refused: {}", results.status().to_string());
    return results.status();
  }
  auto generation = core_->target_state().generation;
  log_->info("deploy of {} applications: {} (generation {})", declared->applications.size(),
             changed ? "accepted" : "unchanged", generation);
  if (changed)
    activity_.record(now(), "deploy", "",
                     "deploy of " + std::to_string(declared->applications.size()) +
                         " applications (generation " + std::to_string(generation) + ")");
  actors_.set_http(core_->target_state().http);
  return render_apply_result(*results, changed, generation).dump();
}

Status ControllerLogic::delete_application(const std::string& app, const Credential& cred) {
  if (auto s =
          once(admit_operator_call(options_.ca_pem, cred, Operation::delete_app, {app}, *recovery_),
               cred, Operation::delete_app);
      !s)
    return s;
  if (auto s = core_->delete_application(app); !s)
    return s;
  log_->info("application {} is being deleted", app);
  activity_.record(now(), "deploy", app, "application " + app + " is being deleted");
  return Status::ok();
}

Status ControllerLogic::delete_deployment(const std::string& app, const std::string& deployment,
                                          const Credential& cred) {
  if (auto s = once(admit_operator_call(options_.ca_pem, cred, Operation::delete_app,
                                        {app, deployment}, *recovery_),
                    cred, Operation::delete_app);
      !s)
    return s;
  if (auto s = core_->delete_deployment(app, deployment); !s) {
    log_->warn("delete of {}/{} refused: {}", app, deployment, s.to_string());
    return s;
  }
  log_->info("deployment {}/{} is being deleted", app, deployment);
  activity_.record(now(), "deploy", app + "/" + deployment,
                   "deployment " + app + "/" + deployment + " is being deleted");
  return Status::ok();
}

Result<DeployResult> ControllerLogic::scale(const std::string& app, const std::string& deployment,
                                            uint32_t replicas, const Credential& cred) {
  if (auto s = once(admit_operator_call(options_.ca_pem, cred, Operation::scale,
                                        {app, deployment, std::to_string(replicas)}, *recovery_),
                    cred, Operation::scale);
      !s)
    return s;
  auto result = core_->scale_deployment(app, deployment, replicas);
  if (!result) {
    log_->warn("scale of {}/{} refused: {}", app, deployment, result.status().to_string());
    return result.status();
  }
  log_->info("scale of {}/{} to {} replicas: {} (generation {})", app, deployment, replicas,
             result->changed ? "accepted" : "unchanged", result->generation);
  if (result->changed)
    activity_.record(now(), "deploy", app + "/" + deployment,
                     "scale of " + app + "/" + deployment + " to " + std::to_string(replicas) +
                         " replicas");
  return result;
}

Result<uint64_t> ControllerLogic::set_traffic(const std::string& app,
                                              const TrafficWeights& weights,
                                              const Credential& cred) {
  if (auto s = once(admit_operator_call(options_.ca_pem, cred, Operation::traffic,
                                        traffic_args(app, weights), *recovery_),
                    cred, Operation::traffic);
      !s)
    return s;
  std::map<std::string, double> split;
  for (const auto& [name, weight] : weights) {
    if (!split.emplace(name, weight).second) {
      return Status(errc::invalid_argument,
                    "applications[" + app + "].traffic[" + name + "]: given more than once");
    }
  }
  auto generation = core_->set_traffic(app, split);
  if (!generation) {
    log_->warn("traffic of {} refused: {}", app, generation.status().to_string());
    return generation.status();
  }
  std::string shown;
  for (const auto& [name, weight] : split)
    shown += (shown.empty() ? "" : " ") + name + "=" + std::to_string(weight);
  log_->info("traffic of {} is now {} (generation {})", app, shown, *generation);
  activity_.record(now(), "deploy", app, "traffic of " + app + " is now " + shown);
  return generation;
}

Result<ControllerLogic::Rollback> ControllerLogic::rollback(const std::string& app,
                                                            const Credential& cred) {
  if (auto s =
          once(admit_operator_call(options_.ca_pem, cred, Operation::rollback, {app}, *recovery_),
               cred, Operation::rollback);
      !s)
    return s;
  const TargetState& state = core_->target_state();
  Rollback out;
  if (auto last = state.last_running.find(app); last != state.last_running.end()) {
    out.from_generation = last->second.generation;
    auto current = state.applications.find(app);
    if (current != state.applications.end() && current->second != last->second.spec) {
      if (auto s = libraries_.check_available(last->second.spec); !s) {
        log_->warn("rollback of {} refused: {}", app, s.to_string());
        return s;
      }
    }
  }
  auto result = core_->rollback(app);
  if (!result) {
    log_->warn("rollback of {} refused: {}", app, result.status().to_string());
    return result.status();
  }
  out.generation = result->generation;
  const std::string what = "rollback of " + app + " to generation " +
                           std::to_string(out.from_generation) + "'s declaration";
  log_->info("{}: accepted (generation {})", what, out.generation);
  activity_.record(now(), "deploy", app,
                   what + " (generation " + std::to_string(out.generation) + ")");
  return out;
}

Status ControllerLogic::shutdown(bool nodes, const Credential& cred) {
  std::vector<std::string> args{nodes ? "nodes" : ""};
  if (auto s =
          once(admit_operator_call(options_.ca_pem, cred, Operation::shutdown, args, *recovery_),
               cred, Operation::shutdown);
      !s)
    return s;
  if (auto s = core_->shutdown(); !s)
    return s;
  log_->warn("shutdown requested: deleting every application{}",
             nodes ? ", then stopping every node" : "");
  activity_.record(now(), "deploy", "", "shutdown requested: deleting every application", true);
  stop_nodes_when_empty_ = nodes;
  return Status::ok();
}

Result<KillTarget> ControllerLogic::kill(const std::string& kind, const std::string& id,
                                         const Credential& cred) {
  if (auto s = once(check_request(options_.ca_pem, cred, Operation::kill, {kind, id}), cred,
                    Operation::kill);
      !s)
    return s;
  auto target = actors_.kill_target(kind, id, proxies_);
  if (target)
    log_->warn("{}", target->log_line);
  return target;
}

// ---------------------------------------------------------------- queries

std::string ControllerLogic::status() const {
  auto started_at = [&](const std::string& id) { return actors_.started_at(id); };
  return render_status(core_.get(), recovering(), started_at, &activity_, now()).dump();
}

std::string ControllerLogic::dashboard() const {
  // Counters of replicas that are gone are of no use any more.
  std::set<std::string> live;
  for (const auto& id : core_->deployment_ids()) {
    for (const auto& r : core_->replicas(id))
      live.insert(r.id);
  }
  activity_.prune([&](const std::string& id) { return live.count(id) > 0; });
  const double t = now();
  auto started_at = [&](const std::string& id) { return actors_.started_at(id); };
  nlohmann::json out;
  out["status"] = render_status(core_.get(), recovering(), started_at, &activity_, t);
  auto nodes = nlohmann::json::array();
  for (const auto& n : render_nodes(membership_, proxies_, t)) {
    nodes.push_back({{"id", n.id},
                     {"address", n.address},
                     {"state", n.state},
                     {"resources", n.resources},
                     {"last_heartbeat_age_ms", n.last_heartbeat_age_ms},
                     {"reason", n.reason},
                     {"pid", n.pid},
                     {"proxy", n.proxy}});
  }
  out["nodes"] = std::move(nodes);
  out["events"] = activity_.events_json(t, 50);
  return out.dump();
}

std::vector<NodeStatus> ControllerLogic::nodes() const {
  return render_nodes(membership_, proxies_, now());
}

double ControllerLogic::request_timeout_s() const {
  return core_->target_state().http.request_timeout_s.value_or(0);
}

RoutingSnapshot ControllerLogic::to_wire(const SnapshotDelta& delta) const {
  auto handle_of = [&](const std::string& id) { return actors_.replica(id); };
  return render_snapshot(delta, core_->target_state(), membership_, handle_of);
}

Result<RoutingSnapshot> ControllerLogic::snapshot(uint64_t epoch, uint64_t seq) const {
  if (auto s = recovery_->require_ready(); !s)
    return s;
  auto delta = core_->changes_since(SnapshotId{epoch, seq});
  if (!delta) {
    RoutingSnapshot same;
    same.epoch = epoch;
    same.seq = seq;
    same.request_timeout_s = request_timeout_s();
    same.keep_alive_timeout_s = core_->target_state().http.keep_alive_timeout_s.value_or(0);
    return same;
  }
  return to_wire(*delta);
}

Result<std::string> ControllerLogic::config() const {
  if (auto s = recovery_->require_ready(); !s)
    return s;
  return encode_target_state(core_->target_state());
}

// ---------------------------------------------------------------- routes

bool ControllerLogic::subscribe(const ProxyActor& subscriber, SnapshotId last,
                                const std::string& node_id, const std::string& lost_node) {
  if (!subscriber)
    return false;
  proxies_.track(actors_.add_subscriber(subscriber, last, lost_node), node_id);
  return !recovering();
}

std::vector<ControllerLogic::Push> ControllerLogic::due_pushes() {
  std::vector<Push> out;
  // Subscribers due the same delta get the same snapshot: render it once
  // (after a controller restart or a deploy, that is every subscriber), and
  // keep it while the view stays where it is, for those the push budget
  // holds back until answers come.
  const auto from = std::make_tuple(core_->snapshot_id().epoch, core_->snapshot_id().seq,
                                    core_->target_state().generation, membership_.registrations());
  if (from != rendered_from_) {
    rendered_.clear();
    rendered_from_ = from;
  }
  size_t in_flight = actors_.in_flight_weight();
  for (const auto& [key, sub] : actors_.subscribers()) {
    if (sub.in_flight != 0)
      continue;
    std::shared_ptr<const RoutingSnapshot> own;  // with nodes to refresh: its alone
    const SnapshotId base = core_->delta_base(sub.last);
    auto& snapshot = sub.refresh.empty() ? rendered_[{base.epoch, base.seq}] : own;
    SnapshotId next;
    if (snapshot) {
      next = SnapshotId{snapshot->epoch, snapshot->seq};
    } else if (auto delta = sub.refresh.empty()
                                ? core_->changes_since(sub.last)
                                : core_->changes_and_replicas_on(sub.last, sub.refresh)) {
      snapshot = std::make_shared<const RoutingSnapshot>(to_wire(*delta));
      next = delta->id;
    } else {
      continue;
    }
    size_t weight = 1;
    for (const auto& d : snapshot->deployments)
      weight += d.replicas.size();
    // Over the budget: this subscriber stays due; answers to the pushes in
    // flight publish again.
    if (in_flight > 0 && in_flight + weight > options_.push_budget_entries)
      continue;
    in_flight += weight;
    auto push = actors_.mark_sent(key, next, weight);
    out.push_back(Push{key, push, sub.handle, snapshot});
  }
  return out;
}

void ControllerLogic::push_done(ProxyHealthMonitor::Key key, uint64_t push, bool ok) {
  actors_.push_done(key, push, ok);
}

// ---------------------------------------------------------------- reconciling

std::vector<Command> ControllerLogic::update() {
  if (recovering())
    return {};
  return core_->update();
}

ControllerLogic::Execution ControllerLogic::plan(const Command& cmd) {
  const std::string& id = cmd.replica_id;
  Execution out{CommandAction::spawn, actors_.agent(cmd.node_id), actors_.replica(id)};
  if (cmd.kind == CommandKind::stop || cmd.kind == CommandKind::kill)
    actors_.mark_stopping(id);
  out.action = plan_command(cmd, static_cast<bool>(out.agent), static_cast<bool>(out.replica));
  if (out.action == CommandAction::replica_gone) {
    if (auto it = unreachable_.find(cmd.node_id);
        it != unreachable_.end() && it->second.ids.count(id) > 0) {
      out.action = CommandAction::awaiting_node;
    }
  }
  switch (out.action) {
    case CommandAction::no_agent:
      core_->on_replica_start_failed(id, "node " + cmd.node_id + " has no agent connected");
      break;
    case CommandAction::replica_gone:
      core_->on_replica_crashed(id);
      break;
    case CommandAction::already_gone:
      actors_.forget_replica(id);
      core_->on_replica_stopped(id);
      break;
    default:
      break;  // the actor sends the message
  }
  return out;
}

void ControllerLogic::log_status_changes() {
  for (const auto& c : status_log_.observe(*core_)) {
    log_->log(c.warn ? spdlog::level::warn : spdlog::level::info, "{}", c.describe());
    activity_.record(now(), "status", c.deployment, c.describe(), c.warn);
  }
}

// ---------------------------------------------------------------- reports

void ControllerLogic::health_reports(const std::string& node_id,
                                     const std::vector<HealthReport>& reports) {
  // While recovering, replicas are not adopted yet; a new watch follows.
  if (recovering())
    return;
  size_t foreign = 0;
  std::string example;
  for (const auto& r : reports) {
    // A node checks the replicas it hosts: a report on another node's
    // replica (a confused or hostile node) must not stop or prove it.
    if (const std::string host = actors_.node_of(r.replica_id); host != node_id) {
      if (foreign++ == 0)
        example = r.replica_id + (host.empty() ? " (not known here)" : " (on node " + host + ")");
      continue;
    }
    if (!r.failure.empty())
      log_->info("health check of {} failed: {} ({} in a row, checked by node {})", r.replica_id,
                 r.failure, r.failures, node_id);
    core_->on_health_report(r.replica_id, r.watch, r.passed, r.failures, r.failure);
  }
  if (foreign > 0) {
    log_->warn("ignored {} health report(s) from node {} on replicas it does not host, e.g. {}",
               foreign, node_id, example);
  }
}

void ControllerLogic::replica_metrics(const ReplicaLoad& load) {
  activity_.report(load, now());
  if (!recovering())
    core_->record_replica_metrics(load.replica_id, load.ongoing);
}

bool ControllerLogic::replica_models(const std::string& replica_id, uint64_t seq,
                                     std::vector<std::string> model_ids) {
  // While recovering, replicas are not adopted yet; their periodic report
  // repeats the list.
  if (recovering())
    return false;
  return core_->record_multiplexed_replica_info(replica_id, seq, std::move(model_ids));
}

bool ControllerLogic::handle_metrics(const std::string& reporter, const std::string& app,
                                     const std::string& deployment, double queued_and_inflight) {
  if (recovering())
    return false;
  DeploymentId id{app, deployment};
  core_->record_handle_metrics(reporter, id, queued_and_inflight);
  return queued_and_inflight > 0 && core_->replicas(id).empty();
}

// ---------------------------------------------------------------- time

double ControllerLogic::pause_threshold_s() const {
  return std::max(5 * options_.tick_interval_s, options_.node_timeout_s / 4);
}

void ControllerLogic::notice_pause() {
  double t = now();
  if (last_tick_at_ < 0 || t - last_tick_at_ <= pause_threshold_s())
    return;
  log_->warn(
      "the controller made no progress for {:.1f} s (its process was stopped or starved): "
      "every node's heartbeat deadline starts again now, and a node whose connection dropped "
      "meanwhile has {:.1f} s to register again before it is DEAD",
      t - last_tick_at_, options_.pause_grace_s);
  membership_.resumed(t, options_.pause_grace_s);
  last_tick_at_ = t;
}

void ControllerLogic::settle_unreachable(const std::string& node,
                                         const std::vector<HostedReplicaInfo>& hosted) {
  auto it = unreachable_.find(node);
  if (it == unreachable_.end())
    return;
  for (const auto& id : it->second.ids) {
    auto h = std::find_if(hosted.begin(), hosted.end(), [&](const HostedReplicaInfo& x) {
      return x.replica_id == id && x.handle;
    });
    if (h != hosted.end()) {
      log_->info("replica {} is back with its node {}", id, node);
      core_->republish(DeploymentId{h->app, h->deployment});
      continue;
    }
    std::string cause = "replica " + id + " was not reported by node " + node +
                        " when it registered again after its connection was lost";
    log_->warn("{}", cause);
    activity_.record(now(), "crash", id, cause, true);
    core_->on_replica_crashed(id, cause);
  }
  unreachable_.erase(it);
}

void ControllerLogic::drop_unreachable(const std::vector<NodeTransition>& ts) {
  for (const auto& t : ts) {
    if (t.to == NodeState::dead)
      unreachable_.erase(t.id);
  }
}

void ControllerLogic::release_held() {
  for (auto it = unreachable_.begin(); it != unreachable_.end();) {
    const auto node = membership_.nodes().find(it->first);
    const bool waits =
        node != membership_.nodes().end() &&
        (node->second.state == NodeState::unreachable || node->second.reconnect_by > now() ||
         now() - it->second.since <= membership_.node_timeout_s());
    if (waits) {
      ++it;
      continue;
    }
    for (const auto& id : it->second.ids) {
      std::string cause = "replica " + id + " went down with the connection to node " + it->first +
                          ", which neither registered again nor was declared lost within " +
                          "the node timeout";
      log_->warn("{}", cause);
      activity_.record(now(), "crash", id, cause, true);
      core_->on_replica_crashed(id, cause);
    }
    it = unreachable_.erase(it);
  }
}

bool ControllerLogic::tick() {
  notice_pause();
  last_tick_at_ = now();
  auto ts = membership_.check(now());
  log_transitions(ts);
  drop_unreachable(ts);
  if (!recovering())
    release_held();
  if (!ts.empty())
    nodes_changed();
  retry_live_nodes();
  if (!recovering() && (libraries_collected_at_ < 0 ||
                        now() - libraries_collected_at_ >= options_.library_collect_interval_s)) {
    libraries_collected_at_ = now();
    (void)libraries_.collect(core_->target_state(), static_cast<double>(std::time(nullptr)));
  }
  return recovery_->window_over();
}

Result<uint64_t> ControllerLogic::upload_library(const std::string& sha256, uint64_t total,
                                                 uint64_t offset, const std::string& piece,
                                                 const Credential& cred) {
  if (auto s = once(check_request(options_.ca_pem, cred, Operation::upload,
                                  {sha256, std::to_string(total), std::to_string(offset),
                                   libraries::sha256_hex(piece)}),
                    cred, Operation::upload);
      !s)
    return s;
  auto received = libraries_.upload(sha256, total, offset, piece);
  if (!received)
    log_->warn("upload of library {} refused: {}", sha256, received.status().to_string());
  return received;
}

std::vector<AgentActor> ControllerLogic::nodes_to_stop() {
  if (recovering() || !stop_nodes_when_empty_ || !core_->is_shut_down())
    return {};
  stop_nodes_when_empty_ = false;
  auto agents = actors_.agents();
  log_->warn("every replica is gone; stopping {} nodes", agents.size());
  return agents;
}

std::vector<std::pair<ProxyHealthMonitor::Key, ProxyActor>> ControllerLogic::due_proxy_checks() {
  std::vector<std::pair<ProxyHealthMonitor::Key, ProxyActor>> out;
  for (auto key : proxies_.start_due_checks()) {
    if (auto proxy = actors_.subscriber(key))
      out.emplace_back(key, proxy);  // tracked together: always there
  }
  return out;
}

ProxyActor ControllerLogic::settle_proxy_check(ProxyHealthMonitor::Key key, bool ok,
                                               const std::string& why) {
  auto out = proxies_.settle(key, ok);
  switch (out.verdict) {
    case ProxyVerdict::gone:
    case ProxyVerdict::healthy:
    case ProxyVerdict::still_unhealthy:
      return {};
    case ProxyVerdict::recovered:
      log_->info("proxy of node {} is HEALTHY again", out.node_id);
      return {};
    case ProxyVerdict::failed:
      log_->warn("proxy of node {} failed a health check ({} of {}): {}", out.node_id, out.failures,
                 options_.proxy_unhealthy_after, why);
      return {};
    case ProxyVerdict::became_unhealthy:
      log_->warn(
          "proxy of node {} is UNHEALTHY after {} failed health checks ({}); "
          "restarting it",
          out.node_id, out.failures, why);
      return actors_.subscriber(key);
  }
  return {};
}

// ---------------------------------------------------------------- down

bool ControllerLogic::on_down(const caf::actor_addr& source, const caf::error& reason,
                              const std::string& rendered) {
  notice_pause();
  auto ev = actors_.on_down(source, reason);
  switch (ev.kind) {
    case DownKind::unknown:
      return false;
    case DownKind::subscriber:
      proxies_.forget(ev.subscriber);
      return false;
    case DownKind::replica_stopped:
      if (recovering())
        return false;
      core_->on_replica_stopped(ev.id);
      return true;
    case DownKind::replica_crashed:
      if (recovering())
        return false;
      if (reason == caf::exit_reason::remote_link_unreachable &&
          membership_.state(ev.node) != NodeState::dead) {
        // The connection to its node dropped: the node's judgement decides
        // (its agent's notice comes with the same drop, or the heartbeats
        // stop), not this notice.
        const NodeState node = membership_.state(ev.node);
        log_->info("replica {} went down with the connection to node {}{}", ev.id, ev.node,
                   membership_.in_pause_grace(now())
                       ? " after the controller's pause; waiting for the node to register again"
                   : node == NodeState::unreachable
                       ? ", which is UNREACHABLE; waiting for it to register again"
                       : "; waiting for the node to register again or be declared lost");
        auto& held = unreachable_[ev.node];
        if (held.ids.empty())
          held.since = now();
        held.ids.insert(ev.id);
        return false;
      }
      // A replica process's handle ends with the cause of its exit ("replica
      // X exited: killed by SIGSEGV"): that is the status message.
      log_->warn("replica {} went down: {}", ev.id, ev.cause.empty() ? rendered : ev.cause);
      activity_.record(now(), "crash", ev.id,
                       "replica " + ev.id + " went down: " +
                           (ev.cause.empty() ? rendered : ev.cause),
                       true);
      core_->on_replica_crashed(ev.id, ev.cause);
      return true;
    case DownKind::agent_died:
      // The agent actor died but the connection to its node did not: the
      // node process lives and restarts its agent, which registers again
      // with the replicas it hosts (they keep serving meanwhile). Only the
      // heartbeat timeout declares the node DEAD if no agent comes back.
      log_->warn("lost the node agent of {}: {}", ev.id, rendered);
      log_->info("node {} still connected; waiting for its new agent (node timeout {:.1f} s)",
                 ev.id, membership_.node_timeout_s());
      return false;
    case DownKind::agent_link_lost: {
      log_->warn("lost the node agent of {}: {}", ev.id, rendered);
      auto ts = membership_.connection_lost(ev.id, ev.incarnation, now());
      log_transitions(ts);
      drop_unreachable(ts);
      if (auto it = membership_.nodes().find(ev.id);
          ts.empty() && it != membership_.nodes().end() && it->second.reconnect_by > now()) {
        log_->info("node {} lost its connection in the controller's pause; it has {:.1f} s to "
                   "register again",
                   ev.id, it->second.reconnect_by - now());
      }
      if (ts.empty())
        return false;
      nodes_changed();
      return true;
    }
  }
  return false;
}

}  // namespace troupe::controller
