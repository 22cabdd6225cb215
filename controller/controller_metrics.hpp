// The controller's metrics in the head's registry (runtime/metrics.hpp),
// kept by the controller actor: reconcile passes, checkpoint writes and
// deploys as they happen; deployments' target and running replicas and the
// nodes by state refreshed from the controller's view (refresh(), at most
// once a second); and, kept by the head's supervisor, the restarts of the
// controller. One per head process, shared by the controller's
// incarnations. docs/observability.md lists them.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "controller/core/checkpoint_store.hpp"
#include "controller/core/state_manager.hpp"
#include "runtime/wire.hpp"

namespace troupe::metrics {
class Registry;
}

namespace troupe::controller {

class ControllerMetrics {
 public:
  explicit ControllerMetrics(std::shared_ptr<metrics::Registry> registry);
  ~ControllerMetrics();
  ControllerMetrics(const ControllerMetrics&) = delete;
  ControllerMetrics& operator=(const ControllerMetrics&) = delete;

  // A reconcile pass took `seconds`.
  void reconciled(double seconds);
  // A deploy or apply request ended: `outcome` "ok" or "error".
  void deployed(const std::string& outcome);
  // The head's supervisor restarted the controller (and published it).
  void restarted();
  // A head candidate (--ha-etcd) started or stopped leading: the gauge
  // troupe_controller_is_leader, and troupe_controller_leader_changes_total
  // counts every change after the first call. A single head never calls it
  // (neither series exists there).
  void leading(bool leads);
  // `store` with every save() timed into
  // troupe_controller_checkpoint_write_duration_seconds.
  std::shared_ptr<CheckpointStore> timed(std::shared_ptr<CheckpointStore> store);
  // A publish pass sent `snapshots` distinct snapshots in `local` sends to
  // subscribers in this process and `remote` to others.
  void pushed(size_t snapshots, size_t local, size_t remote);
  // Deployments' target and running replicas, and the nodes by state; a
  // deployment that is gone loses its series. Also how often this process
  // serialized a pushed snapshot and copied those bytes instead
  // (snapshot_encoding_counts()).
  void refresh(const StateManager* core, const std::vector<NodeStatus>& nodes);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace troupe::controller
