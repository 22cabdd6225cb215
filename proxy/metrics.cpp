#include "proxy/metrics.hpp"

#include "proxy/grpc_fields.hpp"

#include <cstdio>
#include <tuple>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "runtime/metrics.hpp"

namespace troupe::proxy {

// The troupe_http_* metrics and troupe_build_info, kept by prometheus-cpp.
// The metrics of each label set are made once and found in the maps after
// (a family's Add() takes its own lock and hashes the labels every time).
struct Metrics::Http {
  std::shared_ptr<metrics::Registry> node;
  prometheus::Registry& registry;
  prometheus::Family<prometheus::Counter>& requests =
      prometheus::BuildCounter()
          .Name("troupe_http_requests_total")
          .Help("HTTP requests answered by this node's proxy, by application, route prefix, "
                "method and status code.")
          .Register(registry);
  prometheus::Family<prometheus::Histogram>& duration =
      prometheus::BuildHistogram()
          .Name("troupe_http_request_duration_seconds")
          .Help("Time from a parsed request to its answer (a stream's end), by application and "
                "route prefix.")
          .Register(registry);
  prometheus::Gauge& in_flight = prometheus::BuildGauge()
                                     .Name("troupe_http_requests_in_flight")
                                     .Help("HTTP requests received and not yet answered.")
                                     .Register(registry)
                                     .Add({});
  prometheus::Family<prometheus::Counter>& grpc_calls =
      prometheus::BuildCounter()
          .Name("troupe_grpc_requests_total")
          .Help(
              "gRPC calls answered by this node's gRPC port, by application and gRPC status "
              "code (OK, CANCELLED, ...).")
          .Register(registry);
  std::map<std::pair<std::string, int>, prometheus::Counter*> grpc_counters;
  prometheus::Family<prometheus::Gauge>& queued =
      prometheus::BuildGauge()
          .Name("troupe_deployment_queued_requests")
          .Help("Requests this node's proxy holds for a deployment until a replica has room.")
          .Register(registry);
  std::mutex mutex;
  std::map<std::tuple<std::string, std::string, std::string, int>, prometheus::Counter*> counters;
  std::map<std::pair<std::string, std::string>, prometheus::Histogram*> histograms;
  // troupe_deployment_queued_requests, set from the router's view at each
  // render; a deployment the router no longer has is removed.
  std::mutex queued_mutex;
  std::map<std::pair<std::string, std::string>, prometheus::Gauge*> queued_gauges;

  explicit Http(std::shared_ptr<metrics::Registry> r) : node(std::move(r)), registry(node->prom()) {
    prometheus::BuildGauge()
        .Name("troupe_build_info")
        .Help("1, labelled with the version of troupe this node runs.")
        .Register(registry)
        .Add({{"version", TROUPE_VERSION}})
        .Set(1);
  }
};

namespace {

// Label values escape backslash, double quote and newline.
std::string escape(const std::string& in) {
  std::string out;
  out.reserve(in.size());
  for (char c : in) {
    if (c == '\\' || c == '"') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

}  // namespace

void Metrics::render_histogram(std::string& out, const char* name, const std::string& app,
                               const Histogram& h) {
  std::string label = "application=\"" + escape(app) + "\"";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    cumulative += h.buckets[i];
    out += std::string(name) + "_bucket{" + label + ",le=\"" + number(kBuckets[i]) + "\"} " +
           std::to_string(cumulative) + "\n";
  }
  out += std::string(name) + "_bucket{" + label + ",le=\"+Inf\"} " + std::to_string(h.count) +
         "\n";
  out += std::string(name) + "_sum{" + label + "} " + number(h.sum) + "\n";
  out += std::string(name) + "_count{" + label + "} " + std::to_string(h.count) + "\n";
}

void Metrics::Histogram::add(double seconds) {
  size_t i = 0;
  while (i < kBuckets.size() && seconds > kBuckets[i])
    ++i;
  if (i < kBuckets.size())
    ++buckets[i];
  ++count;
  sum += seconds;
}

Metrics::Metrics(std::shared_ptr<metrics::Registry> registry)
    : http_(std::make_unique<Http>(registry ? std::move(registry)
                                            : std::make_shared<metrics::Registry>())) {}
Metrics::~Metrics() = default;

namespace {

std::string method_label(std::string_view method) {
  for (const char* known :
       {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"}) {
    if (method == known)
      return known;
  }
  return "other";  // a client may send any token: the label's values stay few
}

}  // namespace

void Metrics::observe_http(const std::string& app, const std::string& route,
                           std::string_view method, int status, double seconds) {
  auto& h = *http_;
  prometheus::Counter* counter;
  prometheus::Histogram* histogram;
  {
    std::lock_guard<std::mutex> lock(h.mutex);
    auto key = std::make_tuple(app, route, method_label(method), status);
    auto c = h.counters.find(key);
    if (c == h.counters.end()) {
      auto& made = h.requests.Add({{"application", app},
                                   {"route", route},
                                   {"method", std::get<2>(key)},
                                   {"code", std::to_string(status)}});
      c = h.counters.emplace(std::move(key), &made).first;
    }
    counter = c->second;
    auto d = h.histograms.find({app, route});
    if (d == h.histograms.end()) {
      auto& made = h.duration.Add({{"application", app}, {"route", route}},
                                  prometheus::Histogram::BucketBoundaries(kBuckets.begin(),
                                                                          kBuckets.end()));
      d = h.histograms.emplace(std::make_pair(app, route), &made).first;
    }
    histogram = d->second;
  }
  counter->Increment();
  histogram->Observe(seconds);
}

void Metrics::observe_grpc(const std::string& app, int code) {
  auto& h = *http_;
  prometheus::Counter* counter;
  {
    std::lock_guard<std::mutex> lock(h.mutex);
    auto key = std::make_pair(app, code);
    auto c = h.grpc_counters.find(key);
    if (c == h.grpc_counters.end()) {
      auto& made = h.grpc_calls.Add({{"application", app}, {"code", grpc::code_name(code)}});
      c = h.grpc_counters.emplace(std::move(key), &made).first;
    }
    counter = c->second;
  }
  counter->Increment();
}

double Metrics::grpc_count(const std::string& app, int code) const {
  std::lock_guard<std::mutex> lock(http_->mutex);
  auto it = http_->grpc_counters.find(std::make_pair(app, code));
  return it == http_->grpc_counters.end() ? 0 : it->second->Value();
}

double Metrics::http_count(const std::string& app, const std::string& route,
                           const std::string& method, int status) const {
  std::lock_guard<std::mutex> lock(http_->mutex);
  auto it = http_->counters.find(std::make_tuple(app, route, method, status));
  return it == http_->counters.end() ? 0 : it->second->Value();
}

void Metrics::observe(const std::string& app, int status, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++requests_[{app, status}];
  latency_[app].add(seconds);
}

void Metrics::first_byte(const std::string& app, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  first_byte_[app].add(seconds);
}

void Metrics::stream_ended(const std::string& app, const std::string& outcome) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++streams_[{app, outcome}];
}

uint64_t Metrics::streams(const std::string& app, const std::string& outcome) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = streams_.find({app, outcome});
  return it == streams_.end() ? 0 : it->second;
}

uint64_t Metrics::first_bytes(const std::string& app) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = first_byte_.find(app);
  return it == first_byte_.end() ? 0 : it->second.count;
}

void Metrics::retried(const std::string& app) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++retries_[app];
}

void Metrics::crashed(const std::string& app) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++crashed_[app];
}

uint64_t Metrics::crashes(const std::string& app) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = crashed_.find(app);
  return it == crashed_.end() ? 0 : it->second;
}

void Metrics::shadow(const std::string& app, const std::string& deployment,
                     const std::string& outcome) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++shadow_[{app, deployment, outcome}];
}

uint64_t Metrics::shadow_count(const std::string& app, const std::string& deployment,
                               const std::string& outcome) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = shadow_.find({app, deployment, outcome});
  return it == shadow_.end() ? 0 : it->second;
}

uint64_t Metrics::count(const std::string& app, int status) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = requests_.find({app, status});
  return it == requests_.end() ? 0 : it->second;
}

void Metrics::tls_refused(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++tls_refused_[reason];
}

std::string Metrics::render(const std::vector<Router::DeploymentView>& deployments) const {
  http_->in_flight.Set(static_cast<double>(in_flight()));
  {
    std::lock_guard<std::mutex> lock(http_->queued_mutex);
    auto stale = http_->queued_gauges;
    for (const auto& d : deployments) {
      auto key = std::make_pair(d.app, d.deployment);
      stale.erase(key);
      auto& g = http_->queued_gauges[key];
      if (!g)
        g = &http_->queued.Add({{"application", d.app}, {"deployment", d.deployment}});
      g->Set(static_cast<double>(d.queued));
    }
    for (const auto& [key, g] : stale) {
      http_->queued.Remove(g);
      http_->queued_gauges.erase(key);
    }
  }
  // Everything of this node's registry: the troupe_http_* above, and the
  // metrics of its agent, replicas and (on the head) controller.
  std::string out = http_->node->render();
  std::lock_guard<std::mutex> lock(mutex_);
  out += "# HELP troupe_proxy_requests_total HTTP requests answered, by application and status.\n";
  out += "# TYPE troupe_proxy_requests_total counter\n";
  for (const auto& [key, n] : requests_) {
    out += "troupe_proxy_requests_total{application=\"" + escape(key.first) + "\",code=\"" +
           std::to_string(key.second) + "\"} " + std::to_string(n) + "\n";
  }
  out += "# HELP troupe_proxy_request_duration_seconds Time from a parsed request to its answer.\n";
  out += "# TYPE troupe_proxy_request_duration_seconds histogram\n";
  for (const auto& [app, h] : latency_)
    render_histogram(out, "troupe_proxy_request_duration_seconds", app, h);
  out +=
      "# HELP troupe_proxy_time_to_first_byte_seconds Time from a parsed request to the first "
      "byte of its answer (a stream's head, or the whole answer).\n";
  out += "# TYPE troupe_proxy_time_to_first_byte_seconds histogram\n";
  for (const auto& [app, h] : first_byte_)
    render_histogram(out, "troupe_proxy_time_to_first_byte_seconds", app, h);
  out +=
      "# HELP troupe_proxy_streams_total Streamed answers, by application and outcome: complete, "
      "early (the producer failed, the replica was lost or the deadline passed; the client saw "
      "no final chunk) or client_gone.\n";
  out += "# TYPE troupe_proxy_streams_total counter\n";
  for (const auto& [key, n] : streams_) {
    out += "troupe_proxy_streams_total{application=\"" + escape(key.first) + "\",outcome=\"" +
           escape(key.second) + "\"} " + std::to_string(n) + "\n";
  }
  out += "# HELP troupe_proxy_requests_in_flight Requests received and not yet answered.\n";
  out += "# TYPE troupe_proxy_requests_in_flight gauge\n";
  out += "troupe_proxy_requests_in_flight " + std::to_string(in_flight()) + "\n";
  out += "# HELP troupe_proxy_retries_total Requests sent again to another replica.\n";
  out += "# TYPE troupe_proxy_retries_total counter\n";
  for (const auto& [app, n] : retries_) {
    out += "troupe_proxy_retries_total{application=\"" + escape(app) + "\"} " + std::to_string(n) +
           "\n";
  }
  out +=
      "# HELP troupe_proxy_requests_crashed_total Requests answered 502 because two replicas "
      "died with them (not retried again).\n";
  out += "# TYPE troupe_proxy_requests_crashed_total counter\n";
  for (const auto& [app, n] : crashed_) {
    out += "troupe_proxy_requests_crashed_total{application=\"" + escape(app) + "\"} " +
           std::to_string(n) + "\n";
  }
  out +=
      "# HELP troupe_proxy_shadow_requests_total Shadow copies of requests, by application, "
      "shadow deployment and outcome: the status code of the copy's answer (discarded), or "
      "dropped (the shadow had no free slot, or its replica refused it).\n";
  out += "# TYPE troupe_proxy_shadow_requests_total counter\n";
  for (const auto& [key, n] : shadow_) {
    const auto& [app, deployment, outcome] = key;
    out += "troupe_proxy_shadow_requests_total{application=\"" + escape(app) + "\",deployment=\"" +
           escape(deployment) + "\",outcome=\"" + escape(outcome) + "\"} " + std::to_string(n) +
           "\n";
  }
  out +=
      "# HELP troupe_proxy_replica_sends_total Requests sent to replicas (retries included), by "
      "transport: channel (a replica process of this node, over its data channel), caf, or "
      "inline (an in-process replica's handler, called by the io thread), or peer "
      "(a replica of another worker, over that worker's data port).\n";
  out += "# TYPE troupe_proxy_replica_sends_total counter\n";
  out += "troupe_proxy_replica_sends_total{transport=\"channel\"} " +
         std::to_string(sent_over(true)) + "\n";
  out += "troupe_proxy_replica_sends_total{transport=\"caf\"} " + std::to_string(sent_over(false)) +
         "\n";
  out += "troupe_proxy_replica_sends_total{transport=\"inline\"} " +
         std::to_string(sent_inline_count()) + "\n";
  out += "troupe_proxy_replica_sends_total{transport=\"peer\"} " +
         std::to_string(sent_peer_count()) + "\n";
  out +=
      "# HELP troupe_proxy_io_takeovers_total Times an io thread stayed in an in-process "
      "replica's blocking handler for longer than 2 ms and another thread took over its "
      "connections.\n";
  out += "# TYPE troupe_proxy_io_takeovers_total counter\n";
  out += "troupe_proxy_io_takeovers_total " + std::to_string(io_takeovers()) + "\n";
  out += "# HELP troupe_proxy_access_log_dropped_lines_total Access log lines dropped because "
         "the writer was 16 MiB behind (the disk stalled): the io threads do not wait for it.\n";
  out += "# TYPE troupe_proxy_access_log_dropped_lines_total counter\n";
  out += "troupe_proxy_access_log_dropped_lines_total " + std::to_string(access_log_dropped()) +
         "\n";
  out += "# HELP troupe_proxy_requests_by_scheme_total Requests parsed, by the port they came "
         "on: http or https.\n";
  out += "# TYPE troupe_proxy_requests_by_scheme_total counter\n";
  out += "troupe_proxy_requests_by_scheme_total{scheme=\"http\"} " +
         std::to_string(scheme_count(false)) + "\n";
  out += "troupe_proxy_requests_by_scheme_total{scheme=\"https\"} " +
         std::to_string(scheme_count(true)) + "\n";
  out += "# HELP troupe_proxy_tls_handshakes_refused_total TLS handshakes on the HTTPS port "
         "that failed, by reason.\n";
  out += "# TYPE troupe_proxy_tls_handshakes_refused_total counter\n";
  for (const auto& [reason, n] : tls_refused_) {
    out += "troupe_proxy_tls_handshakes_refused_total{reason=\"" + escape(reason) + "\"} " +
           std::to_string(n) + "\n";
  }
  out += "# HELP troupe_proxy_queue_length Requests waiting for a replica, by deployment.\n";
  out += "# TYPE troupe_proxy_queue_length gauge\n";
  for (const auto& d : deployments) {
    out += "troupe_proxy_queue_length{application=\"" + escape(d.app) + "\",deployment=\"" +
           escape(d.deployment) + "\"} " + std::to_string(d.queued) + "\n";
  }
  out += "# HELP troupe_proxy_replica_in_flight Requests this proxy has in flight, by replica.\n";
  out += "# TYPE troupe_proxy_replica_in_flight gauge\n";
  for (const auto& d : deployments) {
    for (const auto& r : d.replicas) {
      out += "troupe_proxy_replica_in_flight{application=\"" + escape(d.app) + "\",deployment=\"" +
             escape(d.deployment) + "\",replica=\"" + escape(r.replica_id) + "\"} " +
             std::to_string(r.in_flight) + "\n";
    }
  }
  return out;
}

}  // namespace troupe::proxy
