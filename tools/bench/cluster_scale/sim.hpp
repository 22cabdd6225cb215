// Simulated nodes and proxies for tools/bench/cluster_scale: node agents that
// speak the real protocol to a real head over CAF (register with the replicas
// they host, heartbeat, reconnect when the controller goes away; spawnrep,
// listrep, stop, killrep) and host stand-in replicas (CAF actors that answer
// init, health checks and requests at once and report metrics to the
// controller through their agent like real replicas do), and proxies that
// subscribe to the controller's snapshots and keep the replica sets they
// describe, recording the bytes they received and, for one watched replica at
// a time, how long its removal took to reach each of them.
//
// Everything a benchmark driver reads is in Observed, guarded by its mutex.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <caf/actor_system.hpp>

#include "runtime/address.hpp"
#include "runtime/wire.hpp"

namespace troupe::sim {

using Clock = std::chrono::steady_clock;

// What one simulated proxy holds.
struct ProxyView {
  uint64_t epoch = 0;
  uint64_t seq = 0;
  // (app, deployment) -> the ids of its routed replicas, sorted.
  std::map<std::pair<std::string, std::string>, std::vector<std::string>> deployments;
  size_t total = 0;
  uint64_t bytes = 0;  // serialized snapshot bytes received
  uint64_t pushes = 0;
  uint64_t full_pushes = 0;
  Clock::time_point epoch_at;  // when it first applied a push of `epoch`
};

// Messages the simulated cluster sent into the head, by kind (counted by
// their senders; no mutex needed).
struct HeadTraffic {
  std::atomic<uint64_t> heartbeats{0};      // node agents' heartbeats
  std::atomic<uint64_t> loads{0};           // replica load reports they carried
  std::atomic<uint64_t> health_answers{0};  // answers to the head's health checks (proxies')
  std::atomic<uint64_t> health_reports{0};  // agents' reports of their replicas' checks
  std::atomic<uint64_t> proxy_loads{0};     // proxies' reports of their deployments' load
  std::atomic<uint64_t> other{0};           // registrations, subscriptions, stop answers
  uint64_t messages() const {
    return heartbeats + health_answers + health_reports + proxy_loads + other;
  }
  // Not into the head: replicas' answers to their agents' checks.
  std::atomic<uint64_t> replica_checks{0};
  // Replicas whose node reported them proven (passed the threshold) under
  // their current watch.
  std::atomic<int64_t> proven{0};
};

struct Observed {
  HeadTraffic traffic;
  std::mutex mutex;
  std::vector<ProxyView> proxies;
  // The replica whose removal is being timed, since when, and per proxy the
  // milliseconds it took to leave that proxy's view (-1: not yet).
  std::string watched;
  Clock::time_point watched_since;
  std::vector<double> watched_ms;
  // Every stand-in replica started and not stopped: id -> (its actor, node).
  std::map<std::string, std::pair<caf::actor, std::string>> replicas;
  uint64_t spawned = 0;  // spawnrep requests that started a replica
  // Per node: what its agent did last with the controller (for reports of
  // a step that did not complete).
  std::map<std::string, std::string> agent_notes;
  // Per node: when its agent's last registration was acknowledged.
  std::map<std::string, Clock::time_point> registered_at;
};

struct SimOptions {
  Endpoint controller;
  size_t nodes = 100;
  size_t proxies = 100;  // one per node, on the first `proxies` nodes
  std::string resources = "cpu=1000";
};

// The simulated cluster, spawned into `sys`. Nodes are named sim-0001 ...
class SimCluster {
 public:
  SimCluster(caf::actor_system& sys, SimOptions options, Observed& observed);
  // Kills the agent of node `index` and its replicas (as if the host died).
  void kill_node(size_t index);
  // Kills one stand-in replica (as if its process crashed); false if unknown.
  bool kill_replica(const std::string& replica_id);
  std::string node_id(size_t index) const;
  // Stops every agent and proxy.
  void stop();

 private:
  caf::actor_system& sys_;
  SimOptions options_;
  Observed& observed_;
  std::vector<caf::actor> agents_;
  std::vector<caf::actor> proxies_;
};

}  // namespace troupe::sim
