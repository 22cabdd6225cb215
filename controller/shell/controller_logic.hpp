// The controller's state and what every call and event does to it, as plain
// C++ with an injected clock: the actor (controller/controller_actor.cpp)
// turns a message into one call here, then does what the answer asks for —
// reconcile, finish the recovery, send a push, a health check or an exit, or
// quit — and feeds the answers of its requests back to the core. Nothing here
// sends a message, so tests drive every flow directly
// (tests/controller/controller_logic_test.cpp).
//
// It composes the parts, each tested on its own: the reconciler (StateManager,
// controller/core), node liveness (Membership), the recovery window
// (RecoveryGate, NodesFile, nodes_to_await), admission (admission.hpp), the
// actor handles (ActorDirectory), proxy health (ProxyHealthMonitor) and the
// rendering of answers (status_view.hpp). Log lines go to the logger given.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <spdlog/logger.h>
#include <caf/actor.hpp>
#include <caf/actor_addr.hpp>
#include <caf/error.hpp>

#include "controller/controller_options.hpp"
#include "controller/core/checkpoint_store.hpp"
#include "controller/core/clock.hpp"
#include "controller/core/state_manager.hpp"
#include "controller/membership.hpp"
#include "controller/shell/activity.hpp"
#include "controller/shell/admission.hpp"
#include "controller/shell/command_plan.hpp"
#include "controller/shell/directory.hpp"
#include "controller/shell/library_store.hpp"
#include "controller/shell/proxy_health.hpp"
#include "controller/shell/recovery_gate.hpp"
#include "controller/shell/status_view.hpp"
#include "runtime/status.hpp"
#include "runtime/wire.hpp"

namespace troupe::controller {

class ControllerLogic {
 public:
  // `seed`: drawn at random for every incarnation (incarnation_options, and
  // the core's Random). `monitor` / `demonitor`: see ActorDirectory.
  ControllerLogic(const ControllerOptions& options, std::shared_ptr<CheckpointStore> store,
                  std::shared_ptr<const Clock> clock, uint64_t seed,
                  ActorDirectory::Monitor monitor, ActorDirectory::Demonitor demonitor,
                  std::shared_ptr<spdlog::logger> log);

  // ------------------------------------------------------------ startup

  // Loads the checkpoint and opens the recovery gate. True: there is state
  // to recover; the actor ends the window after recovery_window_s (or
  // register_node / tick end it earlier). False: nothing to recover; the
  // actor calls finish_recovery() at once. Until start() the controller
  // counts as recovering.
  bool start();
  // Ends the recovery: the core takes over the replicas nodes reported.
  // True when it ended now, false when it had ended before. An error when
  // the checkpoint cannot be recovered: the controller must stop with it.
  Result<bool> finish_recovery();
  bool recovering() const { return recovery_->is_recovering(); }
  // Seconds until the recovery window ends (nodes arriving extend it); 0
  // once it has, or when not recovering.
  double recovery_left_s() const;

  // ------------------------------------------------------------ node calls

  struct Registration {
    uint64_t incarnation = 0;
    // While recovering: every node alive before the restart is back, so the
    // actor ends the recovery now (finish_recovery()).
    bool recovery_complete = false;
  };
  // A node agent (re-)registers with the replicas it hosts: admitted (see
  // admit_node), the node is ALIVE, `agent` is its agent, and its replicas
  // are collected for the recovery or adopted by the core.
  Result<Registration> register_node(const troupe::NodeInfo& info, const AgentActor& agent,
                                     const std::vector<HostedReplicaInfo>& hosted,
                                     const Credential& cred);
  // A node's heartbeat with the load reports of its replicas since the last
  // one (replica_metrics() for each, once the node is known to be up).
  Status heartbeat(const std::string& node_id, const std::vector<ReplicaLoad>& loads,
                   const Credential& cred);
  // The node leaves on purpose: forgotten, its agent no longer monitored.
  Status deregister(const std::string& node_id, const Credential& cred);
  Status drain(const std::string& node_id, const Credential& cred);
  // A node that is stopping asks to leave: it is DRAINING (its replicas are
  // replaced on other nodes first, then stopped) until it deregisters.
  // settled_leaves() says when its move is over.
  Status leave(const std::string& node_id, const Credential& cred);
  struct LeaveOutcome {
    std::string node_id;
    std::string message;  // what happened, for the node's log
  };
  // The leaving nodes whose move is over, each named once: none of their
  // replicas is left but those being stopped, or those left cannot move
  // (their replacements find no node with room), or the node is gone.
  std::vector<LeaveOutcome> settled_leaves();

  // ------------------------------------------------------------ user calls

  Result<DeployResult> deploy(const std::string& encoded_application, const Credential& cred);
  // The declarative deploy: the answer is render_apply_result's JSON. New
  // http settings (the state's `http`) reach every proxy with the next
  // publish.
  // `if_generation` (deploy --if-generation): refused, naming the current
  // generation, unless it is the target state's generation; the credential
  // signs it too.
  Result<std::string> apply(const std::string& encoded_target_state, const Credential& cred,
                            std::optional<uint64_t> if_generation = std::nullopt);
  Status delete_application(const std::string& app, const Credential& cred);
  // One deployment of an application (not its ingress, not one that carries
  // traffic weight).
  Status delete_deployment(const std::string& app, const std::string& deployment,
                           const Credential& cred);
  // One deployment's replica count; refused for an autoscaled deployment.
  Result<DeployResult> scale(const std::string& app, const std::string& deployment,
                             uint32_t replicas, const Credential& cred);
  // Replaces the application's traffic split without a redeploy (written
  // ahead; the next publish pushes the routes) -> the new generation.
  Result<uint64_t> set_traffic(const std::string& app, const TrafficWeights& weights,
                               const Credential& cred);
  // `troupectl rollback`: deploys the application's last good declaration
  // again (StateManager::rollback), once its libraries are checked to be at
  // hand (LibraryStore::check_available); logged and recorded like a deploy.
  struct Rollback {
    uint64_t generation = 0;       // the new one
    uint64_t from_generation = 0;  // the last good declaration's
  };
  Result<Rollback> rollback(const std::string& app, const Credential& cred);
  // Deployment libraries (library_store.hpp). An upload piece is signed by an
  // operator (its digest covers the piece's SHA-256); the size and read
  // queries are open like status, for the node agents.
  Result<uint64_t> upload_library(const std::string& sha256, uint64_t total, uint64_t offset,
                                  const std::string& piece, const Credential& cred);
  uint64_t library_size(const std::string& sha256) {
    return libraries_.size_of(sha256, core_->target_state());
  }
  Result<std::string> library_piece(const std::string& sha256, uint64_t offset) {
    return libraries_.read(sha256, offset, core_->target_state());
  }
  // The pinned libraries this controller cannot serve (LibraryStore::missing).
  std::set<std::string> missing_libraries() { return libraries_.missing(core_->target_state()); }
  // A piece of a missing library taken back from a node's cache: stored as
  // an upload's piece, without a credential (the content must hash to the
  // pin the declaration holds, or nothing is kept).
  Result<uint64_t> store_pulled_library(const std::string& sha256, uint64_t total, uint64_t offset,
                                        const std::string& piece) {
    if (!missing_libraries().count(sha256))
      return {errc::invalid_argument, "library " + sha256 + " is not one this controller misses"};
    return libraries_.upload(sha256, total, offset, piece);
  }
  // Deletes every application; with `nodes`, nodes_to_stop() then names
  // every agent once the last replica is gone.
  Status shutdown(bool nodes, const Credential& cred);
  // The actor `troupectl kill` reaches (see ActorDirectory::kill_target),
  // logged; the actor sends it an exit(kill), or quits.
  Result<KillTarget> kill(const std::string& kind, const std::string& id, const Credential& cred);

  // ------------------------------------------------------------ queries

  std::string status() const;  // the `status` JSON
  std::vector<NodeStatus> nodes() const;
  // What the head's dashboard shows, JSON: {"status": the `status` answer
  // with requests_per_s per replica and deployment, "nodes": the rows of
  // `troupectl nodes`, "events": the newest 50, newest first, each with
  // age_s, kind, subject, message, warn}.
  std::string dashboard() const;
  const Activity& activity() const { return activity_; }
  // A pull: what changed since (epoch, seq), or the same id when current.
  Result<RoutingSnapshot> snapshot(uint64_t epoch, uint64_t seq) const;
  Result<std::string> config() const;  // the target state record

  // ------------------------------------------------------------ routes

  // Tracks a route-table subscriber (a node's proxy) presenting `last`.
  // True when the actor publishes now (not while recovering); an invalid
  // handle is ignored. `lost_node`: the proxy lost its direct connection to
  // that node; its next push carries that node's replicas again (a delta,
  // not the whole view).
  bool subscribe(const ProxyActor& subscriber, SnapshotId last, const std::string& node_id,
                 const std::string& lost_node = "");
  // The snapshot every subscriber is due (a delta since the last one it was
  // sent, in full when it has none), marked as sent; none for a current one
  // or one whose last push is still unanswered (push_done()).
  struct Push {
    ProxyHealthMonitor::Key key = 0;
    uint64_t push = 0;  // for push_done()
    ProxyActor to;
    // Shared by the subscribers due the same delta (the same snapshot id,
    // or none that the current view is a delta of) while the view stays at
    // the same id: rendered once, also across calls (the pushes held back
    // by the push budget get the same object when their turn comes).
    std::shared_ptr<const RoutingSnapshot> snapshot;
  };
  std::vector<Push> due_pushes();
  // The subscriber answered push `push` (`ok`), or it failed or timed out:
  // it is due its next one (in full after a failure).
  void push_done(ProxyHealthMonitor::Key key, uint64_t push, bool ok);

  // ------------------------------------------------------------ reconciling

  // The core's commands for the actor to execute (none while recovering).
  std::vector<Command> update();
  struct Execution {
    CommandAction action;
    AgentActor agent;      // the command's node's agent, if connected
    ReplicaActor replica;  // the command's replica, if known
  };
  // How to execute `cmd` (plan_command). A replica to stop or kill is marked
  // so its down message counts as a stop. Actions that need no message
  // (no_agent, replica_gone, already_gone) are fed back to the core here;
  // the actor sends what the others name.
  Execution plan(const Command& cmd);
  // Logs every change of a deployment's status since the last call: the
  // operator's event trail. After the commands of an update() ran.
  void log_status_changes();

  // ------------------------------------------------------------ reports

  // A replica's report (ReplicaLoad): its average requests in flight over
  // the last interval drive autoscaling; the rest is for status and the
  // dashboard (Activity).
  void replica_metrics(const ReplicaLoad& load);
  // What the checks of a node's replicas came to (node/health_checks.hpp):
  // the core's on_health_report for each; a failure is logged.
  void health_reports(const std::string& node_id, const std::vector<HealthReport>& reports);
  // The models a replica holds (model multiplexing). True when the actor
  // reconciles now, so that proxies get the change at once.
  bool replica_models(const std::string& replica_id, uint64_t seq,
                      std::vector<std::string> model_ids);
  // A proxy's (or handle's) count for one deployment: the only signal when
  // it has no replica. True when the actor reconciles now (a cold start),
  // not at the next tick.
  bool handle_metrics(const std::string& reporter, const std::string& app,
                      const std::string& deployment, double queued_and_inflight);

  // ------------------------------------------------------------ time

  // The tick's liveness check: nodes silent past node_timeout_s are DEAD.
  // True when the recovery window is over, so the actor ends the recovery
  // (the window's own message may come first).
  bool tick();
  // After a tick's reconcile: the agents to send stop_node, once, when a
  // `shutdown --nodes` has seen every replica gone; otherwise none.
  std::vector<AgentActor> nodes_to_stop();

  // The proxies due for a health check now, marked as being checked.
  std::vector<std::pair<ProxyHealthMonitor::Key, ProxyActor>> due_proxy_checks();
  // A check's outcome (`why`: the error, empty when it answered), logged.
  // The proxy to kill when it just became UNHEALTHY (its node's keeper
  // starts a fresh one, which subscribes again); else an invalid handle.
  ProxyActor settle_proxy_check(ProxyHealthMonitor::Key key, bool ok, const std::string& why);

  // ------------------------------------------------------------ down

  // A monitored actor went down with `reason` (`rendered`: CAF's text for
  // it, for the log). A replica's crash or stop goes to the core (not while
  // recovering), an agent whose connection dropped makes its node DEAD, a
  // subscriber's health record is dropped. True when the actor reconciles.
  bool on_down(const caf::actor_addr& source, const caf::error& reason,
               const std::string& rendered);

  // ------------------------------------------------------------ parts

  // For the actor, to feed the answers of its requests back.
  StateManager& core() { return *core_; }
  ActorDirectory& actors() { return actors_; }
  const ControllerOptions& options() const { return options_; }
  // The declared request timeout (the target state's http_options), 0: none.
  // A replica's derived stuck_after_s is computed from it when it starts.
  double request_timeout_s() const;
  spdlog::logger& log() { return *log_; }
  // For tests.
  const StateManager& core() const { return *core_; }
  const Membership& membership() const { return membership_; }
  const ActorDirectory& actors() const { return actors_; }

 private:
  double now() const { return clock_->now_s(); }
  // `checked` (a credential's check), and, when it passed and the cluster
  // checks credentials, the credential used up: its second use is refused.
  Status once(Status checked, const Credential& cred, Operation op);
  void log_transitions(const std::vector<NodeTransition>& ts);
  // Called by tick() and on_down(): a controller whose ticks stopped for
  // longer than pause_threshold_s() was paused; the membership then judges
  // the nodes from now on (Membership::resumed).
  void notice_pause();
  double pause_threshold_s() const;
  // Replicas whose handles went down with their node's connection are not
  // crashes: the node's fate decides theirs. They wait here for their node
  // to register again (which brings the handles back, or names those that
  // are gone), or to be declared DEAD (the core replaces the replicas of
  // DEAD nodes). An UNREACHABLE node's wait lasts until one of those; after
  // a pause, until the pause's grace ends; otherwise (the connection dropped
  // before the node was judged) at most one node timeout, after which they
  // are crashes (release_held()).
  void settle_unreachable(const std::string& node, const std::vector<HostedReplicaInfo>& hosted);
  void drop_unreachable(const std::vector<NodeTransition>& ts);
  void release_held();
  void save_live_nodes();
  // From tick(): the live nodes' list again, once kNodesRetryInterval_s
  // passed since its write failed.
  void retry_live_nodes();
  // The core learns the node table (and <state_dir>/nodes is kept).
  void push_nodes();
  // After a change of membership: the core learns of it (not while
  // recovering; finish_recovery() pushes the nodes then).
  void nodes_changed();
  RoutingSnapshot to_wire(const SnapshotDelta& delta) const;
  // due_pushes()' snapshots by their delta base (StateManager::delta_base),
  // all of them rendered from the same inputs: the core's view at one
  // snapshot id, one generation of the target state (http settings, queue
  // limits) and the same node registrations (peer listeners). A change of
  // any of these starts afresh.
  std::map<std::pair<uint64_t, uint64_t>, std::shared_ptr<const RoutingSnapshot>> rendered_;
  std::tuple<uint64_t, uint64_t, uint64_t, uint64_t> rendered_from_{};

  ControllerOptions options_;
  std::shared_ptr<const Clock> clock_;
  // Credentials accepted within their window: a second use is refused
  // (once()).
  ReplayGuard replay_;
  std::shared_ptr<spdlog::logger> log_;
  Membership membership_;
  SeededRandom rng_;
  std::shared_ptr<CheckpointStore> store_;
  std::unique_ptr<StateManager> core_;
  std::unique_ptr<RecoveryGate> recovery_;
  NodesFile nodes_file_;  // <state_dir>/nodes, for the next restart
  // The last write of nodes_file_ failed: tick() tries again from
  // nodes_retry_at_ on (the controller's clock) until one succeeds. Not on
  // every tick: a write to etcd out of reach waits for its timeout.
  bool nodes_unsaved_ = false;
  double nodes_retry_at_ = 0;
  static constexpr double kNodesRetryInterval_s = 1.0;
  ProxyHealthMonitor proxies_;
  // Replicas, agents and subscribers (proxies; their health lives in
  // `proxies_` under the same key): every actor the controller monitors.
  ActorDirectory actors_;
  // `troupectl shutdown --nodes`: stop the node processes once every replica
  // is gone.
  bool stop_nodes_when_empty_ = false;
  // When tick() last ran (the controller's clock); < 0 before the first.
  double last_tick_at_ = -1;
  // Node id -> replicas whose handles went down with the node's connection
  // (settle_unreachable()), and since when.
  struct Held {
    std::set<std::string> ids;
    double since = 0;
  };
  std::map<std::string, Held> unreachable_;
  // Recent events and request rates, for the dashboard (mutable: reading
  // the dashboard forgets the counters of replicas that are gone).
  mutable Activity activity_;
  // Nodes that asked to leave and wait for settled_leaves().
  std::set<std::string> leaving_;
  // The DEAD and draining nodes the last snapshot listed (push_nodes()).
  std::vector<std::pair<std::string, NodeState>> flagged_nodes_;
  // Last logged status per deployment, to log transitions.
  StatusChangeLog status_log_;
  LibraryStore libraries_;
  // When tick() last looked for libraries to remove (the controller's clock).
  double libraries_collected_at_ = -1;
};

}  // namespace troupe::controller
