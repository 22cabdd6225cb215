// What the controller saw happen, for people (the head's dashboard,
// /-/dashboard): the recent events (nodes joining, leaving, dying; deploys
// and deletes; deployment status changes; replicas that crashed) and each
// replica's load from what replicas report with their metrics (requests and
// errors per second, requests and streams in progress, the p99 of handler
// time), and the restarts of each deployment's replicas. Plain C++ on the
// controller's clock: tests step it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "runtime/wire.hpp"

namespace troupe::controller {

struct Event {
  double at = 0;        // the controller's clock, seconds
  std::string kind;     // node, deploy, status, crash
  std::string subject;  // a node id, an application, "app/deployment", a replica id
  std::string message;  // one sentence
  bool warn = false;    // deserves attention (DEAD, crash, UNHEALTHY, ...)
};

// A replica's load as its last report gave it (Activity::load).
struct ReplicaActivity {
  double requests_per_s = 0;
  double errors_per_s = 0;
  double in_flight = 0;  // average over the interval
  uint32_t streams = 0;
  double p99_s = -1;     // < 0: no request finished in the interval
};

class Activity {
 public:
  explicit Activity(size_t capacity = 200) : capacity_(capacity) {}

  // Keeps the newest `capacity` events.
  void record(double now, std::string kind, std::string subject, std::string message,
              bool warn = false);
  const std::deque<Event>& events() const { return events_; }
  // The newest `limit` events, newest first, each with its age in seconds
  // at `now`: [{"age_s", "kind", "subject", "message", "warn"}].
  nlohmann::json events_json(double now, size_t limit) const;

  // A replica's report at `now` (ReplicaLoad): its counts of requests
  // finished and of errors since it started give rates, the growth since the
  // previous report; a count that went down (a new process under the same
  // id) starts over. The rest is taken as reported.
  void report(const ReplicaLoad& load, double now);
  // What the replica's last report said; nullopt when unknown or when that
  // report is older than `stale_s`.
  std::optional<ReplicaActivity> load(const std::string& replica_id, double now,
                                      double stale_s = 30) const;
  // Requests per second of the replica over its last report interval; 0 when
  // unknown or stale.
  double rate(const std::string& replica_id, double now, double stale_s = 30) const;
  // Forgets the replicas `keep` says are gone.
  void prune(const std::function<bool(const std::string& replica_id)>& keep);

  // Replicas of deployment "APP/DEPLOYMENT" that went down without being
  // asked to (the "crash" events), since the controller started.
  uint64_t restarts(const std::string& app, const std::string& deployment) const;

 private:
  struct Counter {
    uint64_t finished = 0;
    uint64_t errors = 0;
    double at = 0;
    ReplicaActivity load;
  };
  size_t capacity_;
  std::deque<Event> events_;
  std::unordered_map<std::string, Counter> counters_;
  std::unordered_map<std::string, uint64_t> restarts_;  // "APP/DEPLOYMENT" -> crashes
};

}  // namespace troupe::controller
