#include "replica/batching.hpp"

#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "replica/model_report.hpp"
#include "replica/plugin/import_path.hpp"
#include "replica/replica_metrics.hpp"
#include "runtime/libraries.hpp"
#include "runtime/multiplex.hpp"

namespace troupe::replica {

namespace {

using Clock = std::chrono::steady_clock;

HttpResponse to_answer(Response&& r) {
  HttpResponse out;
  if (r.stream) {
    out.status = 500;
    out.headers = {{"Content-Type", "application/json"}};
    out.body = Json{{"error",
                     "handle_batch answered a stream: the answers of a batch must be "
                     "whole responses"}}
                   .dump();
    return out;
  }
  out.status = r.status;
  out.headers = std::move(r.headers);
  out.body = std::move(r.body);
  return out;
}

}  // namespace

bool wants_batching(const BatchSettings& s) {
  return s.max_batch_size > 1 || s.adaptive;
}

Status check_batching(const BatchSettings& s, bool batches, const std::string& import_path) {
  if (batches || !wants_batching(s))
    return Status::ok();
  const std::string field = s.max_batch_size > 1
                                ? "max_batch_size is " + std::to_string(s.max_batch_size)
                                : std::string("batch_wait_timeout_s is auto");
  // The class and its library as the config named them (a pinned
  // library's file name without its pin).
  std::string shown = import_path;
  if (auto parsed = parse_import_path(import_path)) {
    const auto pin = libraries::split_pinned(parsed->library);
    shown = parsed->class_name + " (" + (pin ? pin->name : parsed->library) + ")";
  }
  return Status(errc::invalid_argument,
                field + ", but the deployment class " + shown +
                    " does not implement handle_batch(): only a class that overrides "
                    "troupe::Deployment::handle_batch() can batch (set max_batch_size: 1 and "
                    "remove batch_wait_timeout_s: auto, or implement it)");
}

ReplicaBatcher::ReplicaBatcher(const Instance& instance, const BatchSettings& settings,
                               std::shared_ptr<ReplicaMetrics> metrics,
                               std::shared_ptr<ModelReport> models)
    : metrics_(std::move(metrics)), models_(std::move(models)) {
  auto run = [weak = std::weak_ptr<Deployment>(instance)](const std::vector<Request>& requests) {
    Instance user = weak.lock();
    if (!user) {
      std::vector<Response> gone;
      for (size_t i = 0; i < requests.size(); ++i)
        gone.push_back(Response::json(Json{{"error", "the replica is stopping"}}, 503));
      return gone;
    }
    return user->handle_batch(requests);
  };
  Batcher::Observe observe;
  if (metrics_) {
    observe = [metrics = metrics_.get()](size_t size, double waited_s) {
      metrics->batch(size, waited_s);
    };
  }
  batcher_ = std::make_shared<Batcher>(
      options_of(settings), std::move(run), false, [] { return Clock::now(); }, std::move(observe));
  std::thread([batcher = batcher_] { batcher->run(); }).detach();
  active_.store(settings.max_batch_size > 1, std::memory_order_release);
}

ReplicaBatcher::~ReplicaBatcher() {
  batcher_->stop();
}

BatchOptions ReplicaBatcher::options_of(const BatchSettings& s) {
  BatchOptions o;
  o.max_batch_size = s.max_batch_size > 0 ? s.max_batch_size : 1;
  o.wait_s = s.wait_s;
  o.adaptive = s.adaptive;
  return o;
}

void ReplicaBatcher::apply(const BatchSettings& settings) {
  batcher_->set_options(options_of(settings));
  active_.store(settings.max_batch_size > 1, std::memory_order_release);
}

BatchSettings ReplicaBatcher::settings() const {
  const BatchOptions o = batcher_->options();
  BatchSettings s;
  s.max_batch_size = static_cast<uint32_t>(o.max_batch_size);
  s.wait_s = o.wait_s;
  s.adaptive = o.adaptive;
  return s;
}

void ReplicaBatcher::submit(HttpRequest&& req, std::shared_ptr<RequestControl> control,
                            std::function<void(HttpResponse&&)> done) {
  Request in{std::move(req.method),  std::move(req.path), std::move(req.query),
             std::move(req.headers), std::move(req.body), std::move(control)};
  const bool names_model = !in.multiplexed_model_id().empty();
  if (metrics_)
    metrics_->started();
  batcher_->submit(
      std::move(in), [done = std::move(done), request_id = std::move(req.request_id), names_model,
                      metrics = metrics_, models = models_, began = Clock::now()](Response r) {
        HttpResponse out = to_answer(std::move(r));
        if (metrics) {
          metrics->finished(out.status >= 500,
                            std::chrono::duration<double>(Clock::now() - began).count());
        }
        if (!request_id.empty())
          out.headers.emplace_back("X-Request-Id", request_id);
        if (names_model && models && models->active())
          out.headers.emplace_back(multiplex::kHeldModelsHeader,
                                   multiplex::encode_held(models->held()));
        done(std::move(out));
      });
}

}  // namespace troupe::replica
