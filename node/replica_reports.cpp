#include "node/replica_reports.hpp"

#include <iterator>
#include <utility>

namespace troupe::node {

void ReplicaReports::add_load(ReplicaLoad load) {
  if (pending_loads() >= kMaxLoads) {
    ++first_;
    ++dropped_loads_;
    // Compact once half of the storage is dropped entries.
    if (first_ * 2 >= loads_.size()) {
      loads_.erase(loads_.begin(), loads_.begin() + static_cast<std::ptrdiff_t>(first_));
      first_ = 0;
    }
  }
  loads_.push_back(std::move(load));
}

bool ReplicaReports::add_models(ReplicaModels models) {
  const bool first = models_.empty();
  auto [it, inserted] = models_.try_emplace(models.replica_id);
  if (inserted || it->second.seq <= models.seq)
    it->second = std::move(models);
  return first;
}

std::vector<ReplicaLoad> ReplicaReports::take_loads() {
  std::vector<ReplicaLoad> out;
  if (first_ == 0) {
    out.swap(loads_);
  } else {
    out.assign(std::make_move_iterator(loads_.begin() + static_cast<std::ptrdiff_t>(first_)),
               std::make_move_iterator(loads_.end()));
    loads_.clear();
  }
  first_ = 0;
  return out;
}

std::vector<ReplicaModels> ReplicaReports::take_models() {
  std::vector<ReplicaModels> out;
  out.reserve(models_.size());
  for (auto& [id, m] : models_)
    out.push_back(std::move(m));
  models_.clear();
  return out;
}

}  // namespace troupe::node
