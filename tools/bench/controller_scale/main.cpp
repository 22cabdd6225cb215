// controller_scale: the cost of one reconcile tick of the controller core
// (StateManager::update plus the events it consumes) at scale, in steady state
// and during a full rolling update, and the controller's memory per replica.
//
//   controller_scale [--apps 100] [--deployments-per-app 10] [--replicas 10]
//                    [--nodes 100] [--steady-ticks 300] [--tick-s 0.1]
//
// Replicas are simulated in-process: every command is answered at the next
// tick (start -> ready, stop/kill -> stopped, check -> ok). Timings are wall
// time of this process; run it on an otherwise idle machine.
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "controller/core/checkpoint_store.hpp"
#include "controller/core/clock.hpp"
#include "controller/core/state_manager.hpp"

using namespace troupe;
using namespace troupe::controller;

namespace {

class BenchClock final : public Clock {
 public:
  double now_s() const override { return now; }
  double now = 0;
};

// Keeps nothing: the synced write is measured by tools/bench/checkpoint_write.
class NullStore final : public CheckpointStore {
 public:
  Status save(const TargetState&) override { return Status::ok(); }
  Result<std::optional<TargetState>> load() override { return std::optional<TargetState>(); }
};

struct Event {
  enum Kind { ready, stopped, healthy } kind;
  std::string id;
  ReplicaVersion version;
  uint64_t check_seq = 0;
  uint32_t threshold = 0;
};

struct Stats {
  std::vector<double> ms;
  double pct(double p) const {
    if (ms.empty())
      return 0;
    std::vector<double> v = ms;
    std::sort(v.begin(), v.end());
    std::size_t i = std::min(v.size() - 1, static_cast<std::size_t>(p * (v.size() - 1) + 0.5));
    return v[i];
  }
  double mean() const {
    double s = 0;
    for (double x : ms)
      s += x;
    return ms.empty() ? 0 : s / ms.size();
  }
  double max() const { return ms.empty() ? 0 : *std::max_element(ms.begin(), ms.end()); }
};

std::size_t heap_in_use() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  return mallinfo2().uordblks;
#else
  return 0;
#endif
}

struct Bench {
  BenchClock clock;
  SeededRandom rng{42};
  NullStore store;
  StateManager core{store, clock, rng};
  std::vector<Event> events;
  double tick_s = 0.1;
  std::size_t commands = 0;

  // One controller tick: deliver last tick's answers, then update().
  // Returns the milliseconds spent in the core (events + update).
  double tick() {
    clock.now += tick_s;
    std::vector<Event> in = std::move(events);
    events.clear();
    auto t0 = std::chrono::steady_clock::now();
    for (const auto& e : in) {
      switch (e.kind) {
        case Event::ready:
          core.on_replica_ready(e.id, e.version);
          break;
        case Event::stopped:
          core.on_replica_stopped(e.id);
          break;
        case Event::healthy:
          // What a node whose checks all pass reports: proven.
          core.on_health_report(e.id, e.check_seq, e.threshold, 0, "");
          break;
      }
    }
    std::vector<Command> cmds = core.update();
    auto t1 = std::chrono::steady_clock::now();
    commands += cmds.size();
    for (auto& c : cmds) {
      switch (c.kind) {
        case CommandKind::start:
        case CommandKind::reconfigure:
        case CommandKind::recover:
          events.push_back({Event::ready, std::move(c.replica_id), std::move(c.version)});
          break;
        case CommandKind::stop:
        case CommandKind::kill:
          events.push_back({Event::stopped, std::move(c.replica_id), {}});
          break;
        case CommandKind::watch_health:
          events.push_back(
              {Event::healthy, std::move(c.replica_id), {}, c.check_seq, c.health.threshold});
          break;
      }
    }
    return std::chrono::duration<double, std::milli>(t1 - t0).count();
  }

  bool all_healthy() const {
    for (const auto& id : core.deployment_ids()) {
      auto s = core.deployment_status(id);
      if (!s || s->status != DeploymentStatus::healthy)
        return false;
    }
    return true;
  }
};

std::vector<ApplicationSpec> make_apps(int apps, int per_app, int replicas,
                                       const std::string& version) {
  std::vector<ApplicationSpec> out;
  for (int a = 0; a < apps; ++a) {
    ApplicationSpec app;
    app.name = "app" + std::to_string(a);
    app.route_prefix = "/" + app.name;
    for (int d = 0; d < per_app; ++d) {
      DeploymentSpec dep;
      dep.name = "D" + std::to_string(d);
      dep.import_path = "libbench.so:Model";
      dep.code_version = version;
      dep.config.num_replicas = static_cast<uint32_t>(replicas);
      dep.config.resources.amounts["cpu"] = 1;
      app.deployments.push_back(dep);
    }
    app.ingress = app.deployments.front().name;
    out.push_back(std::move(app));
  }
  return out;
}

void report(const char* what, const Stats& s) {
  std::printf("%-34s ticks=%-5zu mean=%7.3f ms  p50=%7.3f ms  p99=%7.3f ms  max=%7.3f ms\n", what,
              s.ms.size(), s.mean(), s.pct(0.5), s.pct(0.99), s.max());
}

}  // namespace

int main(int argc, char** argv) {
  int apps = 100;
  int per_app = 10;
  int replicas = 10;
  int nodes = 100;
  int steady_ticks = 300;
  double tick_s = 0.1;
  CLI::App cli{"controller_scale: the cost of one reconcile tick of the controller core at scale",
               "controller_scale"};
  cli.add_option("--apps", apps, "applications")->capture_default_str()->check(CLI::PositiveNumber);
  cli.add_option("--deployments-per-app", per_app, "deployments of each application")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cli.add_option("--replicas", replicas, "replicas of each deployment")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cli.add_option("--nodes", nodes, "simulated nodes")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cli.add_option("--steady-ticks", steady_ticks, "ticks measured in steady state")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cli.add_option("--tick-s", tick_s, "seconds of simulated time per tick")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli.exit(e) == 0 ? 0 : 2;  // --help: 0; bad usage: 2
  }
  const long total = static_cast<long>(apps) * per_app * replicas;

  const std::size_t heap0 = heap_in_use();
  auto bench = std::make_unique<Bench>();
  Bench& b = *bench;
  b.tick_s = tick_s;
  std::vector<NodeInfo> view;
  const double cpus = static_cast<double>(total) * 2 / nodes + 1;
  for (int n = 0; n < nodes; ++n) {
    NodeInfo info;
    info.id = "node" + std::to_string(n);
    info.capacity.amounts["cpu"] = cpus;
    view.push_back(info);
  }
  b.core.set_nodes(view);
  if (Status s = b.core.recover({}); !s) {
    std::fprintf(stderr, "recover: %s\n", s.to_string().c_str());
    return 1;
  }
  std::printf(
      "controller_scale: %d deployments x %d replicas = %ld replicas on %d nodes, "
      "tick %.3f s\n",
      apps * per_app, replicas, total, nodes, tick_s);

  auto t0 = std::chrono::steady_clock::now();
  for (const auto& app : make_apps(apps, per_app, replicas, "v1")) {
    auto r = b.core.deploy_application(app);
    if (!r) {
      std::fprintf(stderr, "deploy: %s\n", r.status().to_string().c_str());
      return 1;
    }
  }
  auto t1 = std::chrono::steady_clock::now();
  std::printf("%-34s %.1f ms for %d applications (validation + write-ahead to a null store)\n",
              "deploy calls", std::chrono::duration<double, std::milli>(t1 - t0).count(), apps);

  Stats startup;
  while (startup.ms.size() < 1000) {
    startup.ms.push_back(b.tick());
    if (b.all_healthy())
      break;
  }
  report("initial scale-up (0 -> all)", startup);
  if (!b.all_healthy()) {
    std::fprintf(stderr, "did not become healthy\n");
    return 1;
  }

  // Steady state: health checks go out and come back; nothing changes.
  Stats steady;
  const std::size_t commands_before = b.commands;
  for (int i = 0; i < steady_ticks; ++i)
    steady.ms.push_back(b.tick());
  report("steady state", steady);
  std::printf("%-34s %.1f health checks per tick\n", "",
              static_cast<double>(b.commands - commands_before) / steady_ticks);
  const std::size_t heap1 = heap_in_use();

  // A full rolling update: every deployment gets a new code version at once.
  for (const auto& app : make_apps(apps, per_app, replicas, "v2")) {
    auto r = b.core.deploy_application(app);
    if (!r) {
      std::fprintf(stderr, "deploy v2: %s\n", r.status().to_string().c_str());
      return 1;
    }
  }
  Stats rollout;
  while (rollout.ms.size() < 5000) {
    rollout.ms.push_back(b.tick());
    if (b.all_healthy())
      break;
  }
  report("full rolling update (v1 -> v2)", rollout);
  if (!b.all_healthy()) {
    std::fprintf(stderr, "rolling update did not finish\n");
    return 1;
  }

  if (heap1 > heap0) {
    std::printf(
        "%-34s %.0f bytes per replica (heap in use %.1f MiB for %ld replicas, "
        "including deployments, specs and the node view)\n",
        "controller memory", static_cast<double>(heap1 - heap0) / total,
        (heap1 - heap0) / 1048576.0, total);
  }
  std::printf("goal: steady p99 <= 5 ms: %s; rollout p99 <= 20 ms: %s\n",
              steady.pct(0.99) <= 5 ? "met" : "NOT met",
              rollout.pct(0.99) <= 20 ? "met" : "NOT met");
  return 0;
}
