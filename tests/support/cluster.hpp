// A cluster of real troupe-node processes on loopback for integration tests.
// When the Cluster goes out of scope it stops every node with SIGTERM and
// fails the test for each one that did not exit by itself with status 0
// within the grace period, or that died during the test from a signal the
// test did not send (naming the node, the signal, the last lines of its log
// and, when it dumped core, the backtrace of every thread).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/process.hpp"

namespace troupe::testing {

// Short liveness settings keep the suites fast; the logic is the same.
extern const std::vector<std::string> kFastLiveness;

struct Cluster {
  ~Cluster();
  TempDir dir;
  uint16_t port = free_port();
  std::string address = "127.0.0.1:" + std::to_string(port);
  std::map<std::string, ChildProcess> nodes;
  std::map<std::string, uint16_t> http_ports;  // node id -> its proxy's port
  // node id -> its admin listener's port (/-/metrics, /-/routes, the
  // dashboard: proxy/admin.cpp)
  std::map<std::string, uint16_t> admin_ports;
  std::vector<std::string> extra_args;  // appended to every node's command line
  // The liveness options of every node (change before starting nodes).
  std::vector<std::string> liveness = kFastLiveness;
  // troupectl's options for the cluster's own questions (states(), and so
  // start()): e.g. an operator's --tls-dir and --tls-name on a TLS cluster.
  std::vector<std::string> identity;

  ChildProcess& start_head(const std::vector<std::string>& args = {});
  ChildProcess& start_worker(const std::string& id, const std::vector<std::string>& args = {});
  // A head candidate of a highly available cluster: node `id`, also its
  // --ha-name, its controller on `port` while it leads, the election and
  // the checkpoint in the etcd members `etcd` (URL[,URL...]).
  // `name`: another --ha-name than the id.
  ChildProcess& start_candidate(const std::string& id, uint16_t port, const std::string& etcd,
                                const std::vector<std::string>& args = {},
                                const std::string& name = "");
  // Starts the head, then `workers` (in that order), and REQUIREs that every
  // node is ALIVE within `deadline`.
  void start(const std::vector<std::string>& workers = {},
             std::chrono::milliseconds deadline = std::chrono::seconds(20));
  // The same with extra arguments of the head and of some workers (by id).
  void start(const std::vector<std::string>& workers, const std::vector<std::string>& head_args,
             const std::map<std::string, std::vector<std::string>>& worker_args = {},
             std::chrono::milliseconds deadline = std::chrono::seconds(20));

  // Runs `troupectl --address <address> <args...>` to completion, killing it
  // at `timeout`: its exit code and output.
  RunResult ctl(const std::vector<std::string>& args,
                std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;

  // Node id -> state, as `troupectl nodes --json` reports it (asked with
  // `identity`); empty when the call failed.
  std::map<std::string, std::string> states();
  // `troupectl status --json` (asked with `identity`), parsed; null when the
  // call failed or its output is not JSON.
  nlohmann::json status(std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;
  // Replica id -> node of the RUNNING replicas of app/deployment in
  // status(); empty when there are none or the call failed.
  std::map<std::string, std::string> running_replicas(
      const std::string& app, const std::string& deployment,
      std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;
  bool wait_states(const std::map<std::string, std::string>& expected,
                   std::chrono::milliseconds deadline);
  // Starts node `id` with its role's arguments (`--join ADDRESS`, or a head
  // candidate's) and the cluster's ports, state dir and options, then
  // `args`.
  ChildProcess& launch(const std::string& id, const std::vector<std::string>& role,
                       const std::vector<std::string>& args);
  // Prints every node's output (for failed checks).
  void dump_output();

  // Writes `text` to <dir>/<file>; the file's path.
  std::string write(const std::string& file, const std::string& text) const;
  // Writes `yaml` to <dir>/<file> and deploys it with `troupectl deploy
  // --wait` (killed at `timeout`); REQUIREs that the deploy succeeds.
  void deploy_yaml(const std::string& file, const std::string& yaml,
                   std::chrono::milliseconds timeout = std::chrono::seconds(90));
  // True once GET `path` on node `node`'s proxy answers 200 (within
  // `deadline`).
  bool wait_answers(const std::string& node, const std::string& path,
                    std::chrono::milliseconds deadline = std::chrono::seconds(30));
  // True once GET of each of `paths` on node `node`'s proxy answers 200, all
  // in the same round (within `deadline`).
  bool wait_all_answer(const std::string& node, const std::vector<std::string>& paths,
                       std::chrono::milliseconds deadline = std::chrono::seconds(30));

  // Stops every node (SIGTERM to all, then waits up to `grace`) and returns
  // one report per node that did not end well: still running after the
  // grace, exited non-zero or by a signal (also earlier, unless the test
  // sent that signal or waited for that exit itself), or ended only by its
  // stop watchdog (which exits 0). Forgets the nodes.
  std::vector<std::string> stop_all(std::chrono::milliseconds grace = std::chrono::seconds(20));
};

}  // namespace troupe::testing
