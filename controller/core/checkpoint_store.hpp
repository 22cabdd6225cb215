// Where the controller writes its target state ahead of applying it.
#pragma once

#include <optional>

#include "controller/core/model.hpp"
#include "runtime/status.hpp"

namespace troupe::controller {

class CheckpointStore {
 public:
  virtual ~CheckpointStore() = default;

  // Durably stores `state` (a synced write) before returning ok. On any
  // error nothing may be assumed written, and the caller must not apply the
  // change it was about to make.
  virtual Status save(const TargetState& state) = 0;

  // The last saved state; std::nullopt when nothing was ever saved. Data
  // that cannot be read or decoded is an error (errc::corrupt / io_error)
  // naming the file: the controller must refuse to start empty over it.
  virtual Result<std::optional<TargetState>> load() = 0;
};

}  // namespace troupe::controller
