// The load of a chaos run: HTTP GETs through the nodes' proxies, closed loop
// (a fixed number of clients) or open loop (a fixed rate), each client on one
// node. Every answer is recorded in per-second buckets (successes, failures
// by status code or transport error, latencies), per node, and every failure
// individually (start, end, node, code) so that it can be matched with the
// faults afterwards.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tools/chaos/http_client.hpp"
#include "tools/chaos/process.hpp"
#include "tools/chaos/scenario.hpp"

namespace chaos {

struct SecondStats {
  int64_t ok = 0;
  std::map<std::string, int64_t> failures;  // "503", "connect", "timeout", "reset", ...
  std::vector<float> latencies_ms;          // every answered request (any status)
};

struct FailureRecord {
  double start_s = 0;  // relative to the run's t0
  double end_s = 0;
  std::string node;
  std::string code;
};

struct NodeLoadStats {
  int64_t ok = 0;
  int64_t failed = 0;
};

struct LoadResult {
  std::vector<SecondStats> seconds;
  std::map<std::string, NodeLoadStats> per_node;
  std::vector<FailureRecord> failures;  // at most kMaxFailureRecords
  int64_t failures_not_recorded = 0;
  int64_t ok = 0;
  int64_t failed = 0;
  int64_t late_sends = 0;  // open loop: sent > 100 ms after their slot (pool too small)
};

class LoadGenerator {
 public:
  static constexpr size_t kMaxFailureRecords = 200000;
  static constexpr size_t kMaxLatencySamplesPerSecond = 200000;

  // `ports`: node id -> HTTP endpoint of the nodes that take load.
  LoadGenerator(const LoadSpec& spec, std::map<std::string, Endpoint> ports, Clock::time_point t0);
  ~LoadGenerator();
  LoadGenerator(const LoadGenerator&) = delete;
  LoadGenerator& operator=(const LoadGenerator&) = delete;

  void start();
  // Stops the clients (each finishes its current request, bounded by the
  // request timeout) and joins them.
  void stop();
  bool running() const { return !stop_.load(); }
  // Copy of what was recorded so far.
  LoadResult result() const;

 private:
  void client_loop(size_t index, std::string node, Endpoint port);
  // follow_readyz: polls every node's /-/readyz until stopped.
  void watch_readiness();
  bool ready(const std::string& node) const;
  // The next node after `node` (by id, wrapping) whose /-/readyz said 200.
  std::optional<std::pair<std::string, Endpoint>> next_ready(const std::string& node) const;
  void record(double start_s, double end_s, const std::string& node, int status,
              const std::string& error);

  LoadSpec spec_;
  std::map<std::string, Endpoint> ports_;
  Clock::time_point t0_;
  Clock::time_point end_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> next_slot_{0};
  std::vector<std::thread> threads_;
  std::thread watcher_;
  mutable std::mutex ready_mu_;
  std::map<std::string, bool> ready_;  // node -> its /-/readyz said 200 last
  mutable std::mutex mu_;
  LoadResult result_;
};

}  // namespace chaos
