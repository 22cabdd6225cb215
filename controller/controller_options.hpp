// The controller's options: its timings, budgets, limits, TLS trust and
// library store. Plain C++: the controller actor (controller_actor.hpp) and
// its plain shell (controller/shell/controller_logic.hpp) both take them, and
// the shell must not depend on the actor's header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "controller/core/limits.hpp"

namespace troupe::controller {

class ControllerMetrics;

struct ControllerOptions {
  double node_timeout_s = 5.0;
  // Eviction with judgement (controller/membership.hpp, LossJudgement): more
  // than this share of the nodes, and at least unreachable_min_nodes, lost
  // within one node timeout turn UNREACHABLE instead of DEAD; their replicas
  // move only after unreachable_timeout_s (or an operator's drain).
  double unreachable_share = 0.5;
  uint32_t unreachable_min_nodes = 2;
  double unreachable_timeout_s = 60.0;
  // Snapshot pushes in flight to all subscribers together, in replica
  // entries (each pushed replica counts 1, each push 1 more): a push that
  // would go beyond waits for answers to the ones in flight, so that many
  // subscribers catching up at once (a controller restart, a deploy of
  // thousands of replicas) do not hold all their pushes in the head's
  // buffers at once. One push is always let through, however large.
  size_t push_budget_entries = 150000;
  // How often liveness is checked and the reconciler ticks.
  double tick_interval_s = 0.1;
  // After a restart with a non-empty checkpoint, how long the controller
  // collects the replicas that re-registering nodes report before it
  // reconciles (starting replicas any earlier would duplicate live ones).
  double recovery_window_s = 3.0;
  // A controller that made no progress for longer than a quarter of the node
  // timeout (and five ticks) was paused - stopped, starved, or its VM
  // migrated: it does not judge the nodes by its own silence. Every node's
  // heartbeat deadline is re-armed, and a node whose connection dropped
  // during the pause stays ALIVE for this long after the resume so that it
  // can reconnect and register again (an agent retries at most every 5 s).
  double pause_grace_s = 10.0;
  // Requests to agents and replicas that should answer at once.
  double request_timeout_s = 5.0;
  // Requests for replicas (spawn, initialize, reconfigure, version, stop,
  // kill) awaiting their answers at once: the commands beyond wait for
  // answers, in order. CAF 0.17 keeps an actor's awaited answers in a flat
  // map searched from the start on every request and every answer, so tens
  // of thousands at once (a deploy or a rolling update of 50,000 replicas)
  // stalled the controller for seconds at a time: the nodes' heartbeats went
  // unanswered and most of them turned UNREACHABLE.
  size_t max_replica_requests = 4096;
  // Where the ids of the live nodes are kept instead of <state_dir>/nodes
  // (below): a head candidate keeps them in etcd beside its checkpoint
  // (node/ha_head.cpp), since its own file would hold the nodes of the last
  // term it led, and a stale list could end the recovery window before a
  // node it does not name reported its replicas. Unset: the file.
  struct NodesList {
    std::string where;  // for log lines
    std::function<std::string()> read;  // "" when none or unreadable
    std::function<bool(const std::string&)> write;
  };
  std::optional<NodesList> nodes_list;
  // Where the ids of the live nodes are kept (file "nodes"), so that a
  // restarted controller ends its recovery window as soon as every one of
  // them has registered again. Empty: no such file; the window always runs
  // in full.
  std::string state_dir;
  // Every node's proxy (a route-table subscriber) is health-checked like a
  // replica: every proxy_health_period_s it must answer within
  // proxy_health_timeout_s. After proxy_unhealthy_after failures in a row it
  // is UNHEALTHY (`troupectl nodes` shows it) and its actor is killed, so
  // that its node starts a fresh one.
  double proxy_health_period_s = 2.0;
  double proxy_health_timeout_s = 2.0;
  uint32_t proxy_unhealthy_after = 3;
  // Caps on what one config may ask for (replicas, size).
  Limits limits;
  // The cluster CA (PEM) when the cluster runs with TLS: every write request
  // must then carry a credential signed by a certificate of the required
  // role (operator; node for register/heartbeat/deregister). Empty: no checks.
  std::string ca_pem;
  // The head's controller metrics (controller_metrics.hpp), shared by every
  // incarnation of the controller; empty: none kept.
  std::shared_ptr<ControllerMetrics> metrics;
  // Deployment libraries (controller/shell/library_store.hpp), kept under
  // <state_dir>/libraries: the head's plugin path, whose libraries are pinned
  // by their SHA-256 on deploy, and how long a library no deployment names
  // any more is kept.
  std::vector<std::string> plugin_dirs;
  double library_retention_s = 600;
  // How often unnamed libraries are looked for.
  double library_collect_interval_s = 60;
  // Who leads the control plane, as the JSON object (leader_atom) answers
  // (runtime/wire.hpp): the head fills it in (node/node_main.cpp; a head
  // candidate from its election, node/ha_head.hpp). Empty: the controller
  // answers {"leading": true} only.
  std::function<std::string()> leadership;
  // The controller runs on a thread of its own (caf::detached): its
  // checkpoint writes wait for a network round trip (etcd, up to the
  // client's timeout when etcd is out of reach), which must not hold one of
  // the scheduler's few threads that the proxy, the agent and the head's
  // election share.
  bool own_thread = false;
  // The controller of a head candidate (--ha-etcd): registration refuses a
  // single head's agent; a single head refuses candidates and workers given
  // several heads (controller/shell/admission.hpp, check_head_mode).
  bool highly_available = false;
};

}  // namespace troupe::controller
