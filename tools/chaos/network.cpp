#include "tools/chaos/network.hpp"

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

namespace chaos {

namespace {

constexpr const char* kNsPrefix = "troupe-chaos-";

std::string joined(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv)
    out += (out.empty() ? "" : " ") + a;
  return out;
}

std::string first_line(std::string text) {
  auto nl = text.find('\n');
  if (nl != std::string::npos)
    text.resize(nl);
  return text;
}

// The programs run without a shell: their full paths (sbin included, which
// a user's PATH may lack).
std::string find_program(const std::string& name) {
  std::string path = ::getenv("PATH") ? ::getenv("PATH") : "";
  path += ":/usr/sbin:/sbin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= path.size()) {
    auto end = path.find(':', start);
    if (end == std::string::npos)
      end = path.size();
    auto dir = path.substr(start, end - start);
    if (!dir.empty() && ::access((dir + "/" + name).c_str(), X_OK) == 0)
      return dir + "/" + name;
    start = end + 1;
  }
  return "";
}

const std::string& ip() {
  static const std::string path = find_program("ip");
  return path;
}

const std::string& iptables() {
  static const std::string path = find_program("iptables");
  return path;
}

const std::string& iptables_restore() {
  static const std::string path = find_program("iptables-restore");
  return path;
}

bool pid_alive(const std::string& digits) {
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos)
    return true;  // not ours: leave it
  return std::filesystem::exists("/proc/" + digits);
}

// Namespaces and bridges of runs whose process is gone (killed before its
// destructor ran).
void remove_leftovers() {
  auto r = run({ip(), "netns", "list"}, 10s);
  std::istringstream names(r.out);
  std::string line;
  while (std::getline(names, line)) {
    auto name = line.substr(0, line.find(' '));
    if (name.rfind(kNsPrefix, 0) != 0)
      continue;
    auto rest = name.substr(std::string(kNsPrefix).size());
    if (!pid_alive(rest.substr(0, rest.find('-'))))
      run({ip(), "netns", "del", name}, 10s);
  }
  auto links = run({ip(), "-o", "link", "show", "type", "bridge"}, 10s);
  std::istringstream rows(links.out);
  while (std::getline(rows, line)) {
    // "12: tcb1234: <...>"
    auto a = line.find(": ");
    auto b = a == std::string::npos ? a : line.find(':', a + 2);
    if (b == std::string::npos)
      continue;
    auto name = line.substr(a + 2, b - a - 2);
    if (name.rfind("tcb", 0) == 0 && !pid_alive(name.substr(3)))
      run({ip(), "link", "del", name}, 10s);
  }
}

}  // namespace

std::optional<std::string> Network::unavailable() {
  if (::geteuid() != 0)
    return "network namespaces need root (the suite runs as root)";
  if (ip().empty() || iptables().empty() || iptables_restore().empty())
    return std::string(ip().empty() ? "ip" : "iptables") +
           " is not installed (iproute2, iptables: ./troupe test installs them)";
  std::string probe = std::string(kNsPrefix) + std::to_string(::getpid()) + "-probe";
  auto r = run({ip(), "netns", "add", probe}, 10s);
  if (r.exit_code != 0)
    return "cannot create a network namespace: " + first_line(r.err);
  auto fw = run({ip(), "netns", "exec", probe, iptables(), "-w", "-L", "OUTPUT", "-n"}, 10s);
  run({ip(), "netns", "del", probe}, 10s);
  if (fw.exit_code != 0)
    return "iptables does not work in a network namespace: " + first_line(fw.err);
  return std::nullopt;
}

void Network::sh(const std::vector<std::string>& argv) {
  auto r = run(argv, 10s);
  if (r.exit_code != 0) {
    throw std::runtime_error("`" + joined(argv) + "` failed: " +
                             first_line(r.err.empty() ? r.out : r.err));
  }
}

Network::Network(const std::vector<std::string>& node_ids, std::string netdelay_binary,
                 std::string log_dir)
    : netdelay_(std::move(netdelay_binary)), log_dir_(std::move(log_dir)) {
  remove_leftovers();
  tag_ = std::to_string(::getpid());
  bridge_ = "tcb" + tag_;
  // A /24 that no interface of this host has.
  auto addrs = run({ip(), "-4", "-o", "addr", "show"}, 10s).out;
  for (int k = 0; k < 256; ++k) {
    std::string candidate = "10.213." + std::to_string((::getpid() + k) % 256) + ".";
    if (addrs.find(" " + candidate) == std::string::npos) {
      subnet_ = candidate;
      break;
    }
  }
  if (subnet_.empty())
    throw std::runtime_error("every 10.213.K.0/24 is taken on this host");
  try {
    sh({ip(), "link", "add", bridge_, "type", "bridge"});
    links_.push_back(bridge_);
    sh({ip(), "addr", "add", subnet_ + "1/24", "dev", bridge_});
    sh({ip(), "link", "set", bridge_, "up"});
    int i = 0;
    for (const auto& id : node_ids) {
      std::string ns = kNsPrefix + tag_ + "-" + id;
      std::string host_end = "tc" + tag_ + "v" + std::to_string(i);
      std::string node_end = "tc" + tag_ + "n" + std::to_string(i);
      std::string addr = subnet_ + std::to_string(2 + i);
      sh({ip(), "netns", "add", ns});
      ns_[id] = ns;
      sh({ip(), "link", "add", host_end, "type", "veth", "peer", "name", node_end});
      links_.push_back(host_end);
      sh({ip(), "link", "set", node_end, "netns", ns});
      sh({ip(), "link", "set", host_end, "master", bridge_, "up"});
      sh({ip(), "-n", ns, "link", "set", node_end, "name", "eth0"});
      sh({ip(), "-n", ns, "addr", "add", addr + "/24", "dev", "eth0"});
      sh({ip(), "-n", ns, "link", "set", "eth0", "up"});
      sh({ip(), "-n", ns, "link", "set", "lo", "up"});
      address_[id] = addr;
      ++i;
    }
  } catch (...) {
    teardown();
    throw;
  }
}

Network::~Network() {
  teardown();
}

void Network::teardown() {
  for (auto& f : faults_)
    remove(f, nullptr);
  faults_.clear();
  for (const auto& [id, ns] : ns_)
    run({ip(), "netns", "del", ns}, 10s);
  ns_.clear();
  // Deleting one end of a veth pair deletes both; the bridge last.
  for (auto it = links_.rbegin(); it != links_.rend(); ++it)
    run({ip(), "link", "del", *it}, 10s);
  links_.clear();
}

const std::string& Network::address(const std::string& node) const {
  return address_.at(node);
}

std::vector<std::string> Network::exec_prefix(const std::string& node) const {
  return {ip(), "netns", "exec", ns_.at(node)};
}

void Network::add_rule(Fault& f, const std::string& ns, std::vector<std::string> spec) {
  std::vector<std::string> argv = {ip(), "netns", "exec", ns, iptables(), "-w", "-A"};
  argv.insert(argv.end(), spec.begin(), spec.end());
  sh(argv);
  f.rules.push_back({ns, std::move(spec)});
}

// Every rule of a partition at once (one iptables-restore in the node's
// namespace): the cut is one moment, not a rule every ~100 ms.
void Network::apply(const std::string& ns, const char* verb,
                    const std::vector<std::vector<std::string>>& specs) {
  std::string file = log_dir_ + "/iptables-" + tag_ + "-" + std::to_string(next_queue_++) + ".rules";
  {
    std::ofstream out(file);
    out << "*filter\n";
    for (const auto& spec : specs)
      out << verb << " " << joined(spec) << "\n";
    out << "COMMIT\n";
  }
  sh({ip(), "netns", "exec", ns, iptables_restore(), "-w", "--noflush", file});
  std::filesystem::remove(file);
}

size_t Network::partition(const std::string& node, const std::vector<std::string>& peers,
                          Direction direction, const std::vector<uint16_t>& bridge_ports) {
  Fault f;
  const auto& ns = ns_.at(node);
  std::vector<std::vector<std::string>> specs;
  for (const auto& peer : peers) {
    const auto& addr = address_.at(peer);
    if (direction != Direction::in)
      specs.push_back({"OUTPUT", "-d", addr, "-j", "DROP"});
    if (direction != Direction::out)
      specs.push_back({"INPUT", "-s", addr, "-j", "DROP"});
  }
  // Only these ports of the bridge: the tool's own calls to the node
  // (load, troupectl) come from the bridge address too and must pass.
  for (uint16_t port : bridge_ports) {
    const auto p = std::to_string(port);
    if (direction != Direction::in)
      specs.push_back({"OUTPUT", "-d", bridge_address(), "-p", "tcp", "--dport", p, "-j", "DROP"});
    if (direction != Direction::out)
      specs.push_back({"INPUT", "-s", bridge_address(), "-p", "tcp", "--sport", p, "-j", "DROP"});
  }
  try {
    apply(ns, "-A", specs);  // all or nothing
    for (auto& spec : specs)
      f.rules.push_back({ns, std::move(spec)});
  } catch (...) {
    remove(f, nullptr);
    throw;
  }
  faults_.push_back(std::move(f));
  return faults_.size() - 1;
}

size_t Network::degrade(const std::string& node, const std::vector<std::string>& peers,
                        double delay_ms, double loss_pct, uint32_t seed) {
  Fault f;
  // One delayer in each namespace involved, for that namespace's packets
  // towards the other side: the node's to every peer, each peer's to it.
  std::map<std::string, std::vector<std::string>> towards;  // from -> to (node ids)
  for (const auto& peer : peers) {
    towards[node].push_back(peer);
    towards[peer].push_back(node);
  }
  try {
    for (const auto& [from, to] : towards) {
      Delayer d;
      d.ns = ns_.at(from);
      int queue = next_queue_++;
      d.output = log_dir_ + "/netdelay-" + from + "-" + std::to_string(queue) + ".log";
      auto argv = exec_prefix(from);
      argv.insert(argv.end(), {netdelay_, "--queue", std::to_string(queue), "--delay-ms",
                               std::to_string(delay_ms), "--loss-pct", std::to_string(loss_pct),
                               "--seed", std::to_string(seed + static_cast<uint32_t>(queue))});
      d.process = std::make_unique<Child>(argv, d.output);
      auto* child = d.process.get();
      std::string output = d.output;
      f.delayers.push_back(std::move(d));
      bool ready = wait_until(
          [&] { return !child->running() || slurp(output).find("ready\n") != std::string::npos; },
          5s, 10ms);
      if (!ready || !child->running()) {
        throw DelayUnavailable("this kernel cannot queue packets to a program (NFQUEUE): " +
                               first_line(slurp(output)));
      }
      for (const auto& peer : to) {
        try {
          add_rule(f, ns_.at(from),
                   {"OUTPUT", "-d", address_.at(peer), "-j", "NFQUEUE", "--queue-num",
                    std::to_string(queue)});
        } catch (const std::exception& e) {
          throw DelayUnavailable(std::string("this kernel cannot queue packets to a program "
                                             "(NFQUEUE): ") +
                                 e.what());
        }
      }
    }
  } catch (...) {
    remove(f, nullptr);
    throw;
  }
  faults_.push_back(std::move(f));
  return faults_.size() - 1;
}

void Network::remove(Fault& f, std::string* summary) {
  if (f.healed)
    return;
  f.healed = true;
  // Rules first: nothing is queued to a delayer once it stops. Those of one
  // namespace at once (the heal is one moment too); rule by rule, to say
  // which, when that fails.
  std::map<std::string, std::vector<std::vector<std::string>>> by_ns;
  for (const auto& rule : f.rules)
    by_ns[rule.ns].push_back(rule.spec);
  std::vector<Rule> left;
  for (const auto& [ns, specs] : by_ns) {
    try {
      apply(ns, "-D", specs);
    } catch (const std::exception&) {
      for (const auto& spec : specs)
        left.push_back({ns, spec});
    }
  }
  for (const auto& rule : left) {
    std::vector<std::string> argv = {ip(), "netns", "exec", rule.ns, iptables(), "-w", "-D"};
    argv.insert(argv.end(), rule.spec.begin(), rule.spec.end());
    auto r = run(argv, 10s);
    if (r.exit_code != 0 && summary)
      *summary += "could not remove `" + joined(rule.spec) + "`: " + first_line(r.err) + "; ";
  }
  for (auto& d : f.delayers) {
    if (d.process)
      d.process->stop(5s);
    if (summary) {
      // "seen N dropped M most-held K"
      auto out = slurp(d.output);
      auto at = out.find("seen ");
      *summary += d.ns.substr(d.ns.rfind('-') + 1) + ": " +
                  (at == std::string::npos ? "no count (" + first_line(out) + ")"
                                           : first_line(out.substr(at))) +
                  "; ";
    }
  }
}

std::string Network::heal(size_t handle) {
  std::string summary;
  if (handle < faults_.size())
    remove(faults_[handle], &summary);
  return summary;
}

}  // namespace chaos
