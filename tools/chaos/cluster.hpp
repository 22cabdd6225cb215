// The cluster a chaos run starts: a head and N workers (troupe-node), each
// with its own state directory under the run directory, operated through
// troupectl. With highly available heads (cluster.heads > 1): head
// candidates h1..hN over an etcd cluster the tool starts too
// (tools/common/etcd_cluster.hpp), and every candidate's address given to
// the workers and troupectl. On 127.0.0.1 with free ports below 32768, or (network:
// namespaces) each in a network namespace of its own (tools/chaos/network.hpp).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/chaos/network.hpp"
#include "tools/chaos/process.hpp"
#include "tools/common/etcd_cluster.hpp"
#include "tools/common/tmpfs.hpp"
#include "tools/chaos/scenario.hpp"

namespace chaos {

struct Node {
  std::string id;
  std::string host = "127.0.0.1";  // where its HTTP proxy and ports listen
  uint16_t http_port = 0;
  std::string binary;  // troupe-node (argv may start with `ip netns exec`)
  std::vector<std::string> argv;
  std::string log_path;
  Child process;
  int starts = 0;
  bool frozen = false;
};

struct ShutdownResult {
  bool shutdown_command_ok = false;
  std::string shutdown_error;
  // Node id -> exit code (128 + signal when killed), as they ended.
  std::map<std::string, int> exit_codes;
  std::vector<std::string> needed_sigterm;  // did not stop after `shutdown --nodes`
  std::vector<std::string> needed_sigkill;  // did not stop after SIGTERM either
  std::vector<int> leftover_pids;           // still alive at the end: a violation
};

class Cluster {
 public:
  // Throws std::runtime_error when the hosts or the certificates cannot be
  // made.
  Cluster(std::string bin_dir, std::string plugin_dir, const ClusterSpec& spec, uint32_t seed,
          std::string run_dir);
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // Starts every node (from the main thread: see process.hpp) and waits
  // until `troupectl nodes` lists them all ALIVE; false with `error` set
  // otherwise.
  bool start(std::chrono::milliseconds deadline, std::string* error);

  // The heads' addresses, comma-separated (one without HA).
  const std::string& address() const { return address_; }
  bool ha() const { return spec_.ha(); }
  bool is_head(const std::string& id) const;
  // Its controller's host:port (a head's).
  std::string head_address(const std::string& id) const;
  // The etcd cluster under the heads; null without HA.
  troupe::proc::EtcdCluster* etcd() { return etcd_.get(); }
  std::vector<std::string> node_ids() const;
  Node& node(const std::string& id) { return nodes_.at(id); }
  bool has_node(const std::string& id) const { return nodes_.count(id) > 0; }

  // troupectl --address <controller> --timeout <timeout_s> args...
  RunResult ctl(const std::vector<std::string>& args, double timeout_s = 5) const;
  // The same against the given head addresses only.
  RunResult ctl_at(const std::string& address, const std::vector<std::string>& args,
                   double timeout_s) const;
  // `troupectl leader --json` asked of the heads (`head`: that one alone,
  // however it answers; empty: the list, following the leader).
  std::optional<nlohmann::json> leader_json(const std::string& head, double timeout_s,
                                            std::string* error = nullptr) const;
  // The node id of the leading head, as the first head that answers names
  // it; nullopt when none names one.
  std::optional<std::string> leader(double timeout_s) const;
  // Parsed JSON of `status --json` / `nodes --json`; nullopt when the call
  // failed (error in *error when given).
  std::optional<nlohmann::json> status_json(double timeout_s, std::string* error = nullptr) const;
  std::optional<nlohmann::json> nodes_json(double timeout_s, std::string* error = nullptr) const;

  // Process faults. Must run on the main thread (restart spawns).
  void kill9(const std::string& id);
  void restart(const std::string& id);
  void sigstop(const std::string& id);
  void sigcont(const std::string& id);

  // Asks every node to stop (`troupectl shutdown --nodes`), waits for them,
  // then SIGTERM, then SIGKILL, and checks that no process mentioning the run
  // directory is left.
  ShutdownResult shutdown(std::chrono::milliseconds graceful_deadline);

  // The hosts (network: namespaces), else null.
  Network* network() { return net_.get(); }
  // The head's state directory, a tmpfs when cluster.head_disk_mb is set.
  std::string head_state_dir() const { return run_dir_ + "/head"; }

  // The output of every node (for a failed run).
  std::string logs_tail(size_t bytes_per_node) const;

 private:
  void spawn(Node& n);
  void start_etcd();

  std::string bin_dir_;
  std::string plugin_dir_;
  ClusterSpec spec_;
  std::string run_dir_;
  uint16_t port_ = 0;
  std::string address_;
  std::map<std::string, std::string> head_address_;  // head id -> host:port
  std::string tls_dir_;  // empty: no TLS
  std::unique_ptr<troupe::proc::EtcdCluster> etcd_;
  std::unique_ptr<Network> net_;
  std::unique_ptr<troupe::proc::Tmpfs> head_disk_;
  std::map<std::string, Node> nodes_;
};

}  // namespace chaos
