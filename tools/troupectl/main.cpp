// troupectl: the operator's client. Talks to the controller with CAF actor
// messages (never HTTP). Exit codes: 0 success, 1 failed operation, 2 bad usage.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>

#include <CLI/CLI.hpp>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <nlohmann/json.hpp>

#include "runtime/resources.hpp"
#include "runtime/system_setup.hpp"
#include "tools/troupectl/client.hpp"

using namespace troupe;

namespace {

int fail(int code, const std::string& message) {
  std::fprintf(stderr, "troupectl: error: %s\n", message.c_str());
  return code;
}

nlohmann::json resources_json(const std::string& text) {
  nlohmann::json out = nlohmann::json::object();
  if (auto r = parse_resources(text)) {
    for (const auto& [name, amount] : r->amounts)
      out[name] = amount;
  }
  return out;
}

void print_nodes(const std::vector<NodeStatus>& nodes, bool json) {
  if (json) {
    auto out = nlohmann::json::array();
    for (const auto& n : nodes) {
      out.push_back({{"id", n.id},
                     {"address", n.address},
                     {"state", n.state},
                     {"resources", resources_json(n.resources)},
                     {"last_heartbeat_age_s", n.last_heartbeat_age_ms / 1000.0},
                     {"reason", n.reason},
                     {"pid", n.pid}});
    }
    std::cout << out.dump(2) << "\n";
    return;
  }
  std::printf("%-16s %-22s %-9s %-28s %s\n", "ID", "ADDRESS", "STATE", "RESOURCES",
              "LAST HEARTBEAT");
  for (const auto& n : nodes) {
    char age[32];
    std::snprintf(age, sizeof(age), "%.1fs ago", n.last_heartbeat_age_ms / 1000.0);
    std::printf("%-16s %-22s %-9s %-28s %s\n", n.id.c_str(), n.address.c_str(), n.state.c_str(),
                n.resources.c_str(), age);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"troupectl: operate a troupe cluster", "troupectl"};
  app.require_subcommand(1);
  const char* env_address = std::getenv("TROUPE_ADDRESS");
  std::string address = env_address && *env_address ? env_address : "127.0.0.1:7300";
  double timeout_s = 10.0;
  app.add_option("--address", address, "controller HOST:PORT (env TROUPE_ADDRESS)")
      ->capture_default_str();
  app.add_option("--timeout", timeout_s, "seconds to wait for the controller")
      ->capture_default_str();

  auto* nodes_cmd = app.add_subcommand("nodes", "list the nodes of the cluster");
  bool json = false;
  nodes_cmd->add_flag("--json", json, "print a JSON array");

  auto* drain_cmd = app.add_subcommand("drain", "mark a node DRAINING");
  std::string drain_node;
  drain_cmd->add_option("NODE", drain_node, "node id")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    return fail(2, e.what());
  }
  auto endpoint = parse_endpoint(address);
  if (!endpoint)
    return fail(2, "--address: " + endpoint.status().message());
  if (!(timeout_s > 0))
    return fail(2, "--timeout must be > 0 seconds");

  caf::actor_system_config cfg;
  configure_actor_system(cfg, TransportOptions{});
  caf::actor_system sys{cfg};
  auto client = ControllerClient::connect(sys, *endpoint, timeout_s);
  if (!client)
    return fail(1, client.status().message());

  if (*nodes_cmd) {
    auto nodes = client->nodes();
    if (!nodes)
      return fail(1, nodes.status().message());
    print_nodes(*nodes, json);
    return 0;
  }
  if (*drain_cmd) {
    auto st = client->drain(drain_node);
    if (!st)
      return fail(1, st.message());
    std::printf("node %s is DRAINING\n", drain_node.c_str());
    return 0;
  }
  return fail(2, "no command given");
}
