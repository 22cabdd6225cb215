// What a node's replicas report for the controller, gathered by the node
// agent so that the head receives one message per node per interval, not
// one per replica (issue 45: the head's work grows with nodes):
//   - load reports (ReplicaLoad, every metrics_interval_s per replica) ride
//     on the agent's next heartbeat;
//   - model lists (ReplicaModels, when a replica's ModelCache changed, at
//     most one per replica per 100 ms) go in one message per short window
//     (kModelsWindow) after the first one arrives, since routing by model
//     waits for them.
// Plain C++: the agent adds what arrives and takes what it sends; tested in
// tests/node/replica_reports_test.cpp.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "runtime/wire.hpp"

namespace troupe::node {

class ReplicaReports {
 public:
  // How long model lists wait for others to join them.
  static constexpr std::chrono::milliseconds kModelsWindow{50};
  // Load reports kept at most between two heartbeats; more are dropped,
  // oldest first (counted in dropped_loads()). A heartbeat per second and
  // a report per replica every metrics_interval_s keep far below it.
  static constexpr std::size_t kMaxLoads = 50000;

  // A replica's load report. Reports are kept in the order they came, also
  // several of one replica: each is the average over its own interval.
  void add_load(ReplicaLoad load);
  // A replica's model list; it replaces one of the same replica still
  // waiting, unless that one is newer (a higher seq). True when nothing else
  // waited: the caller sends the lists after kModelsWindow.
  bool add_models(ReplicaModels models);

  // What to send, in arrival order; the gatherer is empty of it after.
  std::vector<ReplicaLoad> take_loads();
  // What to send, by replica id; the gatherer is empty of it after.
  std::vector<ReplicaModels> take_models();

  std::size_t pending_loads() const { return loads_.size(); }
  std::size_t pending_models() const { return models_.size(); }
  uint64_t dropped_loads() const { return dropped_loads_; }

 private:
  std::deque<ReplicaLoad> loads_;
  std::map<std::string, ReplicaModels> models_;
  uint64_t dropped_loads_ = 0;
};

}  // namespace troupe::node
