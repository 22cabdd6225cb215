// A chaos scenario: the cluster to start, what to deploy, the load to run
// through the proxies, the faults to inject while it runs, and the goals the
// run must meet. Loaded from YAML (tools/chaos/scenarios/*.yaml; the schema
// is in docs/reliability.md and in `chaos --help`).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace chaos {

struct ClusterSpec {
  int workers = 2;  // besides the head
  double node_timeout_s = 2;
  double heartbeat_interval_s = 0.2;
  double basp_heartbeat_interval_s = 0.5;
  double basp_connection_timeout_s = 3;
  double recovery_window_s = 1.5;
  double shutdown_grace_s = 5;
  double drain_delay_s = 0;  // troupe-node --drain-delay
  // `loopback`: every node on 127.0.0.1. `namespaces`: each node in a Linux
  // network namespace of its own, with its own address on a bridge the tool
  // creates (tools/chaos/network.hpp); needed by partition and degrade.
  std::string network = "loopback";
  // The nodes and troupectl talk TLS with certificates issued for the run
  // (troupectl certs); always on with network: namespaces unless set false.
  std::optional<bool> tls;
  // network: namespaces: every node listens on 0.0.0.0 (--bind) instead of
  // its own address, and must find the address to give the others itself.
  bool bind_any = false;
  // The head's state directory on a tmpfs of this many MiB (0: no disk of
  // its own); needed by fill_disk. Root only.
  int head_disk_mb = 0;
  std::vector<std::string> extra_args;  // appended to every node's command line
  // Highly available heads: more than one head candidate (h1, h2, ...; the
  // single head is `head`), each campaigning in an etcd cluster of
  // `etcd_members` members the tool starts (each its own etcd process);
  // workers and troupectl are given every candidate's address.
  int heads = 1;
  int etcd_members = 0;  // with heads > 1: default 3
  double ha_lease_ttl_s = 2;
  bool ha() const { return heads > 1; }
};

struct LoadSpec {
  // Exactly one of the two: closed loop (`concurrency` clients, each sends
  // its next request when the previous one is answered) or open loop (`rate`
  // requests per second, sent on a fixed schedule by a pool of clients).
  int concurrency = 0;
  double rate = 0;
  int clients = 0;  // open loop: size of the pool (default: rate / 20, at least 4)
  double duration_s = 30;
  std::vector<std::string> paths;  // requests cycle through them
  // Nodes whose proxies take the load (ids; empty: every node). Clients are
  // spread evenly and each stays on its node.
  std::vector<std::string> via;
  double request_timeout_s = 10;
  // Clients act like a load balancer that health-checks /-/readyz (every
  // 100 ms): one whose node answers anything but 200 sends its next requests
  // through the next node that does (by id).
  bool follow_readyz = false;
};

enum class FaultKind {
  kill_replica,     // troupectl kill replica <random replica>
  kill_proxy,       // troupectl kill proxy NODE
  kill_agent,       // troupectl kill agent NODE
  kill_controller,  // troupectl kill controller
  kill9_node,       // SIGKILL the node process; restart it after restart_after_s
  sigstop_node,     // SIGSTOP the node process for duration_s, then SIGCONT
  drain_node,       // troupectl drain NODE
  sigterm_node,     // SIGTERM the node process: it stops gracefully and leaves the cluster
  poison,           // one GET of a path whose request crashes the replicas it reaches
  partition,        // drop the packets between `node` and `from` for duration_s, then heal
  degrade,          // delay and lose packets between `node` and `from` for duration_s
  fill_disk,        // fill the head's state disk, deploy until refused; free it after duration_s
  redeploy,         // troupectl deploy of the fault's own `deploy:` config (a new release)
  rollback,         // troupectl rollback APP: the application's last good declaration again
  // Highly available heads (cluster.heads > 1): whichever candidate leads
  // when the fault fires (asked with `troupectl leader`).
  kill_leader,       // SIGKILL the leading head; restart it after restart_after_s
  partition_leader,  // cut the leading head off from every node and etcd member for duration_s
  // The etcd cluster under the heads.
  kill_etcd_member,  // SIGKILL one member (`member`); start it again after restart_after_s
  etcd_quorum_loss,  // SIGKILL a majority of the members for duration_s, then start them again
};

// Which packets a partition drops, seen from the partitioned node.
enum class Direction {
  both,
  out,  // the node's packets to its peers: the peers stop hearing it
  in,   // the peers' packets to the node: it stops hearing them
};
const char* to_string(Direction d);

const char* to_string(FaultKind kind);
// Whether the fault hits one node's process (its proxy can fail requests).
bool node_scoped(FaultKind kind);

struct FaultSpec {
  FaultKind kind = FaultKind::kill_replica;
  double start_s = 0;           // seconds after the load started
  double every_s = 0;           // 0: once
  double stop_s = -1;           // last possible firing (repeating faults)
  std::string node;             // node faults: an id, `random`, `random_worker` or `head`
  // kill_replica: only replicas of this application / deployment (empty:
  // any). redeploy: the application and deployment the rollout goals watch
  // (default: the config's only application / its only deployment).
  // rollback: the application rolled back (required).
  std::string app;
  std::string deployment;
  double restart_after_s = -1;  // kill9_node: < 0 never restarts
  double duration_s = 5;        // sigstop_node
  std::optional<double> max_recovery_s;  // overrides goals.max_recovery_s
  // poison: the paths sent (one per firing, in turn), through `node`'s proxy
  // (also `round_robin`: every node in turn); `mark`: a query parameter
  // through which each request carries a unique marker that the deployment
  // writes to its replica's log (Crash's `print`), so that the replicas it
  // reached can be found in <state-dir>/logs/replicas/*.log; `timeout_s`:
  // the client's bound (past it the request counts as hung).
  std::vector<std::string> paths;
  std::string mark;
  double timeout_s = 10;
  // partition / degrade: the peers cut off from `node`: `head`, a node id,
  // `all` (every other node) or `workers` (every worker but `node`).
  std::string from = "head";
  Direction direction = Direction::both;  // partition
  double delay_ms = 0;                    // degrade: added to each packet, each way
  // kill_etcd_member: `m1`, `m2`, ... or `random` (among the running ones
  // that are not etcd's own leader).
  std::string member = "random";
  // kill_etcd_member / etcd_quorum_loss: a deploy (the scenario's plus an
  // application without replicas) made right after the fault: it must be
  // accepted while a majority runs and refused, naming etcd, without one.
  // partition_leader: the same deploy sent to the cut-off head alone: it
  // must not be acknowledged, and nothing of it may show up later.
  bool probe_deploy = true;
  double loss_pct = 0;                    // degrade: share of packets dropped, each way
  // redeploy: a `troupectl deploy` config, verbatim like the scenario's own
  // `deploy:` (a whole declaration: what it leaves out is deleted), deployed
  // without --wait at the fault's time.
  YAML::Node deploy;
};

// The faults that change the network between nodes.
inline bool network_fault(FaultKind kind) {
  return kind == FaultKind::partition || kind == FaultKind::degrade ||
         kind == FaultKind::partition_leader;
}
// The faults of highly available heads and their etcd (need cluster.heads > 1).
inline bool ha_fault(FaultKind kind) {
  return kind == FaultKind::kill_leader || kind == FaultKind::partition_leader ||
         kind == FaultKind::kill_etcd_member || kind == FaultKind::etcd_quorum_loss;
}
inline bool etcd_fault(FaultKind kind) {
  return kind == FaultKind::kill_etcd_member || kind == FaultKind::etcd_quorum_loss;
}

struct Goals {
  std::optional<double> min_success_ratio;
  // Per fault: from the fault (for kill9_node with restart: from the restart;
  // for sigstop_node: from SIGCONT) until the cluster is healthy again.
  std::optional<double> max_recovery_s;
  // From the last fault until the cluster is healthy.
  std::optional<double> max_final_recovery_s;
  // sigstop_node / kill9_node without restart: from the fault until the node
  // is DEAD in `troupectl nodes`.
  std::optional<double> max_dead_detection_s;
  // sigstop_node: from SIGSTOP until the deployments are back at target on
  // the other nodes while the node is still frozen.
  std::optional<double> max_replacement_s;
  // Failed requests sent through nodes that no node fault ever targeted.
  std::optional<int64_t> max_failures_via_unfaulted_nodes;
  // Failed requests that were neither in flight on a process when it was
  // hit nor sent to a node while it was down or frozen.
  std::optional<int64_t> max_unexplained_failures;
  // poison: the share of poisoned requests answered 502 with a JSON body
  // naming the request (the proxy's query-of-death answer).
  std::optional<double> min_poison_502_ratio;
  // Nodes that no node fault or drain targeted and that some poll saw in a
  // state other than ALIVE (or not listed).
  std::optional<int64_t> max_nodes_seen_not_alive;
  // Polls in which `status` or `nodes` got no answer (the controller not
  // answering within the poll's 1 s).
  std::optional<int64_t> max_failed_status_polls;
  // The longest stretch without an answer to `status`: between two answered
  // polls (from t0 for the first), each at the time its answer came.
  std::optional<double> max_status_gap_s;
  // Per node: the times a poll saw it turn DEAD (from any other state),
  // divided by the faults that involved it; a node no fault involved may
  // never turn DEAD. 1 = no flapping.
  std::optional<int64_t> max_dead_transitions_per_fault;
  // At every poll, every deployment keeps at most target + its rollout
  // surge (max(target / 5, 1)) replicas that are not STOPPING on nodes that
  // are not DEAD, plus this many.
  std::optional<int64_t> max_replicas_above_surge;
  // Every replica listed at the last poll answered before the first fault
  // (which must read every deployment HEALTHY at target) is listed at every
  // answered poll after it, and no other: nothing started, stopped or
  // replaced through the faults; the last answered poll lists them all
  // RUNNING.
  bool replicas_unchanged = false;
  // Each of these nodes was read UNREACHABLE by some answered poll.
  std::vector<std::string> seen_unreachable;
  // Every node that ran to the end applied at most this many full route
  // tables (its proxy logs "route table E.S (full; ..."): the first one it
  // subscribed for, and no more when it only lost a direct connection.
  std::optional<int64_t> max_full_route_tables;

  // The rollout goals judge the first `redeploy` fault (the release under
  // test) and the deployment it watches (its app/deployment); "the
  // rollback" is the next `rollback` or `redeploy` fault after it. All of
  // them are judged from the status polls.
  //
  // From the redeploy (troupectl deploy started) until the answer of the
  // first poll that started after it and read the deployment DEPLOY_FAILED,
  // before the rollback.
  std::optional<double> deploy_failed_within_s;
  // That first DEPLOY_FAILED poll's status message contains each of these
  // texts (e.g. the health check's message); empty: not judged. In YAML a
  // text or a list of texts.
  std::vector<std::string> deploy_failed_message;
  // The ids RUNNING in the deployment at the last poll answered before the
  // redeploy (which must read it HEALTHY at target) are RUNNING at every
  // answered poll from then to the end (nothing of the old version stopped
  // or restarted); and, with a rollback, the last answered poll reads the
  // deployment HEALTHY listing exactly those ids, all RUNNING.
  bool replicas_kept = false;
  // No poll answered wholly between the redeploy's acknowledgement and the
  // rollback (the end, without one) reads the deployment HEALTHY.
  bool no_healthy_until_rollback = false;
  // From the rollback (command started) until the answer of the first poll
  // that reads the deployment HEALTHY listing exactly the kept ids, all
  // RUNNING.
  std::optional<double> rollback_healthy_within_s;

  // Highly available heads. kill_leader / partition_leader: from the fault
  // until the answer of the first status poll whose leader is another head;
  // etcd_quorum_loss: from the members' restart until the first status poll
  // answered by a leader.
  std::optional<double> max_failover_s;
  // partition_leader: from the moment the cut is in place until the answer
  // of the cut-off head itself (asked alone, every 100 ms) that it does not
  // lead.
  std::optional<double> max_step_down_s;
};

struct Scenario {
  std::string name;
  std::string description;
  uint32_t seed = 1;
  ClusterSpec cluster;
  YAML::Node deploy;  // a `troupectl deploy` file, verbatim
  bool has_load = false;
  LoadSpec load;
  std::vector<FaultSpec> faults;
  double convergence_deadline_s = 30;
  Goals goals;
  bool long_running = false;  // documented, not run in the test suite
};

// Loads and checks a scenario; throws std::runtime_error naming the file,
// line and field on a bad one.
Scenario load_scenario(const std::string& path);

}  // namespace chaos
