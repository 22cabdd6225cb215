// chaos: runs a scenario of scripted faults under load against a cluster it
// starts itself, and reports whether the cluster kept its promises.
//
//   chaos --scenario FILE [--bin-dir DIR] [--plugin-dir DIR] [--seed N]
//         [--json] [--json-file PATH] [--poll-ms N] [--no-load] [--keep]
//
// Exit codes: 0 every invariant holds and every goal of the scenario is met;
// 1 a violation, a missed goal, or a run that could not be set up; 2 bad
// usage or a bad scenario file; 130 interrupted.
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <mutex>
#include <queue>
#include <random>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "tools/chaos/cluster.hpp"
#include "tools/chaos/http_client.hpp"
#include "tools/chaos/load.hpp"
#include "tools/chaos/monitor.hpp"
#include "tools/chaos/process.hpp"
#include "tools/chaos/report.hpp"
#include "tools/chaos/scenario.hpp"

namespace chaos {
namespace {

const char* kUsage = R"(chaos: scripted faults under load against a troupe cluster it starts itself

usage: chaos --scenario FILE [options]

  --scenario FILE     scenario YAML (tools/chaos/scenarios/*.yaml; schema in docs/reliability.md)
  --bin-dir DIR       where troupe-node and troupectl are (default: this program's directory)
  --plugin-dir DIR    deployment libraries for the nodes (default: BIN_DIR/../plugins)
  --seed N            seed of every random choice (default: the scenario's seed)
  --json              print the report as JSON instead of text
  --json-file PATH    also write the JSON report to PATH
  --poll-ms N         interval of status/nodes polls and proxy probes (default 100)
  --no-load           run the faults without the HTTP load (no proxy needed)
  --keep              keep the run directory (node logs, state) after the run

exit: 0 all invariants hold and all goals are met; 1 otherwise; 2 bad usage; 130 interrupted
)";

struct Options {
  std::string scenario;
  std::string bin_dir;
  std::string plugin_dir;
  std::optional<uint32_t> seed;
  bool json = false;
  std::string json_file;
  int poll_ms = 100;
  bool no_load = false;
  bool keep = false;
};

std::string self_dir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0)
    return ".";
  std::string p(buf, static_cast<size_t>(n));
  return p.substr(0, p.rfind('/'));
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

constexpr double kNever = std::numeric_limits<double>::infinity();

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Clock::time_point at(Clock::time_point t0, double s) {
  return t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f s", s);
  return buf;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' '))
    s.pop_back();
  return s;
}

// A step of the fault schedule.
struct Step {
  double t_s;
  size_t spec;  // index into scenario.faults
  enum Phase { fire, restart, resume, heal, etcd_start } phase;
  size_t event;  // restart/resume/heal/etcd_start: index of the FaultEvent they end
  bool operator>(const Step& o) const { return t_s > o.t_s; }
};

// Watches the head a partition_leader cut off, asking it alone (every
// 100 ms) whether it leads and whom it names: from the cut until it names
// another head as leader after the heal (heal_s, set by the schedule), or
// until the run stops watching. `stepped_down_s`: its first "I do not lead".
struct LeaderWatch {
  size_t index = 0;  // into RunData::faults
  std::string head;
  std::atomic<double> heal_s{-1};
  std::thread thread;
  double stepped_down_s = -1;
  double follows_s = -1;
  std::string last;  // what it said last
};

// A poisoned request in flight: sent from its own thread so that a slow or
// hanging answer does not hold up the fault schedule; `result` is copied
// into the run's fault list once the thread is joined.
struct PoisonCall {
  size_t index = 0;  // into RunData::faults
  FaultEvent result;
  std::thread thread;
};

// The replicas whose logs (<state-dir>/logs/replicas/<id>.log of every node)
// carry `marker` on a line of its own: the ones a marked request reached.
std::vector<std::pair<std::string, std::string>> replicas_marked(
    const std::string& run_dir, const std::vector<std::string>& nodes, const std::string& marker) {
  namespace fs = std::filesystem;
  std::vector<std::pair<std::string, std::string>> out;  // id, node
  for (const auto& node : nodes) {
    std::error_code ec;
    for (const auto& e :
         fs::directory_iterator(fs::path(run_dir) / node / "logs" / "replicas", ec)) {
      auto name = e.path().filename().string();
      auto dot = name.find(".log");
      if (dot == std::string::npos)
        continue;
      std::string text = "\n" + slurp(e.path().string());
      if (text.find("\n" + marker + "\n") != std::string::npos)
        out.emplace_back(name.substr(0, dot), node);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

class Runner {
 public:
  Runner(Options opts, Scenario scenario, std::string command) : opts_(std::move(opts)), rng_(0) {
    run_.scenario = std::move(scenario);
    run_.scenario_path = opts_.scenario;
    run_.command = std::move(command);
    run_.seed = opts_.seed.value_or(run_.scenario.seed);
    run_.poll_ms = opts_.poll_ms;
    rng_.seed(run_.seed);
  }

  RunData& go() {
    auto wall_start = Clock::now();
    run_.started_utc = utc_now();
    if (opts_.keep)
      dir_.keep();
    const auto& sc = run_.scenario;
    try {
      cluster_ = std::make_unique<Cluster>(opts_.bin_dir, opts_.plugin_dir, sc.cluster, run_.seed,
                                           dir_.path());
    } catch (const std::exception& e) {
      run_.setup_error = e.what();
      run_.wall_s = since(wall_start);
      analyze(run_);
      return run_;
    }
    for (const auto& id : cluster_->node_ids()) {
      run_.http_ports[id] = cluster_->node(id).http_port;
      endpoints_[id] = {cluster_->node(id).host, cluster_->node(id).http_port};
    }
    run_.load_enabled = sc.has_load && !opts_.no_load;
    if (opts_.keep)
      run_.notes.push_back("run directory kept: " + dir_.path());
    try {
      body();
    } catch (const std::exception& e) {
      run_.setup_error = std::string("unexpected error: ") + e.what();
    }
    join_poison_calls();
    join_exit_watchers();
    join_leader_watches();
    if (monitor_) {
      monitor_->stop();
      run_.observations = monitor_->observations();
    }
    if (load_) {
      load_->stop();
      run_.load = load_->result();
    }
    run_.shutdown = cluster_->shutdown(30s);
    run_.invariants.push_back({"no troupe process left behind", run_.shutdown.leftover_pids.empty(),
                               run_.shutdown.leftover_pids.empty()
                                   ? "every node process started by the run has exited"
                                   : std::to_string(run_.shutdown.leftover_pids.size()) +
                                         " processes still ran after the shutdown (killed now)"});
    {
      // Every node the run did not kill for good exits by itself with status
      // 0 when stopped (a crash at shutdown is a bug too).
      Check c{"every node exits by itself with status 0 at the shutdown", true, ""};
      for (const auto& id : cluster_->node_ids()) {
        if (dead_.count(id))
          continue;
        auto& n = cluster_->node(id);
        bool killed = std::find(run_.shutdown.needed_sigkill.begin(),
                                run_.shutdown.needed_sigkill.end(),
                                id) != run_.shutdown.needed_sigkill.end();
        if (!killed && n.process.exit_code() == 0)
          continue;
        c.ok = false;
        c.detail += id + (killed ? " needed SIGKILL" : " " + n.process.describe_exit()) +
                    " (log " + n.log_path + ")";
        if (n.process.core_dumped()) {
          c.detail += "\n" + troupe::proc::backtrace_of(n.binary,
                                                n.process.options().working_dir + "/core");
        }
        c.detail += "; ";
      }
      if (c.ok)
        c.detail = "every node exited with status 0";
      run_.invariants.push_back(c);
    }
    run_.interrupted = g_interrupted.load();
    run_.wall_s = since(wall_start);
    analyze(run_);
    if (!run_.ok && !opts_.keep) {
      // A failing run keeps the node logs for the post-mortem.
      dir_.keep();
      run_.notes.push_back("run failed: node logs kept in " + dir_.path());
    }
    return run_;
  }

 private:
  void body() {
    const auto& sc = run_.scenario;
    std::string error;
    if (!cluster_->start(30s, &error)) {
      run_.setup_error = error;
      return;
    }
    // Deploy exactly the scenario's config, and wait until it runs.
    std::string deploy_file = dir_ / "deploy.yaml";
    {
      YAML::Emitter em;
      em << sc.deploy;
      std::ofstream(deploy_file) << em.c_str() << "\n";
    }
    auto dep = cluster_->ctl({"deploy", deploy_file, "--wait", "--wait-timeout", "60"}, 10);
    if (dep.exit_code != 0) {
      run_.setup_error = "deploy failed: " + trim(dep.err.empty() ? dep.out : dep.err);
      return;
    }
    auto acked = cluster_->status_json(5, &error);
    if (!acked) {
      run_.setup_error = "status after deploy failed: " + error;
      return;
    }
    acknowledged_ = *acked;
    for (const auto& app : sc.deploy["applications"])
      declared_apps_.insert(app["name"] ? app["name"].as<std::string>() : "default");

    // Load, monitor and faults share t0.
    t0_ = Clock::now();
    std::map<std::string, Endpoint> load_ports;
    if (run_.load_enabled) {
      auto via = sc.load.via;
      if (via.empty())
        via = cluster_->node_ids();
      for (const auto& id : via) {
        if (!cluster_->has_node(id))
          throw std::runtime_error("load.via names unknown node '" + id + "'");
        load_ports[id] = endpoints_.at(id);
      }
    }
    monitor_ = std::make_unique<Monitor>(
        *cluster_, run_.load_enabled ? endpoints_ : std::map<std::string, Endpoint>{},
        run_.load_enabled ? sc.load.paths.front() : "", t0_,
        std::chrono::milliseconds(opts_.poll_ms));
    monitor_->start();
    if (run_.load_enabled) {
      load_ = std::make_unique<LoadGenerator>(sc.load, load_ports, t0_);
      load_->start();
    }

    run_schedule();
    // The poisoned requests still in flight are bounded by their timeout.
    join_poison_calls();
    if (g_interrupted.load())
      return;

    // Convergence after the last fault (and every replica a poisoned request
    // crashed gone).
    double after = run_.last_fault_s.value_or(0);
    std::set<std::string> victims;
    for (const auto& f : run_.faults)
      victims.insert(f.victims.begin(), f.victims.end());
    auto victims_gone = [&](const Observation& o) {
      for (const auto& v : victims) {
        if (o.replica_ids.count(v))
          return false;
      }
      return true;
    };
    auto deadline =
        std::chrono::milliseconds(static_cast<int64_t>(sc.convergence_deadline_s * 1000));
    auto converged = monitor_->await(
        after,
        [&](const Observation& o) {
          return o.healthy() && nodes_as_expected(o, nullptr) && victims_gone(o);
        },
        deadline);
    if (converged) {
      run_.converged_at_s = converged->state_end_s;
    } else {
      auto last = monitor_->observe();
      std::string why = last.unhealthy_reason();
      nodes_as_expected(last, &why);
      if (!victims_gone(last))
        why += "; a replica a poisoned request crashed is still listed";
      if (why.rfind("; ", 0) == 0)
        why.erase(0, 2);
      run_.convergence_detail =
          "within " + seconds(sc.convergence_deadline_s) + "; last seen: " + why;
    }
    run_.invariants.push_back(
        {"converged after the faults (apps RUNNING, deployments HEALTHY at target, nodes as "
         "expected)",
         converged.has_value(),
         converged ? "after " + seconds(*run_.converged_at_s - after) : run_.convergence_detail});

    // The load runs its full duration.
    if (load_) {
      sleep_until(at(t0_, sc.load.duration_s));
      load_->stop();
    }
    monitor_->stop();
    if (g_interrupted.load())
      return;  // no verdict on an interrupted run; the shutdown still runs
    final_checks();
  }

  // Which node states the run expects at the end: DRAINING for drained
  // nodes, DEAD for killed nodes that were not restarted, ALIVE otherwise;
  // every node's pid must be the process the run started.
  bool nodes_as_expected(const Observation& o, std::string* why) {
    if (!o.nodes_ok)
      return false;
    for (const auto& id : cluster_->node_ids()) {
      std::string want = "ALIVE";
      if (drained_.count(id))
        want = "DRAINING";
      if (dead_.count(id))
        want = "DEAD";
      if (left_.count(id))
        want = "missing";  // it deregistered
      auto it = o.node_state.find(id);
      std::string have = it == o.node_state.end() ? "missing" : it->second;
      if (have != want) {
        if (why)
          *why += "; node " + id + " is " + have + ", expected " + want;
        return false;
      }
    }
    if (o.node_state.size() != cluster_->node_ids().size() - left_.size()) {
      if (why)
        *why += "; nodes --json lists unknown nodes";
      return false;
    }
    return true;
  }

  void run_schedule() {
    const auto& sc = run_.scenario;
    std::priority_queue<Step, std::vector<Step>, std::greater<Step>> steps;
    for (size_t i = 0; i < sc.faults.size(); ++i) {
      const auto& f = sc.faults[i];
      if (f.every_s <= 0) {
        steps.push({f.start_s, i, Step::fire, 0});
        continue;
      }
      for (double t = f.start_s; t <= f.stop_s + 1e-9; t += f.every_s)
        steps.push({t, i, Step::fire, 0});
    }
    while (!steps.empty() && !g_interrupted.load()) {
      Step s = steps.top();
      steps.pop();
      sleep_until(at(t0_, s.t_s));
      if (g_interrupted.load())
        return;
      const auto& spec = sc.faults[s.spec];
      if (s.phase == Step::restart) {
        auto& ev = run_.faults[s.event];
        ev.end_s = since(t0_);
        cluster_->restart(ev.node);
        down_.erase(ev.node);
        run_.last_fault_s = ev.end_s;
        continue;
      }
      if (s.phase == Step::heal && spec.kind == FaultKind::fill_disk) {
        auto& ev = run_.faults[s.event];
        ev.end_s = since(t0_);
        free_disk(ev);
        run_.last_fault_s = ev.end_s;
        continue;
      }
      if (s.phase == Step::etcd_start) {
        auto& ev = run_.faults[s.event];
        ev.end_s = since(t0_);
        for (size_t m : ev.etcd_members)
          cluster_->etcd()->start(m);
        run_.last_fault_s = ev.end_s;
        continue;
      }
      if (s.phase == Step::heal) {
        auto& ev = run_.faults[s.event];
        ev.end_s = since(t0_);
        for (auto& w : leader_watches_) {
          if (w->index == s.event)
            w->heal_s = ev.end_s;
        }
        auto done = cluster_->network()->heal(ev.net_handle);
        if (!done.empty())
          ev.network_detail += "; healed: " + done.substr(0, done.size() - 2);
        down_.erase(ev.node);
        run_.last_fault_s = ev.end_s;
        continue;
      }
      if (s.phase == Step::resume) {
        auto& ev = run_.faults[s.event];
        ev.end_s = since(t0_);
        cluster_->sigcont(ev.node);
        down_.erase(ev.node);
        run_.last_fault_s = ev.end_s;
        continue;
      }
      FaultEvent ev = inject(spec, s.spec);
      run_.last_fault_s = ev.t_s;
      run_.faults.push_back(ev);
      size_t index = run_.faults.size() - 1;
      if (!ev.ok)
        continue;
      if (spec.kind == FaultKind::poison)
        send_poison(spec, index);
      if ((spec.kind == FaultKind::kill9_node || spec.kind == FaultKind::kill_leader) &&
          spec.restart_after_s >= 0)
        steps.push({ev.t_s + spec.restart_after_s, s.spec, Step::restart, index});
      if (spec.kind == FaultKind::kill_etcd_member && spec.restart_after_s >= 0)
        steps.push({ev.t_s + spec.restart_after_s, s.spec, Step::etcd_start, index});
      if (spec.kind == FaultKind::etcd_quorum_loss)
        steps.push({ev.t_s + spec.duration_s, s.spec, Step::etcd_start, index});
      if (spec.kind == FaultKind::partition_leader) {
        watch_leader(index);
        if (spec.probe_deploy)
          probe_deploy(run_.faults[index], cluster_->head_address(run_.faults[index].node));
      }
      if (spec.kind == FaultKind::sigstop_node)
        steps.push({ev.t_s + spec.duration_s, s.spec, Step::resume, index});
      if (network_fault(spec.kind) || spec.kind == FaultKind::fill_disk)
        steps.push({ev.t_s + spec.duration_s, s.spec, Step::heal, index});
      if (spec.kind == FaultKind::sigterm_node)
        watch_exit(index);
    }
  }

  // A node for a node fault: named, or picked at random among the nodes
  // that are up (neither killed nor frozen).
  std::optional<std::string> pick_node(const std::string& which, size_t spec_index) {
    if (which == "round_robin") {
      // Every node that is up, in turn (by id).
      std::vector<std::string> up;
      for (const auto& id : cluster_->node_ids()) {
        if (!down_.count(id) && !dead_.count(id) && !left_.count(id))
          up.push_back(id);
      }
      if (up.empty())
        return std::nullopt;
      return up[round_robin_[spec_index]++ % up.size()];
    }
    if (which == "busiest" || which == "busiest_worker") {
      // The node holding the most replicas right now (ties: the first id).
      auto status = cluster_->status_json(2);
      if (!status)
        return std::nullopt;
      std::map<std::string, int> count;
      for (const auto& [app, a] : (*status)["applications"].items()) {
        for (const auto& [dname, d] : a["deployments"].items()) {
          for (const auto& r : d["replicas"])
            ++count[r.value("node", "")];
        }
      }
      std::optional<std::string> best;
      int most = -1;
      for (const auto& id : cluster_->node_ids()) {
        if (down_.count(id) || dead_.count(id) || left_.count(id) ||
            (which == "busiest_worker" && cluster_->is_head(id)))
          continue;
        if (count[id] > most) {
          most = count[id];
          best = id;
        }
      }
      return best;
    }
    if (which == "leader")
      return cluster_->leader(2);
    if (which != "random" && which != "random_worker") {
      if (!cluster_->has_node(which))
        return std::nullopt;
      return which;
    }
    std::vector<std::string> candidates;
    for (const auto& id : cluster_->node_ids()) {
      if (down_.count(id) || dead_.count(id) || left_.count(id))
        continue;
      if (which == "random_worker" && cluster_->is_head(id))
        continue;
      candidates.push_back(id);
    }
    if (candidates.empty())
      return std::nullopt;
    std::uniform_int_distribution<size_t> pick(0, candidates.size() - 1);
    return candidates[pick(rng_)];
  }

  FaultEvent inject(const FaultSpec& spec, size_t spec_index) {
    FaultEvent ev;
    ev.kind = spec.kind;
    ev.max_recovery_s = spec.max_recovery_s;
    auto command = [&](const std::vector<std::string>& args) {
      ev.t_s = since(t0_);
      auto r = cluster_->ctl(args, 2);
      ev.ok = r.exit_code == 0;
      if (!ev.ok)
        ev.message = r.exit_code < 0 ? "troupectl timed out" : trim(r.err);
    };
    if (spec.kind == FaultKind::kill_replica) {
      std::string error;
      ev.t_s = since(t0_);
      auto status = cluster_->status_json(2, &error);
      if (!status) {
        ev.message = "no status to pick a replica from: " + error;
        return ev;
      }
      std::vector<std::pair<std::string, std::string>> candidates;  // id, node
      for (const auto& [app, a] : (*status)["applications"].items()) {
        if (!spec.app.empty() && app != spec.app)
          continue;
        for (const auto& [dname, d] : a["deployments"].items()) {
          if (!spec.deployment.empty() && dname != spec.deployment)
            continue;
          for (const auto& r : d["replicas"]) {
            if (r.value("state", "") == "RUNNING")
              candidates.emplace_back(r.value("id", ""), r.value("node", ""));
          }
        }
      }
      if (candidates.empty()) {
        ev.message = "no RUNNING replica to kill";
        return ev;
      }
      std::sort(candidates.begin(), candidates.end());
      std::uniform_int_distribution<size_t> pick(0, candidates.size() - 1);
      auto [id, node] = candidates[pick(rng_)];
      ev.victim = id;
      ev.node = node;
      command({"kill", "replica", id});
      return ev;
    }
    if (spec.kind == FaultKind::kill_controller) {
      ev.node = "head";
      command({"kill", "controller"});
      return ev;
    }
    if (spec.kind == FaultKind::redeploy || spec.kind == FaultKind::rollback) {
      release(spec, ev);
      return ev;
    }
    if (etcd_fault(spec.kind)) {
      etcd_fault_on(spec, ev);
      return ev;
    }
    auto node = pick_node(spec.node, spec_index);
    ev.t_s = since(t0_);
    if (!node) {
      ev.message = "no node '" + spec.node + "' to hit";
      return ev;
    }
    ev.node = *node;
    switch (spec.kind) {
      case FaultKind::kill_proxy:
        command({"kill", "proxy", *node});
        break;
      case FaultKind::kill_agent:
        command({"kill", "agent", *node});
        break;
      case FaultKind::drain_node:
        command({"drain", *node});
        if (ev.ok)
          drained_.insert(*node);
        break;
      case FaultKind::sigterm_node:
        ev.t_s = since(t0_);
        cluster_->node(*node).process.signal(SIGTERM);
        ev.ok = true;
        left_.insert(*node);
        break;
      case FaultKind::kill9_node:
      case FaultKind::kill_leader:
        ev.t_s = since(t0_);
        cluster_->kill9(*node);
        ev.ok = true;
        down_.insert(*node);
        if (spec.restart_after_s < 0)
          dead_.insert(*node);
        // The next leader drops the head it took over from from the node
        // list (it will not wait for it): expected gone, not DEAD.
        if (spec.restart_after_s < 0 && spec.kind == FaultKind::kill_leader)
          left_.insert(*node);
        break;
      case FaultKind::sigstop_node:
        ev.t_s = since(t0_);
        cluster_->sigstop(*node);
        ev.ok = true;
        down_.insert(*node);
        break;
      case FaultKind::partition:
      case FaultKind::degrade:
        network_fault_on(spec, *node, ev);
        break;
      case FaultKind::partition_leader:
        network_fault_on(spec, *node, ev);  // the probe deploy once it is watched
        break;
      case FaultKind::fill_disk:
        fill_disk(ev);
        break;
      case FaultKind::poison: {
        // The request itself is sent by send_poison(), at once.
        size_t n = poison_count_++;
        ev.path = spec.paths[n % spec.paths.size()];
        if (!spec.mark.empty()) {
          ev.marker = "chaos-poison-" + std::to_string(n + 1);
          ev.path +=
              (ev.path.find('?') == std::string::npos ? "?" : "&") + spec.mark + "=" + ev.marker;
        }
        ev.t_s = since(t0_);
        ev.ok = true;
        break;
      }
      default:
        break;
    }
    return ev;
  }

  // A new release (troupectl deploy of the fault's config, without --wait)
  // or a rollback (troupectl rollback APP). Once accepted, the declaration
  // is the acknowledged one the final checks compare with.
  void release(const FaultSpec& spec, FaultEvent& ev) {
    ev.app = spec.app;
    ev.deployment = spec.deployment;
    std::vector<std::string> args;
    if (spec.kind == FaultKind::redeploy) {
      std::string file = dir_ / ("redeploy-" + std::to_string(++redeploys_) + ".yaml");
      YAML::Emitter em;
      em << spec.deploy;
      std::ofstream(file) << em.c_str() << "\n";
      args = {"deploy", file};
    } else {
      args = {"rollback", spec.app};
    }
    ev.t_s = since(t0_);
    auto r = cluster_->ctl(args, 10);
    ev.acked_s = since(t0_);
    ev.ok = r.exit_code == 0;
    ev.reply = trim(r.out);
    if (!ev.ok) {
      ev.message = r.exit_code < 0 ? "troupectl timed out"
                                   : trim(r.err.empty() ? r.out : r.err);
      return;
    }
    if (spec.kind == FaultKind::redeploy) {
      declared_apps_.clear();
      for (const auto& app : spec.deploy["applications"])
        declared_apps_.insert(app["name"] ? app["name"].as<std::string>() : "default");
    }
    if (auto st = cluster_->status_json(5))
      acknowledged_ = *st;
  }

  // The peers a partition or degrade cuts `node` off from.
  std::vector<std::string> peers_of(const std::string& from, const std::string& node) const {
    std::vector<std::string> out;
    for (const auto& id : cluster_->node_ids()) {
      if (id == node)
        continue;
      if (from == id || from == "all" || (from == "workers" && !cluster_->is_head(id)))
        out.push_back(id);
    }
    return out;
  }

  void network_fault_on(const FaultSpec& spec, const std::string& node, FaultEvent& ev) {
    ev.peers = peers_of(spec.from, node);
    std::string peers;
    for (const auto& p : ev.peers)
      peers += (peers.empty() ? "" : ",") + p;
    if (spec.kind == FaultKind::partition)
      ev.network_detail = "from " + peers + ", " +
                          (spec.direction == Direction::both  ? "both ways"
                           : spec.direction == Direction::out ? "its packets out lost"
                                                              : "packets to it lost");
    else
      ev.network_detail = "with " + peers + ": " + std::to_string(static_cast<int>(spec.delay_ms)) +
                          " ms delay and " + std::to_string(spec.loss_pct).substr(0, 4) +
                          " % loss, each way";
    if (ev.peers.empty()) {
      ev.message = "no peer '" + spec.from + "' to cut " + node + " off from";
      return;
    }
    // A leader is cut off from the etcd members too (on the bridge).
    std::vector<uint16_t> etcd_ports;
    if (spec.kind == FaultKind::partition_leader) {
      for (size_t i = 0; i < cluster_->etcd()->size(); ++i)
        etcd_ports.push_back(cluster_->etcd()->member(i).client_port);
      ev.network_detail += " and the etcd members";
    }
    try {
      ev.t_s = since(t0_);
      if (spec.kind == FaultKind::partition || spec.kind == FaultKind::partition_leader) {
        ev.net_handle =
            cluster_->network()->partition(node, ev.peers, spec.direction, etcd_ports);
        ev.cut_s = since(t0_);
        ev.network_detail += " (rules in place after " + seconds(ev.cut_s - ev.t_s) + ")";
        down_.insert(node);
      } else {
        ev.net_handle = cluster_->network()->degrade(node, ev.peers, spec.delay_ms, spec.loss_pct,
                                                     run_.seed);
      }
      ev.ok = true;
    } catch (const DelayUnavailable& e) {
      ev.skipped = true;
      ev.message = e.what();
      run_.notes.push_back("SKIPPED " + std::string(to_string(spec.kind)) + " at t=" +
                           std::to_string(ev.t_s).substr(0, 5) + ": " + e.what());
    } catch (const std::exception& e) {
      ev.message = e.what();
    }
  }

  // The scenario's deploy plus an application of the tool's own, `name`,
  // without replicas: a change the head must write ahead that leaves the
  // load alone. An accepted one becomes the acknowledged state.
  RunResult deploy_with(const std::string& name, const std::string& address = "") {
    YAML::Node config = YAML::Clone(run_.scenario.deploy);
    YAML::Node app;
    app["name"] = name;
    app["route_prefix"] = "/" + name;
    app["import_path"] = "libtroupe_examples.so:Echo";
    YAML::Node d;
    d["name"] = "Echo";
    d["num_replicas"] = 0;
    app["deployments"].push_back(d);
    config["applications"].push_back(app);
    std::string file = dir_ / (name + ".yaml");
    {
      YAML::Emitter em;
      em << config;
      std::ofstream(file) << em.c_str() << "\n";
    }
    last_deploy_apps_.clear();
    for (const auto& a : config["applications"])
      last_deploy_apps_.insert(a["name"] ? a["name"].as<std::string>() : "default");
    auto r = cluster_->ctl_at(address.empty() ? cluster_->address() : address, {"deploy", file}, 10);
    if (r.exit_code == 0) {
      declared_apps_.clear();
      for (const auto& a : config["applications"])
        declared_apps_.insert(a["name"] ? a["name"].as<std::string>() : "default");
      if (auto st = cluster_->status_json(5))
        acknowledged_ = *st;
    }
    return r;
  }

  // The etcd faults: members killed at once (one, or enough that fewer
  // than a majority runs), then the probe deploy through the heads.
  void etcd_fault_on(const FaultSpec& spec, FaultEvent& ev) {
    auto* etcd = cluster_->etcd();
    std::vector<size_t> running;
    for (size_t i = 0; i < etcd->size(); ++i) {
      if (etcd->running(i))
        running.push_back(i);
    }
    std::vector<size_t> victims;
    if (spec.kind == FaultKind::kill_etcd_member && spec.member != "random") {
      size_t i = std::stoul(spec.member.substr(1)) - 1;
      if (etcd->running(i))
        victims.push_back(i);
    } else if (spec.kind == FaultKind::kill_etcd_member && !running.empty()) {
      // Not etcd's own (Raft) leader: losing it holds every write and lease
      // renewal for etcd's election (1-2 s), which at a short lease TTL can
      // end the lead of troupe's leader (docs/reliability.md). The fault is
      // the loss of one member; `member: mN` names any, its leader too.
      std::vector<size_t> followers;
      const size_t raft_leader = etcd->raft_leader();
      for (size_t i : running) {
        if (i != raft_leader)
          followers.push_back(i);
      }
      if (followers.empty())
        followers = running;
      std::uniform_int_distribution<size_t> pick(0, followers.size() - 1);
      victims.push_back(followers[pick(rng_)]);
    } else if (spec.kind == FaultKind::etcd_quorum_loss) {
      const size_t keep = etcd->size() / 2;  // one short of a majority
      std::shuffle(running.begin(), running.end(), rng_);
      for (size_t k = keep; k < running.size(); ++k)
        victims.push_back(running[k]);
    }
    ev.t_s = since(t0_);
    if (victims.empty()) {
      ev.message = spec.kind == FaultKind::etcd_quorum_loss
                       ? "no quorum to lose: a majority of the members is down already"
                       : "no running etcd member '" + spec.member + "' to kill";
      return;
    }
    std::sort(victims.begin(), victims.end());
    for (size_t i : victims) {
      etcd->kill(i);
      ev.etcd_members.push_back(i);
      ev.members += (ev.members.empty() ? "" : ",") + etcd->member(i).name;
    }
    ev.ok = true;
    if (spec.probe_deploy)
      probe_deploy(ev, cluster_->address());
  }

  // A deploy that adds an application without replicas, through `address`.
  void probe_deploy(FaultEvent& ev, const std::string& address) {
    ev.probe_app = "chaos-probe-" + std::to_string(++probe_deploys_);
    auto r = deploy_with(ev.probe_app, address);
    ev.probe_acked = r.exit_code == 0;
    ev.probe_message = r.exit_code == 0   ? "acknowledged"
                       : r.exit_code < 0 ? "troupectl timed out"
                                         : trim(r.err.empty() ? r.out : r.err);
    // Refused without a quorum, with an outcome etcd left open: it may show
    // up later. (A cut-off leader's write cannot: its term is over by the
    // heal, and etcd refuses it then.)
    if (ev.kind == FaultKind::etcd_quorum_loss &&
        ev.probe_message.find("was not confirmed by etcd") != std::string::npos)
      unconfirmed_apps_[ev.probe_app] = last_deploy_apps_;
  }

  void watch_leader(size_t index) {
    auto w = std::make_unique<LeaderWatch>();
    w->index = index;
    w->head = run_.faults[index].node;
    auto* watch = w.get();
    w->thread = std::thread([this, watch] {
      while (!stop_watching_.load() && !g_interrupted.load()) {
        auto begin = Clock::now();
        std::string error;
        auto j = cluster_->leader_json(watch->head, 1, &error);
        double now = since(t0_);
        if (!j) {
          watch->last = error;
        } else {
          watch->last = j->dump();
          const bool leads = j->value("leading", false);
          if (!leads && watch->stepped_down_s < 0)
            watch->stepped_down_s = now;
          const double heal = watch->heal_s.load();
          const auto& l = (*j)["leader"];
          if (!leads && heal >= 0 && now > heal && l.is_object() &&
              l.value("node_id", std::string()) != watch->head) {
            watch->follows_s = now;
            return;
          }
        }
        std::this_thread::sleep_until(begin + 100ms);  // the poll's period
      }
    });
    leader_watches_.push_back(std::move(w));
  }

  void join_leader_watches() {
    stop_watching_ = true;
    for (auto& w : leader_watches_) {
      if (w->thread.joinable())
        w->thread.join();
      auto& ev = run_.faults[w->index];
      ev.stepped_down_s = w->stepped_down_s;
      ev.follows_s = w->follows_s;
      ev.follower_answer = w->last;
    }
    leader_watches_.clear();
  }

  std::string disk_filler() const { return cluster_->head_state_dir() + "/chaos-fill"; }

  // Fills the head's state disk, then deploys until the head cannot write a
  // deploy ahead: what was refused, and whether status still answers and
  // leaves the refused deploy out.
  void fill_disk(FaultEvent& ev) {
    ev.t_s = since(t0_);
    auto [bytes, full] = troupe::proc::fill_disk(disk_filler());
    ev.disk_filled_bytes = bytes;
    if (!full) {
      ev.message = "the head's state disk did not fill up (" + std::to_string(bytes) +
                   " bytes written, no ENOSPC)";
      return;
    }
    ev.ok = true;
    for (int i = 0; i < 200 && !g_interrupted.load(); ++i) {
      std::string name = "chaos-disk-" + std::to_string(++disk_deploys_);
      auto r = deploy_with(name);
      if (r.exit_code == 0) {
        ++ev.disk_accepted;
        continue;
      }
      ev.disk_refusal = trim(r.err.empty() ? r.out : r.err);
      disk_refused_ = name;
      std::string error;
      auto st = cluster_->status_json(5, &error);
      ev.disk_reads_ok = st.has_value();
      ev.disk_refused_applied = st && (*st)["applications"].contains(name);
      if (!st)
        ev.disk_refusal += " (then status failed: " + error + ")";
      return;
    }
  }

  // The space returns: the refused deploy is made again, without a restart.
  void free_disk(FaultEvent& ev) {
    std::error_code ec;
    std::filesystem::remove(disk_filler(), ec);
    std::string name =
        disk_refused_.empty() ? "chaos-disk-" + std::to_string(++disk_deploys_) : disk_refused_;
    auto r = deploy_with(name);
    ev.disk_after_ok = r.exit_code == 0;
    ev.disk_after_message = r.exit_code == 0 ? "accepted" : trim(r.err.empty() ? r.out : r.err);
  }

  // Sends the poisoned request of run_.faults[index] from a thread of its
  // own; then, with a mark, finds the replicas it reached in their logs.
  void send_poison(const FaultSpec& spec, size_t index) {
    auto call = std::make_unique<PoisonCall>();
    call->index = index;
    call->result = run_.faults[index];
    auto* c = call.get();
    Endpoint port = endpoints_.at(c->result.node);
    auto timeout = std::chrono::milliseconds(static_cast<int64_t>(spec.timeout_s * 1000));
    std::string run_dir = dir_.path();
    auto nodes = cluster_->node_ids();
    Clock::time_point t0 = t0_;
    c->thread = std::thread([c, port, timeout, run_dir, nodes, t0] {
      auto& ev = c->result;
      HttpClient client(port.host, port.port);
      auto r = client.get(ev.path, timeout);
      ev.answered_s = since(t0);
      ev.answered = true;
      ev.status = r.status;
      ev.error = r.error;
      auto body = nlohmann::json::parse(r.body, nullptr, false);
      if (body.is_object()) {
        if (body.contains("error") && body["error"].is_string())
          ev.answer = body["error"].get<std::string>();
        if (body.contains("request_id") && body["request_id"].is_string())
          ev.request_id = body["request_id"].get<std::string>();
      }
      if (ev.marker.empty())
        return;
      // The replica wrote the marker before it crashed; its node copies the
      // replica's output to the log as it reads it, which may trail the
      // answer a little. A 502 means two replicas had it.
      size_t expect = ev.status == 502 ? 2 : 1;
      std::vector<std::pair<std::string, std::string>> found;
      wait_until(
          [&] {
            found = replicas_marked(run_dir, nodes, ev.marker);
            return found.size() >= expect;
          },
          3s, 50ms);
      for (const auto& [id, node] : found) {
        ev.victims.push_back(id);
        ev.victim_nodes.push_back(node);
      }
      ev.victims_known = true;
    });
    poison_calls_.push_back(std::move(call));
  }

  void join_poison_calls() {
    for (auto& c : poison_calls_) {
      if (c->thread.joinable())
        c->thread.join();
      run_.faults[c->index] = c->result;
    }
    poison_calls_.clear();
  }

  // The invariants checked once the load has stopped.
  // A node sent SIGTERM exits by itself: waited for on a thread of its own
  // (the fault schedule goes on), at most drain delay + grace + 10 s.
  void watch_exit(size_t index) {
    const auto& k = run_.scenario.cluster;
    auto limit = std::chrono::milliseconds(
        static_cast<int64_t>((k.drain_delay_s + k.shutdown_grace_s + 10) * 1000));
    auto& process = cluster_->node(run_.faults[index].node).process;
    exit_watchers_.emplace_back([this, index, limit, &process] {
      auto code = process.wait_exit(limit);
      std::lock_guard<std::mutex> lock(exits_mu_);
      exits_[index] = {code ? since(t0_) : -1.0, code.value_or(-1)};
    });
  }

  void join_exit_watchers() {
    for (auto& t : exit_watchers_) {
      if (t.joinable())
        t.join();
    }
    std::lock_guard<std::mutex> lock(exits_mu_);
    for (const auto& [index, e] : exits_) {
      run_.faults[index].exited_s = e.first;
      run_.faults[index].exit_code = e.second;
    }
  }

  // A node stopped by SIGTERM: it exits 0 within drain delay + grace, and
  // its replicas ran elsewhere before it stopped them (no status poll from
  // the signal to the exit saw a deployment below its target of RUNNING
  // replicas, and one saw each at target on the other nodes alone).
  void sigterm_checks() {
    const auto& k = run_.scenario.cluster;
    const double limit = k.drain_delay_s + k.shutdown_grace_s;
    auto obs = monitor_->observations();
    for (const auto& f : run_.faults) {
      if (f.kind != FaultKind::sigterm_node || !f.ok)
        continue;
      Check exit{"node " + f.node + " stopped by SIGTERM exits 0 within drain delay + grace (" +
                     seconds(limit) + ")",
                 f.exited_s >= 0 && f.exit_code == 0 && f.exited_s - f.t_s <= limit, ""};
      if (f.exited_s < 0)
        exit.detail = "it had not exited " + seconds(limit + 10) + " after SIGTERM";
      else
        exit.detail = "exited " + std::to_string(f.exit_code) + " after " +
                      seconds(f.exited_s - f.t_s);
      run_.invariants.push_back(exit);

      Check moved{"node " + f.node + "'s replicas ran on other nodes before it stopped them", true,
                  ""};
      int held = 0;
      for (const auto& o : obs) {
        if (o.end_s > f.t_s)
          break;
        if (!o.status_ok)
          continue;
        held = 0;
        for (const auto& [name, d] : o.deployments) {
          auto it = d.running_on.find(f.node);
          held += it == d.running_on.end() ? 0 : it->second;
        }
      }
      const double until = f.exited_s >= 0 ? f.exited_s : kNever;
      int polls = 0, elsewhere = 0;
      std::string low;
      for (const auto& o : obs) {
        if (o.start_s < f.t_s || o.end_s > until || !o.status_ok)
          continue;
        ++polls;
        bool all_elsewhere = !o.deployments.empty();
        for (const auto& [name, d] : o.deployments) {
          auto it = d.running_on.find(f.node);
          int there = it == d.running_on.end() ? 0 : it->second;
          if (d.running < d.target && low.empty())
            low = "at " + seconds(o.start_s) + " " + name + " had " + std::to_string(d.running) +
                  " RUNNING of target " + std::to_string(d.target);
          if (d.running - there < d.target)
            all_elsewhere = false;
        }
        if (all_elsewhere)
          ++elsewhere;
      }
      if (held == 0) {
        moved.ok = false;
        moved.detail = "the node held no RUNNING replica before SIGTERM: nothing to show";
      } else if (!low.empty()) {
        moved.ok = false;
        moved.detail = low;
      } else if (elsewhere == 0) {
        moved.ok = false;
        moved.detail = "no poll of " + std::to_string(polls) +
                       " between SIGTERM and exit saw every deployment at target elsewhere";
      } else {
        moved.detail = std::to_string(held) + " RUNNING replicas there before; " +
                       std::to_string(polls) + " polls until its exit, none below target, " +
                       std::to_string(elsewhere) + " with every deployment at target elsewhere";
      }
      run_.invariants.push_back(moved);
    }
  }

  // A full state disk on the head: the deploy it could not write ahead was
  // refused with a message naming the checkpoint and the cause, nothing of
  // it applied, status still answered; once the space returned the same
  // deploy was accepted by the same head process.
  void disk_checks() {
    for (const auto& f : run_.faults) {
      if (f.kind != FaultKind::fill_disk || !f.ok)
        continue;
      Check refused{"a deploy the head could not write ahead was refused naming the checkpoint "
                    "and the cause - nothing of it applied - status answered",
                    false, ""};
      if (f.disk_refusal.empty()) {
        refused.detail = std::to_string(f.disk_accepted) +
                         " deploys on the full disk were all accepted: none refused";
      } else {
        refused.ok = f.disk_refusal.find("checkpoint") != std::string::npos &&
                     f.disk_refusal.find("No space left on device") != std::string::npos &&
                     f.disk_reads_ok && !f.disk_refused_applied;
        refused.detail = std::to_string(f.disk_accepted) +
                         " deploys fitted after the disk was full (" +
                         std::to_string(f.disk_filled_bytes) + " bytes written); then: " +
                         f.disk_refusal;
        if (!f.disk_reads_ok)
          refused.detail += "; status did not answer";
        if (f.disk_refused_applied)
          refused.detail += "; status lists the refused application";
      }
      run_.invariants.push_back(refused);
      auto& head = cluster_->node("head");
      Check after{"once the space returned the next deploy was accepted without a restart",
                  f.disk_after_ok.value_or(false) && head.starts == 1 && head.process.running(),
                  ""};
      after.detail = !f.disk_after_ok ? "the space never returned during the run"
                                      : f.disk_after_message + "; the head was started " +
                                            std::to_string(head.starts) + " time(s)";
      run_.invariants.push_back(after);
    }
  }

  // Highly available heads: what each fault of the heads and their etcd
  // must leave behind, from its probe deploy and the status polls.
  void ha_checks(const Observation& final) {
    auto obs = monitor_->observations();
    for (const auto& f : run_.faults) {
      if (!f.ok || !ha_fault(f.kind))
        continue;
      if (f.probe_acked)
        run_.invariants.push_back(probe_check(f, final));
      if (f.kind == FaultKind::kill_etcd_member)
        run_.invariants.push_back(same_leader_check(f, obs));
      if (f.kind == FaultKind::etcd_quorum_loss)
        run_.invariants.push_back(replicas_kept_check(f, obs, final));
      if (f.kind == FaultKind::partition_leader) {
        Check c{"after the heal the cut-off head " + f.node + " follows the new leader",
                f.follows_s >= 0, ""};
        c.detail = f.follows_s >= 0
                       ? "it named another leader " + seconds(f.follows_s - f.end_s) +
                             " after the heal"
                       : "it never named another head as leader; it said last: " +
                             f.follower_answer;
        run_.invariants.push_back(c);
      }
    }
  }

  // A probe deploy: acknowledged while a majority of etcd runs; refused
  // naming etcd without one, or by a head cut off from it; either way the
  // final state has it exactly when it was acknowledged.
  // The applications of a deploy etcd did not confirm that landed all the
  // same (its application is in `final`): it replaced the declaration, and
  // what it left out is gone on purpose. Empty when none landed.
  std::set<std::string> late_declaration(const Observation& final) const {
    for (const auto& [app, decl] : unconfirmed_apps_) {
      if (final.app_status.count(app))
        return decl;
    }
    return {};
  }

  Check probe_check(const FaultEvent& f, const Observation& final) const {
    const bool want = f.kind == FaultKind::kill_etcd_member;
    const bool acked = *f.probe_acked;
    const auto late = late_declaration(final);
    const bool replaced = !late.empty() && !late.count(f.probe_app);
    const bool present = final.app_status.count(f.probe_app) > 0 || (acked && replaced);
    std::string lower = f.probe_message;
    std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
    // Refused because etcd did not confirm it: etcd may have committed it
    // later, and the refusal said so; then the end state may have it.
    const bool open = f.kind == FaultKind::etcd_quorum_loss && !acked &&
                      f.probe_message.find("etcd may still write it") != std::string::npos;
    Check c{std::string(to_string(f.kind)) + ": a deploy " +
                (want ? "while etcd member(s) " + f.members + " were down is acknowledged"
                      : f.kind == FaultKind::etcd_quorum_loss
                            ? "without an etcd quorum is refused naming etcd"
                            : "sent to the cut-off head " + f.node + " is refused") +
                " - the end state has it exactly then (or, refused as unconfirmed by etcd, may)",
            acked == want && (present == acked || open) && final.status_ok, ""};
    if (!want && f.kind == FaultKind::etcd_quorum_loss && lower.find("etcd") == std::string::npos)
      c.ok = false;
    c.detail = f.probe_app + ": " + f.probe_message + "; at the end " +
               (final.status_ok ? (present ? "listed" : "not listed") : "status failed");
    return c;
  }

  // kill_etcd_member: every status poll from the fault until 3 s after the
  // member came back names the leader of the last poll before it.
  Check same_leader_check(const FaultEvent& f, const std::vector<Observation>& obs) const {
    std::string before;
    for (const auto& o : obs) {
      if (o.end_s <= f.t_s && o.status_ok && !o.leader.empty())
        before = o.leader;
    }
    Check c{"kill_etcd_member(" + f.members + "): the leader stays the same", !before.empty(), ""};
    const double until = (f.end_s >= 0 ? f.end_s : f.t_s) + 3;
    int polls = 0;
    for (const auto& o : obs) {
      if (o.start_s < f.t_s || o.start_s > until || !o.status_ok)
        continue;
      ++polls;
      if (o.leader != before && c.ok) {
        c.ok = false;
        c.detail = "at " + seconds(o.start_s) + " the leader was '" + o.leader + "', before '" +
                   before + "'; ";
      }
    }
    c.detail += before.empty() ? "no poll before the fault named a leader"
                               : std::to_string(polls) + " polls until 3 s after the member " +
                                     "came back, the leader before: " + before;
    if (polls == 0)
      c.ok = false;
    return c;
  }

  // etcd_quorum_loss: the replicas RUNNING before it run on, the same ones.
  Check replicas_kept_check(const FaultEvent& f, const std::vector<Observation>& obs,
                            const Observation& final) const {
    std::set<std::string> before;
    for (const auto& o : obs) {
      if (o.end_s > f.t_s)
        break;
      if (!o.status_ok)
        continue;
      before.clear();
      for (const auto& [name, d] : o.deployments) {
        auto ids = d.running_ids();
        before.insert(ids.begin(), ids.end());
      }
    }
    Check c{"etcd_quorum_loss: no replica stopped - the ones RUNNING before run at the end",
            !before.empty() && final.status_ok, ""};
    std::string gone;
    for (const auto& id : before) {
      bool running = false;
      for (const auto& [name, d] : final.deployments) {
        auto it = d.state_of.find(id);
        running = running || (it != d.state_of.end() && it->second == "RUNNING");
      }
      if (!running)
        gone += (gone.empty() ? "" : ", ") + id;
    }
    if (!gone.empty())
      c.ok = false;
    c.detail = before.empty() ? "no poll before the fault listed a RUNNING replica"
               : !gone.empty() ? "no longer RUNNING at the end: " + gone
                               : std::to_string(before.size()) + " replicas, all RUNNING at the end";
    return c;
  }

  // On hosts of their own: every worker reached every other worker that
  // hosted replicas after the deploy over a direct connection, at that
  // worker's own address (its proxy logs "direct connection to node B at
  // ADDRESS:PORT").
  void direct_connection_checks() {
    auto* net = cluster_->network();
    if (!net)
      return;
    std::set<std::string> hosting;
    for (const auto& [app, a] : acknowledged_["applications"].items()) {
      for (const auto& [dname, d] : a["deployments"].items()) {
        for (const auto& r : d["replicas"])
          hosting.insert(r.value("node", ""));
      }
    }
    Check c{"every worker reached the workers hosting replicas directly, at their own addresses",
            true, ""};
    int pairs = 0;
    for (const auto& a : cluster_->node_ids()) {
      if (cluster_->is_head(a) || dead_.count(a) || left_.count(a))
        continue;
      auto log = slurp(cluster_->node(a).log_path);
      for (const auto& b : hosting) {
        if (b == a || cluster_->is_head(b) || !cluster_->has_node(b))
          continue;
        ++pairs;
        std::string line = "direct connection to node " + b + " at " + net->address(b) + ":";
        if (log.find(line) == std::string::npos) {
          c.ok = false;
          c.detail += a + " never logged \"" + line + "\"; ";
        }
      }
    }
    if (pairs == 0)
      return;  // fewer than two workers hosted replicas: nothing to connect
    if (c.ok)
      c.detail = std::to_string(pairs) + " pairs of workers, each connected directly";
    run_.invariants.push_back(c);
  }

  // goals.max_full_route_tables: per node that ran to the end, the full
  // route tables its proxy applied (its log).
  void full_route_table_checks() {
    const auto& limit = run_.scenario.goals.max_full_route_tables;
    if (!limit)
      return;
    Check c{"every node applied at most " + std::to_string(*limit) + " full route tables", true,
            ""};
    for (const auto& id : cluster_->node_ids()) {
      if (dead_.count(id) || left_.count(id))
        continue;
      std::istringstream log(slurp(cluster_->node(id).log_path));
      int64_t full = 0;
      for (std::string line; std::getline(log, line);) {
        if (line.find("route table ") != std::string::npos &&
            line.find(" (full; ") != std::string::npos)
          ++full;
      }
      if (full > *limit)
        c.ok = false;
      c.detail += id + " " + std::to_string(full) + "; ";
    }
    run_.invariants.push_back(c);
  }

  void final_checks() {
    auto final = monitor_->observe();
    const auto& sc = run_.scenario;
    join_exit_watchers();
    join_leader_watches();
    sigterm_checks();
    disk_checks();
    ha_checks(final);
    direct_connection_checks();
    full_route_table_checks();

    // No node process died that the run did not kill (a crash of user code
    // in a replica process, or anything else, must not take a node down).
    {
      Check c{"every node process the run did not kill still runs", true, ""};
      int running = 0;
      for (const auto& id : cluster_->node_ids()) {
        if (dead_.count(id) || left_.count(id))
          continue;
        auto& n = cluster_->node(id);
        if (n.process.running()) {
          ++running;
          continue;
        }
        c.ok = false;
        c.detail += id + " exited with " + std::to_string(n.process.exit_code().value_or(-1)) +
                    " (log " + n.log_path + "); ";
      }
      if (c.ok)
        c.detail = std::to_string(running) + " node processes running";
      run_.invariants.push_back(c);
    }

    // The replicas the poisoned requests crashed are gone, replaced: none is
    // listed any more and every deployment is HEALTHY at its target.
    if (std::any_of(run_.faults.begin(), run_.faults.end(),
                    [](const FaultEvent& f) { return f.kind == FaultKind::poison && f.ok; })) {
      Check c{
          "the replicas poisoned requests crashed were replaced (none listed, every "
          "deployment HEALTHY at target)",
          final.status_ok && final.healthy(), ""};
      std::set<std::string> victims;
      int known = 0, poisoned = 0;
      std::map<size_t, int> reached;  // victims per request -> requests
      std::string odd;
      for (const auto& f : run_.faults) {
        if (f.kind != FaultKind::poison || !f.ok)
          continue;
        ++poisoned;
        if (!f.victims_known)
          continue;
        ++known;
        ++reached[f.victims.size()];
        victims.insert(f.victims.begin(), f.victims.end());
        if (f.query_of_death() && f.victims.size() != 2)
          odd += f.marker + " answered 502 but reached " + std::to_string(f.victims.size()) +
                 " replicas; ";
      }
      if (!final.status_ok)
        c.detail = "status failed: " + final.status_error + "; ";
      else if (!final.healthy())
        c.detail = "not healthy at the end: " + final.unhealthy_reason() + "; ";
      for (const auto& v : victims) {
        if (final.replica_ids.count(v)) {
          c.ok = false;
          c.detail += v + " still listed; ";
        }
      }
      if (known < poisoned) {
        c.detail += std::to_string(poisoned - known) + " of " + std::to_string(poisoned) +
                    " poisoned requests carried no mark: their replicas are unknown; ";
      } else if (victims.empty()) {
        c.ok = false;
        c.detail +=
            "no replica log carries a poisoned request's mark: nothing was crashed, or "
            "the deployment does not write the mark; ";
      }
      c.detail += std::to_string(victims.size()) + " replicas crashed by " +
                  std::to_string(poisoned) + " poisoned requests (";
      bool first = true;
      for (const auto& [n, count] : reached) {
        c.detail += (first ? "" : ", ") + std::to_string(count) + " reached " + std::to_string(n);
        first = false;
      }
      c.detail += ")";
      if (!odd.empty())
        c.detail += "; " + odd;
      if (c.ok)
        c.detail += ", none listed at the end; " + std::to_string(final.replica_ids.size()) +
                    " replicas, every deployment HEALTHY at target";
      run_.invariants.push_back(c);
    }

    // Exact replica counts, no duplicates, none on a node that cannot hold
    // them.
    {
      Check c{"every deployment has exactly its target of replicas, all RUNNING, no id twice", true,
              ""};
      if (!final.status_ok) {
        c.ok = false;
        c.detail = "status failed: " + final.status_error;
      }
      for (const auto& [name, d] : final.deployments) {
        if (d.running != d.target || d.total != d.target) {
          c.ok = false;
          c.detail += name + ": " + std::to_string(d.running) + " RUNNING of " +
                      std::to_string(d.total) + " listed, target " + std::to_string(d.target) +
                      "; ";
        }
      }
      for (const auto& id : final.duplicate_ids) {
        c.ok = false;
        c.detail += "replica " + id + " listed twice; ";
      }
      for (const auto& [node, count] : final.replicas_per_node) {
        auto it = final.node_state.find(node);
        if (count > 0 && (it == final.node_state.end() || it->second != "ALIVE")) {
          c.ok = false;
          c.detail += std::to_string(count) + " replicas on node " + node + " (" +
                      (it == final.node_state.end() ? "unknown" : it->second) + "); ";
        }
      }
      if (c.ok)
        c.detail = std::to_string(final.replica_ids.size()) + " replicas in " +
                   std::to_string(final.deployments.size()) + " deployments";
      run_.invariants.push_back(c);
    }

    // Every acknowledged deploy is present: the applications, routes,
    // deployments and targets the controller reported after the deploy.
    {
      Check c{"every acknowledged deploy is present", final.status_ok, ""};
      if (!final.status_ok)
        c.detail = "status failed: " + final.status_error;
      for (const auto& app : declared_apps_) {
        if (!acknowledged_["applications"].contains(app)) {
          c.ok = false;
          c.detail += "declared application " + app + " was never reported; ";
        }
      }
      const auto replaced_by = late_declaration(final);
      for (const auto& [app, a] : acknowledged_["applications"].items()) {
        if (!final.app_status.count(app) && !replaced_by.empty() && !replaced_by.count(app)) {
          c.detail += "application " + app + " left out by the deploy etcd confirmed late; ";
          continue;
        }
        if (!final.app_status.count(app)) {
          c.ok = false;
          c.detail += "application " + app + " is gone; ";
          continue;
        }
        if (final.app_route[app] != a.value("route_prefix", "")) {
          c.ok = false;
          c.detail += app + " route changed to " + final.app_route[app] + "; ";
        }
        for (const auto& [dname, d] : a["deployments"].items()) {
          auto it = final.deployments.find(app + "/" + dname);
          if (it == final.deployments.end()) {
            c.ok = false;
            c.detail += "deployment " + app + "/" + dname + " is gone; ";
          } else if (it->second.target != d.value("target_replicas", int64_t{0})) {
            c.ok = false;
            c.detail += app + "/" + dname + " target is " + std::to_string(it->second.target) +
                        ", acknowledged " + std::to_string(d.value("target_replicas", int64_t{0})) +
                        "; ";
          }
        }
      }
      for (const auto& [app, st] : final.app_status) {
        if (acknowledged_["applications"].contains(app))
          continue;
        if (unconfirmed_apps_.count(app)) {
          c.detail += "application " + app + " of a deploy etcd did not confirm is present; ";
          continue;
        }
        c.ok = false;
        c.detail += "unknown application " + app + "; ";
      }
      if (c.ok)
        c.detail += std::to_string(declared_apps_.size()) + " applications as acknowledged";
      run_.invariants.push_back(c);
    }

    // The node processes are the ones the run started (no stray node).
    {
      Check c{"every node listed is a process this run started", final.nodes_ok, ""};
      if (!final.nodes_ok)
        c.detail = "nodes failed: " + final.nodes_error;
      for (const auto& [id, pid] : final.node_pid) {
        if (!cluster_->has_node(id)) {
          c.ok = false;
          c.detail += "unknown node " + id + "; ";
          continue;
        }
        auto& n = cluster_->node(id);
        if (final.node_state[id] != "DEAD" && pid != 0 && pid != n.process.pid()) {
          c.ok = false;
          c.detail += id + " reports pid " + std::to_string(pid) + ", started " +
                      std::to_string(n.process.pid()) + "; ";
        }
      }
      run_.invariants.push_back(c);
    }

    // After convergence, every live node's proxy serves, and only replicas
    // the controller knows answer (an orphan replica serving would show up
    // here with an id absent from status).
    if (run_.load_enabled) {
      Check serve{"every live node's proxy serves after convergence", true, ""};
      Check known{"answers come only from replicas the controller lists", final.status_ok,
                  final.status_ok ? "" : "status failed: " + final.status_error};
      int with_id = 0;
      for (const auto& [id, port] : endpoints_) {
        if (dead_.count(id) || left_.count(id))
          continue;
        int ok = 0, tries = 0;
        for (const auto& path : sc.load.paths) {
          HttpClient client(port.host, port.port);
          for (int i = 0; i < 10; ++i) {
            ++tries;
            auto r = client.get(path, 2000ms);
            if (r.status < 200 || r.status >= 300)
              continue;
            ++ok;
            auto body = nlohmann::json::parse(r.body, nullptr, false);
            if (body.is_object() && body.contains("replica_id") && body["replica_id"].is_string()) {
              ++with_id;
              auto rid = body["replica_id"].get<std::string>();
              if (final.status_ok && !final.replica_ids.count(rid)) {
                known.ok = false;
                known.detail += rid + " answered via " + id + "; ";
              }
            }
          }
        }
        if (ok != tries) {
          serve.ok = false;
          serve.detail += id + ": " + std::to_string(ok) + " of " + std::to_string(tries) + " ok; ";
        }
      }
      if (serve.ok)
        serve.detail = "10 requests per path through every live node, all 2xx";
      if (known.ok && final.status_ok)
        known.detail = std::to_string(with_id) + " answers carried a replica_id, all known";
      run_.invariants.push_back(serve);
      run_.invariants.push_back(known);
    }
  }

  Options opts_;
  RunData run_;
  std::mt19937 rng_;
  TempDir dir_;
  std::unique_ptr<Cluster> cluster_;
  std::map<std::string, Endpoint> endpoints_;  // node -> its HTTP proxy
  std::unique_ptr<Monitor> monitor_;
  std::unique_ptr<LoadGenerator> load_;
  Clock::time_point t0_;
  nlohmann::json acknowledged_;
  std::set<std::string> declared_apps_;
  std::set<std::string> drained_;
  std::set<std::string> dead_;            // killed for good
  std::set<std::string> left_;            // sent SIGTERM: stopped and left the cluster
  std::vector<std::thread> exit_watchers_;
  std::mutex exits_mu_;
  std::map<size_t, std::pair<double, int>> exits_;  // fault index -> (exited_s, code)
  std::set<std::string> down_;            // killed or frozen right now
  std::map<size_t, size_t> round_robin_;  // spec index -> next node (node: round_robin)
  size_t poison_count_ = 0;
  int disk_deploys_ = 0;      // fill_disk: deploys made, for their names
  int probe_deploys_ = 0;     // probe_deploy: deploys made, for their names
  // Applications of probe deploys refused because etcd did not confirm the
  // write: etcd may still commit it, so the end state may have them or not.
  // Each with the applications of its whole declaration (what it leaves
  // out is deleted if it did land).
  std::map<std::string, std::set<std::string>> unconfirmed_apps_;
  std::set<std::string> last_deploy_apps_;  // of deploy_with's last config
  std::vector<std::unique_ptr<LeaderWatch>> leader_watches_;
  std::atomic<bool> stop_watching_{false};
  int redeploys_ = 0;         // redeploy: configs written, for their names
  std::string disk_refused_;  // fill_disk: the application of the refused deploy
  std::vector<std::unique_ptr<PoisonCall>> poison_calls_;
};

int usage_error(const std::string& what) {
  std::fprintf(stderr, "chaos: error: %s\n%s", what.c_str(), kUsage);
  return 2;
}

int main_impl(int argc, char** argv) {
  Options opts;
  std::string command;
  for (int i = 0; i < argc; ++i)
    command += (i ? " " : "") + std::string(argv[i]);
  // CLI11 parses; the help is kUsage, the same text as every error prints.
  CLI::App app{"chaos: scripted faults under load against a troupe cluster it starts itself",
               "chaos"};
  app.set_help_flag();
  bool help = false;
  app.add_flag("-h,--help", help, "print this help");
  app.add_option("--scenario", opts.scenario, "scenario YAML");
  app.add_option("--bin-dir", opts.bin_dir, "where troupe-node and troupectl are");
  app.add_option("--plugin-dir", opts.plugin_dir, "deployment libraries for the nodes");
  uint32_t seed = 0;
  auto* seed_opt = app.add_option("--seed", seed, "seed of every random choice");
  app.add_flag("--json", opts.json, "print the report as JSON instead of text");
  app.add_option("--json-file", opts.json_file, "also write the JSON report to PATH");
  app.add_option("--poll-ms", opts.poll_ms, "interval of status/nodes polls and proxy probes")
      ->check(CLI::Range(10, 10000));
  app.add_flag("--no-load", opts.no_load, "run the faults without the HTTP load");
  app.add_flag("--keep", opts.keep, "keep the run directory after the run");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return usage_error(e.what());
  }
  if (help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (seed_opt->count() > 0)
    opts.seed = seed;
  if (opts.scenario.empty())
    return usage_error("--scenario FILE is required");
  if (opts.bin_dir.empty())
    opts.bin_dir = self_dir();
  if (opts.plugin_dir.empty())
    opts.plugin_dir = opts.bin_dir + "/../plugins";
  // The nodes run in their own state directories: relative paths given here
  // must not be read from there.
  {
    std::error_code ec;
    auto bin = std::filesystem::absolute(opts.bin_dir, ec);
    if (!ec)
      opts.bin_dir = bin.lexically_normal().string();
    auto plugins = std::filesystem::absolute(opts.plugin_dir, ec);
    if (!ec)
      opts.plugin_dir = plugins.lexically_normal().string();
  }
  for (const char* b : {"troupe-node", "troupectl"}) {
    if (::access((opts.bin_dir + "/" + b).c_str(), X_OK) != 0)
      return usage_error(opts.bin_dir + "/" + b + " is not an executable (see --bin-dir)");
  }
  Scenario scenario;
  try {
    scenario = load_scenario(opts.scenario);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chaos: error: %s\n", e.what());
    return 2;
  }
  install_signal_handlers();
  Runner runner(opts, std::move(scenario), command);
  auto& run = runner.go();
  auto j = to_json(run);
  if (!opts.json_file.empty())
    std::ofstream(opts.json_file) << j.dump(2) << "\n";
  if (opts.json)
    std::cout << j.dump(2) << std::endl;
  else
    std::cout << to_text(run) << std::flush;
  if (run.interrupted)
    return 130;
  return run.ok ? 0 : 1;
}

}  // namespace
}  // namespace chaos

int main(int argc, char** argv) {
  return chaos::main_impl(argc, argv);
}
