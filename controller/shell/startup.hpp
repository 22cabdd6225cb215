// How a controller incarnation starts, decided as plain functions: the
// identity it gives its snapshots and replica ids, and whom it waits for
// before it reconciles (see RecoveryGate).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "controller/core/commands.hpp"
#include "controller/core/limits.hpp"
#include "controller/core/model.hpp"
#include "controller/shell/recovery_gate.hpp"
#include "runtime/status.hpp"

namespace troupe::controller {

// The core's options for the incarnation drawn from `seed` (random at every
// start; it also seeds the core's Random):
// - snapshot_epoch = seed | 1, never 0, so a proxy presenting a snapshot id
//   of an earlier incarnation gets a full snapshot;
// - replica_id_tag = the seed's top 24 bits as six hex digits, so a
//   restarted controller never reuses the id of a replica that a node still
//   runs but has not reported yet.
CoreOptions incarnation_options(uint64_t seed, const Limits& limits);

// Whom a starting controller waits for, given what its checkpoint store
// loaded. nullopt: the checkpoint holds nothing (a first start, or every
// application deleted), so there is nothing to recover and it reconciles at
// once. Otherwise the ids of the nodes alive before the restart, from
// `nodes_file` (empty when unknown: the recovery window then runs in full).
// An unreadable checkpoint is not an empty one: the recovery goes on, and
// StateManager::recover's error then stops the controller.
std::optional<std::set<std::string>> nodes_to_await(const Result<std::optional<TargetState>>& saved,
                                                    const NodesFile& nodes_file);

}  // namespace troupe::controller
