// The controller's decision core: applications, their deployments, and the
// replicas of those, as plain C++ (no actors, no threads, no clock reads other
// than the injected Clock). The equivalent of Ray Serve's
// DeploymentStateManager + ApplicationStateManager + scheduler.
//
// How the actor shell drives it (all calls on the actor's own thread):
//
//   startup:   StateManager core(store, clock, rng, options);  with
//              options.snapshot_epoch and options.replica_id_tag unique per
//              controller incarnation (see CoreOptions);
//              core.set_nodes(view);
//              gather the replicas every node hosts (list_replicas, with a
//              timeout), then  Status s = core.recover(hosted);
//              if (!s) -> stop the controller and log s (e.g. a corrupt
//              checkpoint, naming the file). Never run without recover().
//   user call: deploy_application / deploy_deployment / delete_* /
//              set_target_capacity / rollback / shutdown. Each writes the new target
//              state ahead (CheckpointStore::save, synced) and only then
//              changes memory; reply to the client after it returns. On error
//              nothing changed. Run update() right after a successful call.
//   events:    on_replica_ready / on_replica_start_failed /
//              on_health_report (a node's counts for Command::check_seq) /
//              on_replica_stopped /
//              on_replica_crashed (a monitored replica went down) as they
//              arrive; set_nodes when membership or a node's state changes;
//              adopt_replicas when a node (re)registers with replicas.
//              Events only record facts; the next update() acts on them.
//   metrics:   for deployments with an autoscaling_config,
//              record_replica_metrics (each replica's running + queued
//              requests) and record_handle_metrics (each proxy's or handle's
//              queued + in-flight requests for a deployment) as the reports
//              arrive, every autoscaling_config.metrics_interval_s; a proxy
//              queueing a request for a deployment with no running replica
//              should report at once (that report starts the first replica).
//              The next update() decides on them.
//   tick:      std::vector<Command> cmds = core.update(); execute each
//              command asynchronously (start -> spawn on the node agent, ...)
//              and feed the outcome back as an event. Call it periodically
//              (e.g. every 100 ms) and after every state change.
//   publish:   after update(), for every subscriber presenting last id X:
//              if (auto d = core.changes_since(X)) push *d (adding actor
//              handles for replica ids); nothing when X is current.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "controller/core/checkpoint_store.hpp"
#include "controller/core/clock.hpp"
#include "controller/core/commands.hpp"
#include "controller/core/deployment_state.hpp"
#include "controller/core/deployment_status.hpp"
#include "controller/core/model.hpp"
#include "controller/core/replica.hpp"
#include "controller/core/scheduler.hpp"
#include "controller/core/snapshot.hpp"
#include "runtime/status.hpp"

namespace troupe::controller {

// The answer to an accepted deploy call.
struct DeployResult {
  // False when the spec equals the current one: nothing was written (the call
  // reports "unchanged" and is a no-op).
  bool changed = false;
  uint64_t generation = 0;  // of the target state after the call
  // What happened to each deployment of the application.
  std::map<std::string, ChangeKind> deployments;
  std::vector<std::string> removed;  // deployments no longer in the spec
};

class StateManager {
 public:
  StateManager(CheckpointStore& store, const Clock& clock, Random& rng, CoreOptions options = {});
  ~StateManager();
  StateManager(const StateManager&) = delete;
  StateManager& operator=(const StateManager&) = delete;

  // --- startup -------------------------------------------------------------

  // Loads the checkpoint and rebuilds the deployments it names, then adopts
  // `hosted` (see adopt_replicas). An unreadable or corrupt checkpoint is
  // returned as an error and the core stays empty and refuses user calls
  // (errc::unavailable): the controller must stop, never start over it.
  Status recover(const std::vector<HostedReplica>& hosted);

  // Replicas a node reports hosting: those of known deployments become
  // RECOVERING (asked for their version with a `recover` command; a wrong
  // version joins the rolling update; no answer within slow_startup_warning_s
  // replaces them), those of no known deployment are orphans and are stopped.
  // Replicas already known are ignored.
  void adopt_replicas(const std::vector<HostedReplica>& hosted);

  // --- user calls (write-ahead) --------------------------------------------

  // Creates or updates an application. Deployments no longer in the spec are
  // deleted. Identical spec: DeployResult::changed == false, nothing written.
  // A target state above CoreOptions::limits is refused (errc::invalid_argument).
  Result<DeployResult> deploy_application(const ApplicationSpec& app);

  // Creates or updates one deployment of an existing application (also how a
  // client scales: same spec, new num_replicas). With `prev_version`, the call
  // fails with errc::conflict unless the deployment exists and its current
  // effective_code_version equals it.
  Result<DeployResult> deploy_deployment(const std::string& app, const DeploymentSpec& spec,
                                         const std::optional<std::string>& prev_version = {});

  // Declarative: makes the set of applications (and target_capacity, http) exactly
  // `declared`, deleting applications absent from it, in ONE write-ahead
  // commit, so a crash leaves either all of it or none. An identical
  // declaration is a no-op (changed == false). Per-application results are
  // keyed by application name; deleted applications are listed in `removed`.
  // A declaration above CoreOptions::limits is refused (errc::invalid_argument).
  // With `if_generation` (optimistic concurrency, `troupectl deploy
  // --if-generation N`: the seed's prev_version for a whole config), the call
  // fails with errc::conflict, naming the current generation, unless the
  // target state's generation is exactly that; nothing is written then.
  Result<std::map<std::string, DeployResult>> apply(
      const TargetState& declared, bool* changed = nullptr,
      const std::optional<uint64_t>& if_generation = std::nullopt);

  // Sets one deployment's num_replicas and keeps the rest of its spec
  // (`troupectl scale`): deploy_deployment with that one change, so the same
  // limits, validation and write-ahead apply; the same count is a no-op.
  // errc::not_found for an unknown application or deployment;
  // errc::invalid_argument for a deployment with an autoscaling_config (the
  // autoscaler owns its count).
  Result<DeployResult> scale_deployment(const std::string& app, const std::string& deployment,
                                        uint32_t replicas);

  // Replaces an application's traffic split (`troupectl traffic`, Ray
  // Serve's set_traffic) without touching its deployments: written ahead,
  // then published with the routes at the next update(). The same split is
  // a no-op. Validated like a deploy: weights >= 0 summing to 1, names of
  // the application's deployments (errc::invalid_argument); errc::not_found
  // for an unknown application. Returns the generation after the call.
  Result<uint64_t> set_traffic(const std::string& app, const std::map<std::string, double>& weights);

  // Rolls an application back (`troupectl rollback APP`, Kubernetes'
  // `rollout undo`): deploys its last good declaration again
  // (TargetState::last_running: the spec it had the last time it was RUNNING
  // with every deployment HEALTHY) exactly as deploy_application does — the
  // same limits and validation, written ahead with a new generation — so a
  // release that has not run (DEPLOY_FAILED, or still rolling out) is undone
  // without its config file. A release that ran is itself the last good
  // declaration: there is no going further back. Answered like a deploy:
  // the next update() rolls the replicas, the status shows the progress.
  // Refused, changing nothing: errc::not_found for an unknown application
  // (or one being deleted); errc::conflict, naming the application, when it
  // has no last good declaration (it never ran its declaration since it was
  // deployed) or already declares it (naming its generation); whatever
  // deploy_application refuses (a store that fails: nothing changed, retry).
  // The DeployResult's generation is the new one; the last good
  // declaration's own stays in target_state().last_running.
  Result<DeployResult> rollback(const std::string& app);

  // Deletes are idempotent while under way: deleting an application (or
  // deployment) whose replicas are still stopping answers ok again, so a
  // client may retry a call whose answer it lost. A name that is not known
  // at all is errc::not_found (a typo must not pass silently).
  Status delete_application(const std::string& app);
  // The ingress deployment cannot be deleted on its own (delete the app),
  // nor one that carries traffic weight (errc::invalid_argument: move its
  // weight first), nor a shadow of the application (errc::invalid_argument:
  // deploy the application without it in `shadow` first). A deployment named
  // in the split with weight 0, or shadowed with probability 0, leaves the
  // split (or the shadow set) with it, in the same commit.
  Status delete_deployment(const std::string& app, const std::string& deployment);
  // Percent in [0, 100]; nullopt means 100. See capacity_adjusted().
  Status set_target_capacity(std::optional<double> capacity);
  // Writes an empty target state, then stops everything. is_shut_down() once
  // every replica is gone.
  Status shutdown();

  // --- autoscaling ------------------------------------------------------------
  //
  // Every decision (of the policy, or set_autoscaled_target) is written ahead
  // to the checkpoint (TargetState::autoscaled_replicas, without a new
  // generation) before the target moves, as Ray Serve does; a restarted
  // controller resumes the counts. The metrics are soft state.
  //
  // update() runs Ray Serve's request-based policy (controller/core/
  // autoscaling.hpp) for every deployment with an autoscaling_config and moves
  // its target; the status becomes UPSCALING / DOWNSCALING with trigger
  // AUTOSCALING and a message with the numbers behind the decision. The shell
  // feeds the reports below as they arrive; each is O(log n), timestamped with
  // the core's clock, and never fails.

  // A replica's report, sent every autoscaling_config.metrics_interval_s:
  // the requests it runs plus those queued at it. Ignored for an unknown
  // replica, one that is not RUNNING, or one of a deployment without an
  // autoscaling_config.
  void record_replica_metrics(const std::string& replica_id, double ongoing);
  // A handle's or proxy's report for deployment `id`, sent every
  // metrics_interval_s while it has sent requests to it within
  // look_back_period_s: the requests it queues for the deployment plus those
  // it has in flight there. `reporter_id` is stable per handle (e.g.
  // "<node>/proxy"). The only signal while the deployment has no running
  // replica: a report > 0 then starts one at once (scale from zero). Ignored
  // for an unknown deployment or one without an autoscaling_config.
  void record_handle_metrics(const std::string& reporter_id, const DeploymentId& id,
                             double queued_and_inflight);

  // --- model multiplexing (soft state, not checkpointed) --------------------
  //
  // Ray Serve's record_multiplexed_replica_info: a replica reports the models
  // its ModelCache holds, numbered by the replica (`seq` grows with every
  // change). A newer list than the one recorded is kept and published with
  // the replica set at the next update(): subscribers get a delta. Returns
  // true when it recorded something new (the shell then updates at once, so
  // that proxies learn it without waiting for the tick). Ignored (false) for
  // an unknown or removed replica, or an older or equal seq. (A replica that
  // is not RUNNING yet keeps its list for when it is.)
  bool record_multiplexed_replica_info(const std::string& replica_id, uint64_t seq,
                                       std::vector<std::string> model_ids);

  // Manual override of the autoscaled count (clamped to the bounds); the
  // policy moves on from it at the next update(). errc::not_found for an
  // unknown deployment, errc::invalid_argument without autoscaling_config.
  Status set_autoscaled_target(const DeploymentId& id, uint32_t replicas);

  // --- environment ---------------------------------------------------------

  void set_nodes(const std::vector<NodeInfo>& nodes);

  // Events. Each returns false when the replica is unknown (ignored).
  // `version` is what the replica runs (echo of the start/reconfigure command,
  // or its actual version when answering `recover`).
  bool on_replica_ready(const std::string& replica_id, const ReplicaVersion& version);
  bool on_replica_start_failed(const std::string& replica_id, const std::string& error);
  // What the checks of a replica's node came to under watch `watch`
  // (Command::check_seq of watch_health): checks passed (counted up to the
  // threshold), failures in a row, and what the last failure said ("stuck:
  // all 2 request threads busy ..."; it goes into the deployment's status
  // message when the replica is replaced for failing). A report of another
  // watch is ignored.
  bool on_health_report(const std::string& replica_id, uint64_t watch, uint32_t passed,
                        uint32_t failures, const std::string& failure);
  // A node registered again: its agent starts its health checks over (it may
  // have restarted, or its reports were lost while it was cut off), so its
  // RUNNING replicas' watches go to it again, and it counts afresh (passes
  // already counted stay: a replica once proven stays proven).
  void rewatch_node(const std::string& node_id);
  bool on_replica_stopped(const std::string& replica_id);
  // `cause`: what ended it, when known ("replica X exited: killed by
  // SIGSEGV"); it becomes the deployment's status message.
  bool on_replica_crashed(const std::string& replica_id, const std::string& cause = "");

  // One reconcile tick over every deployment; returns the commands to send.
  // Then every application that now runs a declaration other than its last
  // good one (RUNNING, every deployment HEALTHY) gets it recorded as such:
  // written ahead in one synced save (same generation, like an autoscale
  // decision) before target_state().last_running changes. A failed save
  // changes nothing and is tried again at the next update(), at most once
  // per update().
  std::vector<Command> update();

  // --- queries -------------------------------------------------------------

  const TargetState& target_state() const { return target_; }
  bool recovered() const { return recovered_; }
  std::vector<DeploymentId> deployment_ids() const;
  std::optional<DeploymentStatusInfo> deployment_status(const DeploymentId& id) const;
  std::optional<ApplicationStatusInfo> application_status(const std::string& app) const;
  std::vector<ReplicaInfo> replicas(const DeploymentId& id) const;
  std::optional<uint32_t> target_replicas(const DeploymentId& id) const;
  const DeploymentState* deployment(const DeploymentId& id) const;
  // Orphan replicas still being stopped.
  std::vector<std::string> orphans() const;
  bool is_shut_down() const;

  // --- snapshots -----------------------------------------------------------

  SnapshotId snapshot_id() const { return {options_.snapshot_epoch, snapshot_seq_}; }
  // What changed since `last`; nullopt when `last` is current.
  std::optional<SnapshotDelta> changes_since(const SnapshotId& last) const;
  // The id whose changes_since() is the same as `last`'s: `last`, or {0, 0}
  // for every id that gets the whole view (another epoch, none, or one
  // from the future).
  SnapshotId delta_base(const SnapshotId& last) const;
  // changes_since(last), and besides, the published replicas on `nodes`
  // again (partial entries, merged into the delta's own): a subscriber lost
  // its handles of those nodes' actors with its direct connection to them,
  // and gets them anew without the whole view. nullopt: nothing published.
  std::optional<SnapshotDelta> changes_and_replicas_on(const SnapshotId& last,
                                                       const std::set<std::string>& nodes) const;
  // The deployment's set goes out again in the next delta although the core
  // saw no change: the shell holds new actor handles for its replicas (they
  // came back with their node after the controller's pause, and the
  // snapshots sent meanwhile lacked them).
  void republish(const DeploymentId& id);
  // A new snapshot id although no deployment changed: the node table did
  // (a node DEAD, draining, registered), which every snapshot carries.
  void touch_snapshot();

 private:
  struct AppState {
    ApplicationSpec spec;
    bool deleting = false;
  };

  using DeploymentMap = std::map<DeploymentId, std::unique_ptr<DeploymentState>>;
  // The first deployment of `app` (deployments are ordered by app, then name).
  DeploymentMap::iterator first_of(const std::string& app);
  DeploymentMap::const_iterator first_of(const std::string& app) const;

  // Write-ahead: validate `next`, save it, and only then adopt it as target_.
  Status commit(TargetState next);
  // Writes one autoscaled count ahead (same generation); on error target_
  // is unchanged.
  Status write_autoscaled(const DeploymentId& id, uint32_t replicas);
  // Brings apps_/deployments_ in line with target_ (after a commit or load).
  void apply_target(std::map<std::string, DeployResult>* results);
  // The application runs what it declares: not being deleted, and each of
  // its deployments (but those being deleted) HEALTHY.
  bool runs_its_declaration(const std::string& app) const;
  // Records the last good declarations that are due (see update()).
  void record_running();
  Status require_recovered() const;
  TickContext context(std::vector<Command>& out);
  Replica* find(const std::string& replica_id);
  // find(), and wakes the replica's deployment (an event for its update()).
  Replica* touch(const std::string& replica_id);
  void publish();
  std::vector<Route> current_routes() const;

  CheckpointStore& store_;
  const Clock& clock_;
  Random& rng_;
  CoreOptions options_;

  bool recovered_ = false;
  TargetState target_;
  std::map<std::string, AppState> apps_;
  // Applications whose declaration changed since their last good one was
  // recorded (or looked at): record_running() checks only these.
  std::set<std::string> unrecorded_;
  DeploymentMap deployments_;
  std::vector<std::unique_ptr<Replica>> orphans_;
  ReplicaDirectory directory_;
  Cluster cluster_;
  uint64_t next_replica_seq_ = 1;
  std::vector<Command> pending_commands_;  // emitted outside update()

  uint64_t snapshot_seq_ = 0;
  std::vector<Route> routes_;
  uint64_t routes_seq_ = 0;
  bool routes_dirty_ = true;
  std::vector<DeploymentId> removed_pending_;    // deleted since the last publish
  std::map<DeploymentId, uint64_t> removed_at_;  // tombstones
};

}  // namespace troupe::controller
