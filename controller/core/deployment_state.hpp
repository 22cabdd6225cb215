// The reconciler of one deployment: keeps its replicas equal to the target
// (count and version) through scaling, rolling updates, health failures,
// start failures, draining nodes and deletion. Plain C++: update() reads the
// reported replica events and the clock, and appends Commands.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "controller/core/autoscaling.hpp"
#include "controller/core/clock.hpp"
#include "controller/core/commands.hpp"
#include "controller/core/deployment_status.hpp"
#include "controller/core/replica.hpp"
#include "controller/core/scheduler.hpp"
#include "controller/core/snapshot.hpp"
#include "controller/core/version.hpp"

namespace troupe::controller {

// Replica id -> record, across all deployments (and orphans).
using ReplicaDirectory = std::unordered_map<std::string, Replica*>;

// What one update() of a deployment may touch besides the deployment itself.
struct TickContext {
  double now = 0;
  Random& rng;
  Cluster& cluster;
  const CoreOptions& options;
  ReplicaDirectory& directory;
  std::vector<Command>& out;
  uint64_t& next_replica_seq;
  // Writes an autoscale decision ahead (StateManager: the checkpoint); false
  // when that failed, and the decision is not taken. Empty: not written.
  std::function<bool(const DeploymentId&, uint32_t)> write_ahead_autoscaled = nullptr;
};

// Target replica count under a cluster-wide target_capacity (percent): absent
// or >= 100 keeps n; 0 (or n == 0) gives 0; otherwise n * capacity / 100
// rounded half up, at least 1 (Ray Serve's rule; docs/ray-serve.md).
uint32_t capacity_adjusted(uint32_t n, std::optional<double> target_capacity);

// The numeric suffix of a replica id "<app>#<deployment>#[<tag>-]<n>", or 0.
uint64_t parse_replica_seq(const std::string& replica_id);

// The state of the node `r` lives on (cached per Cluster::epoch()).
NodeState node_state(Replica& r, const Cluster& cluster);

// Advances a STOPPING replica: kill when the grace period is over; true once it
// is gone (stopped, crashed, or its node is DEAD). Shared with orphans.
bool advance_stopping(Replica& r, TickContext& ctx);

// Puts `r` into STOPPING: a graceful stop with `grace_s`, or a kill when
// grace_s <= 0. Returns true when the replica was never placed (no actor
// exists): the caller removes it at once.
bool begin_stop(Replica& r, double grace_s, TickContext& ctx);

// The replicas a downscale stops, in order: the first `n` of `candidates`
// by Ray Serve's rule (DeploymentState::scale): not running yet first
// (unplaced, starting, recovering, updating), an old version's before the
// target's, then those on the nodes holding the fewest replicas of all
// deployments (`per_node`, lowered as replicas are picked), newest first; on
// a full tie the earlier candidate.
std::vector<Replica*> downscale_victims(const std::vector<Replica*>& candidates,
                                        std::unordered_map<std::string, uint32_t>& per_node,
                                        size_t n, const ReplicaVersion& target);

class DeploymentState {
 public:
  DeploymentState(DeploymentId id, std::shared_ptr<const DeploymentSpec> spec,
                  std::optional<double> target_capacity, const CoreOptions& options,
                  CapacityDirection direction = CapacityDirection::none);
  ~DeploymentState();
  DeploymentState(const DeploymentState&) = delete;
  DeploymentState& operator=(const DeploymentState&) = delete;

  // Applies a new target spec (already checkpointed by the caller) and returns
  // what kind of change it was. Resets start-failure tracking and backoff
  // unless the change is `unchanged`. Revives a deployment being deleted.
  ChangeKind deploy(std::shared_ptr<const DeploymentSpec> spec,
                    std::optional<double> target_capacity,
                    CapacityDirection direction = CapacityDirection::none);

  // The autoscaled count's bounds under the target capacity: [min_replicas,
  // max_replicas], capacity-adjusted; while the capacity rises
  // (CapacityDirection::up) the lower one is initial_replicas when set (Ray
  // Serve's get_current_lower_bound). {0, 0} without an autoscaling_config.
  std::pair<uint32_t, uint32_t> autoscaling_bounds() const;

  // Sets the autoscaled replica count, clamped to the capacity-adjusted
  // [min, max]; ignored without an autoscaling_config. Soft state: not
  // checkpointed. `reason` ends the status message ("Upscaling from 3 to 6
  // replicas: <reason>."). The policy run by update() moves on from this
  // count; a manual call is an override the policy may undo.
  void set_autoscaled_target(uint32_t n, const std::string& reason = "");
  // The count a predecessor's autoscaler decided, from the checkpoint
  // (recovery, before adopt()): the target resumes it, clamped to the
  // current bounds, and the replicas adopted no longer raise it.
  void restore_autoscaled_target(uint32_t n);
  // The autoscaled count in force; nullopt before a decision or without an
  // autoscaling_config.
  std::optional<uint32_t> autoscaled_target() const { return autoscaled_; }

  // Ongoing-request reports (see OngoingRequestMetrics), taken at `now`.
  // Ignored without an autoscaling_config. The caller checks that the replica
  // belongs to this deployment and is RUNNING.
  void record_replica_metrics(const std::string& replica_id, double ongoing, double now);
  void record_handle_metrics(const std::string& reporter_id, double queued_and_inflight,
                             double now);
  const OngoingRequestMetrics& metrics() const { return metrics_; }
  // The last decision of the autoscaling policy (nullopt before the first
  // evaluation or without an autoscaling_config).
  const std::optional<AutoscalingDecision>& last_decision() const { return last_decision_; }

  // Stops every replica gracefully; finished() once all are gone.
  void start_deleting();

  // Adopts a replica reported by a node (recovery): RECOVERING, or STOPPING if
  // the node says it is already shutting down. Emits `recover`. With an
  // autoscaling_config, no count in the checkpoint (restore_autoscaled_
  // target), and before the policy decided anything in this incarnation, the
  // target rises to the replicas adopted (within the bounds): a checkpoint
  // written before the counts were written ahead must not make a restarted
  // controller stop the capacity its predecessor scaled up to. The policy
  // scales it down again after downscale_delay_s when the load does not need
  // it.
  void adopt(const HostedReplica& hosted, TickContext& ctx);

  // One reconcile step. Skipped while settled() and the cluster's node view
  // is the one it settled under.
  void update(TickContext& ctx);

  // Settled: after its last update() the deployment was HEALTHY with exactly
  // its target of replicas, all RUNNING its target version, placed, proven
  // and with no report waiting, no autoscaling policy, not being deleted,
  // and that update() sent nothing. Nothing the clock alone brings can then
  // change it: only an event (a replica's report, a deploy, a scale, a node
  // change) can, and each of those wakes it. The head's steady state is
  // thousands of settled replicas; reconciling them ten times a second was
  // most of its CPU.
  bool settled() const { return settled_; }
  // Something happened to it or one of its replicas: the next update() runs.
  void wake() { settled_ = false; }

  // Releases every replica from the directory and the cluster (destruction).
  void release_all(TickContext& ctx);

  const DeploymentId& id() const { return id_; }
  const DeploymentSpec& spec() const { return *spec_; }
  const std::shared_ptr<const DeploymentSpec>& spec_ptr() const { return spec_; }
  const ReplicaVersion& target_version() const { return target_version_; }
  uint32_t target_replicas() const { return target_; }
  bool deleting() const { return deleting_; }
  bool finished() const { return deleting_ && replicas_.empty(); }
  const DeploymentStatusInfo& status() const { return status_; }
  std::vector<ReplicaInfo> replicas() const;
  // Replicas in RECOVERING state.
  uint32_t recovering_count() const { return count_in(ReplicaState::recovering); }
  // Replicas in RUNNING state (the gauge; replicas() without the copies).
  uint32_t running_count() const { return count_in(ReplicaState::running); }
  // Start failures counted so far (constructor, reconfigure or the
  // replica's first health check failed); -1 once the count reached the
  // threshold while a replica of the target version ran (partial success:
  // counting stops, as in Ray Serve).
  int64_t start_failures() const { return start_failures_; }
  // Replicas of the target version replaced for failed health checks before
  // they passed health_check_failure_threshold checks;
  // reset when one does, and by a new deploy. At the start-failure
  // threshold, new replicas back off as after start failures; while it is
  // above 0, a rolling update stops an old replica only for a proven one.
  uint32_t unproven_failures() const { return unproven_failures_; }
  // The next backoff wait (before jitter) after a failure beyond the threshold.
  double backoff_s() const { return backoff_s_; }

  // --- publication (used by the state manager)
  // True when the RUNNING set (or max_ongoing_requests) changed since the
  // last publish.
  bool running_set_dirty() const { return running_dirty_; }
  // A replica's model list changed (model multiplexing): publish again.
  void mark_running_set_dirty() { running_dirty_ = true; }
  std::vector<RunningReplicaInfo> running_set() const;
  // Publishes `set` as of snapshot `seq`: a replica that came or changed is
  // marked with `seq`, one that left gets a tombstone of `seq`, unchanged
  // ones keep theirs. `seq` becomes published_seq() when anything changed
  // (or on the first publish); returns whether anything did.
  bool mark_published(uint64_t seq, std::vector<RunningReplicaInfo> set);
  // Every replica is sent again with the next delta (new handles for all).
  void republish(uint64_t seq);
  uint64_t published_seq() const { return published_seq_; }
  const std::vector<RunningReplicaInfo>& published_set() const { return published_; }
  // What changed after snapshot `since`, replica by replica: the replicas
  // that came or changed (`changed`) and the ids of those that left
  // (`removed`). False when that cannot be told (the tombstones from then
  // are gone, or the deployment was first published later): the subscriber
  // gets the whole set. Once there are more than twice as many tombstones as
  // the set has replicas (at least 64), the oldest are dropped down to that
  // many.
  bool changes_since(uint64_t since, std::vector<RunningReplicaInfo>& changed,
                     std::vector<std::string>& removed) const;

 private:
  void recompute_target();
  // Runs the autoscaling policy on the metrics (part of update(), after the
  // replica events and before scaling).
  void autoscale(TickContext& ctx);
  void set_status(DeploymentStatus s, DeploymentTrigger t, std::string message);
  void on_became_running(Replica& r, TickContext& ctx);
  void remove(Replica& r, TickContext& ctx);
  void handle_startup_failure(Replica& r, const std::string& error, TickContext& ctx);
  void handle_crash(Replica& r, TickContext& ctx);
  void check_health(Replica& r, TickContext& ctx);
  void stop_replica(Replica& r, bool graceful, TickContext& ctx);
  void rolling_update(TickContext& ctx);
  void scale(TickContext& ctx);
  void place_pending(TickContext& ctx);
  void stop_migrated(TickContext& ctx);
  void check_status(TickContext& ctx);
  uint32_t start_failure_threshold() const;
  // Start failures or unproven replicas' health failures reached the
  // threshold: new replicas wait for the backoff.
  bool backing_off() const;
  // The failures above mark the deployment DEPLOY_FAILED or UNHEALTHY;
  // false when there is nothing to say.
  bool report_failures(uint32_t running_target, uint32_t running_old);
  bool is_target(const Replica& r) const { return r.version == target_version_; }
  // Whether the state after an update() that sent nothing is settled.
  bool can_settle() const;
  // Replicas (not removed) in `state`.
  uint32_t count_in(ReplicaState state) const;

  DeploymentId id_;
  std::shared_ptr<const DeploymentSpec> spec_;
  ReplicaVersion target_version_;
  std::optional<double> target_capacity_;
  CapacityDirection capacity_direction_ = CapacityDirection::none;
  std::optional<uint32_t> autoscaled_;
  // Set once the policy (or the hook) decided in this controller incarnation:
  // until then replicas adopted at recovery raise the target (see adopt()).
  bool autoscale_decided_ = false;
  std::optional<AutoscalingPolicy> policy_;
  OngoingRequestMetrics metrics_;
  std::optional<AutoscalingDecision> last_decision_;
  uint32_t target_ = 0;
  bool deleting_ = false;
  const CoreOptions& options_;
  DeploymentStatusInfo status_;

  std::vector<std::unique_ptr<Replica>> replicas_;  // creation order

  int64_t start_failures_ = 0;
  std::string last_start_error_;
  double backoff_s_ = 1.0;
  double retry_not_before_ = 0;
  double last_wait_s_ = 0;
  bool failed_this_tick_ = false;
  uint32_t unproven_failures_ = 0;
  std::string last_unproven_error_;
  // A replica of the target version was replaced for failed health checks:
  // HEALTHY again only once every running replica proved itself.
  bool needs_proof_ = false;

  bool settled_ = false;
  uint64_t settled_epoch_ = 0;  // the Cluster::epoch() it settled under

  bool running_dirty_ = true;
  uint64_t published_seq_ = 0;
  std::vector<RunningReplicaInfo> published_;
  std::vector<uint64_t> published_seqs_;  // per entry of published_: when it last changed
  std::map<std::string, uint64_t> tombstones_;  // replica id -> the snapshot it left in
  // Subscribers behind this get the whole set (tombstones dropped up to here).
  uint64_t delta_floor_ = 0;
};

}  // namespace troupe::controller
