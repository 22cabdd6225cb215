#include "controller/membership.hpp"

#include <algorithm>
#include <cstdio>

namespace troupe::controller {

uint64_t Membership::register_node(NodeRecord node, double now) {
  auto it = nodes_.find(node.id);
  bool was_draining = it != nodes_.end() && it->second.drained;
  node.drained = was_draining;
  node.state = was_draining ? NodeState::draining : NodeState::alive;
  node.reason = was_draining ? "drained by operator" : "registered";
  node.registered_at = now;
  node.last_heartbeat = now;
  node.incarnation = next_incarnation_++;
  uint64_t incarnation = node.incarnation;
  nodes_[node.id] = std::move(node);
  return incarnation;
}

Status Membership::heartbeat(const std::string& id, double now) {
  auto it = nodes_.find(id);
  if (it == nodes_.end())
    return Status(errc::not_found, "node '" + id + "' is not registered");
  if (it->second.state == NodeState::dead) {
    return Status(errc::not_found, "node '" + id + "' was declared DEAD; register again");
  }
  it->second.last_heartbeat = now;
  return Status::ok();
}

std::vector<NodeTransition> Membership::check(double now) {
  std::vector<NodeTransition> out;
  for (auto& [id, node] : nodes_) {
    if (node.state == NodeState::dead || now < node.reconnect_by)
      continue;
    double silent = now - node.last_heartbeat;
    if (silent > node_timeout_s_) {
      char buf[128];
      if (node.reconnect_by > 0) {
        std::snprintf(buf, sizeof(buf),
                      "did not register again within %.1f s of the controller's resume",
                      node.reconnect_by - node.last_heartbeat);
      } else {
        std::snprintf(buf, sizeof(buf), "no heartbeat for %.1f s (timeout %.1f s)", silent,
                      node_timeout_s_);
      }
      out.push_back({id, node.state, NodeState::dead, buf});
      node.state = NodeState::dead;
      node.reason = buf;
    }
  }
  return out;
}

void Membership::resumed(double now, double grace_s) {
  grace_until_ = now + grace_s;
  for (auto& [id, node] : nodes_) {
    if (node.state != NodeState::dead)
      node.last_heartbeat = std::max(node.last_heartbeat, now);
  }
}

std::vector<NodeTransition> Membership::connection_lost(const std::string& id, uint64_t incarnation,
                                                        double now) {
  auto it = nodes_.find(id);
  if (it == nodes_.end() || it->second.incarnation != incarnation ||
      it->second.state == NodeState::dead) {
    return {};
  }
  if (in_pause_grace(now)) {
    // Most likely the pause itself: the node's side gave up the connection
    // while this process did not answer. It reconnects and registers again.
    it->second.reconnect_by = grace_until_;
    it->second.reason = "connection lost while the controller was paused; waiting for it to register again";
    return {};
  }
  NodeTransition t{id, it->second.state, NodeState::dead, "connection to the node agent lost"};
  it->second.state = NodeState::dead;
  it->second.reason = t.reason;
  return {t};
}

Status Membership::drain(const std::string& id) {
  auto it = nodes_.find(id);
  if (it == nodes_.end())
    return Status(errc::not_found, "no node named '" + id + "'");
  if (it->second.state == NodeState::dead) {
    return Status(errc::invalid_argument, "node '" + id + "' is DEAD and cannot be drained");
  }
  it->second.state = NodeState::draining;
  it->second.drained = true;
  it->second.reason = "drained by operator";
  return Status::ok();
}

Status Membership::leave(const std::string& id) {
  auto it = nodes_.find(id);
  if (it == nodes_.end())
    return Status(errc::not_found, "no node named '" + id + "'");
  if (it->second.state == NodeState::dead) {
    return Status(errc::invalid_argument, "node '" + id + "' is DEAD and must register again");
  }
  it->second.state = NodeState::draining;
  it->second.reason = it->second.drained ? "drained by operator; stopping" : "stopping";
  return Status::ok();
}

Status Membership::deregister(const std::string& id) {
  if (nodes_.erase(id) == 0)
    return Status(errc::not_found, "no node named '" + id + "'");
  return Status::ok();
}

}  // namespace troupe::controller
