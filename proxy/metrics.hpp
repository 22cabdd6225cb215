// The proxy's counters, rendered in the Prometheus text format (version
// 0.0.4) for /-/metrics. Thread-safe; one instance per proxy.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "proxy/router.hpp"

namespace troupe::metrics {
class Registry;
}

namespace troupe::proxy {

class Metrics {
 public:
  // Upper bounds of the latency histogram, in seconds (+Inf is implicit).
  static constexpr std::array<double, 14> kBuckets = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

  // `registry`: the node's (runtime/metrics.hpp), where the troupe_http_*
  // metrics are made and whose whole content render() serves; empty: one
  // of its own.
  explicit Metrics(std::shared_ptr<metrics::Registry> registry = nullptr);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // A finished request: `app` is "" for requests that matched no application
  // (404s, malformed requests, /-/ endpoints).
  void observe(const std::string& app, int status, double seconds);
  // The same request for the troupe_http_* metrics (prometheus-cpp):
  // `route` is the route prefix it matched ("" for none); a method other than
  // the nine of HTTP/1.1 counts as "other".
  void observe_http(const std::string& app, const std::string& route, std::string_view method,
                    int status, double seconds);
  // A gRPC call's end with its gRPC status code (troupe_grpc_requests_total).
  void observe_grpc(const std::string& app, int code);
  double grpc_count(const std::string& app, int code) const;
  // troupe_http_requests_total for those labels; for tests.
  double http_count(const std::string& app, const std::string& route, const std::string& method,
                    int status) const;
  // The first byte of the answer went to the client, `seconds` after the
  // request was parsed: the head of a stream, or the whole answer.
  void first_byte(const std::string& app, double seconds);
  // A streamed answer ended: `outcome` is complete, early (the replica's
  // producer failed, the replica was lost or the deadline passed) or
  // client_gone.
  void stream_ended(const std::string& app, const std::string& outcome);
  uint64_t streams(const std::string& app, const std::string& outcome) const;
  uint64_t first_bytes(const std::string& app) const;
  void retried(const std::string& app);
  // A request that crashed two replicas (a "query of death"): answered 502
  // and never sent again. See call.cpp: crashed(), and attempts.hpp.
  void crashed(const std::string& app);
  // A request sent to a replica: over a replica process's data channel, or
  // over CAF (other nodes, in-process replicas, frames too large or a full
  // channel).
  void sent(bool channel) {
    (channel ? sent_channel_ : sent_caf_).fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t sent_over(bool channel) const {
    return (channel ? sent_channel_ : sent_caf_).load(std::memory_order_relaxed);
  }
  // A request run inline by an in-process replica's handler
  // (proxy/inline_path.cpp).
  void sent_inline() { sent_inline_.fetch_add(1, std::memory_order_relaxed); }
  // An io thread's loop was taken over: it stayed in a blocking handler
  // (runtime/loop_takeover.hpp).
  void io_takeover() { io_takeovers_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t io_takeovers() const { return io_takeovers_.load(std::memory_order_relaxed); }
  // The access log's lines dropped so far (AccessLog::dropped_lines(); the
  // io threads' sweep reports it).
  void access_log_dropped(uint64_t total) {
    access_log_dropped_.store(total, std::memory_order_relaxed);
  }
  uint64_t access_log_dropped() const {
    return access_log_dropped_.load(std::memory_order_relaxed);
  }
  // ... and over another worker's data port (proxy/peer_client.cpp).
  void sent_peer() { sent_peer_.fetch_add(1, std::memory_order_relaxed); }
  // A request parsed on the HTTP port (secure: false) or the HTTPS port.
  void scheme(bool secure) {
    (secure ? requests_https_ : requests_http_).fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t scheme_count(bool secure) const {
    return (secure ? requests_https_ : requests_http_).load(std::memory_order_relaxed);
  }
  // A TLS handshake on the HTTPS port failed (HttpServer's reasons).
  void tls_refused(const std::string& reason);
  uint64_t sent_peer_count() const { return sent_peer_.load(std::memory_order_relaxed); }
  uint64_t sent_inline_count() const { return sent_inline_.load(std::memory_order_relaxed); }
  // A shadow copy of a request to `app` for its shadow `deployment`, once it
  // ends: `outcome` is the status code of its answer ("200", or the proxy's
  // own "502"/"504" when it failed or timed out) or "dropped" (not sent: the
  // shadow had no free slot; or refused by its replica). See shadow.hpp.
  void shadow(const std::string& app, const std::string& deployment, const std::string& outcome);
  // Copies counted by shadow(); for tests.
  uint64_t shadow_count(const std::string& app, const std::string& deployment,
                        const std::string& outcome) const;
  void request_started() { in_flight_.fetch_add(1, std::memory_order_relaxed); }
  void request_finished() { in_flight_.fetch_sub(1, std::memory_order_relaxed); }
  int64_t in_flight() const { return in_flight_.load(std::memory_order_relaxed); }

  // Requests counted for (app, status); for tests.
  uint64_t count(const std::string& app, int status) const;
  // Requests of `app` counted by crashed(); for tests.
  uint64_t crashes(const std::string& app) const;

  // The exposition text: the node registry's families (the troupe_http_*
  // ones, troupe_deployment_queued_requests and what the node's other parts
  // keep there), then the hand-written troupe_proxy_* ones. Queue lengths
  // and per-replica in-flight counts come from the router's view.
  std::string render(const std::vector<Router::DeploymentView>& deployments) const;

 private:
  struct Histogram {
    std::array<uint64_t, kBuckets.size()> buckets{};  // not cumulative
    uint64_t count = 0;
    double sum = 0;
    void add(double seconds);
  };
  static void render_histogram(std::string& out, const char* name, const std::string& app,
                               const Histogram& h);
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, Histogram> latency_;
  std::map<std::string, Histogram> first_byte_;
  std::map<std::pair<std::string, std::string>, uint64_t> streams_;
  std::map<std::string, uint64_t> retries_;
  std::map<std::string, uint64_t> crashed_;
  // (application, deployment, outcome) of shadow copies.
  std::map<std::tuple<std::string, std::string, std::string>, uint64_t> shadow_;
  std::atomic<int64_t> in_flight_{0};
  std::atomic<uint64_t> sent_channel_{0};
  std::atomic<uint64_t> sent_peer_{0};
  std::atomic<uint64_t> sent_caf_{0};
  std::atomic<uint64_t> sent_inline_{0};
  std::atomic<uint64_t> io_takeovers_{0};
  std::atomic<uint64_t> access_log_dropped_{0};
  std::atomic<uint64_t> requests_http_{0};
  std::atomic<uint64_t> requests_https_{0};
  std::map<std::string, uint64_t> tls_refused_;  // under mutex_
  struct Http;  // the prometheus-cpp registry and families
  std::unique_ptr<Http> http_;
};

}  // namespace troupe::proxy
