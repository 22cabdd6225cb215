// Watches the cluster during a chaos run: polls `troupectl status --json`,
// `troupectl nodes --json` and one GET through every node's proxy, and keeps
// each round as an Observation (with the times it started and ended), so
// that recovery times can be computed afterwards. An observation started
// after a fault can only reflect the state after it.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/chaos/cluster.hpp"
#include "tools/chaos/http_client.hpp"

namespace chaos {

struct DeploymentView {
  std::string status;
  int64_t target = 0;
  int running = 0;  // replicas in state RUNNING
  int total = 0;    // replicas listed, any state
  std::map<std::string, int> running_on;  // node -> replicas RUNNING there
  std::map<std::string, int> kept_on;     // node -> replicas there that are not STOPPING
  std::string message;                      // the deployment's status message
  std::map<std::string, std::string> state_of;  // replica id -> its state (every one listed)

  // The ids of the replicas in state RUNNING.
  std::set<std::string> running_ids() const;
};

struct Observation {
  double start_s = 0;        // relative to the run's t0
  double nodes_start_s = 0;  // the nodes call began (0: at start_s)
  double state_end_s = 0;    // status and nodes answered (probes may take longer)
  double end_s = 0;        // everything answered

  bool status_ok = false;
  std::string status_error;
  bool recovering = false;
  std::string leader;  // status's leader (its node id; highly available heads only)
  std::map<std::string, std::string> app_status;      // app -> status
  std::map<std::string, std::string> app_route;       // app -> route_prefix
  std::map<std::string, DeploymentView> deployments;  // "app/deployment" -> view
  std::set<std::string> replica_ids;
  std::vector<std::string> duplicate_ids;        // listed more than once
  std::map<std::string, int> replicas_per_node;  // any state

  bool nodes_ok = false;
  std::string nodes_error;
  std::map<std::string, std::string> node_state;  // id -> ALIVE/DRAINING/DEAD
  std::map<std::string, int64_t> node_pid;

  std::map<std::string, bool> probe_ok;  // node -> a GET through its proxy got 2xx

  // Every application RUNNING, every deployment HEALTHY with exactly its
  // target of replicas, all RUNNING, no id twice, none on a DEAD or
  // DRAINING node, and the controller not recovering.
  bool healthy() const;
  // Why healthy() is false (first reason), for reports.
  std::string unhealthy_reason() const;
};

class Monitor {
 public:
  // `probe_path`: GET through each node's proxy per round; empty: no probes.
  Monitor(const Cluster& cluster, std::map<std::string, Endpoint> http_ports,
          std::string probe_path, Clock::time_point t0, std::chrono::milliseconds interval);
  ~Monitor();
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  void start();
  void stop();
  // One round now, on the calling thread (not recorded).
  Observation observe() const;
  std::vector<Observation> observations() const;
  // The first recorded observation started at or after `after_s` that
  // satisfies `pred`; waits for it until the deadline.
  std::optional<Observation> await(double after_s,
                                   const std::function<bool(const Observation&)>& pred,
                                   std::chrono::milliseconds deadline) const;

 private:
  void loop();

  const Cluster& cluster_;
  std::map<std::string, Endpoint> http_ports_;
  std::string probe_path_;
  Clock::time_point t0_;
  std::chrono::milliseconds interval_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable std::mutex mu_;
  std::vector<Observation> observations_;
};

}  // namespace chaos
