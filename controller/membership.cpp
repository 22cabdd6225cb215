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
  if (it->second.state == NodeState::unreachable) {
    return Status(errc::not_found,
                  "node '" + id + "' was UNREACHABLE; register again with its replicas");
  }
  it->second.last_heartbeat = now;
  return Status::ok();
}

NodeState Membership::state(const std::string& id) const {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? NodeState::dead : it->second.state;
}

bool Membership::mass_loss(const std::vector<std::string>& newly, double now,
                           std::string& why) const {
  size_t total = 0;
  size_t lost = 0;
  for (const auto& [id, node] : nodes_) {
    const bool recent = node.lost_at >= 0 && now - node.lost_at <= node_timeout_s_;
    if (node.state == NodeState::dead && !recent)
      continue;  // gone before this loss
    ++total;
    if (std::find(newly.begin(), newly.end(), id) != newly.end() || node.state == NodeState::dead ||
        node.state == NodeState::unreachable) {
      ++lost;
    } else if (now >= node.reconnect_by && now - node.last_heartbeat > node_timeout_s_ / 2) {
      ++lost;  // silent: about to time out with the others
    }
  }
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%zu of %zu nodes lost within one node timeout", lost, total);
  why = buf;
  return lost >= judgement_.min_nodes &&
         static_cast<double>(lost) > judgement_.share * static_cast<double>(total);
}

NodeTransition Membership::turn(NodeRecord& node, NodeState to, std::string reason, double now) {
  NodeTransition t{node.id, node.state, to, std::move(reason)};
  node.state = to;
  node.reason = t.reason;
  node.lost_at = now;
  return t;
}

NodeTransition Membership::lose(NodeRecord& node, bool mass, const std::string& cause,
                                const std::string& why, double now) {
  if (!mass)
    return turn(node, NodeState::dead, cause, now);
  char timeout[32];
  std::snprintf(timeout, sizeof(timeout), "%.0f", judgement_.unreachable_timeout_s);
  return turn(node, NodeState::unreachable,
              cause + "; " + why + " (more than " +
                  std::to_string(static_cast<int>(judgement_.share * 100 + 0.5)) +
                  " %): the controller is the likely one cut off, so the node's replicas stay "
                  "where they are until it is back, lost for " +
                  timeout + " s, or drained",
              now);
}

std::vector<NodeTransition> Membership::check(double now) {
  std::vector<NodeTransition> out;
  std::vector<std::string> timed_out;
  for (auto& [id, node] : nodes_) {
    if (node.state == NodeState::dead || node.state == NodeState::unreachable ||
        now < node.reconnect_by)
      continue;
    if (now - node.last_heartbeat > node_timeout_s_)
      timed_out.push_back(id);
  }
  std::string why;
  const bool mass = !timed_out.empty() && mass_loss(timed_out, now, why);
  for (const auto& id : timed_out) {
    auto& node = nodes_.at(id);
    double silent = now - node.last_heartbeat;
    char buf[128];
    if (node.reconnect_by > 0) {
      std::snprintf(buf, sizeof(buf),
                    "did not register again within %.1f s of the controller's resume",
                    node.reconnect_by - node.last_heartbeat);
    } else {
      std::snprintf(buf, sizeof(buf), "no heartbeat for %.1f s (timeout %.1f s)", silent,
                    node_timeout_s_);
    }
    out.push_back(lose(node, mass, buf, why, now));
  }
  if (judgement_.unreachable_timeout_s > 0) {
    for (auto& [id, node] : nodes_) {
      if (node.state != NodeState::unreachable ||
          now - node.lost_at <= judgement_.unreachable_timeout_s)
        continue;
      char buf[128];
      std::snprintf(buf, sizeof(buf),
                    "UNREACHABLE for %.1f s (unreachable timeout %.1f s): its replicas are "
                    "replaced on other nodes",
                    now - node.lost_at, judgement_.unreachable_timeout_s);
      out.push_back(turn(node, NodeState::dead, buf, now));
    }
  }
  return out;
}

void Membership::resumed(double now, double grace_s) {
  grace_until_ = now + grace_s;
  for (auto& [id, node] : nodes_) {
    if (node.state == NodeState::unreachable)
      node.lost_at = std::max(node.lost_at, now);  // its wait starts again too
    else if (node.state != NodeState::dead)
      node.last_heartbeat = std::max(node.last_heartbeat, now);
  }
}

std::vector<NodeTransition> Membership::connection_lost(const std::string& id, uint64_t incarnation,
                                                        double now) {
  auto it = nodes_.find(id);
  if (it == nodes_.end() || it->second.incarnation != incarnation ||
      it->second.state == NodeState::dead || it->second.state == NodeState::unreachable) {
    return {};
  }
  if (in_pause_grace(now)) {
    // Most likely the pause itself: the node's side gave up the connection
    // while this process did not answer. It reconnects and registers again.
    it->second.reconnect_by = grace_until_;
    it->second.reason = "connection lost while the controller was paused; waiting for it to register again";
    return {};
  }
  std::string why;
  const bool mass = mass_loss({id}, now, why);
  return {lose(it->second, mass, "connection to the node agent lost", why, now)};
}

Status Membership::drain(const std::string& id) {
  auto it = nodes_.find(id);
  if (it == nodes_.end())
    return Status(errc::not_found, "no node named '" + id + "'");
  if (it->second.state == NodeState::dead) {
    return Status(errc::invalid_argument, "node '" + id + "' is DEAD and cannot be drained");
  }
  if (it->second.state == NodeState::unreachable) {
    // The operator decides what the judgement would not: the node is lost.
    it->second.state = NodeState::dead;
    it->second.drained = true;
    it->second.reason =
        "drained by operator while UNREACHABLE: its replicas are replaced on "
        "other nodes";
    return Status::ok();
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
