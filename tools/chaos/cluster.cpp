#include "tools/chaos/cluster.hpp"

#include <algorithm>
#include <filesystem>

#include <signal.h>

#include <sstream>

namespace chaos {

namespace {

std::string fmt(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

}  // namespace

Cluster::Cluster(std::string bin_dir, std::string plugin_dir, const ClusterSpec& spec,
                 uint32_t seed, std::string run_dir)
    : bin_dir_(std::move(bin_dir)),
      plugin_dir_(std::move(plugin_dir)),
      spec_(spec),
      run_dir_(std::move(run_dir)) {
  port_ = free_port(seed);
  std::vector<std::string> ids;
  if (spec_.ha()) {
    for (int i = 1; i <= spec_.heads; ++i)
      ids.push_back("h" + std::to_string(i));
  } else {
    ids.push_back("head");
  }
  for (int i = 1; i <= spec_.workers; ++i)
    ids.push_back("w" + std::to_string(i));
  const bool hosts = spec_.network == "namespaces";
  if (hosts) {
    if (auto why = Network::unavailable())
      throw std::runtime_error("cluster.network: namespaces: " + *why);
    net_ = std::make_unique<Network>(ids, bin_dir_ + "/chaos-netdelay", run_dir_);
  }
  if (spec_.head_disk_mb > 0) {
    head_disk_ = std::make_unique<troupe::proc::Tmpfs>(head_state_dir(),
                                                       std::to_string(spec_.head_disk_mb) + "m");
    if (!head_disk_->mounted)
      throw std::runtime_error("cluster.head_disk_mb: cannot mount a tmpfs on " +
                               head_state_dir() + ": " + head_disk_->error +
                               " (mounting needs root)");
  }
  for (const auto& id : ids) {
    if (!is_head(id))
      continue;
    // Each candidate its own port: on loopback they share an address.
    uint16_t port = id == ids.front() ? port_ : free_port(seed);
    head_address_[id] = (hosts ? net_->address(id) : std::string("127.0.0.1")) + ":" +
                        std::to_string(port);
    address_ += (address_.empty() ? "" : ",") + head_address_[id];
  }
  if (spec_.tls.value_or(hosts)) {
    // A CA for the run, a certificate per node and one for the tool.
    tls_dir_ = run_dir_ + "/tls";
    auto certs = [&](std::vector<std::string> args) {
      std::vector<std::string> argv = {bin_dir_ + "/troupectl", "certs"};
      argv.insert(argv.end(), args.begin(), args.end());
      auto r = run(argv, 30s);
      if (r.exit_code != 0)
        throw std::runtime_error("troupectl certs " + args.front() + " failed: " + r.err);
    };
    certs({"init", tls_dir_});
    for (const auto& id : ids)
      certs({"issue", tls_dir_, "--name", id});
    certs({"issue", tls_dir_, "--name", "chaos", "--role", "operator"});
    if (spec_.ha())  // the etcd members' server certificate, for their address
      certs({"issue", tls_dir_, "--name", "etcd", "--host",
             hosts ? net_->bridge_address() : std::string("127.0.0.1")});
  }
  if (spec_.ha())
    start_etcd();
  std::vector<std::string> liveness = {"--node-timeout",
                                       fmt(spec_.node_timeout_s),
                                       "--heartbeat-interval",
                                       fmt(spec_.heartbeat_interval_s),
                                       "--basp-heartbeat-interval",
                                       fmt(spec_.basp_heartbeat_interval_s),
                                       "--basp-connection-timeout",
                                       fmt(spec_.basp_connection_timeout_s),
                                       "--shutdown-grace",
                                       fmt(spec_.shutdown_grace_s),
                                       "--drain-delay",
                                       fmt(spec_.drain_delay_s),
                                       "--plugin-path",
                                       plugin_dir_};
  auto add = [&](const std::string& id, std::vector<std::string> argv) {
    Node n;
    n.id = id;
    n.binary = argv.front();
    n.http_port = free_port(seed);
    // The admin listener is not used by the runs: any free port.
    argv.insert(argv.end(), {"--node-id", id, "--state-dir", run_dir_ + "/" + id, "--http-port",
                             std::to_string(n.http_port), "--admin-port", "0"});
    if (hosts) {
      n.host = net_->address(id);
      argv.insert(argv.end(), {"--bind", spec_.bind_any ? "0.0.0.0" : n.host});
      auto prefix = net_->exec_prefix(id);
      argv.insert(argv.begin(), prefix.begin(), prefix.end());
    }
    if (!tls_dir_.empty())
      argv.insert(argv.end(), {"--tls-dir", tls_dir_});
    else if (hosts)
      argv.push_back("--insecure");
    argv.insert(argv.end(), liveness.begin(), liveness.end());
    argv.insert(argv.end(), spec_.extra_args.begin(), spec_.extra_args.end());
    n.argv = std::move(argv);
    n.log_path = run_dir_ + "/" + id + ".log";
    nodes_.emplace(id, std::move(n));
  };
  for (const auto& [id, at] : head_address_) {
    std::vector<std::string> argv = {bin_dir_ + "/troupe-node", "--head", "--port",
                                     at.substr(at.rfind(':') + 1), "--recovery-window",
                                     fmt(spec_.recovery_window_s)};
    if (spec_.ha())
      argv.insert(argv.end(), {"--ha-etcd", etcd_->endpoints(), "--ha-name", id,
                               "--ha-lease-ttl", fmt(spec_.ha_lease_ttl_s)});
    add(id, argv);
  }
  for (int i = 1; i <= spec_.workers; ++i)
    add("w" + std::to_string(i), {bin_dir_ + "/troupe-node", "--join", address_});
}

// The etcd members in the tool's own namespace: on loopback, or (hosts of
// their own) on the bridge address every node reaches; with TLS on their
// client URLs when the nodes speak TLS.
void Cluster::start_etcd() {
  std::optional<troupe::proc::EtcdTlsFiles> tls;
  if (!tls_dir_.empty())
    tls = troupe::proc::EtcdTlsFiles{tls_dir_ + "/ca.crt", tls_dir_ + "/etcd.crt",
                                     tls_dir_ + "/etcd.key"};
  etcd_ = std::make_unique<troupe::proc::EtcdCluster>(
      run_dir_ + "/etcd", tls, net_ ? net_->bridge_address() : std::string("127.0.0.1"),
      static_cast<size_t>(spec_.etcd_members));
}

bool Cluster::is_head(const std::string& id) const {
  if (!spec_.ha())
    return id == "head";
  return id.size() > 1 && id[0] == 'h' &&
         id.find_first_not_of("0123456789", 1) == std::string::npos;
}

std::string Cluster::head_address(const std::string& id) const {
  return head_address_.at(id);
}

Cluster::~Cluster() {
  // Children die with their Child objects (SIGCONT + SIGKILL) before the
  // hosts they ran in are removed; the etcd members after the heads.
  nodes_.clear();
  etcd_.reset();
  net_.reset();
  head_disk_.reset();
}

std::vector<std::string> Cluster::node_ids() const {
  std::vector<std::string> out;
  for (const auto& [id, n] : nodes_)
    out.push_back(id);
  return out;
}

void Cluster::spawn(Node& n) {
  // In its state dir with core dumps on: a crash leaves a core to read.
  troupe::proc::ChildOptions options;
  auto at = std::find(n.argv.begin(), n.argv.end(), "--state-dir");
  if (at != n.argv.end() && at + 1 != n.argv.end()) {
    std::error_code ec;
    std::filesystem::create_directories(*(at + 1), ec);
    options.working_dir = *(at + 1);
  }
  options.core_dumps = true;
  n.process = Child(n.argv, n.log_path, options);
  n.frozen = false;
  ++n.starts;
}

bool Cluster::start(std::chrono::milliseconds deadline, std::string* error) {
  for (auto& [id, n] : nodes_) {
    if (is_head(id))
      spawn(n);
  }
  for (auto& [id, n] : nodes_) {
    if (!is_head(id))
      spawn(n);
  }
  std::string last;
  bool ok = wait_until(
      [&] {
        for (auto& [id, n] : nodes_) {
          if (!n.process.running()) {
            last = "node " + id + " exited with " +
                   std::to_string(n.process.exit_code().value_or(-1)) + " (log " + n.log_path + ")";
            return true;
          }
        }
        auto nodes = nodes_json(2, &last);
        if (!nodes)
          return false;
        size_t alive = 0;
        for (const auto& row : *nodes) {
          if (row.value("state", "") == "ALIVE" && nodes_.count(row.value("id", "")))
            ++alive;
        }
        last = std::to_string(alive) + " of " + std::to_string(nodes_.size()) + " nodes ALIVE";
        return alive == nodes_.size();
      },
      deadline, 100ms);
  for (auto& [id, n] : nodes_) {
    if (!n.process.running())
      ok = false;
  }
  if (!ok && error)
    *error = "cluster did not come up: " + last;
  return ok;
}

RunResult Cluster::ctl(const std::vector<std::string>& args, double timeout_s) const {
  return ctl_at(address_, args, timeout_s);
}

RunResult Cluster::ctl_at(const std::string& address, const std::vector<std::string>& args,
                          double timeout_s) const {
  std::vector<std::string> argv = {bin_dir_ + "/troupectl", "--address", address, "--timeout",
                                   fmt(timeout_s)};
  if (!tls_dir_.empty())
    argv.insert(argv.end(), {"--tls-dir", tls_dir_, "--tls-name", "chaos"});
  argv.insert(argv.end(), args.begin(), args.end());
  // troupectl bounds itself by --timeout per step; the outer bound is a
  // safety net against a hung client.
  auto bound = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 3000) + 5000);
  return run(argv, bound);
}

namespace {

std::optional<nlohmann::json> parse_answer(const RunResult& r, std::string* error) {
  if (r.exit_code != 0) {
    if (error) {
      std::string err = r.err;
      while (!err.empty() && (err.back() == '\n' || err.back() == '\r'))
        err.pop_back();
      *error = r.exit_code < 0 ? "troupectl timed out" : err;
    }
    return std::nullopt;
  }
  try {
    return nlohmann::json::parse(r.out);
  } catch (const std::exception& e) {
    if (error)
      *error = std::string("unparsable troupectl output: ") + e.what();
    return std::nullopt;
  }
}

}  // namespace

std::optional<nlohmann::json> Cluster::status_json(double timeout_s, std::string* error) const {
  return parse_answer(ctl({"status", "--json"}, timeout_s), error);
}

std::optional<nlohmann::json> Cluster::nodes_json(double timeout_s, std::string* error) const {
  return parse_answer(ctl({"nodes", "--json"}, timeout_s), error);
}

std::optional<nlohmann::json> Cluster::leader_json(const std::string& head, double timeout_s,
                                                   std::string* error) const {
  auto r = ctl_at(head.empty() ? address_ : head_address(head), {"leader", "--json"}, timeout_s);
  // Exit 1 with an answer: the head answered and names no leader.
  if (r.exit_code == 1 && !r.out.empty())
    r.exit_code = 0;
  return parse_answer(r, error);
}

std::optional<std::string> Cluster::leader(double timeout_s) const {
  auto j = leader_json("", timeout_s);
  // Whoever answered: a follower names the leader it knows.
  if (!j || !(*j)["leader"].is_object())
    return std::nullopt;
  return (*j)["leader"].value("node_id", std::string());
}

void Cluster::kill9(const std::string& id) {
  auto& n = nodes_.at(id);
  n.process.signal(SIGKILL);
  n.process.wait_exit(5s);
  n.frozen = false;
}

void Cluster::restart(const std::string& id) {
  auto& n = nodes_.at(id);
  if (n.process.running())
    kill9(id);
  spawn(n);
}

void Cluster::sigstop(const std::string& id) {
  auto& n = nodes_.at(id);
  n.process.signal(SIGSTOP);
  n.frozen = true;
}

void Cluster::sigcont(const std::string& id) {
  auto& n = nodes_.at(id);
  n.process.signal(SIGCONT);
  n.frozen = false;
}

ShutdownResult Cluster::shutdown(std::chrono::milliseconds graceful_deadline) {
  ShutdownResult out;
  for (auto& [id, n] : nodes_) {
    if (n.frozen)
      sigcont(id);
  }
  auto r = ctl({"shutdown", "--nodes"}, 10);
  out.shutdown_command_ok = r.exit_code == 0;
  if (!out.shutdown_command_ok)
    out.shutdown_error = r.exit_code < 0 ? "troupectl timed out" : r.err;
  auto all_stopped = [&] {
    for (auto& [id, n] : nodes_) {
      if (n.process.running())
        return false;
    }
    return true;
  };
  if (out.shutdown_command_ok)
    wait_until(all_stopped, graceful_deadline, 50ms, false);
  for (auto& [id, n] : nodes_) {
    if (n.process.running()) {
      out.needed_sigterm.push_back(id);
      n.process.signal(SIGTERM);
    }
  }
  auto grace =
      std::chrono::milliseconds(static_cast<int64_t>(spec_.shutdown_grace_s * 1000) + 5000);
  wait_until(all_stopped, grace, 50ms, false);
  for (auto& [id, n] : nodes_) {
    if (n.process.running()) {
      out.needed_sigkill.push_back(id);
      n.process.signal(SIGKILL);
      n.process.wait_exit(5s);
    }
    out.exit_codes[id] = n.process.exit_code().value_or(-1);
  }
  // The etcd members last (the heads needed them to hand over).
  if (etcd_) {
    for (size_t i = 0; i < etcd_->size(); ++i)
      etcd_->stop(i);
  }
  // Anything else that carries the run directory in its command line (a
  // node restarted by someone else, a stray troupectl) is a leftover.
  wait_until([&] { return processes_mentioning(run_dir_).empty(); }, 2s, 50ms, false);
  for (pid_t pid : processes_mentioning(run_dir_)) {
    out.leftover_pids.push_back(pid);
    ::kill(pid, SIGCONT);
    ::kill(pid, SIGKILL);
  }
  return out;
}

std::string Cluster::logs_tail(size_t bytes_per_node) const {
  std::string out;
  for (const auto& [id, n] : nodes_) {
    std::string log = slurp(n.log_path);
    if (log.size() > bytes_per_node)
      log = "..." + log.substr(log.size() - bytes_per_node);
    out += "----- " + id + " (" + n.log_path + ") -----\n" + log + "\n";
  }
  return out;
}

}  // namespace chaos
