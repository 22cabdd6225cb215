// The user's object of a replica (internal to replica/): made by the control
// worker, shared by the control and request threads.
#pragma once

#include <memory>

#include <caf/allowed_unsafe_message_type.hpp>
#include <troupe/deployment.hpp>

namespace troupe::replica {

using Instance = std::shared_ptr<Deployment>;

}  // namespace troupe::replica

// Passed between the replica's own local actors only; never serialized.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::replica::Instance)
