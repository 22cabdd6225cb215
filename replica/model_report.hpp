// What a replica's ModelCache reports (model multiplexing; internal to
// replica/): the runtime's troupe::ModelIdsListener, put into the
// ReplicaContext. It numbers the lists it is told, so that whoever gets two
// (the proxy from answers, the controller from reports) keeps the newer, and
// tells the replica actor, which reports them to its metrics sink (the node
// agent, on to the controller) at once, at most every kMinReportGap.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <caf/actor_control_block.hpp>
#include <troupe/deployment.hpp>

#include "runtime/multiplex.hpp"

namespace troupe::replica {

class ModelReport final : public ModelIdsListener {
 public:
  // A burst of loads and evictions is reported as one message this long
  // after the previous report. Short: until the controller's push arrives,
  // the other proxies route by the old list, and two proxies that each send
  // requests for a different model to the same replica, each believing it
  // holds its model, make it load one and evict the other in turn (the
  // integration test measured 99 % of requests finding their model with the
  // answers' lists alone at first, 90 % with a 100 ms gap on a busy machine).
  static constexpr std::chrono::milliseconds kMinReportGap{10};

  // Called by the cache with its lock held: records, and tells the replica
  // actor (an enqueue, no wait).
  void models_changed(const std::vector<std::string>& model_ids) override;

  // The latest list and its number (seq 0: none reported yet).
  multiplex::HeldModels held() const;
  // Cheap check for the request threads: has the replica a model cache that
  // reported anything?
  bool active() const { return seq_.load(std::memory_order_acquire) > 0; }

  // The replica actor to tell (set once before the constructor runs).
  void set_replica(caf::weak_actor_ptr replica);

 private:
  mutable std::mutex mutex_;
  multiplex::HeldModels held_;
  std::atomic<uint64_t> seq_{0};
  caf::weak_actor_ptr replica_;
};

}  // namespace troupe::replica
