// A cluster of real nodes with a controller client of the test's own: what
// the integration tests that deploy through the client library start from.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <nlohmann/json.hpp>

#include "tests/support/cluster.hpp"
#include "tools/troupectl/client.hpp"

namespace troupe::testing {

struct ClientCluster {
  Cluster cluster;
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::optional<ControllerClient> client;

  // Starts the head (with `head_args`) and `workers`, waits until every node
  // is ALIVE and connects the client; REQUIREs each step.
  // `worker_args`: extra arguments of some workers, by id.
  void start(const std::vector<std::string>& workers,
             const std::vector<std::string>& head_args = {},
             const std::map<std::string, std::vector<std::string>>& worker_args = {});

  // Connects the client again (after a fault that dropped its connection to
  // the head); REQUIREs that it succeeds within `deadline`.
  void reconnect(std::chrono::milliseconds deadline = std::chrono::seconds(20));

  // `status --json`, parsed; REQUIREs that the call succeeds.
  nlohmann::json status();

  // The status of deployment `dep` of `app`; {} when it is absent or the
  // call failed (for polling while nodes come and go).
  nlohmann::json deployment(const std::string& app, const std::string& dep);

  // Waits until the deployment is HEALTHY with `n` replicas, all RUNNING;
  // on failure prints its last status and every node's output.
  bool wait_healthy(const std::string& app, const std::string& dep, size_t n,
                    std::chrono::milliseconds deadline = std::chrono::seconds(30));

  // Waits until the proxy of `node` routes (app, dep) to `n` replicas (its
  // admin listener's /-/routes); on failure prints the last routes it saw.
  bool wait_routed(const std::string& node, const std::string& app, const std::string& dep,
                   size_t n, std::chrono::milliseconds deadline = std::chrono::seconds(30));
};

}  // namespace troupe::testing
