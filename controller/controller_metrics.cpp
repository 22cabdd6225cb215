#include "controller/controller_metrics.hpp"

#include <chrono>
#include <mutex>
#include <set>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "runtime/metrics.hpp"
#include "runtime/wire.hpp"

namespace troupe::controller {

namespace {

const prometheus::Histogram::BucketBoundaries kSeconds = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};

}  // namespace

struct ControllerMetrics::Impl {
  std::shared_ptr<metrics::Registry> registry;
  prometheus::Histogram& reconcile;
  prometheus::Histogram& checkpoint;
  prometheus::Family<prometheus::Counter>& deploys;
  prometheus::Counter& restarts;
  prometheus::Family<prometheus::Gauge>& target;
  prometheus::Family<prometheus::Gauge>& running;
  prometheus::Family<prometheus::Gauge>& nodes;
  std::map<std::pair<std::string, std::string>, std::pair<prometheus::Gauge*, prometheus::Gauge*>>
      deployments;

  explicit Impl(std::shared_ptr<metrics::Registry> r)
      : registry(std::move(r)),
        reconcile(prometheus::BuildHistogram()
                      .Name("troupe_controller_reconcile_duration_seconds")
                      .Help("Time of one reconcile pass of the controller (on the head).")
                      .Register(registry->prom())
                      .Add({}, kSeconds)),
        checkpoint(prometheus::BuildHistogram()
                       .Name("troupe_controller_checkpoint_write_duration_seconds")
                       .Help("Time of one synced write of the controller's checkpoint.")
                       .Register(registry->prom())
                       .Add({}, kSeconds)),
        deploys(prometheus::BuildCounter()
                    .Name("troupe_controller_deploys_total")
                    .Help("Deploy and apply requests the controller answered, by outcome (ok, "
                          "error).")
                    .Register(registry->prom())),
        restarts(prometheus::BuildCounter()
                     .Name("troupe_controller_restarts_total")
                     .Help("Times the head's supervisor restarted the controller after it died.")
                     .Register(registry->prom())
                     .Add({})),
        target(prometheus::BuildGauge()
                   .Name("troupe_deployment_target_replicas")
                   .Help("Replicas a deployment should have now (autoscaling included).")
                   .Register(registry->prom())),
        running(prometheus::BuildGauge()
                    .Name("troupe_deployment_running_replicas")
                    .Help("Replicas of a deployment that are RUNNING.")
                    .Register(registry->prom())),
        nodes(
            prometheus::BuildGauge()
                .Name("troupe_nodes")
                .Help("Nodes the controller knows, by state (ALIVE, DRAINING, UNREACHABLE, DEAD).")
                .Register(registry->prom())) {}
  prometheus::Counter& snapshots = prometheus::BuildCounter()
                                       .Name("troupe_controller_snapshots_pushed_total")
                                       .Help(
                                           "Distinct routing snapshots the controller pushed "
                                           "(each once however many subscribers got it).")
                                       .Register(registry->prom())
                                       .Add({});
  prometheus::Family<prometheus::Counter>& pushes =
      prometheus::BuildCounter()
          .Name("troupe_controller_snapshot_pushes_total")
          .Help(
              "Routing snapshots sent to subscribers, by where the subscriber runs (local: "
              "this process, never serialized; remote).")
          .Register(registry->prom());
  prometheus::Counter& serialized =
      prometheus::BuildCounter()
          .Name("troupe_controller_snapshot_serializations_total")
          .Help("Pushed snapshots serialized for another process: at most once per snapshot.")
          .Register(registry->prom())
          .Add({});
  prometheus::Counter& copied =
      prometheus::BuildCounter()
          .Name("troupe_controller_snapshot_serialization_copies_total")
          .Help(
              "Sends of a pushed snapshot to another process that copied the bytes of its one "
              "serialization instead of serializing it again.")
          .Register(registry->prom())
          .Add({});
  SnapshotEncodingCounts counted;  // what serialized and copied hold
  std::mutex mutex;  // refresh() of two incarnations of the controller
  // Only on head candidates (leading()).
  prometheus::Gauge* is_leader = nullptr;
  prometheus::Counter* leader_changes = nullptr;
};

namespace {

class TimedStore : public CheckpointStore {
 public:
  TimedStore(std::shared_ptr<CheckpointStore> inner, std::shared_ptr<ControllerMetrics::Impl> m)
      : inner_(std::move(inner)), m_(std::move(m)) {}
  Status save(const TargetState& state) override {
    auto start = std::chrono::steady_clock::now();
    Status s = inner_->save(state);
    m_->checkpoint.Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return s;
  }
  Result<std::optional<TargetState>> load() override { return inner_->load(); }

 private:
  std::shared_ptr<CheckpointStore> inner_;
  std::shared_ptr<ControllerMetrics::Impl> m_;
};

}  // namespace

ControllerMetrics::ControllerMetrics(std::shared_ptr<metrics::Registry> registry)
    : impl_(std::make_shared<Impl>(std::move(registry))) {}

ControllerMetrics::~ControllerMetrics() = default;

void ControllerMetrics::reconciled(double seconds) {
  impl_->reconcile.Observe(seconds);
}

void ControllerMetrics::deployed(const std::string& outcome) {
  impl_->deploys.Add({{"outcome", outcome}}).Increment();
}

void ControllerMetrics::restarted() {
  impl_->restarts.Increment();
}

void ControllerMetrics::leading(bool leads) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (!impl_->is_leader) {
    impl_->is_leader =
        &prometheus::BuildGauge()
             .Name("troupe_controller_is_leader")
             .Help("1 while this head candidate leads (runs the controller), else 0.")
             .Register(impl_->registry->prom())
             .Add({});
    impl_->leader_changes = &prometheus::BuildCounter()
                                 .Name("troupe_controller_leader_changes_total")
                                 .Help("Times this head candidate started or stopped leading.")
                                 .Register(impl_->registry->prom())
                                 .Add({});
  } else if ((impl_->is_leader->Value() != 0) != leads) {
    impl_->leader_changes->Increment();
  }
  impl_->is_leader->Set(leads ? 1 : 0);
}

std::shared_ptr<CheckpointStore> ControllerMetrics::timed(std::shared_ptr<CheckpointStore> store) {
  if (!store)
    return store;
  return std::make_shared<TimedStore>(std::move(store), impl_);
}

void ControllerMetrics::pushed(size_t snapshots, size_t local, size_t remote) {
  impl_->snapshots.Increment(static_cast<double>(snapshots));
  if (local > 0)
    impl_->pushes.Add({{"to", "local"}}).Increment(static_cast<double>(local));
  if (remote > 0)
    impl_->pushes.Add({{"to", "remote"}}).Increment(static_cast<double>(remote));
}

void ControllerMetrics::refresh(const StateManager* core, const std::vector<NodeStatus>& nodes) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto counts = snapshot_encoding_counts();
  impl_->serialized.Increment(static_cast<double>(counts.serialized - impl_->counted.serialized));
  impl_->copied.Increment(static_cast<double>(counts.copied - impl_->counted.copied));
  impl_->counted = counts;
  std::map<std::string, int> by_state = {
      {"ALIVE", 0}, {"DRAINING", 0}, {"UNREACHABLE", 0}, {"DEAD", 0}};
  for (const auto& n : nodes)
    ++by_state[n.state];
  for (const auto& [state, n] : by_state)
    impl_->nodes.Add({{"state", state}}).Set(n);

  std::set<std::pair<std::string, std::string>> seen;
  if (core) {
    for (const auto& id : core->deployment_ids()) {
      auto key = std::make_pair(id.app, id.name);
      seen.insert(key);
      auto& g = impl_->deployments[key];
      if (!g.first) {
        prometheus::Labels labels{{"application", id.app}, {"deployment", id.name}};
        g.first = &impl_->target.Add(labels);
        g.second = &impl_->running.Add(labels);
      }
      const DeploymentState* d = core->deployment(id);
      g.first->Set(d ? d->target_replicas() : 0);
      g.second->Set(d ? d->running_count() : 0);
    }
  }
  for (auto it = impl_->deployments.begin(); it != impl_->deployments.end();) {
    if (seen.count(it->first)) {
      ++it;
      continue;
    }
    impl_->target.Remove(it->second.first);
    impl_->running.Remove(it->second.second);
    it = impl_->deployments.erase(it);
  }
}

}  // namespace troupe::controller
