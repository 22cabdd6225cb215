#include "controller/core/scheduler.hpp"

namespace troupe::controller {

void Cluster::set_nodes(const std::vector<NodeInfo>& nodes) {
  ++epoch_;
  unreachable_ = 0;
  std::map<std::string, Node> next;
  for (const auto& info : nodes) {
    if (info.state == NodeState::unreachable)
      ++unreachable_;
    Node node;
    if (auto it = nodes_.find(info.id); it != nodes_.end()) {
      node = std::move(it->second);
    } else if (auto u = unknown_.find(info.id); u != unknown_.end()) {
      node = std::move(u->second);
      unknown_.erase(u);
    }
    node.info = info;
    node.free = info.capacity.minus(node.used);
    next.emplace(info.id, std::move(node));
  }
  for (auto& [id, node] : nodes_) {
    if (next.count(id) == 0 && node.replicas > 0) {
      node.info.state = NodeState::dead;
      unknown_[id] = std::move(node);
    }
  }
  nodes_ = std::move(next);
}

NodeState Cluster::state(const std::string& node_id) const {
  auto it = nodes_.find(node_id);
  return it == nodes_.end() ? NodeState::dead : it->second.info.state;
}

namespace {

// Adds `sign * need` to the node's usage and refreshes its free amounts for
// the touched names only (no allocation once a name is known).
void adjust(Cluster::Node& node, const Resources& need, double sign) {
  for (const auto& [name, amount] : need.amounts) {
    double& used = node.used.amounts[name];
    used += sign * amount;
    if (used < 1e-12)
      used = 0;
    double left = node.info.capacity.get(name) - used;
    node.free.amounts[name] = left > 0 ? left : 0.0;
  }
}

}  // namespace

void Cluster::reserve(const std::string& node_id, const Resources& need) {
  auto it = nodes_.find(node_id);
  Node& node = it != nodes_.end() ? it->second : unknown_[node_id];
  adjust(node, need, +1);
  ++node.replicas;
}

void Cluster::release(const std::string& node_id, const Resources& need) {
  auto it = nodes_.find(node_id);
  Node* node = nullptr;
  if (it != nodes_.end()) {
    node = &it->second;
  } else if (auto u = unknown_.find(node_id); u != unknown_.end()) {
    node = &u->second;
  }
  if (node == nullptr)
    return;
  adjust(*node, need, -1);
  if (node->replicas > 0)
    --node->replicas;
  if (it == nodes_.end() && node->replicas == 0)
    unknown_.erase(node_id);
}

std::optional<std::string> Cluster::pick(const Resources& need, uint32_t max_per_node,
                                         const std::map<std::string, uint32_t>& per_node,
                                         Random& rng) const {
  std::vector<const std::string*> best;
  uint32_t best_dep = 0;
  uint32_t best_total = 0;
  // Both maps are ordered by node id: walk them together instead of looking
  // each node up (this loop runs once per replica placed).
  auto pit = per_node.begin();
  for (const auto& [id, node] : nodes_) {
    while (pit != per_node.end() && pit->first < id)
      ++pit;
    const uint32_t dep = (pit != per_node.end() && pit->first == id) ? pit->second : 0;
    if (node.info.state != NodeState::alive)
      continue;
    if (max_per_node != 0 && dep >= max_per_node)
      continue;
    if (!best.empty() && (dep > best_dep || (dep == best_dep && node.replicas > best_total)))
      continue;
    if (!node.free.fits(need))
      continue;
    if (best.empty() || dep < best_dep || node.replicas < best_total) {
      best.clear();
      best_dep = dep;
      best_total = node.replicas;
    }
    best.push_back(&id);
  }
  if (best.empty())
    return std::nullopt;
  std::size_t i = best.size() == 1 ? 0 : rng.index(best.size());
  return *best[i];
}

std::string Cluster::describe_free() const {
  std::string out;
  for (const auto& [id, node] : nodes_) {
    if (node.info.state != NodeState::alive)
      continue;
    if (!out.empty())
      out += "; ";
    std::string free = node.free.to_string();
    out += id + ": " + (free.empty() ? "nothing" : free);
  }
  return out.empty() ? "no alive nodes" : out;
}

}  // namespace troupe::controller
