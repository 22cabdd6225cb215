// The cluster as the scheduler sees it: nodes, their capacity and what the
// controller's replicas hold on them. Placement spreads the replicas of a
// deployment over ALIVE nodes.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "controller/core/clock.hpp"
#include "controller/core/commands.hpp"
#include "runtime/resources.hpp"

namespace troupe::controller {

class Cluster {
 public:
  struct Node {
    NodeInfo info;
    Resources used;  // held by replicas placed here (any state)
    Resources free;  // capacity minus used, clamped at zero
    uint32_t replicas = 0;
  };

  // Replaces the node view. Usage of nodes that stay is kept; nodes that are
  // no longer listed are DEAD (their replicas are released by their owners).
  void set_nodes(const std::vector<NodeInfo>& nodes);

  // DEAD when unknown.
  NodeState state(const std::string& node_id) const;

  // Nodes UNREACHABLE in the view (autoscaling holds while there are any).
  size_t unreachable() const { return unreachable_; }

  // Changes with every set_nodes(): lets callers cache state() per replica.
  uint64_t epoch() const { return epoch_; }

  void reserve(const std::string& node_id, const Resources& need);
  void release(const std::string& node_id, const Resources& need);

  // Chooses an ALIVE node where `need` fits in the free resources and which
  // hosts fewer than `max_per_node` (0: no limit) of the deployment's replicas
  // (`per_node`: node -> count of this deployment's replicas). Among the
  // candidates, those with the fewest replicas of the deployment win, then
  // those with the fewest replicas overall; remaining ties are broken by
  // `rng.index` over the tied nodes in id order. nullopt: nothing fits.
  std::optional<std::string> pick(const Resources& need, uint32_t max_per_node,
                                  const std::map<std::string, uint32_t>& per_node,
                                  Random& rng) const;

  // "node-a: cpu=1; node-b: cpu=0.5" — free resources of ALIVE nodes.
  std::string describe_free() const;

  const std::map<std::string, Node>& nodes() const { return nodes_; }

 private:
  std::map<std::string, Node> nodes_;
  uint64_t epoch_ = 1;
  size_t unreachable_ = 0;
  // Usage reserved on nodes that are not (or no longer) in the view, so that
  // a node that comes back gets the right numbers.
  std::map<std::string, Node> unknown_;
};

}  // namespace troupe::controller
