// One replica's metrics in its process's registry (runtime/metrics.hpp):
// troupe's own (requests, errors, processing time, requests in progress,
// health) and the user's (ReplicaContext::counter() and its kin), every
// series labelled application, deployment and replica. The series are
// removed when the last holder lets go: the replica and every user metric
// handed out (a user's object may outlive the replica's actor).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include <troupe/deployment.hpp>

#include "replica/load_window.hpp"
#include "runtime/metrics.hpp"

namespace troupe::replica {

class ReplicaMetrics {
 public:
  static std::shared_ptr<ReplicaMetrics> make(std::shared_ptr<metrics::Registry> registry,
                                              const std::string& app,
                                              const std::string& deployment,
                                              const std::string& replica_id);
  ~ReplicaMetrics();
  ReplicaMetrics(const ReplicaMetrics&) = delete;
  ReplicaMetrics& operator=(const ReplicaMetrics&) = delete;

  // A request entered handle(); it left after `seconds`, with `error` when
  // the answer is a 5xx (an exception included).
  void started();
  void finished(bool error, double seconds);
  // What the replica's metrics report carries besides them (ReplicaLoad):
  // errors, streams in progress, the interval's p99 of handler time.
  LoadWindow& load() { return load_; }
  // The user's check_health() ended after `seconds`.
  void health(bool healthy, double seconds);
  // Unhealthy without running the user's check (a stuck replica).
  void set_healthy(bool healthy);
  // The process's request loop was taken over (a handler blocked in it).
  void loop_taken_over();
  // A batch of `size` requests ran; its oldest request waited `waited_s`
  // for it to close.
  void batch(size_t size, double waited_s);

  // ReplicaContext::metrics of this replica.
  std::shared_ptr<MetricsSink> user_sink();

  const std::shared_ptr<metrics::Registry>& registry() const;

  struct Impl;

 private:
  explicit ReplicaMetrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::weak_ptr<ReplicaMetrics> self_;
  LoadWindow load_;
};

}  // namespace troupe::replica
