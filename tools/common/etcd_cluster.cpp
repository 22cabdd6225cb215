#include "tools/common/etcd_cluster.hpp"

#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <stdexcept>

namespace troupe::proc {

namespace {

const char* const kEtcd = "/usr/bin/etcd";
const char* const kEtcdctl = "/usr/bin/etcdctl";

}  // namespace

RunResult etcdctl(const std::string& endpoints, const std::vector<std::string>& args,
                  std::chrono::milliseconds timeout) {
  // proc::run execs with the driver's environment; env sets the API version.
  std::vector<std::string> argv{"/usr/bin/env", "ETCDCTL_API=3", kEtcdctl, "--endpoints", endpoints};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, timeout);
}

EtcdCluster::EtcdCluster(const std::string& dir, size_t members,
                         std::chrono::milliseconds ready_within)
    : dir_(dir), token_("troupe-test-" + std::to_string(::getpid()) + "-" + std::to_string(free_port())) {
  start_all(members, ready_within);
}

EtcdCluster::EtcdCluster(const std::string& dir, EtcdTlsFiles tls, size_t members,
                         std::chrono::milliseconds ready_within)
    : dir_(dir),
      tls_(std::move(tls)),
      token_("troupe-test-" + std::to_string(::getpid()) + "-" + std::to_string(free_port())) {
  start_all(members, ready_within);
}

EtcdCluster::EtcdCluster(const std::string& dir, std::optional<EtcdTlsFiles> tls,
                         std::string client_host, size_t members,
                         std::chrono::milliseconds ready_within)
    : dir_(dir),
      tls_(std::move(tls)),
      client_host_(std::move(client_host)),
      token_("troupe-test-" + std::to_string(::getpid()) + "-" + std::to_string(free_port())) {
  start_all(members, ready_within);
}

void EtcdCluster::start_all(size_t members, std::chrono::milliseconds ready_within) {
  const std::string& dir = dir_;
  if (::access(kEtcd, X_OK) != 0 || ::access(kEtcdctl, X_OK) != 0)
    throw std::runtime_error(std::string("etcd is not installed (") + kEtcd + ", " + kEtcdctl +
                             "; Debian: apt-get install etcd-server etcd-client)");
  std::filesystem::create_directories(dir);  // the members' logs and data go there
  for (size_t i = 0; i < members; ++i) {
    EtcdMember m;
    m.name = "m" + std::to_string(i + 1);
    m.client_port = free_port();
    m.peer_port = free_port();
    m.data_dir = dir + "/" + m.name + ".data";
    m.log_path = dir + "/" + m.name + ".log";
    m.tls = tls_.has_value();
    m.client_host = client_host_;
    members_.push_back(std::move(m));
  }
  for (size_t i = 0; i < members; ++i)
    start(i);
  auto until = Clock::now() + ready_within;
  for (size_t i = 0; i < members; ++i) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    bool ok = wait_until([&] { return !members_[i].process.running() || healthy(i); },
                         std::max(left, std::chrono::milliseconds(1)), 100ms) &&
              members_[i].process.running();
    if (!ok) {
      std::string why = "etcd member " + members_[i].name + " is not healthy (" +
                        members_[i].process.describe_exit() + "); its log ends:\n" + log_tail(i);
      for (auto& m : members_)
        m.process.stop(2s);
      throw std::runtime_error(why);
    }
  }
}

EtcdCluster::~EtcdCluster() {
  for (auto& m : members_)
    if (m.process.running())
      m.process.stop(3s);  // SIGTERM, SIGKILL after the grace
}

std::vector<std::string> EtcdCluster::argv(size_t i, bool existing) const {
  const auto& m = members_[i];
  std::string initial;
  for (const auto& other : members_)
    initial += (initial.empty() ? "" : ",") + other.name + "=" + other.peer_url();
  std::vector<std::string> out{kEtcd,
          "--name", m.name,
          "--data-dir", m.data_dir,
          "--listen-client-urls", m.client_url(),
          "--advertise-client-urls", m.client_url(),
          "--listen-peer-urls", m.peer_url(),
          "--initial-advertise-peer-urls", m.peer_url(),
          "--initial-cluster", initial,
          "--initial-cluster-state", existing ? "existing" : "new",
          "--initial-cluster-token", token_,
          "--heartbeat-interval", "50",
          "--election-timeout", "500",
          "--logger", "zap",
          "--log-level", "warn"};
  if (tls_)
    out.insert(out.end(), {"--cert-file", tls_->cert_file, "--key-file", tls_->key_file,
                           "--trusted-ca-file", tls_->ca_file, "--client-cert-auth"});
  return out;
}

std::vector<std::string> EtcdCluster::etcdctl_flags() const {
  if (!tls_)
    return {};
  return {"--cacert", tls_->ca_file, "--cert", tls_->cert_file, "--key", tls_->key_file};
}

std::vector<std::string> EtcdCluster::client_urls() const {
  std::vector<std::string> out;
  for (const auto& m : members_)
    out.push_back(m.client_url());
  return out;
}

std::string EtcdCluster::endpoints() const {
  std::string out;
  for (const auto& url : client_urls())
    out += (out.empty() ? "" : ",") + url;
  return out;
}

void EtcdCluster::kill(size_t i) {
  auto& p = members_.at(i).process;
  if (!p.running())
    return;
  p.signal(SIGKILL);
  p.wait_exit(10s);
}

void EtcdCluster::stop(size_t i) {
  auto& p = members_.at(i).process;
  if (p.running())
    p.stop(10s);
}

void EtcdCluster::start(size_t i) {
  auto& m = members_.at(i);
  if (m.process.running())
    return;
  // A member that ran once has its data: it joins the cluster it belongs to.
  bool existing = m.started_once || std::filesystem::exists(m.data_dir + "/member");
  m.process = Child(argv(i, existing), m.log_path);
  m.started_once = true;
  // Until its exec the child is a copy of the driver, with the driver's
  // signal handlers (a test framework's SIGTERM handler would report a
  // crash from it): wait until it is etcd, so that stop(), kill() and the
  // destructor signal etcd, and processes_mentioning() sees the member.
  const std::string cmdline = "/proc/" + std::to_string(m.process.pid()) + "/cmdline";
  if (!wait_until([&] { return !m.process.running() || slurp(cmdline).find(m.data_dir) != std::string::npos; },
                  10s, 1ms))
    throw std::runtime_error("etcd member " + m.name + " did not exec " + kEtcd + " within 10 s");
}

bool EtcdCluster::healthy(size_t i, std::chrono::milliseconds timeout) {
  auto secs = std::max<long long>(1, std::chrono::duration_cast<std::chrono::seconds>(timeout).count());
  auto args = etcdctl_flags();
  args.insert(args.end(), {"--command-timeout", std::to_string(secs) + "s", "endpoint", "health"});
  auto r = etcdctl(members_.at(i).client_url(), args, timeout + 2s);
  return r.exit_code == 0;
}

size_t EtcdCluster::raft_leader() {
  for (size_t i = 0; i < members_.size(); ++i) {
    if (!members_[i].process.running())
      continue;
    // "URL, ID, VERSION, DB SIZE, IS LEADER, IS LEARNER, ..."
    auto args = etcdctl_flags();
    args.insert(args.end(), {"endpoint", "status"});
    auto r = etcdctl(members_[i].client_url(), args, 5s);
    if (r.exit_code != 0)
      continue;
    std::vector<std::string> fields;
    size_t at = 0;
    while (at <= r.out.size()) {
      auto end = r.out.find(',', at);
      auto field = r.out.substr(at, end == std::string::npos ? std::string::npos : end - at);
      field.erase(0, field.find_first_not_of(' '));
      fields.push_back(field);
      if (end == std::string::npos)
        break;
      at = end + 1;
    }
    if (fields.size() > 4 && fields[4] == "true")
      return i;
  }
  return members_.size();
}

bool EtcdCluster::has_quorum(std::chrono::milliseconds within) {
  return wait_until([&] {
    size_t ok = 0;
    for (size_t i = 0; i < members_.size(); ++i)
      if (members_[i].process.running() && healthy(i, 1s))
        ++ok;
    return ok * 2 > members_.size();
  }, within, 100ms);
}

std::string EtcdCluster::log_tail(size_t i, size_t lines) const {
  return tail_lines(slurp(members_.at(i).log_path), lines);
}

}  // namespace troupe::proc
