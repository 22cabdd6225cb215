// The health checks of the replicas a node hosts, run by its agent (issue
// 45: the head's work grows with nodes, not replicas). The timings are those
// the controller kept before (Ray Serve's): the first check at once when a
// replica is watched, each next one health_check_period_s × U(1 − jitter,
// 1 + jitter) after the last was sent (and not before its answer or
// timeout), a check without an answer within health_check_timeout_s a
// failure. Per replica it counts the checks passed (up to the threshold:
// what proves a replica), the failures in a row and what the last failure
// said; the agent sends the controller only what changed (HealthReport),
// and the controller decides (controller/core). Plain C++ with the time
// passed in and the randomness injected, header-only (the controller core's
// tests run it as their nodes' checks): tests/node/health_checks_test.cpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace troupe::node {

class HealthChecks {
 public:
  // As the controller sends them (the wire's HealthSettings).
  struct Settings {
    double period_s = 10.0;
    double timeout_s = 30.0;
    uint32_t threshold = 3;
    double jitter = 0.1;
  };
  // What the checks of a replica came to under a watch (the wire's
  // HealthReport).
  struct Report {
    std::string replica_id;
    uint64_t watch = 0;
    uint32_t passed = 0;
    uint32_t failures = 0;
    std::string failure;
  };

  // A value in [lo, hi] (the period's jitter).
  using Uniform = std::function<double(double lo, double hi)>;

  explicit HealthChecks(Uniform uniform) : uniform_(std::move(uniform)) {}

  // Watches a replica. A watch id it did not have for the replica starts
  // afresh: nothing passed, nothing failed, the first check due at `now`.
  // The same id again takes the settings only, from the next check sent on
  // (as the controller applied a changed period or timeout before).
  void watch(const std::string& replica_id, uint64_t watch_id, const Settings& settings,
             double now);
  // A replica that is gone: no more checks, no more reports.
  void forget(const std::string& replica_id);

  struct Check {
    std::string replica_id;
    uint64_t seq = 0;
  };
  // The checks due at `now`, each outstanding until its result() or its
  // timeout; the next is scheduled from now.
  std::vector<Check> due(double now);
  // The answer to check `seq` of a replica; one that comes after its check
  // timed out (or for a replica watched anew) counts for nothing.
  void result(const std::string& replica_id, uint64_t seq, bool ok, const std::string& why);
  // Outstanding checks past their timeout fail: "no answer within
  // health_check_timeout_s".
  void expire(double now);
  // When the next check or timeout is due; nothing when nothing is watched.
  std::optional<double> next_event() const;
  // For one timer: when to arm it, or nothing when `armed` (the time it is
  // armed for, if any) already comes no later than next_event(); `armed`
  // becomes that time. The caller clears `armed` when the timer fires.
  std::optional<double> arm(std::optional<double>& armed) const {
    auto next = next_event();
    if (!next || (armed && *armed <= *next))
      return std::nullopt;
    armed = next;
    return next;
  }

  // The replicas whose report changed since the last take, by id.
  std::vector<Report> take_changes();
  // Whether take_changes() would give anything.
  bool has_changes() const {
    for (const auto& [id, w] : replicas_)
      if (w.changed)
        return true;
    return false;
  }
  // Forgets every watch (the node registered: the controller sends the
  // watches of its RUNNING replicas again, and they start afresh).
  void clear() { replicas_.clear(); }
  std::size_t watched() const { return replicas_.size(); }

 private:
  struct Watched {
    uint64_t watch = 0;
    Settings settings;
    uint32_t passed = 0;    // up to settings.threshold
    uint32_t failures = 0;  // in a row
    std::string failure;    // what the last failure said
    uint64_t seq = 0;       // of the last check sent
    bool outstanding = false;
    double deadline = 0;
    double next_at = 0;
    bool changed = false;  // since the last take
  };
  void fail(Watched& w, std::string why);
  static Report report(const std::string& id, const Watched& w);

  Uniform uniform_;
  std::map<std::string, Watched> replicas_;
};

inline void HealthChecks::watch(const std::string& replica_id, uint64_t watch_id,
                                const Settings& settings, double now) {
  auto [it, inserted] = replicas_.try_emplace(replica_id);
  Watched& w = it->second;
  if (inserted || w.watch != watch_id) {
    const uint64_t seq = w.seq;  // answers to an earlier watch's checks never match
    w = Watched{};
    w.watch = watch_id;
    w.settings = settings;
    w.seq = seq;
    w.next_at = now;  // the first check at once
    w.changed = true;
    return;
  }
  // New settings for the same watch: they apply from the next check sent
  // (the one outstanding keeps its timeout, the next its time).
  if (settings.threshold != w.settings.threshold && w.passed > settings.threshold) {
    w.passed = settings.threshold;
    w.changed = true;
  }
  w.settings = settings;
}

inline void HealthChecks::forget(const std::string& replica_id) {
  replicas_.erase(replica_id);
}

inline std::vector<HealthChecks::Check> HealthChecks::due(double now) {
  std::vector<Check> out;
  for (auto& [id, w] : replicas_) {
    if (w.outstanding || now < w.next_at)
      continue;
    w.outstanding = true;
    w.deadline = now + w.settings.timeout_s;
    const double j = w.settings.jitter;
    w.next_at = now + w.settings.period_s * uniform_(1.0 - j, 1.0 + j);
    out.push_back({id, ++w.seq});
  }
  return out;
}

inline void HealthChecks::result(const std::string& replica_id, uint64_t seq, bool ok,
                                 const std::string& why) {
  auto it = replicas_.find(replica_id);
  if (it == replicas_.end())
    return;
  Watched& w = it->second;
  if (!w.outstanding || seq != w.seq)
    return;
  w.outstanding = false;
  if (!ok) {
    fail(w, why);
    return;
  }
  const uint32_t passed = std::min(w.passed + 1, w.settings.threshold);
  if (w.failures != 0 || !w.failure.empty() || passed != w.passed)
    w.changed = true;
  w.failures = 0;
  w.failure.clear();
  w.passed = passed;
}

inline void HealthChecks::expire(double now) {
  for (auto& [id, w] : replicas_) {
    if (w.outstanding && now >= w.deadline) {
      w.outstanding = false;
      fail(w, "no answer within health_check_timeout_s");
    }
  }
}

inline void HealthChecks::fail(Watched& w, std::string why) {
  ++w.failures;
  w.failure = std::move(why);
  w.changed = true;
}

inline std::optional<double> HealthChecks::next_event() const {
  std::optional<double> next;
  for (const auto& [id, w] : replicas_) {
    const double t = w.outstanding ? w.deadline : w.next_at;
    if (!next || t < *next)
      next = t;
  }
  return next;
}

inline HealthChecks::Report HealthChecks::report(const std::string& id, const Watched& w) {
  return Report{id, w.watch, w.passed, w.failures, w.failure};
}

inline std::vector<HealthChecks::Report> HealthChecks::take_changes() {
  std::vector<Report> out;
  for (auto& [id, w] : replicas_) {
    if (!w.changed)
      continue;
    w.changed = false;
    out.push_back(report(id, w));
  }
  return out;
}

}  // namespace troupe::node
