// The health of every node's proxy (a route-table subscriber), as plain C++
// driven by an injected clock: which proxies are due for a check, and what an
// answer (or a failed or timed-out check) does to a proxy's state. The actor
// shell sends the checks, logs what settle() reports and kills a proxy that
// became UNHEALTHY (its node then starts a fresh one, which subscribes again).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "controller/core/clock.hpp"

namespace troupe::controller {

enum class ProxyHealth {
  starting,   // subscribed, no check answered yet
  healthy,    // answered its last check (or failed fewer in a row than the limit)
  unhealthy,  // failed `unhealthy_after` checks in a row; the shell killed it
};

// STARTING, HEALTHY, UNHEALTHY: the proxy column of `troupectl nodes`.
const char* to_string(ProxyHealth h);

// What `troupectl nodes` shows for a node without any subscribed proxy.
inline constexpr const char* kNoProxy = "NONE";

struct ProxyHealthOptions {
  // A proxy is checked again this long after its previous check settled.
  double period_s = 2.0;
  // Failed checks in a row after which a proxy is UNHEALTHY (and killed).
  uint32_t unhealthy_after = 3;
};

// What one settled check means for the shell.
enum class ProxyVerdict {
  gone,              // the proxy was forgotten meanwhile: nothing to do
  healthy,           // answered; it was STARTING or HEALTHY already
  recovered,         // answered after being UNHEALTHY: worth a log line
  failed,            // failed, still below the limit: a warning
  became_unhealthy,  // reached the limit just now: kill it
  still_unhealthy,   // failed again while UNHEALTHY (killed already): nothing more
};

struct ProxyCheckOutcome {
  ProxyVerdict verdict = ProxyVerdict::gone;
  std::string node_id;
  uint32_t failures = 0;  // failed checks in a row, this one included
};

class ProxyHealthMonitor {
 public:
  // Identifies one subscribed proxy; the shell maps it to the actor.
  using Key = uint64_t;

  ProxyHealthMonitor(const Clock& clock, ProxyHealthOptions options)
      : clock_(clock), options_(options) {}

  // A proxy subscribed: a new key starts STARTING with a check due at once; a
  // known key (the same proxy subscribing again) keeps its health record and
  // takes the node id given.
  void track(Key key, const std::string& node_id);
  // The proxy went down (or was killed): it no longer counts for its node.
  void forget(Key key);

  // The proxies whose check is due now, marked as being checked: the shell
  // sends each a check and reports the outcome with settle(). A proxy is
  // never checked twice at once.
  std::vector<Key> start_due_checks();

  // The outcome of a check started by start_due_checks(): `ok` is false for
  // an error answer and for a timeout. The next check is due one period from
  // now.
  ProxyCheckOutcome settle(Key key, bool ok);

  std::optional<ProxyHealth> health(Key key) const;
  // The proxy column of `troupectl nodes` for `node_id`: its proxy's health,
  // or kNoProxy. With several proxies of one node subscribed at once (a new
  // one before the old one's down notice), the one subscribed first.
  std::string node_health(const std::string& node_id) const;
  // The proxy of `node_id` (the one subscribed first), if any.
  std::optional<Key> proxy_of(const std::string& node_id) const;
  size_t size() const { return proxies_.size(); }

 private:
  struct Record {
    std::string node_id;
    ProxyHealth health = ProxyHealth::starting;
    double next_check = 0;
    bool checking = false;
    uint32_t failures = 0;
  };

  const Clock& clock_;
  ProxyHealthOptions options_;
  std::map<Key, Record> proxies_;  // ordered by key: subscription order
};

}  // namespace troupe::controller
