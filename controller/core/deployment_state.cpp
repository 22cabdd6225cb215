#include "controller/core/deployment_state.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <utility>

namespace troupe::controller {

namespace {

std::string seconds(double s) {
  std::ostringstream out;
  out << s;
  return out.str();
}

bool active(const Replica& r) {
  return !r.removed && r.state != ReplicaState::stopping;
}

}  // namespace

uint32_t capacity_adjusted(uint32_t n, std::optional<double> target_capacity) {
  if (!target_capacity || *target_capacity >= 100)
    return n;
  if (n == 0 || *target_capacity <= 0)
    return 0;
  // Rounded half up, as Ray Serve does (4 replicas at 30 % is 1); the
  // tolerance keeps 2.4999999999 from an exact 2.5 rounding down.
  double scaled = std::floor(static_cast<double>(n) * *target_capacity / 100.0 + 0.5 + 1e-9);
  return std::max<uint32_t>(1, static_cast<uint32_t>(scaled));
}

uint64_t parse_replica_seq(const std::string& id) {
  auto pos = id.find_last_of("#-");
  if (pos == std::string::npos || pos + 1 >= id.size())
    return 0;
  uint64_t n = 0;
  for (std::size_t i = pos + 1; i < id.size(); ++i) {
    if (id[i] < '0' || id[i] > '9')
      return 0;
    n = n * 10 + static_cast<uint64_t>(id[i] - '0');
  }
  return n;
}

NodeState node_state(Replica& r, const Cluster& cluster) {
  if (r.node_epoch != cluster.epoch()) {
    r.node_state = cluster.state(r.node_id);
    r.node_epoch = cluster.epoch();
  }
  return r.node_state;
}

bool advance_stopping(Replica& r, TickContext& ctx) {
  if (r.stopped || r.crashed || node_state(r, ctx.cluster) == NodeState::dead)
    return true;
  // Sent again every kill_resend_s until the replica is gone (Ray Serve
  // repeats it every loop): a kill lost with a dropped connection, or one
  // its node could not carry out yet, must not keep the deployment one
  // replica short for ever.
  if (ctx.now >= r.kill_at) {
    Command c;
    c.kind = CommandKind::kill;
    c.replica_id = r.id;
    c.node_id = r.node_id;
    ctx.out.push_back(std::move(c));
    r.kill_at = ctx.now + ctx.options.kill_resend_s;
  }
  return false;
}

bool begin_stop(Replica& r, double grace_s, TickContext& ctx) {
  const bool has_actor = !(r.state == ReplicaState::starting && !r.placed);
  r.state = ReplicaState::stopping;
  r.state_since = ctx.now;
  r.watch_due = false;
  r.health_reported = false;
  r.migrating = false;
  if (!has_actor)
    return true;
  Command c;
  c.replica_id = r.id;
  c.node_id = r.node_id;
  if (grace_s > 0) {
    c.kind = CommandKind::stop;
    c.timeout_s = grace_s;
    r.kill_at = ctx.now + grace_s;
  } else {
    c.kind = CommandKind::kill;
    r.kill_at = ctx.now + ctx.options.kill_resend_s;
  }
  ctx.out.push_back(std::move(c));
  return false;
}

DeploymentState::DeploymentState(DeploymentId id, std::shared_ptr<const DeploymentSpec> spec,
                                 std::optional<double> target_capacity, const CoreOptions& options,
                                 CapacityDirection direction)
    : id_(std::move(id)),
      spec_(std::move(spec)),
      target_version_(version_of(*spec_)),
      target_capacity_(target_capacity),
      capacity_direction_(direction),
      options_(options) {
  if (const auto& a = spec_->config.autoscaling_config) {
    policy_.emplace(*a);
    metrics_.set_look_back_s(a->look_back_period_s);
  }
  recompute_target();
  status_ = {DeploymentStatus::updating, DeploymentTrigger::config_update_started, ""};
}

DeploymentState::~DeploymentState() = default;

void DeploymentState::recompute_target() {
  const DeploymentConfig& c = spec_->config;
  if (deleting_) {
    target_ = 0;
  } else if (c.autoscaling_config) {
    const AutoscalingConfig& a = *c.autoscaling_config;
    const auto [lo, hi] = autoscaling_bounds();
    uint32_t want = autoscaled_ ? *autoscaled_
                                : capacity_adjusted(a.initial_replicas.value_or(a.min_replicas),
                                                    target_capacity_);
    target_ = std::clamp(want, lo, hi);
  } else {
    target_ = capacity_adjusted(c.num_replicas, target_capacity_);
  }
}

void DeploymentState::set_status(DeploymentStatus s, DeploymentTrigger t, std::string message) {
  status_.status = s;
  status_.trigger = t;
  status_.message = std::move(message);
}

std::pair<uint32_t, uint32_t> DeploymentState::autoscaling_bounds() const {
  const auto& a = spec_->config.autoscaling_config;
  if (!a)
    return {0, 0};
  const uint32_t floor = capacity_direction_ == CapacityDirection::up && a->initial_replicas
                             ? *a->initial_replicas
                             : a->min_replicas;
  return {capacity_adjusted(floor, target_capacity_),
          capacity_adjusted(a->max_replicas, target_capacity_)};
}

ChangeKind DeploymentState::deploy(std::shared_ptr<const DeploymentSpec> spec,
                                   std::optional<double> target_capacity,
                                   CapacityDirection direction) {
  ChangeKind kind = classify_change(*spec_, *spec);
  const bool capacity_changed =
      target_capacity != target_capacity_ || direction != capacity_direction_;
  const bool was_deleting = deleting_;
  if (kind == ChangeKind::unchanged && !capacity_changed && !was_deleting)
    return kind;
  wake();

  const uint32_t old_target = target_;
  const bool had_autoscaling = spec_->config.autoscaling_config.has_value();
  // Ray Serve's is_scaled_copy_of compares the whole deployment config but
  // num_replicas: a new autoscaling_config is a config update (UPDATING),
  // not a scale.
  const bool autoscaling_changed =
      spec_->config.autoscaling_config != spec->config.autoscaling_config;
  if (spec->config.max_ongoing_requests != spec_->config.max_ongoing_requests) {
    running_dirty_ = true;
  }
  // New health-check timings go to the nodes of the running replicas (the
  // same watches: their counts go on).
  if (spec->config.health_check_period_s != spec_->config.health_check_period_s ||
      spec->config.health_check_timeout_s != spec_->config.health_check_timeout_s) {
    for (auto& rp : replicas_) {
      if (rp->state == ReplicaState::running && !rp->removed)
        rp->watch_due = true;
    }
  }
  spec_ = std::move(spec);
  target_version_ = version_of(*spec_);
  target_capacity_ = target_capacity;
  capacity_direction_ = direction;
  deleting_ = false;
  if (const auto& a = spec_->config.autoscaling_config) {
    // A redeploy (new code, new config, new capacity) keeps the count the load
    // asked for, within the new bounds, so a rollout under load does not drop
    // capacity. Switching autoscaling on starts at initial_replicas, else at
    // the current count (Ray Serve's rule); a revived deployment starts over.
    if (was_deleting || (!had_autoscaling && a->initial_replicas)) {
      autoscaled_.reset();
    } else if (!had_autoscaling) {
      autoscaled_ = old_target;
    }
    // A pending decision survives changes that leave the policy's inputs
    // alone (new code, a num_replicas that autoscaling ignores).
    if (policy_) {
      if (policy_->config() != *a || capacity_changed || was_deleting)
        policy_->reset(*a);
    } else {
      policy_.emplace(*a);
    }
    metrics_.set_look_back_s(a->look_back_period_s);
  } else {
    autoscaled_.reset();
    policy_.reset();
    metrics_.clear();
    last_decision_.reset();
  }
  recompute_target();

  start_failures_ = 0;
  last_start_error_.clear();
  unproven_failures_ = 0;
  last_unproven_error_.clear();
  needs_proof_ = false;
  backoff_s_ = 1.0;
  retry_not_before_ = 0;
  // The rolling update picks again which replicas the new target replaces
  // (none, when it is the version they run: a rollback keeps them).
  for (auto& r : replicas_)
    r->replacing = false;

  if (kind == ChangeKind::unchanged)
    kind = ChangeKind::scaled;
  if (kind == ChangeKind::scaled && !was_deleting && !autoscaling_changed) {
    if (target_ != old_target) {
      const bool up = target_ > old_target;
      const DeploymentStatus s =
          status_.status == DeploymentStatus::updating
              ? DeploymentStatus::updating
              : (up ? DeploymentStatus::upscaling : DeploymentStatus::downscaling);
      set_status(s, DeploymentTrigger::config_update_started,
                 std::string(up ? "Upscaling" : "Downscaling") + " from " +
                     std::to_string(old_target) + " to " + std::to_string(target_) + " replicas.");
    }
  } else {
    set_status(DeploymentStatus::updating, DeploymentTrigger::config_update_started, "");
  }
  return kind;
}

void DeploymentState::set_autoscaled_target(uint32_t n, const std::string& reason) {
  if (!spec_->config.autoscaling_config || deleting_)
    return;
  const uint32_t old_target = target_;
  autoscaled_ = n;
  autoscale_decided_ = true;
  recompute_target();
  wake();
  if (target_ == old_target || status_.status == DeploymentStatus::updating)
    return;
  const bool up = target_ > old_target;
  set_status(up ? DeploymentStatus::upscaling : DeploymentStatus::downscaling,
             DeploymentTrigger::autoscaling,
             std::string(up ? "Upscaling" : "Downscaling") + " from " + std::to_string(old_target) +
                 " to " + std::to_string(target_) + " replicas" +
                 (reason.empty() ? "." : ": " + reason + "."));
}

void DeploymentState::restore_autoscaled_target(uint32_t n) {
  if (!spec_->config.autoscaling_config || deleting_)
    return;
  autoscaled_ = n;
  autoscale_decided_ = true;
  recompute_target();
  wake();
}

void DeploymentState::record_replica_metrics(const std::string& replica_id, double ongoing,
                                             double now) {
  if (policy_)
    metrics_.record_replica(replica_id, ongoing, now);
}

void DeploymentState::record_handle_metrics(const std::string& reporter_id,
                                            double queued_and_inflight, double now) {
  if (policy_)
    metrics_.record_handle(reporter_id, queued_and_inflight, now);
}

void DeploymentState::autoscale(TickContext& ctx) {
  if (!policy_ || deleting_)
    return;
  // While nodes are UNREACHABLE their replicas' reports do not arrive: the
  // load would look lower than it is, and the controller is the likely one
  // cut off. The counts hold until the nodes are back or DEAD.
  if (ctx.cluster.unreachable() > 0)
    return;
  metrics_.prune(ctx.now, [&](const std::string& replica_id) {
    auto it = ctx.directory.find(replica_id);
    return it != ctx.directory.end() && it->second->owner == this &&
           it->second->state == ReplicaState::running;
  });
  const AutoscalingConfig& a = *spec_->config.autoscaling_config;
  AutoscalingInput in;
  in.now = ctx.now;
  in.total_ongoing = metrics_.total(ctx.now);
  for (const auto& rp : replicas_) {
    if (!rp->removed && rp->state == ReplicaState::running)
      ++in.running;
  }
  in.current = target_;
  std::tie(in.lower, in.upper) = autoscaling_bounds();
  last_decision_ = policy_->decide(in);
  const AutoscalingDecision& d = *last_decision_;
  if (d.apply && d.proposed != target_) {
    // Written ahead, like Ray Serve's target_num_replicas: a decision that
    // cannot be saved is not taken (the policy proposes again).
    if (ctx.write_ahead_autoscaled && !ctx.write_ahead_autoscaled(id_, d.proposed))
      return;
    std::string reason = describe(a, in, d);
    if (target_capacity_ && *target_capacity_ < 100)
      reason += " (target_capacity " + seconds(*target_capacity_) + "%)";
    set_autoscaled_target(d.proposed, reason);
  }
}

void DeploymentState::start_deleting() {
  wake();
  deleting_ = true;
  target_ = 0;
  // Ray Serve reports a deployment being deleted as UPDATING, trigger DELETING.
  set_status(DeploymentStatus::updating, DeploymentTrigger::deleting, "Deleting.");
}

void DeploymentState::adopt(const HostedReplica& hosted, TickContext& ctx) {
  wake();
  auto owned = std::make_unique<Replica>();
  Replica& r = *owned;
  r.id = hosted.replica_id;
  r.seq = parse_replica_seq(r.id);
  r.owner = this;
  r.placed = true;
  r.node_id = hosted.node_id;
  r.reserved = spec_->config.resources;
  r.created_at = r.state_since = ctx.now;
  ctx.cluster.reserve(r.node_id, r.reserved);
  if (hosted.stopping) {
    r.state = ReplicaState::stopping;
    r.kill_at = ctx.now + spec_->config.graceful_shutdown_timeout_s;
  } else {
    r.state = ReplicaState::recovering;
    Command c;
    c.kind = CommandKind::recover;
    c.replica_id = r.id;
    c.node_id = r.node_id;
    ctx.out.push_back(std::move(c));
  }
  ctx.directory[r.id] = &r;
  replicas_.push_back(std::move(owned));
  if (spec_->config.autoscaling_config && !autoscale_decided_ && !hosted.stopping) {
    uint32_t adopted = 0;
    for (const auto& rp : replicas_)
      adopted += active(*rp) ? 1 : 0;
    if (adopted > target_) {
      autoscaled_ = adopted;
      recompute_target();
    }
  }
}

void DeploymentState::remove(Replica& r, TickContext& ctx) {
  if (r.removed)
    return;
  if (r.state == ReplicaState::running)
    running_dirty_ = true;
  if (r.placed)
    ctx.cluster.release(r.node_id, r.reserved);
  ctx.directory.erase(r.id);
  r.removed = true;
}

void DeploymentState::release_all(TickContext& ctx) {
  for (auto& r : replicas_)
    remove(*r, ctx);
  replicas_.clear();
}

void DeploymentState::stop_replica(Replica& r, bool graceful, TickContext& ctx) {
  if (r.state == ReplicaState::running)
    running_dirty_ = true;
  const double grace = graceful ? spec_->config.graceful_shutdown_timeout_s : 0.0;
  if (begin_stop(r, grace, ctx))
    remove(r, ctx);
}

void DeploymentState::on_became_running(Replica& r, TickContext& ctx) {
  if (!r.reported_version.code.empty())
    r.version = r.reported_version;
  r.state = ReplicaState::running;
  r.state_since = ctx.now;
  r.consecutive_failures = 0;
  r.checks_passed = 0;
  r.last_failure.clear();
  r.health_reported = false;
  // A new watch (sent at the next tick): its node counts afresh, with the
  // first check at once, as in Ray Serve, whose replica starts with its last
  // check at time 0: a replica unhealthy from the start is found one period
  // sooner than if it waited a whole period.
  ++r.check_seq;
  r.watch_due = true;
  running_dirty_ = true;
}

void DeploymentState::handle_startup_failure(Replica& r, const std::string& error,
                                             TickContext& ctx) {
  if (start_failures_ >= 0) {
    ++start_failures_;
    last_start_error_ = error;
  }
  failed_this_tick_ = true;
  stop_replica(r, /*graceful=*/r.state != ReplicaState::starting, ctx);
}

void DeploymentState::handle_crash(Replica& r, TickContext& ctx) {
  switch (r.state) {
    case ReplicaState::starting:
    case ReplicaState::updating:
      if (start_failures_ >= 0) {
        ++start_failures_;
        last_start_error_ = r.error.empty() ? "the replica actor died during initialization"
                                            : r.error + " during initialization";
      }
      failed_this_tick_ = true;
      break;
    case ReplicaState::running:
      if (is_target(r) && !deleting_) {
        // Not counted as an unproven failure: a crash may come from outside
        // (a kill, a node's memory limit, a query of death), which says
        // nothing about the version (docs/architecture.md, "Safe rollouts").
        set_status(DeploymentStatus::unhealthy, DeploymentTrigger::health_check_failed,
                   (r.error.empty() ? "Replica " + r.id + " crashed" : r.error) +
                       ". This deployment is UNHEALTHY until the replica is replaced or "
                       "a new deploy happens.");
      }
      break;
    default:
      break;
  }
  // A "down" notice may come from a lost connection while the actor still
  // runs on its node: ask the node to make sure it is gone (idempotent there).
  // Nothing waits for the answer. Not needed when the node itself is dead or
  // the replica reported its own exit.
  if (r.placed && !r.stopped && node_state(r, ctx.cluster) != NodeState::dead) {
    Command c;
    c.kind = CommandKind::kill;
    c.replica_id = r.id;
    c.node_id = r.node_id;
    ctx.out.push_back(std::move(c));
  }
  remove(r, ctx);
}

void DeploymentState::check_health(Replica& r, TickContext& ctx) {
  const DeploymentConfig& c = spec_->config;
  if (r.health_reported) {
    r.health_reported = false;
    const uint32_t threshold = options_.health_check_failure_threshold;
    const bool was_proven = r.checks_passed >= threshold;
    // Passes only grow within a watch; fewer means the node counted afresh
    // (its agent restarted), which does not unprove the replica.
    r.checks_passed = std::max(r.checks_passed, r.reported_passed);
    r.consecutive_failures = r.reported_failures;
    r.last_failure = std::move(r.reported_failure);
    r.reported_failure.clear();
    // A replica of the target version proved itself: its version can run,
    // so earlier replicas that failed early were not its fault.
    if (!was_proven && r.checks_passed >= threshold && is_target(r))
      unproven_failures_ = 0;
  }
  if (r.consecutive_failures >= options_.health_check_failure_threshold) {
    const bool target = is_target(r);
    const uint32_t failures = r.consecutive_failures;
    // The replica's own words ("stuck: all 2 request threads busy for 31.0 s
    // with none finished"), so the status says why it is replaced.
    const std::string why = r.last_failure.empty() ? "" : " (last: " + r.last_failure + ")";
    const bool proven = r.checks_passed >= options_.health_check_failure_threshold;
    stop_replica(r, /*graceful=*/!c.force_stop_unhealthy_replicas, ctx);
    if (target && !deleting_) {
      needs_proof_ = true;
      if (!proven) {
        // Replaced before it proved itself: a start that did not hold, so
        // its replacements back off like those of failed starts instead of
        // being replaced in a tight loop.
        ++unproven_failures_;
        last_unproven_error_ = "replica " + r.id + " failed " + std::to_string(failures) +
                               " health checks in a row after passing " +
                               std::to_string(r.checks_passed) + why;
        failed_this_tick_ = true;
      }
      set_status(DeploymentStatus::unhealthy, DeploymentTrigger::health_check_failed,
                 "Replica " + r.id + " failed " + std::to_string(failures) +
                     " health checks in a row" + why +
                     ". This deployment is UNHEALTHY until the replica "
                     "is replaced or a new deploy happens.");
    }
    return;
  }
  if (r.watch_due) {
    r.watch_due = false;
    Command cmd;
    cmd.kind = CommandKind::watch_health;
    cmd.check_seq = r.check_seq;
    cmd.replica_id = r.id;
    cmd.node_id = r.node_id;
    cmd.health.period_s = c.health_check_period_s;
    cmd.health.timeout_s = c.health_check_timeout_s;
    cmd.health.threshold = options_.health_check_failure_threshold;
    cmd.health.jitter = options_.health_check_jitter;
    ctx.out.push_back(std::move(cmd));
  }
}

uint32_t DeploymentState::start_failure_threshold() const {
  return std::min<uint32_t>(options_.max_constructor_retry_count, 3 * target_);
}

bool DeploymentState::backing_off() const {
  const uint32_t threshold = start_failure_threshold();
  return threshold > 0 && (start_failures_ >= threshold || unproven_failures_ >= threshold);
}

void DeploymentState::update(TickContext& ctx) {
  if (settled_ && settled_epoch_ == ctx.cluster.epoch() && !ctx.options.update_settled)
    return;
  const std::size_t sent_before = ctx.out.size();
  failed_this_tick_ = false;
  const std::size_t n = replicas_.size();
  for (std::size_t i = 0; i < n; ++i) {
    Replica& r = *replicas_[i];
    if (r.removed)
      continue;
    if (r.state == ReplicaState::stopping) {
      if (advance_stopping(r, ctx))
        remove(r, ctx);
      continue;
    }
    if (r.crashed || (r.placed && node_state(r, ctx.cluster) == NodeState::dead)) {
      handle_crash(r, ctx);
      continue;
    }
    if (r.state == ReplicaState::running) {
      if (r.placed && node_state(r, ctx.cluster) == NodeState::unreachable) {
        // Its node is cut off from the controller, not known to be down:
        // it goes on checking, and what it found arrives when it is back
        // (it registers again, and is sent the watches again).
        continue;
      }
      check_health(r, ctx);
      continue;
    }
    // STARTING, UPDATING, RECOVERING
    if (r.startup == Replica::Startup::ready) {
      r.startup = Replica::Startup::none;
      on_became_running(r, ctx);
    } else if (r.startup == Replica::Startup::failed) {
      r.startup = Replica::Startup::none;
      handle_startup_failure(r, r.error, ctx);
    } else if (r.state == ReplicaState::recovering &&
               ctx.now - r.state_since > options_.slow_startup_warning_s) {
      // It never told us what it runs: replace it.
      stop_replica(r, /*graceful=*/false, ctx);
    }
  }

  // Replicas on DRAINING nodes keep serving until their replacement runs.
  for (auto& rp : replicas_) {
    Replica& r = *rp;
    if (!active(r) || !r.placed)
      continue;
    if (r.state == ReplicaState::running || r.state == ReplicaState::updating) {
      r.migrating = node_state(r, ctx.cluster) == NodeState::draining;
    }
  }

  // Backoff after failures beyond the threshold: 1, 2, 4, ... s, capped.
  if (failed_this_tick_ && backing_off()) {
    last_wait_s_ = backoff_s_;
    // Ray Serve's offset: up to backoff_jitter_s more, so deployments that
    // failed together do not retry together.
    retry_not_before_ = ctx.now + backoff_s_ + ctx.rng.uniform(0.0, options_.backoff_jitter_s);
    backoff_s_ = std::min(backoff_s_ * 2, options_.max_backoff_s);
  }

  autoscale(ctx);
  if (!deleting_)
    rolling_update(ctx);
  scale(ctx);
  place_pending(ctx);
  stop_migrated(ctx);
  check_status(ctx);

  replicas_.erase(std::remove_if(replicas_.begin(), replicas_.end(),
                                 [](const std::unique_ptr<Replica>& r) { return r->removed; }),
                  replicas_.end());
  settled_ = ctx.out.size() == sent_before && can_settle();
  settled_epoch_ = ctx.cluster.epoch();
}

bool DeploymentState::can_settle() const {
  // Autoscaling decides on the clock and the load; backoff, slow starts,
  // stops and kills run on the clock: none of them settles.
  if (policy_ || deleting_ || failed_this_tick_ || needs_proof_ ||
      status_.status != DeploymentStatus::healthy || replicas_.size() != target_)
    return false;
  const uint32_t threshold = options_.health_check_failure_threshold;
  for (const auto& rp : replicas_) {
    const Replica& r = *rp;
    if (r.removed || r.state != ReplicaState::running || !r.placed || r.migrating || r.replacing ||
        !is_target(r) || r.startup != Replica::Startup::none || r.crashed || r.stopped ||
        r.health_reported || r.watch_due || r.checks_passed < threshold ||
        r.consecutive_failures >= threshold)
      return false;
  }
  return true;
}

void DeploymentState::rolling_update(TickContext& ctx) {
  if (target_ == 0)
    return;
  int64_t old_active = 0;
  int64_t old_stopping = 0;
  int64_t new_running = 0;
  for (const auto& rp : replicas_) {
    const Replica& r = *rp;
    if (r.removed || r.migrating)
      continue;
    const bool target = is_target(r);
    if (r.replacing) {  // on its way out: serves until its replacement runs
      ++old_stopping;
      continue;
    }
    switch (r.state) {
      case ReplicaState::starting:
      case ReplicaState::updating:
        if (!target)
          ++old_active;
        break;
      case ReplicaState::running:
        if (target) {
          ++new_running;
        } else {
          ++old_active;
        }
        break;
      case ReplicaState::stopping:
        if (!target)
          ++old_stopping;
        break;
      case ReplicaState::recovering:
        break;
    }
  }
  if (old_active == 0)
    return;
  // A pending scale-down completes before the rollout proceeds.
  if (static_cast<int64_t>(target_) < old_active + old_stopping)
    return;
  const int64_t pending = static_cast<int64_t>(target_) - new_running - old_active;
  const int64_t rollout = std::max<int64_t>(target_ / 5, 1);
  const int64_t max_changes = std::max<int64_t>(rollout - pending, 0);
  int64_t changes = 0;
  for (ReplicaState pass : {ReplicaState::starting, ReplicaState::running}) {
    for (std::size_t i = 0, n = replicas_.size(); i < n && changes < max_changes; ++i) {
      Replica& r = *replicas_[i];
      if (r.removed || r.migrating || r.replacing || r.state != pass || is_target(r))
        continue;
      if (r.version.code != target_version_.code) {
        ++changes;
        if (r.state == ReplicaState::running) {
          // Surge: it serves until a replacement of the new version passed
          // its start-up gate (scale() starts it, stop_migrated() stops
          // this one), so a release that fails to start leaves the old
          // version's replicas running.
          r.replacing = true;
        } else {
          // Still starting: no requests to finish, no grace period.
          stop_replica(r, /*graceful=*/false, ctx);
        }
      } else if (r.state == ReplicaState::running) {
        ++changes;
        running_dirty_ = true;
        r.state = ReplicaState::updating;
        r.state_since = ctx.now;
        r.watch_due = false;
        r.health_reported = false;
        r.version = target_version_;
        Command c;
        c.kind = CommandKind::reconfigure;
        c.replica_id = r.id;
        c.node_id = r.node_id;
        c.spec = spec_;
        c.version = target_version_;
        ctx.out.push_back(std::move(c));
      }
    }
  }
}

std::vector<Replica*> downscale_victims(const std::vector<Replica*>& candidates,
                                        std::unordered_map<std::string, uint32_t>& per_node,
                                        size_t n, const ReplicaVersion& target) {
  // Rank and version never change while picking, so the candidates fall
  // into classes taken one after the other. Within a class the replicas of
  // one node go newest first, and the node whose count is lowest goes next;
  // only the picked node's count changes. O(c log c) instead of a scan of
  // every candidate per pick (50,000 replicas scaled down at once took
  // minutes).
  auto class_of = [&](const Replica& r) {
    int rank = 4;
    switch (r.state) {
      case ReplicaState::starting:
        rank = r.placed ? 1 : 0;
        break;
      case ReplicaState::recovering:
        rank = 2;
        break;
      case ReplicaState::updating:
        rank = 3;
        break;
      default:
        break;
    }
    return 2 * rank + (r.version == target ? 1 : 0);
  };
  std::array<std::vector<size_t>, 10> classes;
  for (size_t i = 0; i < candidates.size(); ++i)
    classes[class_of(*candidates[i])].push_back(i);
  auto newer = [&](size_t a, size_t b) {  // newest first; the earlier candidate on a tie
    return candidates[a]->seq != candidates[b]->seq ? candidates[a]->seq > candidates[b]->seq
                                                    : a < b;
  };
  std::vector<Replica*> out;
  for (const auto& members : classes) {
    if (out.size() >= n)
      break;
    if (members.empty())
      continue;
    // Groups: the class's replicas on one node; an unplaced replica alone.
    std::vector<std::vector<size_t>> groups;
    std::unordered_map<std::string, size_t> group_of_node;
    for (size_t i : members) {
      const Replica& r = *candidates[i];
      if (!r.placed) {
        groups.push_back({i});
        continue;
      }
      auto [it, fresh] = group_of_node.emplace(r.node_id, groups.size());
      if (fresh)
        groups.emplace_back();
      groups[it->second].push_back(i);
    }
    for (auto& g : groups)  // popped from the back: oldest first here
      std::sort(g.begin(), g.end(), [&](size_t a, size_t b) { return newer(b, a); });
    // (the node's count, newest first, candidate order, group)
    using Key = std::tuple<uint32_t, uint64_t, size_t, size_t>;
    auto key = [&](size_t g) {
      const size_t head = groups[g].back();
      const Replica& r = *candidates[head];
      const uint32_t count = r.placed ? per_node[r.node_id] : 0;
      return Key{count, std::numeric_limits<uint64_t>::max() - r.seq, head, g};
    };
    std::set<Key> next;
    for (size_t g = 0; g < groups.size(); ++g)
      next.insert(key(g));
    while (out.size() < n && !next.empty()) {
      const size_t g = std::get<3>(*next.begin());
      next.erase(next.begin());
      Replica* victim = candidates[groups[g].back()];
      groups[g].pop_back();
      out.push_back(victim);
      if (victim->placed)
        --per_node[victim->node_id];
      if (!groups[g].empty())
        next.insert(key(g));
    }
  }
  return out;
}

void DeploymentState::scale(TickContext& ctx) {
  int64_t current = 0;
  int64_t stopping = 0;
  int64_t migrating = 0;
  for (const auto& rp : replicas_) {
    const Replica& r = *rp;
    if (r.removed)
      continue;
    if (r.state == ReplicaState::stopping) {
      ++stopping;
    } else if (r.migrating || r.replacing) {
      ++migrating;
    } else {
      ++current;
    }
  }
  // Replicas on draining nodes, and old ones a rolling update replaces, are
  // replaced at most rollout_size at a time; the others still count as
  // current until their turn.
  const int64_t rollout = std::max<int64_t>(target_ / 5, 1);
  current += std::max<int64_t>(migrating - rollout, 0);
  const int64_t delta = static_cast<int64_t>(target_) - current;
  if (delta > 0) {
    const int64_t to_add = std::max<int64_t>(delta - stopping, 0);
    if (to_add == 0)
      return;
    if (backing_off() && ctx.now < retry_not_before_)
      return;
    for (int64_t k = 0; k < to_add; ++k) {
      auto owned = std::make_unique<Replica>();
      Replica& r = *owned;
      r.seq = ctx.next_replica_seq++;
      r.id = id_.app + "#" + id_.name + "#" +
             (options_.replica_id_tag.empty() ? "" : options_.replica_id_tag + "-") +
             std::to_string(r.seq);
      r.owner = this;
      r.state = ReplicaState::starting;
      r.version = target_version_;
      r.created_at = r.state_since = ctx.now;
      ctx.directory[r.id] = &r;
      replicas_.push_back(std::move(owned));
    }
    return;
  }
  if (delta == 0)
    return;

  // Downscale, Ray Serve's order (its scheduler's _get_replicas_to_stop):
  // replicas not running yet first (unplaced, starting, recovering, then
  // updating); then those on the nodes holding the fewest replicas of all
  // deployments, so that whole nodes empty out and can be given back;
  // newest first. troupe adds one rule: an old version's replica before one
  // of the target version (a rolling update then has less to replace).
  // Every replica stops gracefully, one still starting included (it has no
  // request, so it goes at once).
  std::vector<Replica*> candidates;
  for (auto& rp : replicas_) {
    Replica& r = *rp;
    if (!active(r) || r.migrating || r.replacing)
      continue;
    candidates.push_back(&r);
  }
  std::unordered_map<std::string, uint32_t> per_node;  // replicas of every deployment
  for (const auto& [id, r] : ctx.directory) {
    if (r->placed && !r->removed && r->state != ReplicaState::stopping)
      ++per_node[r->node_id];
  }
  for (Replica* victim :
       downscale_victims(candidates, per_node, static_cast<size_t>(-delta), target_version_))
    stop_replica(*victim, /*graceful=*/true, ctx);
}

void DeploymentState::place_pending(TickContext& ctx) {
  bool any = false;
  for (const auto& rp : replicas_) {
    if (!rp->removed && rp->state == ReplicaState::starting && !rp->placed) {
      any = true;
      break;
    }
  }
  if (!any)
    return;
  std::map<std::string, uint32_t> per_node;
  for (const auto& rp : replicas_) {
    if (!rp->removed && rp->placed)
      ++per_node[rp->node_id];
  }
  const DeploymentConfig& c = spec_->config;
  for (auto& rp : replicas_) {
    Replica& r = *rp;
    if (r.removed || r.state != ReplicaState::starting || r.placed)
      continue;
    auto node = ctx.cluster.pick(c.resources, c.max_replicas_per_node, per_node, ctx.rng);
    if (!node)
      break;  // the others need the same: nothing fits them either
    r.placed = true;
    r.node_id = *node;
    r.reserved = c.resources;
    ctx.cluster.reserve(r.node_id, r.reserved);
    ++per_node[r.node_id];
    Command cmd;
    cmd.kind = CommandKind::start;
    cmd.replica_id = r.id;
    cmd.node_id = r.node_id;
    cmd.app = id_.app;
    cmd.deployment = id_.name;
    cmd.spec = spec_;
    cmd.version = r.version;
    ctx.out.push_back(std::move(cmd));
  }
}

void DeploymentState::stop_migrated(TickContext& ctx) {
  uint32_t running_ok = 0;
  int64_t unplaced = 0;
  int64_t freeing = 0;  // placed and STOPPING: their room comes free
  std::vector<Replica*> migrating;
  std::vector<Replica*> replacing;
  for (auto& rp : replicas_) {
    Replica& r = *rp;
    if (r.removed)
      continue;
    if (r.state == ReplicaState::stopping) {
      freeing += r.placed ? 1 : 0;
      continue;
    }
    if (r.state == ReplicaState::starting && !r.placed)
      ++unplaced;
    if (r.migrating || r.replacing) {
      migrating.push_back(&r);
      if (r.replacing)
        replacing.push_back(&r);
    } else if (r.state == ReplicaState::running &&
               (unproven_failures_ == 0 || !is_target(r) ||
                r.checks_passed >= options_.health_check_failure_threshold)) {
      // Once replicas of this version failed before proving themselves, an
      // old replica waits for a proven replacement, not just a running one.
      ++running_ok;
    }
  }
  if (migrating.empty())
    return;
  const std::size_t keep = target_ > running_ok ? target_ - running_ok : 0;
  // Oldest first.
  std::size_t stopped = 0;
  for (std::size_t i = 0; i + keep < migrating.size(); ++i) {
    if (migrating[i]->replacing)
      ++stopped;
    stop_replica(*migrating[i], /*graceful=*/true, ctx);
  }
  // No node has room for a replacement beside the replica it replaces
  // (resources, max_replicas_per_node): that one makes room, as Ray Serve's
  // rolling update always does. A release that then fails to start costs
  // the old version those replicas (at most rollout_size) until a rollback.
  int64_t make_room = unplaced - freeing - static_cast<int64_t>(stopped);
  for (std::size_t i = 0; i < replacing.size() && make_room > 0; ++i) {
    Replica& r = *replacing[i];
    if (r.removed || r.state == ReplicaState::stopping)
      continue;
    stop_replica(r, /*graceful=*/true, ctx);
    --make_room;
  }
}

bool DeploymentState::report_failures(uint32_t running_target, uint32_t running_old) {
  const uint32_t threshold = start_failure_threshold();
  if (threshold == 0)
    return false;
  std::string what;
  if (start_failures_ >= threshold) {
    if (running_target > 0) {
      // Partial success, checked at the threshold as Ray Serve does: the
      // version can start; the controller goes on filling the target.
      start_failures_ = -1;
    } else {
      what = "The deployment failed to start " + std::to_string(start_failures_) +
             " times in a row. This may be due to a problem with its constructor, reconfigure "
             "or initial health check.";
    }
  }
  DeploymentTrigger trigger = DeploymentTrigger::replica_startup_failed;
  std::string error = last_start_error_;
  if (what.empty() && unproven_failures_ >= threshold) {
    what = std::to_string(unproven_failures_) +
           " replicas of this version in a row failed their health checks before passing " +
           std::to_string(options_.health_check_failure_threshold) + ".";
    trigger = DeploymentTrigger::health_check_failed;
    error = last_unproven_error_;
  }
  if (what.empty())
    return false;
  const bool was_running =
      status_.status == DeploymentStatus::healthy || status_.status == DeploymentStatus::unhealthy;
  if (running_old > 0) {
    what += " The previous version keeps serving on " + std::to_string(running_old) +
            (running_old == 1 ? " replica." : " replicas.");
  }
  set_status(was_running ? DeploymentStatus::unhealthy : DeploymentStatus::deploy_failed, trigger,
             what + " Retrying after " + seconds(last_wait_s_) + " seconds. Error:\n" + error);
  return true;
}

void DeploymentState::check_status(TickContext& ctx) {
  if (deleting_)
    return;
  uint32_t running_all = 0;
  uint32_t running_target = 0;
  uint32_t unproven = 0;
  uint32_t transitional = 0;
  uint32_t migrating = 0;
  uint32_t slow_allocation = 0;
  uint32_t slow_init = 0;
  for (const auto& rp : replicas_) {
    const Replica& r = *rp;
    if (r.removed)
      continue;
    if (r.migrating || r.replacing)
      ++migrating;
    if (r.state == ReplicaState::running) {
      ++running_all;
      if (is_target(r))
        ++running_target;
      if (r.checks_passed < options_.health_check_failure_threshold)
        ++unproven;
    } else {
      ++transitional;
      if ((r.state == ReplicaState::starting || r.state == ReplicaState::updating) &&
          ctx.now - r.state_since > options_.slow_startup_warning_s) {
        ++(r.placed ? slow_init : slow_allocation);
      }
    }
  }
  if (report_failures(running_target, running_all - running_target))
    return;
  // After a replica of this version failed its checks, HEALTHY needs every
  // replica to have proven itself: a replacement that passes its gate and
  // fails a few checks later must not read HEALTHY in between.
  if (needs_proof_ && unproven > 0) {
    if (status_.status == DeploymentStatus::healthy) {
      set_status(DeploymentStatus::unhealthy, DeploymentTrigger::health_check_failed,
                 "Waiting for the replacement replicas to pass " +
                     std::to_string(options_.health_check_failure_threshold) + " health checks.");
    }
    return;
  }
  if (transitional == 0 && migrating == 0 && running_target == target_ &&
      running_all == running_target) {
    if (status_.status != DeploymentStatus::healthy) {
      DeploymentTrigger t = DeploymentTrigger::config_update_completed;
      if (status_.status == DeploymentStatus::upscaling)
        t = DeploymentTrigger::upscale_completed;
      if (status_.status == DeploymentStatus::downscaling) {
        t = DeploymentTrigger::downscale_completed;
      }
      // Back from UNHEALTHY: Ray Serve's trigger is UNSPECIFIED; the message
      // says what happened.
      std::string message;
      if (status_.status == DeploymentStatus::unhealthy) {
        t = DeploymentTrigger::unspecified;
        message = "Every replica is healthy again.";
      }
      set_status(DeploymentStatus::healthy, t, std::move(message));
    }
    needs_proof_ = false;
    return;
  }
  if (status_.status == DeploymentStatus::unhealthy)
    return;
  if (slow_allocation > 0) {
    status_.message =
        "Deployment '" + id_.name + "' in application '" + id_.app + "' has " +
        std::to_string(slow_allocation) + " replicas that have taken more than " +
        seconds(options_.slow_startup_warning_s) +
        "s to be scheduled. Resources required for each replica: " +
        (spec_->config.resources.empty() ? std::string("none")
                                         : spec_->config.resources.to_string()) +
        (spec_->config.max_replicas_per_node
             ? ", at most " + std::to_string(spec_->config.max_replicas_per_node) + " per node"
             : std::string()) +
        "; free resources: " + ctx.cluster.describe_free() + ".";
  } else if (slow_init > 0) {
    status_.message = "Deployment '" + id_.name + "' in application '" + id_.app + "' has " +
                      std::to_string(slow_init) + " replicas that have taken more than " +
                      seconds(options_.slow_startup_warning_s) +
                      "s to initialize. This may be caused by a slow constructor or reconfigure.";
  }
}

std::vector<ReplicaInfo> DeploymentState::replicas() const {
  std::vector<ReplicaInfo> out;
  for (const auto& rp : replicas_) {
    const Replica& r = *rp;
    if (r.removed)
      continue;
    out.push_back({r.id, r.state, r.state == ReplicaState::starting && !r.placed, r.migrating,
                   r.node_id, r.version, r.model_ids});
  }
  return out;
}

uint32_t DeploymentState::count_in(ReplicaState state) const {
  uint32_t n = 0;
  for (const auto& rp : replicas_) {
    if (!rp->removed && rp->state == state)
      ++n;
  }
  return n;
}

std::vector<RunningReplicaInfo> DeploymentState::running_set() const {
  std::vector<RunningReplicaInfo> out;
  for (const auto& rp : replicas_) {
    const Replica& r = *rp;
    if (r.removed || r.state != ReplicaState::running)
      continue;
    out.push_back(
        {r.id, r.node_id, spec_->config.max_ongoing_requests, r.model_ids, r.model_ids_seq});
  }
  std::sort(out.begin(), out.end(), [](const RunningReplicaInfo& a, const RunningReplicaInfo& b) {
    return a.replica_id < b.replica_id;
  });
  return out;
}

bool DeploymentState::mark_published(uint64_t seq, std::vector<RunningReplicaInfo> set) {
  running_dirty_ = false;
  const bool first = published_seq_ == 0;
  bool changed = first;
  std::vector<uint64_t> seqs(set.size(), seq);
  // Both sets are sorted by replica id: one merge walk.
  size_t i = 0;
  size_t j = 0;
  while (i < published_.size() || j < set.size()) {
    if (j == set.size() ||
        (i < published_.size() && published_[i].replica_id < set[j].replica_id)) {
      tombstones_[published_[i].replica_id] = seq;
      changed = true;
      ++i;
    } else if (i == published_.size() || set[j].replica_id < published_[i].replica_id) {
      tombstones_.erase(set[j].replica_id);
      changed = true;
      ++j;
    } else {
      if (published_[i] == set[j])
        seqs[j] = published_seqs_[i];
      else
        changed = true;
      ++i;
      ++j;
    }
  }
  published_ = std::move(set);
  published_seqs_ = std::move(seqs);
  if (first)
    delta_floor_ = seq;
  if (changed)
    published_seq_ = seq;
  // Bounded: as many tombstones as replicas (at least 64). Dropping one
  // raises the floor to its seq.
  const size_t keep = std::max<size_t>(64, published_.size());
  if (tombstones_.size() > 2 * keep) {
    std::vector<std::pair<uint64_t, std::string>> by_seq;
    by_seq.reserve(tombstones_.size());
    for (const auto& [id, at] : tombstones_)
      by_seq.emplace_back(at, id);
    std::sort(by_seq.begin(), by_seq.end());
    for (size_t k = 0; k + keep < by_seq.size(); ++k) {
      delta_floor_ = std::max(delta_floor_, by_seq[k].first);
      tombstones_.erase(by_seq[k].second);
    }
  }
  return changed;
}

void DeploymentState::republish(uint64_t seq) {
  if (published_seq_ == 0)
    return;
  published_seq_ = seq;
  std::fill(published_seqs_.begin(), published_seqs_.end(), seq);
}

bool DeploymentState::changes_since(uint64_t since, std::vector<RunningReplicaInfo>& changed,
                                    std::vector<std::string>& removed) const {
  if (published_seq_ == 0 || since < delta_floor_)
    return false;
  // Every entry and tombstone is at most published_seq_ (the last change).
  if (since >= published_seq_)
    return true;
  for (size_t k = 0; k < published_.size(); ++k) {
    if (published_seqs_[k] > since)
      changed.push_back(published_[k]);
  }
  for (const auto& [id, at] : tombstones_) {
    if (at > since)
      removed.push_back(id);
  }
  return true;
}

}  // namespace troupe::controller
