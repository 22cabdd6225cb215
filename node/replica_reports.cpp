#include "node/replica_reports.hpp"

#include <iterator>
#include <utility>

namespace troupe::node {

void ReplicaReports::add_load(ReplicaLoad load) {
  if (loads_.size() >= kMaxLoads) {
    loads_.pop_front();
    ++dropped_loads_;
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
  std::vector<ReplicaLoad> out(std::make_move_iterator(loads_.begin()),
                               std::make_move_iterator(loads_.end()));
  loads_.clear();
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
