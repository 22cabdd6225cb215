#include "controller/shell/directory.hpp"

#include <caf/exit_reason.hpp>

namespace troupe::controller {

const char* to_string(DownKind k) {
  switch (k) {
    case DownKind::unknown:
      return "unknown";
    case DownKind::replica_stopped:
      return "replica_stopped";
    case DownKind::replica_crashed:
      return "replica_crashed";
    case DownKind::agent_link_lost:
      return "agent_link_lost";
    case DownKind::agent_died:
      return "agent_died";
    case DownKind::subscriber:
      return "subscriber";
  }
  return "?";
}

// ---------------------------------------------------------------- replicas

void ActorDirectory::remember_replica(const std::string& id, const std::string& node,
                                      const ReplicaActor& handle) {
  auto& ref = replicas_[id];
  if (ref.handle && ref.handle != handle)
    replica_of_.erase(ref.handle.address());
  ref.handle = handle;
  ref.node_id = node;
  replica_of_[handle.address()] = id;
  monitor_(caf::actor_cast<caf::actor>(handle));
}

void ActorDirectory::forget_replica(const std::string& id) {
  auto it = replicas_.find(id);
  if (it == replicas_.end())
    return;
  if (it->second.handle)
    replica_of_.erase(it->second.handle.address());
  replicas_.erase(it);
}

ReplicaActor ActorDirectory::replica(const std::string& id) const {
  auto it = replicas_.find(id);
  return it == replicas_.end() ? ReplicaActor{} : it->second.handle;
}

std::string ActorDirectory::node_of(const std::string& id) const {
  auto it = replicas_.find(id);
  return it == replicas_.end() ? std::string() : it->second.node_id;
}

void ActorDirectory::mark_stopping(const std::string& id) {
  if (auto it = replicas_.find(id); it != replicas_.end())
    it->second.stopping = true;
}

void ActorDirectory::set_started_at(const std::string& id, double start_time) {
  if (auto it = replicas_.find(id); it != replicas_.end())
    it->second.started_at = start_time;
}

double ActorDirectory::started_at(const std::string& id) const {
  auto it = replicas_.find(id);
  return it == replicas_.end() ? 0.0 : it->second.started_at;
}

std::vector<HostedReplica> ActorDirectory::take_hosted(const std::string& node,
                                                       const std::vector<HostedReplicaInfo>& hosted,
                                                       bool recovering) {
  std::vector<HostedReplica> adopt;
  for (const auto& h : hosted) {
    if (!h.handle)
      continue;
    auto known = replicas_.find(h.replica_id);
    if (known == replicas_.end() || known->second.handle != h.handle) {
      remember_replica(h.replica_id, node, h.handle);
      replicas_[h.replica_id].stopping = h.stopping;
    } else if (recovering) {
      continue;  // already collected for the recovery
    }
    adopt.push_back({h.replica_id, h.app, h.deployment, node, h.stopping});
  }
  return adopt;
}

// ---------------------------------------------------------------- agents

void ActorDirectory::attach_agent(const std::string& node, const AgentActor& agent,
                                  uint64_t incarnation) {
  for (auto it = agents_.begin(); it != agents_.end();) {
    if (it->second.node_id == node && it->first != agent.address()) {
      it = agents_.erase(it);
    } else {
      ++it;
    }
  }
  agents_[agent.address()] = AgentRef{node, incarnation};
  agent_of_[node] = agent;
  monitor_(caf::actor_cast<caf::actor>(agent));
}

AgentActor ActorDirectory::agent(const std::string& node) const {
  auto it = agent_of_.find(node);
  return it == agent_of_.end() ? AgentActor{} : it->second;
}

std::vector<AgentActor> ActorDirectory::agents() const {
  std::vector<AgentActor> out;
  out.reserve(agent_of_.size());
  for (const auto& [node, agent] : agent_of_)
    out.push_back(agent);
  return out;
}

void ActorDirectory::detach_node(const std::string& node) {
  for (auto it = agents_.begin(); it != agents_.end();) {
    if (it->second.node_id == node) {
      demonitor_(it->first);
      it = agents_.erase(it);
    } else {
      ++it;
    }
  }
  agent_of_.erase(node);
}

// ---------------------------------------------------------------- subscribers

ActorDirectory::Key ActorDirectory::add_subscriber(const ProxyActor& subscriber, SnapshotId last,
                                                   const std::string& lost_node) {
  monitor_(caf::actor_cast<caf::actor>(subscriber));
  auto [it, fresh] = subscriber_of_.emplace(subscriber.address(), next_subscriber_key_);
  if (fresh)
    ++next_subscriber_key_;  // a new proxy: a fresh health record
  std::set<std::string> refresh;
  if (auto known = subscribers_.find(it->second); known != subscribers_.end())
    refresh = std::move(known->second.refresh);
  if (!lost_node.empty())
    refresh.insert(lost_node);
  Subscriber sub{subscriber, last};
  sub.refresh = std::move(refresh);
  subscribers_[it->second] = std::move(sub);
  return it->second;
}

ProxyActor ActorDirectory::subscriber(Key key) const {
  auto it = subscribers_.find(key);
  return it == subscribers_.end() ? ProxyActor{} : it->second.handle;
}

uint64_t ActorDirectory::mark_sent(Key key, SnapshotId id, size_t weight) {
  auto it = subscribers_.find(key);
  if (it == subscribers_.end())
    return 0;
  it->second.last = id;
  it->second.refresh.clear();
  it->second.in_flight = next_push_++;
  it->second.in_flight_weight = weight;
  return it->second.in_flight;
}

size_t ActorDirectory::in_flight_weight() const {
  size_t total = 0;
  for (const auto& [key, sub] : subscribers_) {
    if (sub.in_flight != 0)
      total += sub.in_flight_weight;
  }
  return total;
}

void ActorDirectory::push_done(Key key, uint64_t push, bool ok) {
  auto it = subscribers_.find(key);
  if (it == subscribers_.end() || push == 0 || it->second.in_flight != push)
    return;
  it->second.in_flight = 0;
  it->second.in_flight_weight = 0;
  if (!ok)
    it->second.last = SnapshotId{};
}

void ActorDirectory::set_http(const HttpSettings& http) {
  if (http == http_)
    return;
  http_ = http;
  for (auto& [key, sub] : subscribers_)
    sub.last = SnapshotId{};  // push in full
}

// ---------------------------------------------------------------- kill, down

Result<KillTarget> ActorDirectory::kill_target(const std::string& kind, const std::string& id,
                                               const ProxyHealthMonitor& proxies) const {
  auto not_found = [&](const std::string& what) {
    return Status(errc::not_found, "no " + what + " '" + id + "'");
  };
  KillTarget t;
  if (kind == "replica") {
    t.actor = caf::actor_cast<caf::actor>(replica(id));
    if (!t.actor)
      return not_found("replica");
    t.log_line = "killing replica " + id + " on operator request";
  } else if (kind == "agent") {
    t.actor = caf::actor_cast<caf::actor>(agent(id));
    if (!t.actor)
      return not_found("node agent of node");
    t.log_line = "killing the node agent of " + id + " on operator request";
  } else if (kind == "proxy") {
    auto key = proxies.proxy_of(id);
    t.actor = key ? caf::actor_cast<caf::actor>(subscriber(*key)) : caf::actor{};
    if (!t.actor)
      return not_found("proxy on node");
    t.log_line = "killing the proxy of " + id + " on operator request";
  } else if (kind == "controller") {
    t.controller = true;
    t.log_line = "controller killed on operator request";
  } else {
    return Status(errc::invalid_argument, "kill: unknown kind '" + kind +
                                              "'; expected replica, proxy, agent or controller");
  }
  return t;
}

DownEvent ActorDirectory::on_down(const caf::actor_addr& source, const caf::error& reason) {
  DownEvent ev;
  if (auto it = replica_of_.find(source); it != replica_of_.end()) {
    ev.id = it->second;  // a copy: forget_replica() erases the entry
    bool stopping = replicas_[ev.id].stopping;
    ev.node = replicas_[ev.id].node_id;
    forget_replica(ev.id);
    ev.kind = stopping ? DownKind::replica_stopped : DownKind::replica_crashed;
    // A replica process's handle ends with the cause of its exit.
    if (!stopping && reason.category() == kErrorCategory)
      ev.cause = from_caf_error(reason).message();
    return ev;
  }
  if (auto it = subscriber_of_.find(source); it != subscriber_of_.end()) {
    ev.kind = DownKind::subscriber;
    ev.subscriber = it->second;
    subscribers_.erase(it->second);
    subscriber_of_.erase(it);
    return ev;
  }
  if (auto it = agents_.find(source); it != agents_.end()) {
    ev.id = it->second.node_id;
    ev.incarnation = it->second.incarnation;
    agent_of_.erase(ev.id);
    agents_.erase(it);
    // Only a dropped connection means the node is gone. The agent actor dying
    // alone leaves its node process running, which starts a new agent that
    // registers again with the replicas it hosts.
    ev.kind = reason == caf::exit_reason::remote_link_unreachable ? DownKind::agent_link_lost
                                                                  : DownKind::agent_died;
  }
  return ev;
}

}  // namespace troupe::controller
