// What the controller answers to queries, rendered from its state as pure
// functions: `troupectl status` (JSON), `troupectl nodes`, and the answer to a
// declarative deploy. troupectl and the tests parse these, so field names and
// shapes are an interface: see docs/architecture.md.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include <caf/actor.hpp>

#include <nlohmann/json.hpp>

#include "controller/core/state_manager.hpp"
#include "controller/membership.hpp"
#include "controller/shell/activity.hpp"
#include "controller/shell/proxy_health.hpp"
#include "runtime/wire.hpp"

namespace troupe::controller {

// When a replica became ready (Unix seconds, as the replica reported it); 0
// when not yet or unknown.
using StartedAt = std::function<double(const std::string& replica_id)>;
// The `status` answer: every application of the target state with its
// status, its deployments' status, target and replicas (each with the
// models it holds, `models`), and whether the controller is still
// recovering. A null core renders no applications.
// With `activity` (read at `now`), each replica has `requests_per_s`,
// `errors_per_s`, `in_flight`, `streams` and `p99_ms` (null: none finished
// lately), and each deployment their sums (`p99_ms`: the largest of its
// replicas') and its `restarts`.
nlohmann::json render_status(const StateManager* core, bool recovering,
                             const StartedAt& started_at, const Activity* activity = nullptr,
                             double now = 0);

// The answer to `apply`: changed, generation, and per application what
// happened to each deployment and which were removed.
nlohmann::json render_apply_result(const std::map<std::string, DeployResult>& results, bool changed,
                                   uint64_t generation);

// One row of `troupectl nodes` (heartbeat age relative to `now`, on the
// membership's clock), and all of them with their proxies' health.
NodeStatus render_node(const NodeRecord& n, double now);
std::vector<NodeStatus> render_nodes(const Membership& membership,
                                     const ProxyHealthMonitor& proxies, double now);

// The actor of a replica id; an invalid handle when the shell has none yet
// (such replicas are left out of what is pushed).
using HandleOf = std::function<ReplicaActor(const std::string& replica_id)>;

// A snapshot delta as pushed to route-table subscribers: routes, each
// deployment's RUNNING replicas with their actors and its queue limit, the
// removed and withheld deployments, every DEAD node, and the target's http
// settings (request and keep-alive timeouts; 0 where none is declared), and
// the peer listeners of the live nodes that host one of those replicas.
RoutingSnapshot render_snapshot(const SnapshotDelta& delta, const TargetState& target,
                                const Membership& membership, const HandleOf& handle_of);

// One deployment whose status changed since the last observation: the
// operator's event trail. `from` is empty for a deployment seen first.
struct StatusChange {
  std::string deployment;  // "app/name"
  std::string from;        // "" when new
  DeploymentStatusInfo info;
  // UNHEALTHY and DEPLOY_FAILED deserve a warning; the rest is information.
  bool warn = false;
  // "deployment a/D: NEW -> UPDATING (CONFIG_UPDATE_STARTED): message"
  std::string describe() const;
};

// Remembers every deployment's last status and reports the changes.
class StatusChangeLog {
 public:
  std::vector<StatusChange> observe(const StateManager& core);

 private:
  std::unordered_map<std::string, DeploymentStatus> last_;
};

}  // namespace troupe::controller
