#include "runtime/local_replicas.hpp"

namespace troupe::local {

void LocalReplicas::add(LocalReplicaPtr replica) {
  std::lock_guard<std::mutex> lock(mutex_);
  replicas_[replica->replica_id()] = std::move(replica);
}

void LocalReplicas::remove(const LocalReplicaPtr& replica) {
  LocalReplicaPtr gone;  // released outside the lock
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = replicas_.find(replica->replica_id());
  if (it == replicas_.end() || it->second != replica)
    return;
  gone = std::move(it->second);
  replicas_.erase(it);
}

LocalReplicaPtr LocalReplicas::find(const std::string& replica_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = replicas_.find(replica_id);
  return it == replicas_.end() ? nullptr : it->second;
}

size_t LocalReplicas::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return replicas_.size();
}

}  // namespace troupe::local
