// What the controller saw happen, for people (the head's dashboard,
// /-/dashboard): the recent events (nodes joining, leaving, dying; deploys
// and deletes; deployment status changes; replicas that crashed) and each
// replica's request rate from the counters replicas report with their
// metrics. Plain C++ on the controller's clock: tests step it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace troupe::controller {

struct Event {
  double at = 0;        // the controller's clock, seconds
  std::string kind;     // node, deploy, status, crash
  std::string subject;  // a node id, an application, "app/deployment", a replica id
  std::string message;  // one sentence
  bool warn = false;    // deserves attention (DEAD, crash, UNHEALTHY, ...)
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

  // A replica's count of requests finished since it started, as reported
  // at `now`. The rate is the growth since the previous report; a count that
  // went down (a new process under the same id) starts over.
  void count(const std::string& replica_id, uint64_t finished, double now);
  // Requests per second of the replica over its last report interval; 0 when
  // unknown or when its last report is older than `stale_s`.
  double rate(const std::string& replica_id, double now, double stale_s = 30) const;
  // Forgets the replicas `keep` says are gone.
  void prune(const std::function<bool(const std::string& replica_id)>& keep);

 private:
  struct Counter {
    uint64_t finished = 0;
    double at = 0;
    double rate = 0;
  };
  size_t capacity_;
  std::deque<Event> events_;
  std::unordered_map<std::string, Counter> counters_;
};

}  // namespace troupe::controller
