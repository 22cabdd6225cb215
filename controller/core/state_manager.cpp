#include "controller/core/state_manager.hpp"

#include <algorithm>
#include <sstream>

#include "controller/core/validate.hpp"

namespace troupe::controller {

namespace {

std::string app_path(const std::string& app) {
  return "applications[" + app + "]";
}

// The answer for an application the target state does not have.
Status unknown_application(const std::string& app) {
  return Status(errc::not_found, app_path(app) + ": \"" + app + "\" is not a known application");
}

// The deployment of that name in `deps`, or deps.end().
std::vector<DeploymentSpec>::const_iterator find_deployment(const std::vector<DeploymentSpec>& deps,
                                                            const std::string& name) {
  return std::find_if(deps.begin(), deps.end(),
                      [&](const DeploymentSpec& d) { return d.name == name; });
}

// A shadow deployment cannot be deleted alone: the application's shadow
// field names it (errc::invalid_argument saying so). One shadowed with
// probability 0 gets no copy: it may go, and leaves the shadow set with it
// (the seed's set_shadow removes an entry set to 0).
Status check_not_shadow(const std::string& app, const ApplicationSpec& spec,
                        const std::string& deployment) {
  auto s = spec.shadow.find(deployment);
  if (s == spec.shadow.end() || s->second == 0)
    return Status::ok();
  std::ostringstream probability;
  probability << s->second;
  return Status(errc::invalid_argument,
                app_path(app) + ".deployments[" + deployment + "]: \"" + deployment +
                    "\" is a shadow of the application (" + app_path(app) + ".shadow[" +
                    deployment + "] = " + probability.str() +
                    ") and cannot be deleted; deploy the application without it in shadow first");
}

}  // namespace

StateManager::StateManager(CheckpointStore& store, const Clock& clock, Random& rng,
                           CoreOptions options)
    : store_(store), clock_(clock), rng_(rng), options_(options) {}

StateManager::~StateManager() = default;

StateManager::DeploymentMap::iterator StateManager::first_of(const std::string& app) {
  return deployments_.lower_bound(DeploymentId{app, ""});
}

StateManager::DeploymentMap::const_iterator StateManager::first_of(const std::string& app) const {
  return deployments_.lower_bound(DeploymentId{app, ""});
}

TickContext StateManager::context(std::vector<Command>& out) {
  return TickContext{
      clock_.now_s(),
      rng_,
      cluster_,
      options_,
      directory_,
      out,
      next_replica_seq_,
      [this](const DeploymentId& id, uint32_t n) { return write_autoscaled(id, n).is_ok(); }};
}

Status StateManager::require_recovered() const {
  if (recovered_)
    return Status::ok();
  return Status(errc::unavailable, "the controller has not recovered its checkpoint yet");
}

// ---------------------------------------------------------------- startup

Status StateManager::recover(const std::vector<HostedReplica>& hosted) {
  if (recovered_)
    return Status(errc::internal, "recover() called twice");
  auto loaded = store_.load();
  if (!loaded)
    return loaded.status();
  if (loaded->has_value()) {
    Status v = validate(**loaded);
    if (!v) {
      return Status(errc::corrupt, "the checkpoint holds an invalid target state: " + v.message());
    }
    target_ = std::move(**loaded);
    // A last good declaration outlives no application (no checkpoint holds
    // one of an application it lacks; dropped rather than trusted if one did).
    for (auto it = target_.last_running.begin(); it != target_.last_running.end();) {
      it = target_.applications.count(it->first) ? std::next(it) : target_.last_running.erase(it);
    }
  }
  recovered_ = true;
  apply_target(nullptr);
  // The autoscaler's counts resume before the replicas are adopted.
  for (const auto& [app, counts] : target_.autoscaled_replicas) {
    for (const auto& [name, replicas] : counts) {
      auto it = deployments_.find(DeploymentId{app, name});
      if (it != deployments_.end())
        it->second->restore_autoscaled_target(replicas);
    }
  }
  adopt_replicas(hosted);
  return Status::ok();
}

void StateManager::adopt_replicas(const std::vector<HostedReplica>& hosted) {
  TickContext ctx = context(pending_commands_);
  for (const auto& h : hosted) {
    if (directory_.count(h.replica_id))
      continue;
    next_replica_seq_ = std::max(next_replica_seq_, parse_replica_seq(h.replica_id) + 1);
    auto it = deployments_.find(DeploymentId{h.app, h.deployment});
    if (it != deployments_.end() && !it->second->deleting()) {
      it->second->adopt(h, ctx);
      continue;
    }
    // An orphan: it belongs to no deployment we know. Stop it.
    auto owned = std::make_unique<Replica>();
    Replica& r = *owned;
    r.id = h.replica_id;
    r.seq = parse_replica_seq(r.id);
    r.placed = true;
    r.node_id = h.node_id;
    r.created_at = ctx.now;
    cluster_.reserve(r.node_id, r.reserved);
    r.state = ReplicaState::running;
    if (h.stopping) {
      r.state = ReplicaState::stopping;
      r.kill_at = ctx.now + options_.orphan_graceful_shutdown_timeout_s;
    } else {
      begin_stop(r, options_.orphan_graceful_shutdown_timeout_s, ctx);
    }
    directory_[r.id] = &r;
    orphans_.push_back(std::move(owned));
  }
}

// ---------------------------------------------------------------- write-ahead

Status StateManager::commit(TargetState next) {
  next.generation = target_.generation + 1;
  // The autoscaler's counts are not the caller's to declare: those of
  // deployments that stay autoscaled are kept, the rest dropped (a
  // deployment that gets autoscaling again starts afresh).
  next.autoscaled_replicas.clear();
  for (const auto& [app, counts] : target_.autoscaled_replicas) {
    auto a = next.applications.find(app);
    if (a == next.applications.end())
      continue;
    for (const auto& [name, replicas] : counts) {
      for (const auto& d : a->second.deployments) {
        if (d.name == name && d.config.autoscaling_config)
          next.autoscaled_replicas[app][name] = replicas;
      }
    }
  }
  // A deleted application's last good declaration goes with it, in the same
  // commit (an application deployed again under its name starts afresh).
  for (auto it = next.last_running.begin(); it != next.last_running.end();) {
    it = next.applications.count(it->first) ? std::next(it) : next.last_running.erase(it);
  }
  if (Status v = validate(next); !v)
    return v;
  // Written ahead: if the store fails, memory is untouched and the caller
  // gets the error.
  if (Status s = store_.save(next); !s)
    return s;
  target_ = std::move(next);
  return Status::ok();
}

bool StateManager::runs_its_declaration(const std::string& app) const {
  auto a = apps_.find(app);
  if (a == apps_.end() || a->second.deleting)
    return false;
  bool any = false;
  for (auto d = first_of(app); d != deployments_.end() && d->first.app == app; ++d) {
    if (d->second->deleting())
      continue;  // dropped from the declaration, still stopping
    if (d->second->status().status != DeploymentStatus::healthy)
      return false;
    any = true;
  }
  return any;
}

void StateManager::record_running() {
  std::vector<std::string> due;
  for (auto it = unrecorded_.begin(); it != unrecorded_.end();) {
    auto declared = target_.applications.find(*it);
    if (declared == target_.applications.end()) {  // deleted meanwhile
      it = unrecorded_.erase(it);
      continue;
    }
    auto last = target_.last_running.find(*it);
    if (last != target_.last_running.end() && last->second.spec == declared->second) {
      it = unrecorded_.erase(it);  // e.g. a rollback, or the same spec deployed again
      continue;
    }
    if (runs_its_declaration(*it))
      due.push_back(*it);
    ++it;
  }
  if (due.empty())
    return;
  // One synced save for every application that got there this tick; a failed
  // one changes nothing, and the next tick tries again.
  TargetState next = target_;
  for (const auto& app : due)
    next.last_running[app] = RunningDeclaration{next.applications.at(app), next.generation};
  if (Status s = store_.save(next); !s)
    return;
  target_.last_running = std::move(next.last_running);
  for (const auto& app : due)
    unrecorded_.erase(app);
}

Status StateManager::write_autoscaled(const DeploymentId& id, uint32_t replicas) {
  auto& counts = target_.autoscaled_replicas[id.app];
  auto it = counts.find(id.name);
  if (it != counts.end() && it->second == replicas)
    return Status::ok();
  const std::optional<uint32_t> old =
      it == counts.end() ? std::nullopt : std::optional<uint32_t>(it->second);
  counts[id.name] = replicas;
  Status s = store_.save(target_);
  if (!s) {  // memory stays as the store has it
    if (old)
      counts[id.name] = *old;
    else
      counts.erase(id.name);
    if (counts.empty())
      target_.autoscaled_replicas.erase(id.app);
  }
  return s;
}

void StateManager::apply_target(std::map<std::string, DeployResult>* results) {
  for (const auto& [name, app] : target_.applications) {
    AppState& state = apps_[name];
    if (state.deleting || state.spec != app) {
      routes_dirty_ = true;
      unrecorded_.insert(name);
    }
    state.spec = app;
    state.deleting = false;
    DeployResult* result = results ? &(*results)[name] : nullptr;
    for (const auto& d : app.deployments) {
      DeploymentId id{name, d.name};
      auto spec = std::make_shared<const DeploymentSpec>(d);
      auto it = deployments_.find(id);
      ChangeKind kind;
      if (it == deployments_.end()) {
        deployments_.emplace(id, std::make_unique<DeploymentState>(
                                     id, std::move(spec), target_.target_capacity, options_,
                                     target_.target_capacity_direction));
        removed_at_.erase(id);
        kind = ChangeKind::created;
      } else {
        kind = it->second->deploy(std::move(spec), target_.target_capacity,
                                  target_.target_capacity_direction);
      }
      if (result)
        result->deployments[d.name] = kind;
    }
    // Deployments dropped from the application.
    for (auto it = first_of(name); it != deployments_.end() && it->first.app == name; ++it) {
      const DeploymentId& id = it->first;
      DeploymentState* dep = it->second.get();
      if (dep->deleting())
        continue;
      bool listed = std::any_of(app.deployments.begin(), app.deployments.end(),
                                [&](const DeploymentSpec& d) { return d.name == id.name; });
      if (!listed) {
        dep->start_deleting();
        if (result)
          result->removed.push_back(id.name);
      }
    }
  }
  for (auto& [name, state] : apps_) {
    if (state.deleting || target_.applications.count(name))
      continue;
    state.deleting = true;
    routes_dirty_ = true;
    for (auto it = first_of(name); it != deployments_.end() && it->first.app == name; ++it) {
      if (!it->second->deleting())
        it->second->start_deleting();
    }
  }
}

Result<DeployResult> StateManager::deploy_application(const ApplicationSpec& app) {
  if (Status s = require_recovered(); !s)
    return s;
  {
    // Checked on the whole state: the cluster-wide total counts every other
    // application too. Also for an unchanged spec, so a lowered limit shows.
    TargetState next = target_;
    next.applications[app.name] = app;
    if (Status s = check_limits(next, options_.limits); !s)
      return s;
  }
  if (Status v = validate(app); !v)
    return v;
  auto current = target_.applications.find(app.name);
  if (current != target_.applications.end() && current->second == app) {
    DeployResult r;
    r.generation = target_.generation;
    for (const auto& d : app.deployments)
      r.deployments[d.name] = ChangeKind::unchanged;
    return r;
  }
  TargetState next = target_;
  next.applications[app.name] = app;
  if (Status s = commit(std::move(next)); !s)
    return s;
  std::map<std::string, DeployResult> results;
  apply_target(&results);
  DeployResult r = std::move(results[app.name]);
  r.changed = true;
  r.generation = target_.generation;
  return r;
}

Result<DeployResult> StateManager::rollback(const std::string& app) {
  if (Status s = require_recovered(); !s)
    return s;
  auto current = target_.applications.find(app);
  if (current == target_.applications.end())
    return unknown_application(app);
  auto last = target_.last_running.find(app);
  if (last == target_.last_running.end()) {
    return Status(errc::conflict,
                  app_path(app) + ": application '" + app +
                      "' has no last good declaration to roll back to: it has not run with "
                      "every deployment HEALTHY since it was deployed");
  }
  if (last->second.spec == current->second) {
    return Status(errc::conflict, app_path(app) + ": application '" + app +
                                      "' is already at its last good declaration (generation " +
                                      std::to_string(last->second.generation) +
                                      "): there is nothing to roll back");
  }
  // A copy: the commit replaces target_, which holds it.
  const ApplicationSpec spec = last->second.spec;
  return deploy_application(spec);
}

Result<DeployResult> StateManager::deploy_deployment(
    const std::string& app, const DeploymentSpec& spec,
    const std::optional<std::string>& prev_version) {
  if (Status s = require_recovered(); !s)
    return s;
  auto it = target_.applications.find(app);
  if (it == target_.applications.end()) {
    return unknown_application(app);
  }
  const auto& deps = it->second.deployments;
  auto current = find_deployment(deps, spec.name);
  const std::string path = app_path(app) + ".deployments[" + spec.name + "]";
  if (prev_version) {
    if (current == deps.end()) {
      return Status(errc::conflict, path + ".prev_version: \"" + *prev_version +
                                        "\" must equal the current version, but the "
                                        "deployment does not exist");
    }
    const std::string now = effective_code_version(*current);
    if (now != *prev_version) {
      return Status(errc::conflict, path + ".prev_version: \"" + *prev_version +
                                        "\" must equal the current version \"" + now + "\"");
    }
  }
  if (current != deps.end() && *current == spec) {
    DeployResult r;
    r.generation = target_.generation;
    r.deployments[spec.name] = ChangeKind::unchanged;
    return r;
  }
  ApplicationSpec next_app = it->second;
  auto slot = std::find_if(next_app.deployments.begin(), next_app.deployments.end(),
                           [&](const DeploymentSpec& d) { return d.name == spec.name; });
  if (slot == next_app.deployments.end()) {
    next_app.deployments.push_back(spec);
  } else {
    *slot = spec;
  }
  auto result = deploy_application(next_app);
  if (result) {
    // Report only the deployment the caller named.
    ChangeKind kind = result->deployments[spec.name];
    result->deployments.clear();
    result->deployments[spec.name] = kind;
  }
  return result;
}

Result<std::map<std::string, DeployResult>> StateManager::apply(
    const TargetState& declared, bool* changed, const std::optional<uint64_t>& if_generation) {
  if (changed)
    *changed = false;
  if (Status s = require_recovered(); !s)
    return s;
  if (if_generation && *if_generation != target_.generation) {
    return Status(errc::conflict, "if_generation: " + std::to_string(*if_generation) +
                                      " is not the current generation " +
                                      std::to_string(target_.generation) +
                                      " (the target state changed since; read it again)");
  }
  if (Status s = check_limits(declared, options_.limits); !s)
    return s;
  for (const auto& [name, app] : declared.applications) {
    if (name != app.name) {
      return Status(errc::invalid_argument,
                    app_path(name) + ": keyed as \"" + name + "\" but named \"" + app.name + "\"");
    }
    if (Status v = validate(app); !v)
      return v;
  }
  std::map<std::string, DeployResult> results;
  if (declared.applications == target_.applications &&
      declared.target_capacity == target_.target_capacity && declared.http == target_.http) {
    for (const auto& [name, app] : declared.applications) {
      DeployResult& r = results[name];
      r.generation = target_.generation;
      for (const auto& d : app.deployments)
        r.deployments[d.name] = ChangeKind::unchanged;
    }
    return results;
  }
  TargetState next = target_;
  next.applications = declared.applications;
  next.target_capacity = declared.target_capacity;
  next.target_capacity_direction = next_capacity_direction(target_, next);
  next.http = declared.http;
  if (Status s = commit(std::move(next)); !s)
    return s;
  apply_target(&results);
  for (auto& [name, r] : results) {
    r.changed = true;
    r.generation = target_.generation;
  }
  if (changed)
    *changed = true;
  return results;
}

Result<DeployResult> StateManager::scale_deployment(const std::string& app,
                                                    const std::string& deployment,
                                                    uint32_t replicas) {
  if (Status s = require_recovered(); !s)
    return s;
  auto it = target_.applications.find(app);
  if (it == target_.applications.end()) {
    return unknown_application(app);
  }
  const auto& deps = it->second.deployments;
  auto current = find_deployment(deps, deployment);
  const std::string path = app_path(app) + ".deployments[" + deployment + "]";
  if (current == deps.end())
    return Status(errc::not_found, path + ": \"" + deployment + "\" is not a known deployment");
  if (current->config.autoscaling_config) {
    return Status(errc::invalid_argument,
                  path +
                      ".num_replicas: the deployment is autoscaled (autoscaling_config is "
                      "set), so its replica count is the autoscaler's; change min_replicas and "
                      "max_replicas in its config instead");
  }
  DeploymentSpec next = *current;
  next.config.num_replicas = replicas;
  return deploy_deployment(app, next);
}

Status StateManager::delete_application(const std::string& app) {
  if (Status s = require_recovered(); !s)
    return s;
  if (target_.applications.count(app) == 0) {
    // Asked again while its replicas stop (a client retrying after a lost
    // answer): the delete it asks for is under way. Ray Serve's calls are
    // idempotent the same way; a name never deployed stays an error.
    if (auto a = apps_.find(app); a != apps_.end() && a->second.deleting)
      return Status::ok();
    return unknown_application(app);
  }
  TargetState next = target_;
  next.applications.erase(app);
  if (Status s = commit(std::move(next)); !s)
    return s;
  apply_target(nullptr);
  return Status::ok();
}

Status StateManager::delete_deployment(const std::string& app, const std::string& deployment) {
  if (Status s = require_recovered(); !s)
    return s;
  auto it = target_.applications.find(app);
  if (it == target_.applications.end()) {
    return unknown_application(app);
  }
  const std::string path = app_path(app) + ".deployments[" + deployment + "]";
  ApplicationSpec next_app = it->second;
  auto slot = std::find_if(next_app.deployments.begin(), next_app.deployments.end(),
                           [&](const DeploymentSpec& d) { return d.name == deployment; });
  if (slot == next_app.deployments.end()) {
    // Being deleted already (a retried call): under way, as asked.
    if (auto d = deployments_.find(DeploymentId{app, deployment});
        d != deployments_.end() && d->second->deleting())
      return Status::ok();
    return Status(errc::not_found, path + ": \"" + deployment + "\" is not a known deployment");
  }
  if (deployment == next_app.ingress) {
    return Status(errc::invalid_argument,
                  path + ": \"" + deployment +
                      "\" is the ingress and cannot be deleted alone (delete the application)");
  }
  if (Status s = check_not_shadow(app, next_app, deployment); !s)
    return s;
  next_app.shadow.erase(deployment);
  if (auto w = next_app.traffic.find(deployment); w != next_app.traffic.end()) {
    if (w->second > 0) {
      std::ostringstream weight;
      weight << w->second;
      return Status(errc::invalid_argument,
                    path + ": \"" + deployment + "\" carries traffic (" + app_path(app) +
                        ".traffic[" + deployment + "] = " + weight.str() +
                        ") and cannot be deleted; give its weight to other deployments first");
    }
    next_app.traffic.erase(w);
  }
  next_app.deployments.erase(slot);
  TargetState next = target_;
  next.applications[app] = std::move(next_app);
  if (Status s = commit(std::move(next)); !s)
    return s;
  apply_target(nullptr);
  return Status::ok();
}

Result<uint64_t> StateManager::set_traffic(const std::string& app,
                                           const std::map<std::string, double>& weights) {
  if (Status s = require_recovered(); !s)
    return s;
  auto it = target_.applications.find(app);
  if (it == target_.applications.end()) {
    return unknown_application(app);
  }
  if (weights.empty()) {
    return Status(errc::invalid_argument,
                  app_path(app) + ".traffic: {} must name at least one deployment");
  }
  if (it->second.traffic == weights)
    return target_.generation;
  TargetState next = target_;
  next.applications[app].traffic = weights;
  if (Status s = commit(std::move(next)); !s)
    return s;
  apply_target(nullptr);
  return target_.generation;
}

Status StateManager::set_target_capacity(std::optional<double> capacity) {
  if (Status s = require_recovered(); !s)
    return s;
  if (capacity == target_.target_capacity)
    return Status::ok();
  TargetState next = target_;
  next.target_capacity = capacity;
  next.target_capacity_direction = next_capacity_direction(target_, next);
  if (Status s = commit(std::move(next)); !s)
    return s;
  apply_target(nullptr);
  return Status::ok();
}

Status StateManager::shutdown() {
  if (Status s = require_recovered(); !s)
    return s;
  if (!target_.applications.empty()) {
    TargetState next = target_;
    next.applications.clear();
    if (Status s = commit(std::move(next)); !s)
      return s;
  }
  apply_target(nullptr);
  return Status::ok();
}

Status StateManager::set_autoscaled_target(const DeploymentId& id, uint32_t replicas) {
  auto it = deployments_.find(id);
  if (it == deployments_.end() || it->second->deleting()) {
    return Status(errc::not_found,
                  app_path(id.app) + ".deployments[" + id.name + "]: not a known deployment");
  }
  if (!it->second->spec().config.autoscaling_config) {
    return Status(errc::invalid_argument, app_path(id.app) + ".deployments[" + id.name +
                                              "].autoscaling_config: none, so the replica count "
                                              "cannot be autoscaled");
  }
  // Clamped like a decision of the policy, and written ahead like one.
  const auto [lo, hi] = it->second->autoscaling_bounds();
  const uint32_t n = std::clamp(replicas, lo, hi);
  if (Status s = write_autoscaled(id, n); !s)
    return s;
  it->second->set_autoscaled_target(n);
  return Status::ok();
}

void StateManager::record_replica_metrics(const std::string& replica_id, double ongoing) {
  Replica* r = find(replica_id);
  if (!r || !r->owner || r->state != ReplicaState::running)
    return;
  r->owner->record_replica_metrics(replica_id, ongoing, clock_.now_s());
}

bool StateManager::record_multiplexed_replica_info(const std::string& replica_id, uint64_t seq,
                                                   std::vector<std::string> model_ids) {
  Replica* r = find(replica_id);
  if (!r || !r->owner || r->removed || seq <= r->model_ids_seq)
    return false;
  r->model_ids_seq = seq;
  if (r->model_ids == model_ids)
    return false;  // periodic repeat: nothing to push
  r->model_ids = std::move(model_ids);
  r->owner->mark_running_set_dirty();
  return true;
}

void StateManager::record_handle_metrics(const std::string& reporter_id, const DeploymentId& id,
                                         double queued_and_inflight) {
  auto it = deployments_.find(id);
  if (it == deployments_.end() || it->second->deleting())
    return;
  it->second->record_handle_metrics(reporter_id, queued_and_inflight, clock_.now_s());
}

// ---------------------------------------------------------------- environment

void StateManager::set_nodes(const std::vector<NodeInfo>& nodes) {
  cluster_.set_nodes(nodes);
}

Replica* StateManager::find(const std::string& replica_id) {
  auto it = directory_.find(replica_id);
  return it == directory_.end() ? nullptr : it->second;
}

Replica* StateManager::touch(const std::string& replica_id) {
  Replica* r = find(replica_id);
  if (r && r->owner)
    r->owner->wake();
  return r;
}

bool StateManager::on_replica_ready(const std::string& replica_id, const ReplicaVersion& version) {
  Replica* r = touch(replica_id);
  if (!r)
    return false;
  if (r->state == ReplicaState::starting || r->state == ReplicaState::updating ||
      r->state == ReplicaState::recovering) {
    r->startup = Replica::Startup::ready;
    r->reported_version = version;
  }
  return true;
}

bool StateManager::on_replica_start_failed(const std::string& replica_id,
                                           const std::string& error) {
  Replica* r = touch(replica_id);
  if (!r)
    return false;
  if (r->state == ReplicaState::starting || r->state == ReplicaState::updating ||
      r->state == ReplicaState::recovering) {
    r->startup = Replica::Startup::failed;
    r->error = error;
  }
  return true;
}

bool StateManager::on_health_report(const std::string& replica_id, uint64_t watch, uint32_t passed,
                                    uint32_t failures, const std::string& failure) {
  Replica* r = touch(replica_id);
  if (!r)
    return false;
  if (r->state == ReplicaState::running && watch == r->check_seq) {
    r->health_reported = true;
    r->reported_passed = passed;
    r->reported_failures = failures;
    r->reported_failure = failure;
  }
  return true;
}

void StateManager::rewatch_node(const std::string& node_id) {
  for (auto& [id, r] : directory_) {
    if (r->state == ReplicaState::running && r->node_id == node_id) {
      r->watch_due = true;
      if (r->owner)
        r->owner->wake();
    }
  }
}

bool StateManager::on_replica_stopped(const std::string& replica_id) {
  Replica* r = touch(replica_id);
  if (!r)
    return false;
  r->stopped = true;
  // A replica that exits while we did not ask it to has crashed.
  if (r->state != ReplicaState::stopping)
    r->crashed = true;
  return true;
}

bool StateManager::on_replica_crashed(const std::string& replica_id, const std::string& cause) {
  Replica* r = touch(replica_id);
  if (!r)
    return false;
  r->crashed = true;
  r->error = cause;
  return true;
}

std::vector<Command> StateManager::update() {
  std::vector<Command> out = std::move(pending_commands_);
  pending_commands_.clear();
  if (!recovered_)
    return out;
  TickContext ctx = context(out);
  for (auto it = deployments_.begin(); it != deployments_.end();) {
    DeploymentState& dep = *it->second;
    dep.update(ctx);
    if (dep.finished()) {
      dep.release_all(ctx);
      removed_pending_.push_back(it->first);
      it = deployments_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& r : orphans_) {
    if (!r->removed && advance_stopping(*r, ctx)) {
      cluster_.release(r->node_id, r->reserved);
      directory_.erase(r->id);
      r->removed = true;
    }
  }
  orphans_.erase(std::remove_if(orphans_.begin(), orphans_.end(),
                                [](const std::unique_ptr<Replica>& r) { return r->removed; }),
                 orphans_.end());
  for (auto it = apps_.begin(); it != apps_.end();) {
    auto first = first_of(it->first);
    bool gone =
        it->second.deleting && (first == deployments_.end() || first->first.app != it->first);
    it = gone ? apps_.erase(it) : std::next(it);
  }
  record_running();
  publish();
  return out;
}

// ---------------------------------------------------------------- snapshots

std::vector<Route> StateManager::current_routes() const {
  std::vector<Route> routes;
  for (const auto& [name, app] : apps_) {
    if (app.deleting)
      continue;
    routes.push_back({app.spec.route_prefix, name, app.spec.ingress, app.spec.traffic,
                      app.spec.traffic_key_header, app.spec.shadow, app.spec.open_inference});
  }
  std::sort(routes.begin(), routes.end(),
            [](const Route& a, const Route& b) { return a.prefix < b.prefix; });
  return routes;
}

void StateManager::publish() {
  const uint64_t next = snapshot_seq_ + 1;
  bool changed = false;
  if (routes_dirty_) {
    routes_dirty_ = false;
    std::vector<Route> routes = current_routes();
    if (routes != routes_ || routes_seq_ == 0) {
      routes_ = std::move(routes);
      routes_seq_ = next;
      changed = true;
    }
  }
  for (const auto& id : removed_pending_) {
    removed_at_[id] = next;
    changed = true;
  }
  removed_pending_.clear();
  for (auto& [id, dep] : deployments_) {
    if (!dep->running_set_dirty())
      continue;
    // Never publish while replicas are still RECOVERING: subscribers keep the
    // previous incarnation's view instead of an empty or partial set.
    if (dep->recovering_count() > 0)
      continue;
    if (dep->mark_published(next, dep->running_set()))
      changed = true;
  }
  if (changed)
    snapshot_seq_ = next;
}

void StateManager::touch_snapshot() {
  if (snapshot_seq_ > 0)
    ++snapshot_seq_;
}

void StateManager::republish(const DeploymentId& id) {
  auto it = deployments_.find(id);
  if (it == deployments_.end() || it->second->published_seq() == 0)
    return;
  ++snapshot_seq_;
  it->second->republish(snapshot_seq_);
}

SnapshotId StateManager::delta_base(const SnapshotId& last) const {
  const bool full =
      last.epoch != options_.snapshot_epoch || last.seq == 0 || last.seq > snapshot_seq_;
  return full ? SnapshotId{} : last;
}

std::optional<SnapshotDelta> StateManager::changes_since(const SnapshotId& last) const {
  if (snapshot_seq_ == 0)
    return std::nullopt;  // nothing published yet
  const bool full = delta_base(last).seq == 0;
  if (!full && last.seq == snapshot_seq_)
    return std::nullopt;
  SnapshotDelta d;
  d.id = snapshot_id();
  d.full = full;
  d.routes_changed = full || routes_seq_ > last.seq;
  if (d.routes_changed)
    d.routes = routes_;
  for (const auto& [id, dep] : deployments_) {
    if (dep->published_seq() == 0) {
      if (full)
        d.withheld.push_back(id);
      continue;
    }
    if (full) {
      d.deployments.push_back({id, dep->published_set()});
    } else if (dep->published_seq() > last.seq) {
      DeploymentReplicas change{id, {}};
      change.partial = dep->changes_since(last.seq, change.replicas, change.removed_replicas);
      if (!change.partial)
        change.replicas = dep->published_set();
      d.deployments.push_back(std::move(change));
    }
  }
  if (!full) {
    for (const auto& [id, seq] : removed_at_) {
      if (seq > last.seq && deployments_.count(id) == 0)
        d.removed.push_back(id);
    }
  }
  return d;
}

std::optional<SnapshotDelta> StateManager::changes_and_replicas_on(
    const SnapshotId& last, const std::set<std::string>& nodes) const {
  if (snapshot_seq_ == 0)
    return std::nullopt;
  SnapshotDelta d;
  if (auto changes = changes_since(last)) {
    d = std::move(*changes);
  } else {
    d.id = snapshot_id();
  }
  if (d.full || nodes.empty())
    return d;
  auto by_id = [](const RunningReplicaInfo& a, const RunningReplicaInfo& b) {
    return a.replica_id < b.replica_id;
  };
  for (const auto& [id, dep] : deployments_) {
    if (dep->published_seq() == 0)
      continue;
    std::vector<RunningReplicaInfo> on;
    for (const auto& r : dep->published_set()) {
      if (nodes.count(r.node_id))
        on.push_back(r);
    }
    if (on.empty())
      continue;
    const DeploymentId& dep_id = id;  // a structured binding: not captured below
    auto entry = std::find_if(d.deployments.begin(), d.deployments.end(),
                              [&](const DeploymentReplicas& e) { return e.id == dep_id; });
    if (entry == d.deployments.end()) {
      DeploymentReplicas e{dep_id, std::move(on)};
      e.partial = true;
      d.deployments.push_back(std::move(e));
      continue;
    }
    if (!entry->partial)
      continue;  // the whole set goes out already
    for (auto& r : on) {
      auto at = std::lower_bound(entry->replicas.begin(), entry->replicas.end(), r, by_id);
      if (at == entry->replicas.end() || at->replica_id != r.replica_id)
        entry->replicas.insert(at, std::move(r));
    }
  }
  return d;
}

// ---------------------------------------------------------------- queries

std::vector<DeploymentId> StateManager::deployment_ids() const {
  std::vector<DeploymentId> ids;
  for (const auto& [id, dep] : deployments_)
    ids.push_back(id);
  return ids;
}

const DeploymentState* StateManager::deployment(const DeploymentId& id) const {
  auto it = deployments_.find(id);
  return it == deployments_.end() ? nullptr : it->second.get();
}

std::optional<DeploymentStatusInfo> StateManager::deployment_status(const DeploymentId& id) const {
  const DeploymentState* d = deployment(id);
  if (!d)
    return std::nullopt;
  return d->status();
}

std::optional<uint32_t> StateManager::target_replicas(const DeploymentId& id) const {
  const DeploymentState* d = deployment(id);
  if (!d)
    return std::nullopt;
  return d->target_replicas();
}

std::vector<ReplicaInfo> StateManager::replicas(const DeploymentId& id) const {
  const DeploymentState* d = deployment(id);
  if (!d)
    return {};
  return d->replicas();
}

std::vector<std::string> StateManager::orphans() const {
  std::vector<std::string> ids;
  for (const auto& r : orphans_)
    ids.push_back(r->id);
  return ids;
}

std::optional<ApplicationStatusInfo> StateManager::application_status(
    const std::string& app) const {
  auto it = apps_.find(app);
  if (it == apps_.end())
    return std::nullopt;
  if (it->second.deleting)
    return ApplicationStatusInfo{ApplicationStatus::deleting, "Deleting."};
  std::optional<ApplicationStatusInfo> failed;
  std::optional<ApplicationStatusInfo> unhealthy;
  std::optional<ApplicationStatusInfo> deploying;
  for (auto d = first_of(app); d != deployments_.end() && d->first.app == app; ++d) {
    const DeploymentId& id = d->first;
    const DeploymentState* dep = d->second.get();
    if (dep->deleting())
      continue;
    const DeploymentStatusInfo& s = dep->status();
    const std::string prefix = "Deployment '" + id.name + "' is " + to_string(s.status) +
                               (s.message.empty() ? "." : ": " + s.message);
    switch (s.status) {
      case DeploymentStatus::deploy_failed:
        if (!failed)
          failed = ApplicationStatusInfo{ApplicationStatus::deploy_failed, prefix};
        break;
      case DeploymentStatus::unhealthy:
        if (!unhealthy)
          unhealthy = ApplicationStatusInfo{ApplicationStatus::unhealthy, prefix};
        break;
      case DeploymentStatus::updating:
        if (!deploying)
          deploying = ApplicationStatusInfo{ApplicationStatus::deploying, prefix};
        break;
      default:
        break;
    }
  }
  if (failed)
    return failed;
  if (unhealthy)
    return unhealthy;
  if (deploying)
    return deploying;
  return ApplicationStatusInfo{ApplicationStatus::running, ""};
}

bool StateManager::is_shut_down() const {
  return recovered_ && target_.applications.empty() && deployments_.empty() && orphans_.empty();
}

}  // namespace troupe::controller
