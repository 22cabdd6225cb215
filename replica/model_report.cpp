#include "replica/model_report.hpp"

#include <caf/actor.hpp>
#include <caf/actor_cast.hpp>
#include <caf/send.hpp>

#include "runtime/wire.hpp"

namespace troupe::replica {

void ModelReport::models_changed(const std::vector<std::string>& model_ids) {
  caf::weak_actor_ptr replica;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    held_.model_ids = model_ids;
    held_.seq += 1;
    seq_.store(held_.seq, std::memory_order_release);
    replica = replica_;
  }
  if (auto strong = replica.lock())
    caf::anon_send(caf::actor_cast<caf::actor>(strong), models_atom::value);
}

multiplex::HeldModels ModelReport::held() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return held_;
}

void ModelReport::set_replica(caf::weak_actor_ptr replica) {
  std::lock_guard<std::mutex> lock(mutex_);
  replica_ = std::move(replica);
}

}  // namespace troupe::replica
