#include "tests/support/cluster.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

namespace troupe::testing {

const std::vector<std::string> kFastLiveness = {"--node-timeout",
                                                "2",
                                                "--heartbeat-interval",
                                                "0.2",
                                                "--basp-heartbeat-interval",
                                                "0.5",
                                                "--basp-connection-timeout",
                                                "3",
                                                "--recovery-window",
                                                "1.5"};

ChildProcess& Cluster::start_head(const std::vector<std::string>& args) {
  if (!http_ports.count("head"))
    http_ports["head"] = free_port();
  std::vector<std::string> argv = {
      bin("troupe-node"), "--head",     "--port",      std::to_string(port),
      "--state-dir",      dir / "head", "--http-port", std::to_string(http_ports["head"])};
  argv.insert(argv.end(), liveness.begin(), liveness.end());
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  argv.insert(argv.end(), args.begin(), args.end());
  nodes.erase("head");
  return nodes.emplace("head", ChildProcess(argv, dir / "head.log")).first->second;
}

ChildProcess& Cluster::start_worker(const std::string& id, const std::vector<std::string>& args) {
  if (!http_ports.count(id))
    http_ports[id] = free_port();
  std::vector<std::string> argv = {bin("troupe-node"),
                                   "--join",
                                   address,
                                   "--node-id",
                                   id,
                                   "--state-dir",
                                   dir / id,
                                   "--http-port",
                                   std::to_string(http_ports[id])};
  argv.insert(argv.end(), liveness.begin(), liveness.end());
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  argv.insert(argv.end(), args.begin(), args.end());
  nodes.erase(id);
  return nodes.emplace(id, ChildProcess(argv, dir / (id + ".log"))).first->second;
}

std::map<std::string, std::string> Cluster::states() {
  auto r = run({bin("troupectl"), "--address", address, "--timeout", "2", "nodes", "--json"});
  std::map<std::string, std::string> out;
  if (r.exit_code != 0)
    return out;
  for (const auto& node : nlohmann::json::parse(r.out))
    out[node.at("id")] = node.at("state");
  return out;
}

bool Cluster::wait_states(const std::map<std::string, std::string>& expected,
                          std::chrono::milliseconds deadline) {
  std::map<std::string, std::string> last;
  bool ok = wait_until([&] { return (last = states()) == expected; }, deadline, 100ms);
  if (!ok) {
    std::string seen;
    for (auto& [id, state] : last)
      seen += id + "=" + state + " ";
    MESSAGE("last seen states: " << seen);
    dump_output();
  }
  return ok;
}

void Cluster::dump_output() {
  for (auto& [id, proc] : nodes)
    MESSAGE(id << " output:\n" << proc.output());
}

}  // namespace troupe::testing
