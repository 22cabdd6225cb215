// Hosts for a chaos run on one machine: every node in a Linux network
// namespace of its own, with a veth pair to a bridge in the tool's namespace
// and an address of its own (10.213.K.2, .3, ... of a /24 no interface here
// uses; the bridge is .1, from where the tool sends its load and troupectl).
// Faults between them are firewall rules inside the namespaces (iptables),
// so that the tool's own traffic is never cut:
//   partition: the node's packets to its peers, or theirs to it, dropped;
//   degrade:   both ways queued (NFQUEUE) to chaos-netdelay, which holds
//              each packet for a fixed delay or drops it.
// Needs root, iproute2 and iptables; everything is removed by the destructor,
// and leftovers of a run that was killed are removed by the next one.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tools/chaos/process.hpp"
#include "tools/chaos/scenario.hpp"

namespace chaos {

class Network {
 public:
  // Why node namespaces cannot be made here; nullopt when they can.
  static std::optional<std::string> unavailable();

  // Throws std::runtime_error naming the command that failed (whatever was
  // made before is removed).
  Network(const std::vector<std::string>& node_ids, std::string netdelay_binary,
          std::string log_dir);
  ~Network();
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  const std::string& address(const std::string& node) const;
  // The command prefix that runs a program in the node's namespace.
  std::vector<std::string> exec_prefix(const std::string& node) const;

  // A fault between `node` and `peers`; returns its handle for heal().
  // Throws std::runtime_error on a failed rule (nothing of it is left).
  // Must be called on the main thread (degrade starts processes).
  // `bridge_ports`: also the node's TCP traffic with these ports of the
  // bridge address (services the tool runs for the nodes, e.g. etcd).
  size_t partition(const std::string& node, const std::vector<std::string>& peers,
                   Direction direction, const std::vector<uint16_t>& bridge_ports = {});
  // The tool's own address on the bridge, reachable from every node.
  std::string bridge_address() const { return subnet_ + "1"; }
  size_t degrade(const std::string& node, const std::vector<std::string>& peers, double delay_ms,
                 double loss_pct, uint32_t seed);
  // Removes the fault's rules; returns what it did (degrade: packets
  // delayed and dropped per namespace). Never throws.
  std::string heal(size_t handle);

 private:
  struct Rule {
    std::string ns;
    std::vector<std::string> spec;  // iptables arguments after -A / -D
  };
  struct Delayer {
    std::string ns;
    std::string output;
    std::unique_ptr<Child> process;
  };
  struct Fault {
    std::vector<Rule> rules;
    std::vector<Delayer> delayers;
    bool healed = false;
  };

  void sh(const std::vector<std::string>& argv);
  void add_rule(Fault& f, const std::string& ns, std::vector<std::string> spec);
  // `verb` (-A, -D) of every spec in namespace `ns`, in one iptables-restore;
  // throws naming the command when it fails (then none applies).
  void apply(const std::string& ns, const char* verb,
             const std::vector<std::vector<std::string>>& specs);
  void remove(Fault& f, std::string* summary);
  void teardown();

  std::string tag_;
  std::string bridge_;
  std::string subnet_;  // "10.213.K."
  std::string netdelay_;
  std::string log_dir_;
  std::map<std::string, std::string> ns_;       // node -> namespace
  std::map<std::string, std::string> address_;  // node -> IPv4 address
  std::vector<std::string> links_;              // veth ends in the tool's namespace
  std::vector<Fault> faults_;
  int next_queue_ = 1;
};

// Thrown by degrade() when this kernel cannot queue packets to a program
// (no NFQUEUE): the fault is skipped, and the run says so.
struct DelayUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace chaos
