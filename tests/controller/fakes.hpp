// Test doubles for the controller core: a fake clock, a scripted random
// source, in-memory and failing checkpoint stores, and a fake cluster that
// executes the core's commands and answers with events one tick later.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "controller/core/checkpoint_store.hpp"
#include "controller/core/clock.hpp"
#include "controller/core/state_manager.hpp"
#include "node/health_checks.hpp"

namespace doctest {
template <>
struct StringMaker<std::vector<std::string>> {
  static String convert(const std::vector<std::string>& v) {
    std::string out = "{";
    for (const auto& s : v)
      out += (out.size() > 1 ? ", \"" : "\"") + s + "\"";
    return (out + "}").c_str();
  }
};
template <>
struct StringMaker<std::vector<double>> {
  static String convert(const std::vector<double>& v) {
    std::string out = "{";
    for (double d : v)
      out += (out.size() > 1 ? ", " : "") + std::to_string(d);
    return (out + "}").c_str();
  }
};
}  // namespace doctest

namespace troupe::controller::testing {

class FakeClock final : public Clock {
 public:
  double now_s() const override { return now_; }
  void advance(double s) { now_ += s; }
  void set(double s) { now_ = s; }

 private:
  double now_ = 0;
};

// uniform() returns lo + fraction * (hi - lo); index() returns `pick` (mod n).
class FakeRandom final : public Random {
 public:
  double fraction = 0.5;
  std::size_t pick = 0;
  std::vector<std::pair<double, double>> uniform_calls;
  double uniform(double lo, double hi) override {
    uniform_calls.emplace_back(lo, hi);
    return lo + fraction * (hi - lo);
  }
  std::size_t index(std::size_t n) override { return pick % n; }
};

// Keeps the last saved state; optionally observes the core at save time.
class MemoryStore : public CheckpointStore {
 public:
  std::optional<TargetState> saved;
  int saves = 0;
  std::function<void(const TargetState&)> on_save;
  Status save(const TargetState& state) override {
    if (on_save)
      on_save(state);
    ++saves;
    saved = state;
    return Status::ok();
  }
  Result<std::optional<TargetState>> load() override { return saved; }
};

// Fails every save (a full disk); loads whatever `saved` holds.
class FailingStore final : public MemoryStore {
 public:
  int attempts = 0;
  Status save(const TargetState&) override {
    ++attempts;
    return Status(errc::io_error, "write /var/lib/troupe/checkpoint: No space left on device");
  }
};

// A checkpoint that cannot be decoded.
class CorruptStore final : public CheckpointStore {
 public:
  Status save(const TargetState&) override { return Status::ok(); }
  Result<std::optional<TargetState>> load() override {
    return Status(errc::corrupt,
                  "/var/lib/troupe/checkpoint: cannot decode the target state (bad segment size)");
  }
};

struct FakeActor {
  std::string id;
  std::string app;
  std::string deployment;
  std::string node;
  ReplicaVersion version;
  bool stopping = false;
};

// Plays the node agents and replica actors. execute() applies the commands a
// tick produced and queues the answers; deliver() feeds them to the core at
// the start of the next tick. The nodes health-check their replicas as the
// real agents do, with node::HealthChecks on the harness's clock and random
// source: checks due are sent at the end of a tick (execute()) and their
// answers reach the core at the next one; timeouts at the start of a tick
// (expire_checks()).
class FakeCluster {
 public:
  FakeCluster(const Clock& clock, Random*& random)
      : clock_(clock),
        checks_([&random](double lo, double hi) { return random->uniform(lo, hi); }) {}
  // Every health check sent: (replica, when).
  std::vector<std::pair<std::string, double>> checks_sent;
  std::map<std::string, FakeActor> actors;  // alive actors by replica id
  // Behaviour knobs.
  std::map<std::string, std::string> fail_start;  // deployment -> constructor error
  std::set<std::string> hang_start;               // deployments whose constructor never returns
  std::set<std::string> ignore_stop;              // replicas that ignore graceful stops
  std::set<std::string> ignore_kill;              // replicas whose kills are lost (no answer)
  std::set<std::string> unhealthy;                // replicas failing health checks
  std::set<std::string> silent;                   // replicas not answering health checks
  std::map<std::string, std::string> unhealthy_why;  // what a failing check says, by replica
  std::set<std::string> slow_ready;               // replicas whose start never answers
  std::set<std::string> succeed_ids;              // replicas that start despite fail_start
  std::set<std::string> fail_codes;               // code versions whose constructor fails
  std::set<std::string> late_health;              // replicas answering checks only on release
  // Code versions whose replicas pass their start-up gate (they report
  // ready) and fail every health check after it.
  std::set<std::string> unhealthy_codes;
  // Answers of late_health replicas, held until a test runs one.
  std::vector<std::function<void()>> late_answers;
  int starts = 0;

  void execute(const std::vector<Command>& cmds) {
    for (const auto& c : cmds)
      execute(c);
  }

  void execute(const Command& c) {
    const std::string id = c.replica_id;
    switch (c.kind) {
      case CommandKind::start: {
        ++starts;
        actors[id] = FakeActor{id, c.app, c.deployment, c.node_id, c.version, false};
        auto f = fail_start.find(c.deployment);
        if (fail_codes.count(c.version.code)) {
          queue([id](StateManager& m) { m.on_replica_start_failed(id, "bad version"); });
        } else if (f != fail_start.end() && !succeed_ids.count(id)) {
          std::string err = f->second;
          queue([id, err](StateManager& m) { m.on_replica_start_failed(id, err); });
        } else if (!hang_start.count(c.deployment) && !slow_ready.count(id)) {
          ReplicaVersion v = c.version;
          queue([id, v](StateManager& m) { m.on_replica_ready(id, v); });
        }
        break;
      }
      case CommandKind::reconfigure: {
        auto it = actors.find(id);
        if (it == actors.end())
          break;
        it->second.version = c.version;
        ReplicaVersion v = c.version;
        queue([id, v](StateManager& m) { m.on_replica_ready(id, v); });
        break;
      }
      case CommandKind::watch_health:
        if (actors.count(id))
          checks_.watch(
              id, c.check_seq,
              {c.health.period_s, c.health.timeout_s, c.health.threshold, c.health.jitter},
              clock_.now_s());
        break;
      case CommandKind::recover: {
        auto it = actors.find(id);
        if (it == actors.end()) {
          queue([id](StateManager& m) { m.on_replica_crashed(id); });
        } else {
          ReplicaVersion v = it->second.version;
          queue([id, v](StateManager& m) { m.on_replica_ready(id, v); });
        }
        break;
      }
      case CommandKind::stop: {
        auto it = actors.find(id);
        if (it == actors.end()) {
          queue([id](StateManager& m) { m.on_replica_stopped(id); });
          break;
        }
        it->second.stopping = true;
        if (!ignore_stop.count(id)) {
          actors.erase(it);
          queue([id](StateManager& m) { m.on_replica_stopped(id); });
        }
        break;
      }
      case CommandKind::kill:
        if (ignore_kill.count(id))
          break;
        actors.erase(id);
        queue([id](StateManager& m) { m.on_replica_stopped(id); });
        break;
    }
  }

  // The actor dies on its own (process crash): the monitor reports it.
  // By value: callers pass keys of `actors`, which the erase frees.
  void crash(std::string id) {
    actors.erase(id);
    queue([id](StateManager& m) { m.on_replica_crashed(id); });
  }

  // The nodes' checks that timed out (at the start of a tick).
  void expire_checks() {
    checks_.expire(clock_.now_s());
    queue_reports();
  }

  // Sends the checks due now; what they answer is reported at the next tick.
  void run_checks() {
    for (const auto& c : checks_.due(clock_.now_s())) {
      const std::string id = c.replica_id;
      auto a = actors.find(id);
      if (a == actors.end()) {
        checks_.forget(id);  // gone from its node
        continue;
      }
      checks_sent.emplace_back(id, clock_.now_s());
      if (silent.count(id))
        continue;
      const bool ok = !unhealthy.count(id) && !unhealthy_codes.count(a->second.version.code);
      std::string why;
      if (auto it = unhealthy_why.find(id); !ok && it != unhealthy_why.end())
        why = it->second;
      const uint64_t seq = c.seq;
      if (late_health.count(id)) {
        late_answers.push_back([this, id, seq, ok, why] {
          checks_.result(id, seq, ok, why);
          queue_reports();
        });
        continue;
      }
      checks_.result(id, seq, ok, why);
    }
    queue_reports();
  }

  // The nodes' agents registered again (a new controller): their checks
  // start over.
  void reset_checks() { checks_.clear(); }

  // The health checks sent to replica `id` so far.
  std::vector<double> checks_of(const std::string& id) const {
    std::vector<double> out;
    for (const auto& [r, t] : checks_sent)
      if (r == id)
        out.push_back(t);
    return out;
  }

  void deliver(StateManager& core) {
    auto events = std::move(pending_);
    pending_.clear();
    for (auto& e : events)
      e(core);
  }

  // Drops every queued answer (the controller that would receive them died).
  void drop_pending() { pending_.clear(); }

  std::vector<HostedReplica> hosted() const {
    std::vector<HostedReplica> out;
    for (const auto& [id, a] : actors)
      out.push_back({id, a.app, a.deployment, a.node, a.stopping});
    return out;
  }

  std::size_t alive_not_stopping(const std::string& app, const std::string& dep) const {
    std::size_t n = 0;
    for (const auto& [id, a] : actors) {
      if (a.app == app && a.deployment == dep && !a.stopping)
        ++n;
    }
    return n;
  }

 private:
  void queue(std::function<void(StateManager&)> f) { pending_.push_back(std::move(f)); }
  void queue_reports() {
    for (auto& r : checks_.take_changes())
      queue([r](StateManager& m) {
        m.on_health_report(r.replica_id, r.watch, r.passed, r.failures, r.failure);
      });
  }
  const Clock& clock_;
  node::HealthChecks checks_;
  std::vector<std::function<void(StateManager&)>> pending_;
};

// ---------------------------------------------------------------- builders

inline DeploymentSpec make_deployment(const std::string& name, uint32_t replicas,
                                      const std::string& code_version = "v1") {
  DeploymentSpec d;
  d.name = name;
  d.import_path = "libexamples.so:" + name;
  d.code_version = code_version;
  d.config.num_replicas = replicas;
  return d;
}

inline ApplicationSpec make_app(const std::string& name, const std::string& prefix,
                                std::vector<DeploymentSpec> deployments) {
  ApplicationSpec a;
  a.name = name;
  a.route_prefix = prefix;
  a.ingress = deployments.empty() ? "" : deployments.front().name;
  a.deployments = std::move(deployments);
  return a;
}

inline std::vector<NodeInfo> make_nodes(int n, const std::string& capacity = "cpu=100") {
  std::vector<NodeInfo> nodes;
  for (int i = 1; i <= n; ++i) {
    nodes.push_back({"n" + std::to_string(i), NodeState::alive, *parse_resources(capacity)});
  }
  return nodes;
}

// "start a#d#1@n1", "stop a#d#1 20", "kill a#d#1", "watch a#d#1",
// "reconfigure a#d#1", "recover a#d#1".
inline std::string describe(const Command& c) {
  switch (c.kind) {
    case CommandKind::start:
      return "start " + c.replica_id + "@" + c.node_id;
    case CommandKind::stop: {
      std::string t = std::to_string(c.timeout_s);
      t.erase(t.find_last_not_of('0') + 1);
      if (!t.empty() && t.back() == '.')
        t.pop_back();
      return "stop " + c.replica_id + " " + t;
    }
    case CommandKind::kill:
      return "kill " + c.replica_id;
    case CommandKind::watch_health:
      return "watch " + c.replica_id;
    case CommandKind::reconfigure:
      return "reconfigure " + c.replica_id;
    case CommandKind::recover:
      return "recover " + c.replica_id;
  }
  return "?";
}

// Leaves out "@node" from start descriptions.
inline std::vector<std::string> without_nodes(std::vector<std::string> v) {
  for (auto& s : v) {
    auto at = s.find('@');
    if (at != std::string::npos)
      s.erase(at);
  }
  return v;
}

// Describes the commands, leaving out health watches unless asked.
inline std::vector<std::string> ops(const std::vector<Command>& cmds, bool with_checks = false) {
  std::vector<std::string> out;
  for (const auto& c : cmds) {
    if (c.kind == CommandKind::watch_health && !with_checks)
      continue;
    out.push_back(describe(c));
  }
  return out;
}

// The core, its fakes, and a tick loop. Each tick advances the clock, delivers
// the answers to the previous tick's commands, runs update() and executes the
// new commands.
struct Harness {
  FakeClock clock;
  FakeRandom rng;
  Random* random = &rng;  // what the core uses; tests may swap in a SeededRandom
  std::unique_ptr<MemoryStore> owned_store = std::make_unique<MemoryStore>();
  MemoryStore* store = owned_store.get();
  FakeCluster cluster{clock, random};
  CoreOptions options;
  std::vector<NodeInfo> nodes = make_nodes(3);
  std::unique_ptr<StateManager> core;
  std::vector<Command> last;

  Harness() { start(); }

  void start() {
    core = std::make_unique<StateManager>(*store, clock, *random, options);
    core->set_nodes(nodes);
    Status s = core->recover(cluster.hosted());
    if (!s)
      throw std::runtime_error(s.to_string());
    last.clear();
  }

  int restarts = 0;

  // A controller crash: queued answers are lost, replicas keep running. The
  // new incarnation names its replicas "<app>#<deployment>#r<restarts>-<n>".
  void restart() {
    options.replica_id_tag = "r" + std::to_string(++restarts);
    core.reset();
    cluster.drop_pending();
    cluster.reset_checks();
    start();
  }

  // Swaps the checkpoint store and restarts the controller on it.
  void replace_store(std::unique_ptr<MemoryStore> s) {
    owned_store = std::move(s);
    store = owned_store.get();
    restart();
  }

  void set_nodes(std::vector<NodeInfo> n) {
    nodes = std::move(n);
    core->set_nodes(nodes);
  }

  std::vector<std::string> tick(double dt = 1.0, bool with_checks = false) {
    clock.advance(dt);
    cluster.expire_checks();
    cluster.deliver(*core);
    last = core->update();
    cluster.execute(last);
    cluster.run_checks();
    return ops(last, with_checks);
  }

  void ticks(int n, double dt = 1.0) {
    for (int i = 0; i < n; ++i)
      tick(dt);
  }

  DeploymentStatusInfo status(const std::string& app, const std::string& dep) const {
    auto s = core->deployment_status({app, dep});
    if (!s)
      throw std::runtime_error("no deployment " + app + "/" + dep);
    return *s;
  }

  std::vector<ReplicaInfo> replicas(const std::string& app, const std::string& dep) const {
    return core->replicas({app, dep});
  }

  std::size_t count(const std::string& app, const std::string& dep, ReplicaState s) const {
    std::size_t n = 0;
    for (const auto& r : replicas(app, dep))
      n += r.state == s;
    return n;
  }
};

}  // namespace troupe::controller::testing
