#include "replica/replica_metrics.hpp"

#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace troupe::replica {

namespace {

const prometheus::Histogram::BucketBoundaries kSeconds = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
// Requests per batch: powers of two up to the largest max_batch_size a
// config may set (controller/core/validate.hpp, kMaxBatchSize).
const prometheus::Histogram::BucketBoundaries kBatchSizes = {1,   2,   4,   8,    16,   32,   64,
                                                             128, 256, 512, 1024, 2048, 4096, 8192};
const prometheus::Histogram::BucketBoundaries kBatchWaits = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1};

}  // namespace

struct ReplicaMetrics::Impl {
  std::shared_ptr<metrics::Registry> registry;
  prometheus::Labels labels;  // application, deployment, replica

  prometheus::Family<prometheus::Counter>* requests_family;
  prometheus::Family<prometheus::Counter>* errors_family;
  prometheus::Family<prometheus::Histogram>* processing_family;
  prometheus::Family<prometheus::Gauge>* ongoing_family;
  prometheus::Family<prometheus::Gauge>* healthy_family;
  prometheus::Family<prometheus::Histogram>* health_family;
  prometheus::Family<prometheus::Counter>* takeovers_family;
  prometheus::Family<prometheus::Histogram>* batch_size_family;
  prometheus::Family<prometheus::Histogram>* batch_wait_family;
  prometheus::Counter* requests;
  prometheus::Counter* errors;
  prometheus::Histogram* processing;
  prometheus::Gauge* ongoing;
  prometheus::Gauge* healthy;
  prometheus::Histogram* health;
  prometheus::Counter* takeovers;
  // Made by the first batch (a replica that never batches shows none).
  std::once_flag batch_once;
  prometheus::Histogram* batch_size = nullptr;
  prometheus::Histogram* batch_wait = nullptr;

  // User metrics: the object handed out per (name, labels) while anyone
  // holds it (weak: it holds this object), and how to remove each series at
  // the end.
  std::mutex mutex;
  std::map<std::pair<std::string, Labels>, std::weak_ptr<void>> user;
  std::map<std::string, char> types;
  std::map<std::pair<std::string, Labels>, std::function<void()>> removals;

  ~Impl() {
    requests_family->Remove(requests);
    errors_family->Remove(errors);
    processing_family->Remove(processing);
    ongoing_family->Remove(ongoing);
    healthy_family->Remove(healthy);
    health_family->Remove(health);
    takeovers_family->Remove(takeovers);
    if (batch_size) {
      batch_size_family->Remove(batch_size);
      batch_wait_family->Remove(batch_wait);
    }
    for (auto& [key, remove] : removals)
      remove();
  }
};

namespace {

// User metrics hold the ReplicaMetrics they were made by: its series live
// while they do.
struct UserCounter : Counter {
  std::shared_ptr<ReplicaMetrics> owner;
  prometheus::Counter* metric;
  void inc(double by) override {
    if (by >= 0)
      metric->Increment(by);
  }
  double value() const override { return metric->Value(); }
};

struct UserGauge : Gauge {
  std::shared_ptr<ReplicaMetrics> owner;
  prometheus::Gauge* metric;
  void set(double v) override { metric->Set(v); }
  void add(double by) override { metric->Increment(by); }
  double value() const override { return metric->Value(); }
};

struct UserHistogram : Histogram {
  std::shared_ptr<ReplicaMetrics> owner;
  prometheus::Histogram* metric;
  void observe(double v) override { metric->Observe(v); }
};

class UserSink : public MetricsSink {
 public:
  UserSink(std::weak_ptr<ReplicaMetrics> owner, ReplicaMetrics::Impl& impl)
      : owner_(std::move(owner)), impl_(impl) {}

  std::shared_ptr<Counter> counter(const std::string& name, const std::string& help,
                                   const Labels& labels) override {
    return make<UserCounter, prometheus::Counter>('c', name, help, labels, [&] {
      return &prometheus::BuildCounter().Name(name).Help(help).Register(impl_.registry->prom());
    });
  }
  std::shared_ptr<Gauge> gauge(const std::string& name, const std::string& help,
                               const Labels& labels) override {
    return make<UserGauge, prometheus::Gauge>('g', name, help, labels, [&] {
      return &prometheus::BuildGauge().Name(name).Help(help).Register(impl_.registry->prom());
    });
  }
  std::shared_ptr<Histogram> histogram(const std::string& name, const std::string& help,
                                       const std::vector<double>& buckets,
                                       const Labels& labels) override {
    for (size_t i = 1; i < buckets.size(); ++i) {
      if (!(buckets[i - 1] < buckets[i]))
        throw std::invalid_argument("the buckets of the histogram '" + name +
                                    "' are not in ascending order");
    }
    return make<UserHistogram, prometheus::Histogram>(
        'h', name, help, labels,
        [&] {
          return &prometheus::BuildHistogram().Name(name).Help(help).Register(
              impl_.registry->prom());
        },
        buckets);
  }

 private:
  template <class Mine, class Theirs, class MakeFamily, class... Args>
  std::shared_ptr<Mine> make(char type, const std::string& name, const std::string& help,
                             const Labels& labels, MakeFamily make_family, Args&&... args) {
    detail::LocalMetrics::check_name(name, false);
    for (const auto& kv : labels)
      detail::LocalMetrics::check_name(kv.first, true);
    (void)help;
    auto owner = owner_.lock();
    if (!owner)
      throw std::logic_error("the replica's metrics are gone");
    std::lock_guard<std::mutex> lock(impl_.mutex);
    auto t = impl_.types.emplace(name, type).first;
    if (t->second != type)
      throw std::invalid_argument("the metric '" + name + "' exists with another type");
    auto key = std::make_pair(name, labels);
    auto& slot = impl_.user[key];
    if (auto held = slot.lock())
      return std::static_pointer_cast<Mine>(held);
    // Throws std::invalid_argument when another deployment in this process
    // registered the name with another type.
    prometheus::Family<Theirs>* family = make_family();
    prometheus::Labels all(labels.begin(), labels.end());
    all.insert(impl_.labels.begin(), impl_.labels.end());
    Theirs* metric = &family->Add(all, std::forward<Args>(args)...);
    impl_.removals.emplace(key, [family, metric] { family->Remove(metric); });
    auto mine = std::make_shared<Mine>();
    mine->owner = std::move(owner);
    mine->metric = metric;
    slot = mine;
    return mine;
  }

  std::weak_ptr<ReplicaMetrics> owner_;
  ReplicaMetrics::Impl& impl_;
};

}  // namespace

std::shared_ptr<ReplicaMetrics> ReplicaMetrics::make(std::shared_ptr<metrics::Registry> registry,
                                                     const std::string& app,
                                                     const std::string& deployment,
                                                     const std::string& replica_id) {
  auto impl = std::make_unique<Impl>();
  impl->registry = std::move(registry);
  impl->labels = {{"application", app}, {"deployment", deployment}, {"replica", replica_id}};
  auto& reg = impl->registry->prom();
  impl->requests_family = &prometheus::BuildCounter()
                               .Name("troupe_deployment_requests_total")
                               .Help("Requests a replica's handle() ran.")
                               .Register(reg);
  impl->errors_family = &prometheus::BuildCounter()
                             .Name("troupe_deployment_errors_total")
                             .Help("Requests whose handle() answered 5xx or raised.")
                             .Register(reg);
  impl->processing_family = &prometheus::BuildHistogram()
                                 .Name("troupe_deployment_processing_duration_seconds")
                                 .Help("Time in handle(), measured in the replica (a stream: "
                                       "until its head).")
                                 .Register(reg);
  impl->ongoing_family = &prometheus::BuildGauge()
                              .Name("troupe_replica_processing_requests")
                              .Help("Requests in a replica's handle() now.")
                              .Register(reg);
  impl->healthy_family = &prometheus::BuildGauge()
                              .Name("troupe_replica_healthy")
                              .Help("1 when the replica's last health check passed, else 0.")
                              .Register(reg);
  impl->health_family = &prometheus::BuildHistogram()
                             .Name("troupe_health_check_duration_seconds")
                             .Help("Time of a replica's check_health().")
                             .Register(reg);
  impl->takeovers_family =
      &prometheus::BuildCounter()
           .Name("troupe_replica_loop_takeovers_total")
           .Help("Times a replica process's request loop was taken over by another thread "
                 "because a handler it ran blocked for 2 ms.")
           .Register(reg);
  impl->batch_size_family =
      &prometheus::BuildHistogram()
           .Name("troupe_deployment_batch_size")
           .Help("Requests per batch a replica's handle_batch() ran (request batching).")
           .Register(reg);
  impl->batch_wait_family =
      &prometheus::BuildHistogram()
           .Name("troupe_deployment_batch_wait_seconds")
           .Help("How long the oldest request of a batch waited for its batch to close.")
           .Register(reg);
  impl->requests = &impl->requests_family->Add(impl->labels);
  impl->errors = &impl->errors_family->Add(impl->labels);
  impl->processing = &impl->processing_family->Add(impl->labels, kSeconds);
  impl->ongoing = &impl->ongoing_family->Add(impl->labels);
  impl->healthy = &impl->healthy_family->Add(impl->labels);
  impl->health = &impl->health_family->Add(impl->labels, kSeconds);
  impl->takeovers = &impl->takeovers_family->Add(impl->labels);
  // Healthy until a check says otherwise: a replica is started only once
  // its constructor succeeded.
  impl->healthy->Set(1);
  std::shared_ptr<ReplicaMetrics> made(new ReplicaMetrics(std::move(impl)));
  made->self_ = made;
  return made;
}

ReplicaMetrics::ReplicaMetrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ReplicaMetrics::~ReplicaMetrics() = default;

void ReplicaMetrics::started() {
  impl_->ongoing->Increment();
}

void ReplicaMetrics::finished(bool error, double seconds) {
  impl_->ongoing->Decrement();
  impl_->requests->Increment();
  if (error)
    impl_->errors->Increment();
  impl_->processing->Observe(seconds);
  load_.record(error, seconds);
}

void ReplicaMetrics::health(bool healthy, double seconds) {
  impl_->healthy->Set(healthy ? 1 : 0);
  impl_->health->Observe(seconds);
}

void ReplicaMetrics::loop_taken_over() {
  impl_->takeovers->Increment();
}

void ReplicaMetrics::batch(size_t size, double waited_s) {
  std::call_once(impl_->batch_once, [&] {
    impl_->batch_size = &impl_->batch_size_family->Add(impl_->labels, kBatchSizes);
    impl_->batch_wait = &impl_->batch_wait_family->Add(impl_->labels, kBatchWaits);
  });
  impl_->batch_size->Observe(static_cast<double>(size));
  impl_->batch_wait->Observe(waited_s);
}

void ReplicaMetrics::set_healthy(bool healthy) {
  impl_->healthy->Set(healthy ? 1 : 0);
}

std::shared_ptr<MetricsSink> ReplicaMetrics::user_sink() {
  return std::make_shared<UserSink>(self_, *impl_);
}

const std::shared_ptr<metrics::Registry>& ReplicaMetrics::registry() const {
  return impl_->registry;
}

}  // namespace troupe::replica
