// A cluster of real troupe-node processes on loopback for integration tests.
// Every process is killed when the Cluster goes out of scope.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "tests/support/process.hpp"

namespace troupe::testing {

// Short liveness settings keep the suites fast; the logic is the same.
extern const std::vector<std::string> kFastLiveness;

struct Cluster {
  TempDir dir;
  uint16_t port = free_port();
  std::string address = "127.0.0.1:" + std::to_string(port);
  std::map<std::string, ChildProcess> nodes;
  std::map<std::string, uint16_t> http_ports;  // node id -> its proxy's port
  std::vector<std::string> extra_args;         // appended to every node's command line
  // The liveness options of every node (change before starting nodes).
  std::vector<std::string> liveness = kFastLiveness;

  ChildProcess& start_head(const std::vector<std::string>& args = {});
  ChildProcess& start_worker(const std::string& id, const std::vector<std::string>& args = {});

  // Node id -> state, as `troupectl nodes --json` reports it; empty when the
  // call failed.
  std::map<std::string, std::string> states();
  bool wait_states(const std::map<std::string, std::string>& expected,
                   std::chrono::milliseconds deadline);
  // Prints every node's output (for failed checks).
  void dump_output();
};

}  // namespace troupe::testing
