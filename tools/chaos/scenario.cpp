#include "tools/chaos/scenario.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <stdexcept>

namespace chaos {

const char* to_string(FaultKind kind) {
  switch (kind) {
    case FaultKind::kill_replica:
      return "kill_replica";
    case FaultKind::kill_proxy:
      return "kill_proxy";
    case FaultKind::kill_agent:
      return "kill_agent";
    case FaultKind::kill_controller:
      return "kill_controller";
    case FaultKind::kill9_node:
      return "kill9_node";
    case FaultKind::sigstop_node:
      return "sigstop_node";
    case FaultKind::drain_node:
      return "drain_node";
    case FaultKind::sigterm_node:
      return "sigterm_node";
    case FaultKind::poison:
      return "poison";
    case FaultKind::partition:
      return "partition";
    case FaultKind::degrade:
      return "degrade";
    case FaultKind::fill_disk:
      return "fill_disk";
    case FaultKind::redeploy:
      return "redeploy";
    case FaultKind::rollback:
      return "rollback";
    case FaultKind::kill_leader:
      return "kill_leader";
    case FaultKind::partition_leader:
      return "partition_leader";
    case FaultKind::kill_etcd_member:
      return "kill_etcd_member";
    case FaultKind::etcd_quorum_loss:
      return "etcd_quorum_loss";
  }
  return "?";
}

const char* to_string(Direction d) {
  switch (d) {
    case Direction::both:
      return "both";
    case Direction::out:
      return "out";
    case Direction::in:
      return "in";
  }
  return "?";
}

bool node_scoped(FaultKind kind) {
  return kind == FaultKind::kill_proxy || kind == FaultKind::kill_agent ||
         kind == FaultKind::kill9_node || kind == FaultKind::sigstop_node ||
         kind == FaultKind::partition || kind == FaultKind::kill_leader ||
         kind == FaultKind::partition_leader;
}

namespace {

struct Reader {
  std::string file;

  [[noreturn]] void fail(const YAML::Node& at, const std::string& what) const {
    auto mark = at.Mark();
    std::string where = file;
    if (mark.line >= 0)
      where += ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
    throw std::runtime_error(where + ": " + what);
  }

  void only(const YAML::Node& map, const std::set<std::string>& known,
            const std::string& what) const {
    if (!map.IsMap())
      fail(map, what + " must be a mapping");
    for (const auto& kv : map) {
      auto key = kv.first.as<std::string>();
      if (!known.count(key))
        fail(kv.first, "unknown field '" + key + "' in " + what);
    }
  }

  template <class T>
  T get(const YAML::Node& map, const std::string& key, T fallback) const {
    auto node = map[key];
    if (!node)
      return fallback;
    try {
      return node.as<T>();
    } catch (const YAML::Exception&) {
      fail(node, key + ": wrong type");
    }
  }

  double positive(const YAML::Node& map, const std::string& key, double fallback) const {
    double v = get<double>(map, key, fallback);
    if (!(v > 0))
      fail(map[key] ? map[key] : map, key + " must be > 0");
    return v;
  }

  std::optional<double> opt_double(const YAML::Node& map, const std::string& key) const {
    if (!map[key])
      return std::nullopt;
    return get<double>(map, key, 0);
  }
  std::optional<int64_t> opt_int(const YAML::Node& map, const std::string& key) const {
    if (!map[key])
      return std::nullopt;
    return get<int64_t>(map, key, 0);
  }
};

FaultKind parse_kind(const Reader& r, const YAML::Node& node) {
  static const std::pair<const char*, FaultKind> kinds[] = {
      {"kill_replica", FaultKind::kill_replica}, {"kill_proxy", FaultKind::kill_proxy},
      {"kill_agent", FaultKind::kill_agent},     {"kill_controller", FaultKind::kill_controller},
      {"kill9_node", FaultKind::kill9_node},     {"sigstop_node", FaultKind::sigstop_node},
      {"drain_node", FaultKind::drain_node},     {"poison", FaultKind::poison},
      {"sigterm_node", FaultKind::sigterm_node}, {"partition", FaultKind::partition},
      {"degrade", FaultKind::degrade},           {"fill_disk", FaultKind::fill_disk},
      {"redeploy", FaultKind::redeploy},         {"rollback", FaultKind::rollback},
      {"kill_leader", FaultKind::kill_leader},   {"partition_leader", FaultKind::partition_leader},
      {"kill_etcd_member", FaultKind::kill_etcd_member},
      {"etcd_quorum_loss", FaultKind::etcd_quorum_loss},
  };
  if (!node)
    r.fail(node, "a fault needs an action");
  auto name = node.as<std::string>();
  for (const auto& [text, kind] : kinds) {
    if (name == text)
      return kind;
  }
  r.fail(node, "unknown action '" + name +
                   "' (kill_replica, kill_proxy, kill_agent, kill_controller, kill9_node, "
                   "sigstop_node, drain_node, sigterm_node, poison, partition, degrade, fill_disk, "
                   "redeploy, rollback, kill_leader, partition_leader, kill_etcd_member, "
                   "etcd_quorum_loss)");
}

// The applications a `troupectl deploy` config declares: name -> its
// entry ("default" when it has no name).
std::map<std::string, YAML::Node> applications_of(const YAML::Node& config) {
  std::map<std::string, YAML::Node> out;
  if (!config || !config.IsMap() || !config["applications"] ||
      !config["applications"].IsSequence())
    return out;
  for (const auto& app : config["applications"]) {
    if (!app.IsMap())
      continue;
    std::string name = "default";
    if (app["name"] && app["name"].IsScalar())
      name = app["name"].as<std::string>();
    out[name] = static_cast<const YAML::Node&>(app);
  }
  return out;
}

// The deployments an application entry names: those listed, and the
// ingress of its import_path (the class after ':').
std::vector<std::string> deployments_of(const YAML::Node& app) {
  std::vector<std::string> out;
  if (app["deployments"] && app["deployments"].IsSequence()) {
    for (const auto& d : app["deployments"]) {
      if (d.IsMap() && d["name"] && d["name"].IsScalar())
        out.push_back(d["name"].as<std::string>());
    }
  }
  if (out.empty() && app["import_path"] && app["import_path"].IsScalar()) {
    auto path = app["import_path"].as<std::string>();
    auto colon = path.rfind(':');
    if (colon != std::string::npos && colon + 1 < path.size())
      out.push_back(path.substr(colon + 1));
  }
  return out;
}

}  // namespace

// cluster.heads, etcd_members, ha_lease_ttl_s.
void read_ha(const Reader& r, const YAML::Node& c, ClusterSpec& k) {
  k.heads = r.get<int>(c, "heads", 1);
  if (k.heads < 1 || k.heads > 7)
    r.fail(c["heads"], "heads must be within 1-7");
  k.etcd_members = r.get<int>(c, "etcd_members", k.heads > 1 ? 3 : 0);
  if (k.heads > 1 && (k.etcd_members < 1 || k.etcd_members > 7))
    r.fail(c["etcd_members"] ? c["etcd_members"] : c["heads"],
           "highly available heads need etcd_members within 1-7");
  if (k.heads == 1 && k.etcd_members != 0)
    r.fail(c["etcd_members"], "etcd_members needs heads > 1 (a single head keeps its own checkpoint)");
  k.ha_lease_ttl_s = r.get<double>(c, "ha_lease_ttl_s", 2);
  if (!(k.ha_lease_ttl_s >= 1 && k.ha_lease_ttl_s <= 60) || k.ha_lease_ttl_s != int(k.ha_lease_ttl_s))
    r.fail(c["ha_lease_ttl_s"], "ha_lease_ttl_s is whole seconds within 1-60");
  if (k.heads > 1 && k.head_disk_mb > 0)
    r.fail(c["head_disk_mb"], "head_disk_mb is for a single head (candidates keep the checkpoint in etcd)");
}

// The fields of the faults of highly available heads.
void read_ha_fault(const Reader& r, const YAML::Node& item, const Scenario& s, FaultSpec& spec) {
  if (!ha_fault(spec.kind)) {
    for (const char* key : {"member", "probe_deploy"}) {
      if (item[key])
        r.fail(item[key], std::string(key) + " is for the etcd faults and partition_leader");
    }
    return;
  }
  const char* what = to_string(spec.kind);
  if (!s.cluster.ha())
    r.fail(item["action"], std::string(what) + " needs highly available heads (cluster.heads > 1)");
  if (item["node"])
    r.fail(item["node"], std::string(what) + " picks its node itself: no node");
  spec.node = etcd_fault(spec.kind) ? "" : "leader";
  spec.probe_deploy = r.get<bool>(item, "probe_deploy", spec.kind != FaultKind::kill_leader);
  if (spec.kind == FaultKind::kill_leader && spec.probe_deploy)
    r.fail(item["probe_deploy"], "probe_deploy is for the etcd faults and partition_leader");
  spec.member = r.get<std::string>(item, "member", "random");
  if (item["member"] && spec.kind != FaultKind::kill_etcd_member)
    r.fail(item["member"], "member is for action kill_etcd_member");
  if (spec.member != "random") {
    bool known = false;
    for (int i = 1; i <= s.cluster.etcd_members; ++i)
      known = known || spec.member == "m" + std::to_string(i);
    if (!known)
      r.fail(item["member"], "member is random or m1..m" + std::to_string(s.cluster.etcd_members));
  }
  if (spec.kind == FaultKind::etcd_quorum_loss && !item["duration_s"])
    r.fail(item, "etcd_quorum_loss needs duration_s (when the members start again)");
  if (spec.kind == FaultKind::partition_leader && !item["from"])
    spec.from = "all";
  if (spec.kind == FaultKind::partition_leader && spec.from != "all")
    r.fail(item["from"], "partition_leader cuts the leader off from all (every node and etcd member)");
}

Scenario load_scenario(const std::string& path) {
  Reader r{path};
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  r.only(root,
         {"name", "description", "seed", "long", "cluster", "deploy", "load", "faults",
          "convergence_deadline_s", "goals"},
         "scenario");
  Scenario s;
  s.name = r.get<std::string>(root, "name", "");
  if (s.name.empty())
    r.fail(root, "a scenario needs a name");
  s.description = r.get<std::string>(root, "description", "");
  s.seed = r.get<uint32_t>(root, "seed", 1);
  s.long_running = r.get<bool>(root, "long", false);
  s.convergence_deadline_s = r.positive(root, "convergence_deadline_s", 30);

  if (auto c = root["cluster"]) {
    r.only(c,
           {"workers", "node_timeout_s", "heartbeat_interval_s", "basp_heartbeat_interval_s",
            "basp_connection_timeout_s", "recovery_window_s", "shutdown_grace_s", "drain_delay_s",
            "extra_args", "network", "tls", "head_disk_mb", "bind_any", "heads", "etcd_members",
            "ha_lease_ttl_s"},
           "cluster");
    auto& k = s.cluster;
    k.workers = r.get<int>(c, "workers", k.workers);
    if (k.workers < 0 || k.workers > 16)
      r.fail(c, "workers must be within 0-16");
    k.node_timeout_s = r.positive(c, "node_timeout_s", k.node_timeout_s);
    k.heartbeat_interval_s = r.positive(c, "heartbeat_interval_s", k.heartbeat_interval_s);
    k.basp_heartbeat_interval_s =
        r.positive(c, "basp_heartbeat_interval_s", k.basp_heartbeat_interval_s);
    k.basp_connection_timeout_s =
        r.positive(c, "basp_connection_timeout_s", k.basp_connection_timeout_s);
    k.recovery_window_s = r.positive(c, "recovery_window_s", k.recovery_window_s);
    k.shutdown_grace_s = r.positive(c, "shutdown_grace_s", k.shutdown_grace_s);
    k.drain_delay_s = r.get<double>(c, "drain_delay_s", k.drain_delay_s);
    if (!(k.drain_delay_s >= 0) || k.drain_delay_s > 60)
      r.fail(c["drain_delay_s"], "drain_delay_s must be within 0-60 seconds");
    k.extra_args = r.get<std::vector<std::string>>(c, "extra_args", {});
    k.network = r.get<std::string>(c, "network", k.network);
    if (k.network != "loopback" && k.network != "namespaces")
      r.fail(c["network"], "network is loopback or namespaces");
    if (c["tls"])
      k.tls = r.get<bool>(c, "tls", false);
    k.bind_any = r.get<bool>(c, "bind_any", false);
    if (k.bind_any && k.network != "namespaces")
      r.fail(c["bind_any"], "bind_any needs network: namespaces");
    k.head_disk_mb = r.get<int>(c, "head_disk_mb", 0);
    if (k.head_disk_mb != 0 && (k.head_disk_mb < 8 || k.head_disk_mb > 4096))
      r.fail(c["head_disk_mb"], "head_disk_mb is within 8-4096 (or 0: no disk of its own)");
    read_ha(r, c, k);
  }

  s.deploy = root["deploy"];
  if (!s.deploy || !s.deploy.IsMap() || !s.deploy["applications"])
    r.fail(root, "a scenario needs `deploy:`, a troupectl deploy config with applications");

  if (auto l = root["load"]) {
    r.only(l, {"concurrency", "rate", "clients", "duration_s", "paths", "via", "request_timeout_s",
            "follow_readyz"},
           "load");
    s.has_load = true;
    auto& ld = s.load;
    ld.concurrency = r.get<int>(l, "concurrency", 0);
    ld.rate = r.get<double>(l, "rate", 0);
    ld.clients = r.get<int>(l, "clients", 0);
    if ((ld.concurrency > 0) == (ld.rate > 0))
      r.fail(l, "load needs exactly one of concurrency (> 0) and rate (> 0)");
    if (ld.concurrency > 512 || ld.rate > 20000 || ld.clients < 0 || ld.clients > 512)
      r.fail(l, "load is bounded: concurrency and clients at most 512, rate at most 20000");
    ld.duration_s = r.positive(l, "duration_s", ld.duration_s);
    if (ld.duration_s > 3600)
      r.fail(l, "duration_s is at most 3600");
    ld.paths = r.get<std::vector<std::string>>(l, "paths", {});
    if (ld.paths.empty())
      r.fail(l, "load needs paths (e.g. [/echo/chaos])");
    for (const auto& p : ld.paths) {
      if (p.empty() || p[0] != '/')
        r.fail(l["paths"], "paths start with /");
    }
    ld.via = r.get<std::vector<std::string>>(l, "via", {});
    ld.request_timeout_s = r.positive(l, "request_timeout_s", ld.request_timeout_s);
    ld.follow_readyz = r.get<bool>(l, "follow_readyz", false);
  }

  if (auto f = root["faults"]) {
    if (!f.IsSequence())
      r.fail(f, "faults must be a list");
    for (const auto& item : f) {
      r.only(
          item,
          {"action", "at_s", "start_s", "every_s", "stop_s", "node", "app", "deployment",
           "restart_after_s", "duration_s", "max_recovery_s", "path", "paths", "mark", "timeout_s",
           "from", "direction", "delay_ms", "loss_pct", "deploy", "member", "probe_deploy"},
          "fault");
      FaultSpec spec;
      spec.kind = parse_kind(r, item["action"]);
      if (item["at_s"] && item["start_s"])
        r.fail(item, "give at_s (once) or start_s/every_s/stop_s (repeated), not both");
      spec.start_s = r.get<double>(item, item["at_s"] ? "at_s" : "start_s", 0);
      spec.every_s = r.get<double>(item, "every_s", 0);
      spec.stop_s = r.get<double>(item, "stop_s", spec.start_s);
      if (spec.start_s < 0 || spec.every_s < 0 || spec.stop_s < spec.start_s)
        r.fail(item, "need 0 <= start_s <= stop_s and every_s >= 0");
      if (spec.every_s > 0 && spec.every_s < 0.05)
        r.fail(item, "every_s is at least 0.05");
      const bool poison = spec.kind == FaultKind::poison;
      const bool disk = spec.kind == FaultKind::fill_disk;
      spec.node = r.get<std::string>(item, "node", poison ? "random" : disk ? "head" : "random_worker");
      if (disk) {
        if (spec.node != "head")
          r.fail(item["node"], "fill_disk fills the head's state disk: node is head");
        if (s.cluster.head_disk_mb == 0)
          r.fail(item["action"], "fill_disk needs cluster.head_disk_mb (a disk of its own)");
        if (!item["duration_s"])
          r.fail(item, "fill_disk needs duration_s (when the space returns)");
      }
      if (spec.node == "round_robin" && !poison)
        r.fail(item["node"], "node: round_robin is for poison only");
      if (poison) {
        if (item["path"] && item["paths"])
          r.fail(item, "give path or paths, not both");
        if (item["path"])
          spec.paths = {r.get<std::string>(item, "path", "")};
        else
          spec.paths = r.get<std::vector<std::string>>(item, "paths", {});
        if (spec.paths.empty())
          r.fail(item, "poison needs path (or paths), e.g. /crash/?mode=segv");
        for (const auto& p : spec.paths) {
          if (p.empty() || p[0] != '/')
            r.fail(item[item["path"] ? "path" : "paths"], "poison paths start with /");
        }
        spec.mark = r.get<std::string>(item, "mark", "");
        for (char c : spec.mark) {
          if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-')
            r.fail(item["mark"], "mark is a query parameter name ([A-Za-z0-9_-]+)");
        }
        spec.timeout_s = r.positive(item, "timeout_s", spec.timeout_s);
      } else {
        for (const char* key : {"path", "paths", "mark", "timeout_s"}) {
          if (item[key])
            r.fail(item[key], std::string(key) + " is for action poison only");
        }
      }
      spec.app = r.get<std::string>(item, "app", "");
      spec.deployment = r.get<std::string>(item, "deployment", "");
      const bool release = spec.kind == FaultKind::redeploy || spec.kind == FaultKind::rollback;
      if (release) {
        const char* what = to_string(spec.kind);
        if (spec.every_s > 0 || item["stop_s"])
          r.fail(item, std::string(what) + " happens once: give at_s (or start_s), not every_s/stop_s");
        for (const char* key : {"node", "restart_after_s", "duration_s", "max_recovery_s"}) {
          if (item[key])
            r.fail(item[key], std::string(key) + " is not a field of action " + what);
        }
      } else if (item["deploy"]) {
        r.fail(item["deploy"], "deploy is for action redeploy only");
      }
      if (spec.kind == FaultKind::redeploy) {
        const std::string needs =
            "redeploy needs deploy:, a troupectl deploy config with applications (like the "
            "scenario's own deploy)";
        if (!item["deploy"])
          r.fail(item, needs);
        spec.deploy = item["deploy"];
        if (!spec.deploy.IsMap() || !spec.deploy["applications"] ||
            !spec.deploy["applications"].IsSequence() || spec.deploy["applications"].size() == 0)
          r.fail(spec.deploy, needs);
        auto apps = applications_of(spec.deploy);
        if (spec.app.empty()) {
          if (apps.size() != 1)
            r.fail(item, "redeploy of several applications needs app: the one its goals watch");
          spec.app = apps.begin()->first;
        } else if (!apps.count(spec.app)) {
          r.fail(item["app"], "app '" + spec.app + "' is not an application of this deploy");
        }
        auto deps = deployments_of(apps.at(spec.app));
        if (spec.deployment.empty()) {
          if (deps.size() != 1)
            r.fail(item, "redeploy needs deployment: application '" + spec.app + "' has " +
                             std::to_string(deps.size()) + " deployments");
          spec.deployment = deps.front();
        } else if (std::find(deps.begin(), deps.end(), spec.deployment) == deps.end()) {
          r.fail(item["deployment"], "deployment '" + spec.deployment +
                                         "' is not a deployment of application '" + spec.app +
                                         "' in this deploy");
        }
      }
      if (spec.kind == FaultKind::rollback) {
        if (spec.app.empty())
          r.fail(item, "rollback needs app: the application rolled back");
        if (item["deployment"])
          r.fail(item["deployment"], "rollback rolls back a whole application: no deployment");
        bool declared = applications_of(s.deploy).count(spec.app) > 0;
        for (const auto& earlier : s.faults) {
          if (earlier.kind == FaultKind::redeploy && applications_of(earlier.deploy).count(spec.app))
            declared = true;
        }
        if (!declared)
          r.fail(item["app"], "app '" + spec.app + "' is not an application the scenario deploys");
      }
      spec.restart_after_s = r.get<double>(item, "restart_after_s", -1);
      spec.duration_s = r.positive(item, "duration_s", spec.duration_s);
      spec.max_recovery_s = r.opt_double(item, "max_recovery_s");
      if (network_fault(spec.kind)) {
        if (s.cluster.network != "namespaces")
          r.fail(item["action"], std::string(to_string(spec.kind)) +
                                     " needs cluster.network: namespaces (each node on a host "
                                     "of its own)");
        if (!item["duration_s"])
          r.fail(item, std::string(to_string(spec.kind)) + " needs duration_s (when it heals)");
        spec.from = r.get<std::string>(item, "from", spec.from);
        if (spec.from.empty())
          r.fail(item["from"], "from names the peers: head, a node id, all or workers");
        auto dir = r.get<std::string>(item, "direction", "both");
        if (dir == "both")
          spec.direction = Direction::both;
        else if (dir == "out")
          spec.direction = Direction::out;
        else if (dir == "in")
          spec.direction = Direction::in;
        else
          r.fail(item["direction"], "direction is both, out (the peers stop hearing the node) or "
                                    "in (the node stops hearing the peers)");
        spec.delay_ms = r.get<double>(item, "delay_ms", 0);
        spec.loss_pct = r.get<double>(item, "loss_pct", 0);
        if (spec.kind == FaultKind::partition && (item["delay_ms"] || item["loss_pct"]))
          r.fail(item, "delay_ms and loss_pct are for action degrade");
        if (spec.kind == FaultKind::degrade) {
          if (item["direction"])
            r.fail(item["direction"], "direction is for action partition (degrade acts both ways)");
          if (!(spec.delay_ms >= 0 && spec.delay_ms <= 10000) ||
              !(spec.loss_pct >= 0 && spec.loss_pct <= 100))
            r.fail(item, "delay_ms is within 0-10000 and loss_pct within 0-100");
          if (spec.delay_ms == 0 && spec.loss_pct == 0)
            r.fail(item, "degrade needs delay_ms or loss_pct");
        }
      } else {
        for (const char* key : {"from", "direction", "delay_ms", "loss_pct"}) {
          if (item[key])
            r.fail(item[key], std::string(key) + " is for actions partition and degrade");
        }
      }
      read_ha_fault(r, item, s, spec);
      if (s.has_load && spec.start_s > s.load.duration_s)
        r.fail(item, "the fault starts after the load ends");
      s.faults.push_back(spec);
    }
  }

  if (auto g = root["goals"]) {
    r.only(g,
           {"min_success_ratio",
            "max_recovery_s",
            "max_final_recovery_s",
            "max_dead_detection_s",
            "max_replacement_s",
            "max_failures_via_unfaulted_nodes",
            "max_unexplained_failures",
            "min_poison_502_ratio",
            "max_nodes_seen_not_alive",
            "max_failed_status_polls",
            "max_status_gap_s",
            "max_dead_transitions_per_fault",
            "max_replicas_above_surge",
            "replicas_unchanged",
            "seen_unreachable",
            "max_full_route_tables",
            "deploy_failed_within_s",
            "deploy_failed_message",
            "replicas_kept",
            "no_healthy_until_rollback",
            "rollback_healthy_within_s",
            "max_failover_s",
            "max_step_down_s"},
           "goals");
    auto& go = s.goals;
    go.min_success_ratio = r.opt_double(g, "min_success_ratio");
    go.max_recovery_s = r.opt_double(g, "max_recovery_s");
    go.max_final_recovery_s = r.opt_double(g, "max_final_recovery_s");
    go.max_dead_detection_s = r.opt_double(g, "max_dead_detection_s");
    go.max_replacement_s = r.opt_double(g, "max_replacement_s");
    go.max_failures_via_unfaulted_nodes = r.opt_int(g, "max_failures_via_unfaulted_nodes");
    go.max_unexplained_failures = r.opt_int(g, "max_unexplained_failures");
    go.min_poison_502_ratio = r.opt_double(g, "min_poison_502_ratio");
    go.max_nodes_seen_not_alive = r.opt_int(g, "max_nodes_seen_not_alive");
    go.max_failed_status_polls = r.opt_int(g, "max_failed_status_polls");
    go.max_status_gap_s = r.opt_double(g, "max_status_gap_s");
    go.max_dead_transitions_per_fault = r.opt_int(g, "max_dead_transitions_per_fault");
    go.max_replicas_above_surge = r.opt_int(g, "max_replicas_above_surge");
    go.replicas_unchanged = r.get<bool>(g, "replicas_unchanged", false);
    go.max_full_route_tables = r.opt_int(g, "max_full_route_tables");
    go.seen_unreachable = r.get<std::vector<std::string>>(g, "seen_unreachable", {});
    if (go.replicas_unchanged && s.faults.empty())
      r.fail(g["replicas_unchanged"],
             "replicas_unchanged needs a fault (it compares with the "
             "replicas before the first)");
    for (const auto& id : go.seen_unreachable) {
      bool known = id == "head";
      for (int w = 1; w <= s.cluster.workers; ++w)
        known = known || id == "w" + std::to_string(w);
      if (!known)
        r.fail(g["seen_unreachable"], "seen_unreachable names nodes of the cluster (head, w1 to w" +
                                          std::to_string(s.cluster.workers) + "), not '" + id +
                                          "'");
    }
    if (g["max_failover_s"])
      go.max_failover_s = r.positive(g, "max_failover_s", 0);
    if (g["max_step_down_s"])
      go.max_step_down_s = r.positive(g, "max_step_down_s", 0);
    if ((go.max_failover_s || go.max_step_down_s) && !s.cluster.ha())
      r.fail(g[go.max_failover_s ? "max_failover_s" : "max_step_down_s"],
             "max_failover_s and max_step_down_s need highly available heads (cluster.heads > 1)");
    if (go.min_poison_502_ratio &&
        std::none_of(s.faults.begin(), s.faults.end(),
                     [](const FaultSpec& f) { return f.kind == FaultKind::poison; }))
      r.fail(g["min_poison_502_ratio"], "min_poison_502_ratio needs a poison fault");

    // The rollout goals: the first redeploy (by time) and the rollback after it.
    const FaultSpec* release = nullptr;
    for (const auto& f : s.faults) {
      if (f.kind == FaultKind::redeploy && (!release || f.start_s < release->start_s))
        release = &f;
    }
    bool rolled_back = false;
    for (const auto& f : s.faults) {
      if (release && &f != release &&
          (f.kind == FaultKind::redeploy || f.kind == FaultKind::rollback) &&
          f.start_s > release->start_s)
        rolled_back = true;
    }
    if (g["deploy_failed_within_s"])
      go.deploy_failed_within_s = r.positive(g, "deploy_failed_within_s", 0);
    if (auto m = g["deploy_failed_message"]) {
      if (m.IsSequence())
        go.deploy_failed_message = r.get<std::vector<std::string>>(g, "deploy_failed_message", {});
      else
        go.deploy_failed_message = {r.get<std::string>(g, "deploy_failed_message", "")};
      if (go.deploy_failed_message.empty() ||
          std::any_of(go.deploy_failed_message.begin(), go.deploy_failed_message.end(),
                      [](const std::string& t) { return t.empty(); }))
        r.fail(m, "deploy_failed_message is a text to find, or a list of them (none empty)");
    }
    go.replicas_kept = r.get<bool>(g, "replicas_kept", false);
    go.no_healthy_until_rollback = r.get<bool>(g, "no_healthy_until_rollback", false);
    if (g["rollback_healthy_within_s"])
      go.rollback_healthy_within_s = r.positive(g, "rollback_healthy_within_s", 0);
    for (const char* key : {"deploy_failed_within_s", "deploy_failed_message", "replicas_kept",
                            "no_healthy_until_rollback", "rollback_healthy_within_s"}) {
      if (g[key] && !release)
        r.fail(g[key], std::string(key) + " needs a redeploy fault (the release it judges)");
    }
    if (go.rollback_healthy_within_s && !rolled_back)
      r.fail(g["rollback_healthy_within_s"],
             "rollback_healthy_within_s needs a rollback (or redeploy) fault after the first "
             "redeploy");
  }
  return s;
}

}  // namespace chaos
