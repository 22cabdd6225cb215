// The controller's rollback call (`troupectl rollback APP`): its atom and the
// controller's interface with it. Part of protocol version 15 (see
// kProtocolVersion in runtime/wire.hpp): a troupectl and a controller that
// agree on the version both know it. Only built-in types and the Credential
// (registered by register_wire_types) cross the wire, so nothing is added to
// the type registry.
#pragma once

#include <cstdint>
#include <string>

#include <caf/atom.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "runtime/wire.hpp"

namespace troupe {

using rollback_atom = caf::atom_constant<caf::atom("rollback")>;

// ControllerActor with the rollback call; the controller actor implements
// it, troupectl casts the controller's handle to it.
using ControllerRollbackActor = ControllerActor::extend<
    // (app) -> (the new generation, the generation of the last good
    // declaration deployed again). Refused like a deploy: errc::not_found
    // for an unknown application, errc::conflict when it has no last good
    // declaration or already declares it; signed by an operator (Operation
    // rollback, the application as its argument).
    caf::replies_to<rollback_atom, std::string /*app*/, Credential>::with<uint64_t, uint64_t>>;

}  // namespace troupe
