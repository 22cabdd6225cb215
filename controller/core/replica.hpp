// The controller's record of one replica. Events from the shell only set the
// "reported" fields; DeploymentState::update() turns them into transitions, so
// that every transition happens at a tick, in a deterministic order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "controller/core/commands.hpp"
#include "controller/core/deployment_status.hpp"
#include "controller/core/version.hpp"
#include "runtime/resources.hpp"

namespace troupe::controller {

class DeploymentState;

struct Replica {
  std::string id;
  uint64_t seq = 0;                  // creation order; larger is newer
  DeploymentState* owner = nullptr;  // nullptr: an orphan being stopped
  ReplicaState state = ReplicaState::starting;
  // STARTING: false while pending allocation (no node fits), true once a
  // start command was sent (pending initialization).
  bool placed = false;
  std::string node_id;
  Resources reserved;      // what it holds on node_id while placed
  ReplicaVersion version;  // what it runs (or will run once started/updated)
  double created_at = 0;
  double state_since = 0;
  bool migrating = false;  // RUNNING on a DRAINING node, waiting for its replacement
  // An old version's RUNNING replica that a rolling update replaces: it
  // keeps serving until a replacement of the target version passed its
  // start-up gate (or, with no room for one more replica, until the
  // replacement needs its place).
  bool replacing = false;
  // State of node_id as of Cluster::epoch() == node_epoch (a cache: the node
  // view changes rarely, replicas are visited every tick).
  uint64_t node_epoch = 0;
  NodeState node_state = NodeState::alive;
  bool removed = false;

  // --- reported by events, consumed by the next update()
  enum class Startup : uint8_t { none, ready, failed };
  Startup startup = Startup::none;
  ReplicaVersion reported_version;
  std::string error;
  bool crashed = false;
  bool stopped = false;
  // The counts of its node's checks for the current watch, when a report
  // came (StateManager::on_health_report).
  bool health_reported = false;
  uint32_t reported_passed = 0;
  uint32_t reported_failures = 0;
  std::string reported_failure;

  // --- model multiplexing (soft state: a restarted controller learns it
  // again from the replicas' periodic reports)
  std::vector<std::string> model_ids;  // the models its ModelCache holds
  uint64_t model_ids_seq = 0;          // the replica's number of that list

  // --- health checking (RUNNING). The replica's node runs the checks
  // (node/health_checks.hpp) from the watch the core sends it, and reports
  // their counts when they change.
  uint64_t check_seq = 0;  // the id of the current watch
  bool watch_due = false;  // send the watch (the node may not have it)
  uint32_t consecutive_failures = 0;
  std::string last_failure;  // why the last failed check failed ("" unknown)
  // Checks passed in a row since it became RUNNING. A replica has proven
  // itself once this reaches health_check_failure_threshold: before that, a
  // replica replaced for failed checks counts toward the deployment's
  // backoff like a start failure.
  uint32_t checks_passed = 0;

  // --- stopping
  double kill_at = 0;  // when the (next) kill is due
};

// A read-only view for status queries and tests.
struct ReplicaInfo {
  std::string id;
  ReplicaState state = ReplicaState::starting;
  bool pending_allocation = false;
  bool migrating = false;
  std::string node_id;
  ReplicaVersion version;
  std::vector<std::string> model_ids;  // the models it holds (model multiplexing)
};

}  // namespace troupe::controller
