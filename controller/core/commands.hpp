// The core's boundary with the outside world (the actor shell, or the fakes in
// tests). The core never blocks and never calls out:
//
//   * in:  the node view (set_nodes), replica events (on_replica_ready, ...),
//          user calls (deploy, delete, ...), and one update() per tick;
//   * out: the Commands that update() returns, for the shell to execute
//          asynchronously. Each command's outcome comes back later as an event.
//
// Replica and node identities are strings; the shell maps them to actors.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "controller/core/limits.hpp"
#include "controller/core/model.hpp"
#include "controller/core/version.hpp"
#include "runtime/resources.hpp"

namespace troupe::controller {

enum class CommandKind {
  // Spawn replica `replica_id` of `app`/`deployment` on `node_id`, running
  // `spec` (import path, init args, user_config). Answer: on_replica_ready(id,
  // version) once constructed and reconfigured, or on_replica_start_failed.
  start,
  // Apply `spec->config.user_config` to a running replica. Answer:
  // on_replica_ready(id, version) or on_replica_start_failed(id, error).
  reconfigure,
  // Ask the replica's node to health-check it (`health`) under the watch id
  // `check_seq`: an id new for the replica starts the node's counts afresh
  // with a check at once; the same id again only changes the settings. The
  // node answers on_health_report(id, watch, ...) whenever its counts change.
  // Sent when a replica turns RUNNING, when its settings change and when its
  // node registers again.
  watch_health,
  // Adopted after a controller restart: ask the replica what it runs. Answer:
  // on_replica_ready(id, version) or on_replica_crashed(id).
  recover,
  // Ask the replica to finish its in-flight requests and exit within
  // `timeout_s`. The core sends `kill` itself when the time is up. Answer:
  // on_replica_stopped(id) once the actor is gone.
  stop,
  // Terminate the replica now. Answer: on_replica_stopped(id).
  kill,
};

const char* to_string(CommandKind kind);

// How a node health-checks a replica: the deployment's period and timeout,
// the failure threshold and the period's jitter (CoreOptions).
struct CheckSettings {
  double period_s = 10.0;
  double timeout_s = 30.0;
  uint32_t threshold = 3;
  double jitter = 0.1;
};

struct Command {
  CommandKind kind = CommandKind::start;
  std::string replica_id;
  std::string node_id;     // start, recover, stop, kill: where the replica lives
  std::string app;         // start
  std::string deployment;  // start
  // start / reconfigure: the target spec (shared, immutable).
  std::shared_ptr<const DeploymentSpec> spec;
  ReplicaVersion version;  // start / reconfigure: what the replica will run
  double timeout_s = 0;    // stop: graceful shutdown timeout
  uint64_t check_seq = 0;  // watch_health: the watch id
  CheckSettings health;    // watch_health: how to check
};

// UNREACHABLE: lost together with so many other nodes that the controller is
// the likely fault (Membership's LossJudgement): its replicas stay where
// they are, counted and routed to, until it is back or declared DEAD.
enum class NodeState { alive, draining, dead, unreachable };

const char* to_string(NodeState s);

// What the core knows about a node. A node missing from the view is DEAD.
struct NodeInfo {
  std::string id;
  NodeState state = NodeState::alive;
  Resources capacity;
};

// A replica actor that a node reports hosting (after a controller restart, or
// when a node re-registers).
struct HostedReplica {
  std::string replica_id;
  std::string app;
  std::string deployment;
  std::string node_id;
  // The node agent already asked it to shut down.
  bool stopping = false;
};

// Tunables of the core; defaults are Ray Serve's.
struct CoreOptions {
  // Consecutive failed (or unanswered) health checks that make a replica
  // unhealthy. A crash makes it unhealthy at once.
  uint32_t health_check_failure_threshold = 3;
  // A replica STARTING (or RECOVERING) for longer than this gets a status
  // message naming what it waits for; RECOVERING ones are then replaced.
  double slow_startup_warning_s = 30.0;
  // Constructor failures, without any running target-version replica, after
  // which a deployment is DEPLOY_FAILED: min(this, 3 * target).
  uint32_t max_constructor_retry_count = 100;
  // Backoff between start retries after the threshold: 1, 2, 4, ... s, capped.
  double max_backoff_s = 64.0;
  // Each backoff wait is extended by uniform(0, backoff_jitter_s), drawn once
  // per wait (Ray Serve: random.uniform(0, 3)).
  double backoff_jitter_s = 3.0;
  // Health-check periods are multiplied by uniform(1 - j, 1 + j).
  double health_check_jitter = 0.1;
  // Grace period for orphans (replicas of no known deployment).
  double orphan_graceful_shutdown_timeout_s = 20.0;
  // A replica still not gone this long after a kill is killed again, and so
  // on until its node reports it stopped (or the node is DEAD).
  double kill_resend_s = 1.0;
  // Identifies this controller incarnation in snapshot ids, so a subscriber
  // presenting an id of a previous incarnation gets a full snapshot. The shell
  // should pass a value unlikely to repeat (e.g. a random 64-bit number).
  uint64_t snapshot_epoch = 1;
  // Makes replica ids unique across controller incarnations:
  // "<app>#<deployment>#<tag>-<n>" ("<app>#<deployment>#<n>" when empty). A
  // restarted controller may not hear from every node before it starts new
  // replicas, so the shell must pass a tag unique per incarnation (e.g. six
  // random letters, or the snapshot epoch in hex).
  std::string replica_id_tag;
  // Caps on what the target state may ask for: deploy_application (and so
  // deploy_deployment) and apply refuse a state above them with
  // errc::invalid_argument before anything is validated or written.
  Limits limits;
  // A deployment whose replicas all run its target version, proven, with
  // nothing reported since its last update() and nothing due on the clock,
  // is settled: update() skips it until an event or a node change wakes it
  // (DeploymentState::settled()). True makes every tick visit every
  // deployment: the reference the tests hold the skipping to.
  bool update_settled = false;
};

}  // namespace troupe::controller
