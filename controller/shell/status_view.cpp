#include "controller/shell/status_view.hpp"

#include <algorithm>
#include <set>

namespace troupe::controller {

using nlohmann::json;

namespace {

json deployment_json(const StateManager& core, const DeploymentId& id, const DeploymentSpec& spec,
                     const StartedAt& started_at, const Activity* activity, double now) {
  json d;
  if (auto s = core.deployment_status(id)) {
    d["status"] = to_string(s->status);
    d["trigger"] = to_string(s->trigger);
    d["message"] = s->message;
  }
  if (auto t = core.target_replicas(id))
    d["target_replicas"] = *t;
  d["isolation"] = to_string(spec.config.isolation);
  d["memory_limit_bytes"] = spec.config.memory_limit_bytes;
  json rows = json::array();
  ReplicaActivity sum;
  for (const auto& r : core.replicas(id)) {
    rows.push_back({{"id", r.id},
                    {"node", r.node_id},
                    {"state", to_string(r.state)},
                    {"version", r.version.code},
                    {"pending_allocation", r.pending_allocation},
                    {"started", started_at ? started_at(r.id) : 0.0},
                    {"models", r.model_ids}});
    if (!activity)
      continue;
    auto load = activity->load(r.id, now).value_or(ReplicaActivity{});
    auto& row = rows.back();
    row["requests_per_s"] = load.requests_per_s;
    row["errors_per_s"] = load.errors_per_s;
    row["in_flight"] = load.in_flight;
    row["streams"] = load.streams;
    row["p99_ms"] = load.p99_s < 0 ? json(nullptr) : json(load.p99_s * 1000);
    sum.requests_per_s += load.requests_per_s;
    sum.errors_per_s += load.errors_per_s;
    sum.in_flight += load.in_flight;
    sum.streams += load.streams;
    sum.p99_s = std::max(sum.p99_s, load.p99_s);
  }
  d["replicas"] = std::move(rows);
  if (activity) {
    d["restarts"] = activity->restarts(id.app, id.name);
    d["requests_per_s"] = sum.requests_per_s;
    d["errors_per_s"] = sum.errors_per_s;
    d["in_flight"] = sum.in_flight;
    d["streams"] = sum.streams;
    d["p99_ms"] = sum.p99_s < 0 ? json(nullptr) : json(sum.p99_s * 1000);
  }
  return d;
}

}  // namespace

json render_status(const StateManager* core, bool recovering, const StartedAt& started_at,
                   const Activity* activity, double now) {
  json apps = json::object();
  if (!core)
    return json{{"applications", apps}};
  for (const auto& [name, app] : core->target_state().applications) {
    json a;
    a["route_prefix"] = app.route_prefix;
    a["ingress"] = app.ingress;
    // The traffic split, only when there is one (fields are only added).
    if (!app.traffic.empty())
      a["traffic"] = app.traffic;
    if (!app.traffic_key_header.empty())
      a["traffic_key_header"] = app.traffic_key_header;
    if (!app.shadow.empty())
      a["shadow"] = app.shadow;
    if (app.open_inference)
      a["open_inference"] = true;
    if (auto s = core->application_status(name)) {
      a["status"] = to_string(s->status);
      a["message"] = s->message;
    }
    json deps = json::object();
    for (const auto& spec : app.deployments)
      deps[spec.name] =
          deployment_json(*core, DeploymentId{name, spec.name}, spec, started_at, activity, now);
    a["deployments"] = std::move(deps);
    apps[name] = std::move(a);
  }
  json out{{"applications", apps},
           {"recovering", recovering},
           {"generation", core->target_state().generation}};
  // The declared http timeouts, only those declared (fields are only added).
  const HttpSettings& http = core->target_state().http;
  if (http != HttpSettings{}) {
    json h = json::object();
    if (http.request_timeout_s)
      h["request_timeout_s"] = *http.request_timeout_s;
    if (http.keep_alive_timeout_s)
      h["keep_alive_timeout_s"] = *http.keep_alive_timeout_s;
    out["http_options"] = std::move(h);
  }
  return out;
}

json render_apply_result(const std::map<std::string, DeployResult>& results, bool changed,
                         uint64_t generation) {
  json out;
  out["changed"] = changed;
  out["generation"] = generation;
  json apps = json::object();
  for (const auto& [name, r] : results) {
    json deps = json::object();
    for (const auto& [dep, kind] : r.deployments)
      deps[dep] = to_string(kind);
    apps[name] = {{"deployments", deps}, {"removed", r.removed}};
  }
  out["applications"] = apps;
  return out;
}

NodeStatus render_node(const NodeRecord& n, double now) {
  NodeStatus s;
  s.id = n.id;
  s.address = n.host + ":" + std::to_string(n.http_port);
  s.state = to_string(n.state);
  s.resources = n.resources.to_string();
  s.last_heartbeat_age_ms = static_cast<int64_t>((now - n.last_heartbeat) * 1000);
  s.reason = n.reason;
  s.pid = n.pid;
  return s;
}

std::vector<NodeStatus> render_nodes(const Membership& membership,
                                     const ProxyHealthMonitor& proxies, double now) {
  std::vector<NodeStatus> out;
  for (const auto& [id, node] : membership.nodes()) {
    out.push_back(render_node(node, now));
    out.back().proxy = proxies.node_health(id);
  }
  return out;
}

RoutingSnapshot render_snapshot(const SnapshotDelta& d, const TargetState& target,
                                const Membership& membership, const HandleOf& handle_of) {
  RoutingSnapshot out;
  out.epoch = d.id.epoch;
  out.seq = d.id.seq;
  out.full = d.full;
  out.routes_changed = d.routes_changed;
  out.request_timeout_s = target.http.request_timeout_s.value_or(0);
  out.keep_alive_timeout_s = target.http.keep_alive_timeout_s.value_or(0);
  for (const auto& r : d.routes) {
    TrafficWeights traffic(r.traffic.begin(), r.traffic.end());
    TrafficWeights shadow(r.shadow.begin(), r.shadow.end());
    out.routes.push_back({r.prefix, r.app, r.ingress, std::move(traffic), r.traffic_key_header,
                          std::move(shadow), r.open_inference});
  }
  for (const auto& dep : d.deployments) {
    DeploymentEndpoints e{dep.id.app, dep.id.name, {}, -1, dep.partial, dep.removed_replicas};
    if (auto app = target.applications.find(dep.id.app); app != target.applications.end()) {
      for (const auto& spec : app->second.deployments) {
        if (spec.name == dep.id.name)
          e.max_queued_requests = spec.config.max_queued_requests;
      }
    }
    for (const auto& r : dep.replicas) {
      ReplicaActor handle = handle_of ? handle_of(r.replica_id) : ReplicaActor{};
      if (!handle) {
        // Not reachable: left out of a whole set, removed by a partial one.
        if (dep.partial)
          e.removed_replicas.push_back(r.replica_id);
        continue;
      }
      e.replicas.push_back(
          {r.replica_id, r.node_id, r.max_ongoing_requests, handle, r.model_ids, r.model_ids_seq});
    }
    out.deployments.push_back(std::move(e));
  }
  for (const auto& id : d.removed)
    out.removed.emplace_back(id.app, id.name);
  for (const auto& id : d.withheld)
    out.withheld.emplace_back(id.app, id.name);
  std::set<std::string> hosts;
  for (const auto& d : out.deployments) {
    for (const auto& r : d.replicas)
      hosts.insert(r.node_id);
  }
  for (const auto& [id, n] : membership.nodes()) {
    if (n.state == NodeState::dead)
      out.dead_nodes.push_back(id);
    else if (n.state == NodeState::draining)
      out.draining_nodes.push_back(id);
    if (n.state != NodeState::dead && n.peer_port != 0 && hosts.count(id) > 0)
      out.peers.push_back({id, n.host, n.peer_port});
  }
  return out;
}

std::string StatusChange::describe() const {
  return "deployment " + deployment + ": " + (from.empty() ? "NEW" : from) + " -> " +
         to_string(info.status) + " (" + to_string(info.trigger) + ")" +
         (info.message.empty() ? "" : ": ") + info.message;
}

std::vector<StatusChange> StatusChangeLog::observe(const StateManager& core) {
  std::vector<StatusChange> changes;
  std::unordered_map<std::string, DeploymentStatus> now;
  for (const auto& id : core.deployment_ids()) {
    auto info = core.deployment_status(id);
    if (!info)
      continue;
    auto key = id.to_string();
    now[key] = info->status;
    auto it = last_.find(key);
    if (it != last_.end() && it->second == info->status)
      continue;
    StatusChange c;
    c.deployment = key;
    c.from = it == last_.end() ? "" : to_string(it->second);
    c.info = *info;
    c.warn = info->status == DeploymentStatus::unhealthy ||
             info->status == DeploymentStatus::deploy_failed;
    changes.push_back(std::move(c));
  }
  last_ = std::move(now);
  return changes;
}

}  // namespace troupe::controller
