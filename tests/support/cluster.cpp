#include "tests/support/cluster.hpp"

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "tests/support/http_client.hpp"

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

namespace {

// What troupe-node logs when its stop watchdog ends the process
// (node/node_main.cpp).
constexpr const char* kStopWatchdogLine = "stopping did not complete in time";

// Each node runs in its state directory with core dumps on: with the usual
// core_pattern ("core") a crash leaves <state-dir>/core for gdb.
proc::ChildOptions node_options_in(const std::string& state_dir) {
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  proc::ChildOptions o;
  o.working_dir = state_dir;
  o.core_dumps = true;
  return o;
}

// A test that stops a node waits for no load balancer: no drain delay,
// unless the test gives one.
void no_drain_delay_unless_given(std::vector<std::string>& argv) {
  if (std::find(argv.begin(), argv.end(), "--drain-delay") == argv.end())
    argv.insert(argv.end(), {"--drain-delay", "0"});
}

std::string core_file_of(const ChildProcess& node) {
  const auto& cwd = node.options().working_dir;
  for (const auto& name : {std::string("core"), "core." + std::to_string(node.pid())}) {
    if (std::filesystem::exists(cwd + "/" + name))
      return cwd + "/" + name;
  }
  return cwd + "/core";
}

}  // namespace

Cluster::~Cluster() {
  for (const auto& problem : stop_all())
    FAIL_CHECK(problem);
}

std::vector<std::string> Cluster::stop_all(std::chrono::milliseconds grace) {
  std::vector<std::string> problems;
  std::map<std::string, bool> was_running;
  for (auto& [id, node] : nodes) {
    was_running[id] = node.running();
    if (was_running[id])
      node.signal(SIGTERM);  // all at once; stop() below waits for each
  }
  auto until = std::chrono::steady_clock::now() + grace;
  for (auto& [id, node] : nodes) {
    std::string what;
    if (was_running[id]) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      auto code = node.stop(std::max(left, std::chrono::milliseconds(100)));
      if (!code)
        what = "did not exit within " + std::to_string(grace.count() / 1000) + " s of SIGTERM";
      else if (*code != 0)
        what = node.describe_exit() + " after SIGTERM";
      else if (node.output().find(kStopWatchdogLine) != std::string::npos)
        // Its watchdog exits with the node's status, 0 for a stop that
        // should have been clean: the stop hung somewhere.
        what = "exited 0 after SIGTERM only by its stop watchdog (\"" +
               std::string(kStopWatchdogLine) + "\")";
    } else if (!node.fate_owned() && node.exit_code() && *node.exit_code() != 0) {
      what = node.describe_exit() + " during the test";
    }
    if (what.empty())
      continue;
    std::string report = "node " + id + " (pid " + std::to_string(node.pid()) + ") " + what +
                         "\n--- last lines of its output (" + node.output_path() + ") ---\n" +
                         proc::tail_lines(node.output(), 40);
    if (node.core_dumped()) {
      report +=
          "\n--- backtrace ---\n" + proc::backtrace_of(node.argv().front(), core_file_of(node));
    }
    problems.push_back(std::move(report));
  }
  nodes.clear();
  return problems;
}

ChildProcess& Cluster::start_head(const std::vector<std::string>& args) {
  if (!http_ports.count("head"))
    http_ports["head"] = free_port();
  if (!admin_ports.count("head"))
    admin_ports["head"] = free_port();
  std::vector<std::string> argv = {bin("troupe-node"), "--head",
                                   "--port",           std::to_string(port),
                                   "--state-dir",      dir / "head",
                                   "--http-port",      std::to_string(http_ports["head"]),
                                   "--admin-port",     std::to_string(admin_ports["head"])};
  argv.insert(argv.end(), liveness.begin(), liveness.end());
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  argv.insert(argv.end(), args.begin(), args.end());
  no_drain_delay_unless_given(argv);
  nodes.erase("head");
  return nodes.emplace("head", ChildProcess(argv, dir / "head.log", node_options_in(dir / "head")))
      .first->second;
}

ChildProcess& Cluster::start_candidate(const std::string& id, uint16_t port,
                                       const std::string& etcd,
                                       const std::vector<std::string>& args,
                                       const std::string& name) {
  return launch(id,
                {"--head", "--port", std::to_string(port), "--ha-etcd", etcd, "--ha-name",
                 name.empty() ? id : name},
                args);
}

ChildProcess& Cluster::start_worker(const std::string& id, const std::vector<std::string>& args) {
  return launch(id, {"--join", address}, args);
}

ChildProcess& Cluster::launch(const std::string& id, const std::vector<std::string>& role,
                              const std::vector<std::string>& args) {
  if (!http_ports.count(id))
    http_ports[id] = free_port();
  if (!admin_ports.count(id))
    admin_ports[id] = free_port();
  std::vector<std::string> argv = {bin("troupe-node")};
  argv.insert(argv.end(), role.begin(), role.end());
  argv.insert(argv.end(), {"--node-id", id, "--state-dir", dir / id, "--http-port",
                           std::to_string(http_ports[id]), "--admin-port",
                           std::to_string(admin_ports[id])});
  argv.insert(argv.end(), liveness.begin(), liveness.end());
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  argv.insert(argv.end(), args.begin(), args.end());
  no_drain_delay_unless_given(argv);
  nodes.erase(id);
  return nodes.emplace(id, ChildProcess(argv, dir / (id + ".log"), node_options_in(dir / id)))
      .first->second;
}

void Cluster::start(const std::vector<std::string>& workers, std::chrono::milliseconds deadline) {
  start(workers, {}, {}, deadline);
}

void Cluster::start(const std::vector<std::string>& workers,
                    const std::vector<std::string>& head_args,
                    const std::map<std::string, std::vector<std::string>>& worker_args,
                    std::chrono::milliseconds deadline) {
  start_head(head_args);
  std::map<std::string, std::string> expected{{"head", "ALIVE"}};
  for (const auto& id : workers) {
    auto args = worker_args.find(id);
    start_worker(id, args == worker_args.end() ? std::vector<std::string>{} : args->second);
    expected[id] = "ALIVE";
  }
  REQUIRE(wait_states(expected, deadline));
}

RunResult Cluster::ctl(const std::vector<std::string>& args,
                       std::chrono::milliseconds timeout) const {
  std::vector<std::string> argv = {bin("troupectl"), "--address", address};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, timeout);
}

std::map<std::string, std::string> Cluster::states() {
  std::vector<std::string> args = identity;
  args.insert(args.end(), {"--timeout", "2", "nodes", "--json"});
  auto r = ctl(args, 30s);
  std::map<std::string, std::string> out;
  if (r.exit_code != 0)
    return out;
  for (const auto& node : nlohmann::json::parse(r.out))
    out[node.at("id")] = node.at("state");
  return out;
}

nlohmann::json Cluster::status(std::chrono::milliseconds timeout) const {
  std::vector<std::string> args = identity;
  args.insert(args.end(), {"status", "--json"});
  auto r = ctl(args, timeout);
  if (r.exit_code != 0)
    return nullptr;
  auto parsed = nlohmann::json::parse(r.out, nullptr, false);
  return parsed.is_discarded() ? nullptr : parsed;
}

std::map<std::string, std::string> Cluster::running_replicas(
    const std::string& app, const std::string& deployment,
    std::chrono::milliseconds timeout) const {
  std::map<std::string, std::string> out;
  const auto s = status(timeout);
  const auto ptr = nlohmann::json::json_pointer("/applications/" + app + "/deployments/" +
                                                deployment + "/replicas");
  if (!s.is_object() || !s.contains(ptr))
    return out;
  for (const auto& replica : s.at(ptr)) {
    if (replica.value("state", "") == "RUNNING")
      out[replica.value("id", "")] = replica.value("node", "");
  }
  return out;
}

std::string Cluster::write(const std::string& file, const std::string& text) const {
  auto path = dir / file;
  std::ofstream(path) << text;
  return path;
}

void Cluster::deploy_yaml(const std::string& file, const std::string& yaml,
                          std::chrono::milliseconds timeout) {
  auto deployed = ctl({"deploy", write(file, yaml), "--wait"}, timeout);
  CAPTURE(deployed.err);
  REQUIRE(deployed.exit_code == 0);
}

bool Cluster::wait_answers(const std::string& node, const std::string& path,
                           std::chrono::milliseconds deadline) {
  return wait_all_answer(node, {path}, deadline);
}

bool Cluster::wait_all_answer(const std::string& node, const std::vector<std::string>& paths,
                              std::chrono::milliseconds deadline) {
  const uint16_t port = http_ports.at(node);
  return wait_until(
      [&] {
        for (const auto& path : paths) {
          auto r = http_get(port, path, 5);
          if (!r || r->status != 200)
            return false;
        }
        return true;
      },
      deadline, 100ms);
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
