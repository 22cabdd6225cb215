// A blocking client of the controller over CAF actor messages, used by
// troupectl and by tests. Every call is bounded by the timeout given at
// connect time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "runtime/address.hpp"
#include "runtime/status.hpp"
#include "runtime/wire.hpp"

namespace troupe {

class ControllerClient {
 public:
  // Connects and checks that both sides speak the same protocol version.
  static Result<ControllerClient> connect(caf::actor_system& sys, const Endpoint& endpoint,
                                          double timeout_s);

  Result<std::vector<NodeStatus>> nodes();
  Status drain(const std::string& node_id);

 private:
  ControllerClient(caf::actor_system& sys, caf::actor controller, Endpoint endpoint,
                   double timeout_s)
      : sys_(&sys),
        controller_(std::move(controller)),
        endpoint_(std::move(endpoint)),
        timeout_s_(timeout_s) {}

  // Prefixes failures with the controller's address.
  Status describe(const caf::error& err) const;

  caf::actor_system* sys_;
  caf::actor controller_;
  Endpoint endpoint_;
  double timeout_s_;
};

}  // namespace troupe
