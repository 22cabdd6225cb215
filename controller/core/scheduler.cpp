#include "controller/core/scheduler.hpp"

namespace troupe::controller {

void Cluster::set_nodes(const std::vector<NodeInfo>& nodes) {
  ++epoch_;
  std::map<std::string, Node> next;
  for (const auto& info : nodes) {
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

void Cluster::reserve(const std::string& node_id, const Resources& need) {
  auto it = nodes_.find(node_id);
  Node& node = it != nodes_.end() ? it->second : unknown_[node_id];
  node.used = node.used.plus(need);
  node.free = node.info.capacity.minus(node.used);
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
  node->used = node->used.minus(need);
  node->free = node->info.capacity.minus(node->used);
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
  for (const auto& [id, node] : nodes_) {
    if (node.info.state != NodeState::alive)
      continue;
    auto pit = per_node.find(id);
    uint32_t dep = pit == per_node.end() ? 0 : pit->second;
    if (max_per_node != 0 && dep >= max_per_node)
      continue;
    if (!node.free.fits(need))
      continue;
    if (best.empty() || dep < best_dep || (dep == best_dep && node.replicas < best_total)) {
      best.clear();
      best_dep = dep;
      best_total = node.replicas;
    } else if (dep != best_dep || node.replicas != best_total) {
      continue;
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
