// What the replica's public handle, its replica actor and its request threads
// share (internal to replica/). The handle is an actor pool whose dispatch
// runs in the sender's context (CAF's actor_pool): a request goes from the
// sender straight to an idle request thread, and its answer straight back —
// no hop through the replica actor and no message back to it when a request
// ends.
//
// Dispatch holds the admission (at most max_ongoing_requests in flight: CAF
// request threads claimed with atomics, or a count for a data channel's
// threads), the stopping flag, the time-weighted integral of requests in
// flight that the metrics report averages, the progress the health check
// reads (since when every request slot is busy, when a request last
// finished), and the tokens of requests that came over CAF to a replica with
// a data channel. Every method is
// thread-safe; those that account time take it as an argument (tests pass
// their own).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_pool.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/weak_intrusive_ptr.hpp>

#include "replica/model_report.hpp"
#include "replica/streams.hpp"
#include "runtime/local_replicas.hpp"
#include "runtime/status.hpp"

namespace troupe::channel {
class ReplicaEnd;
}

namespace troupe::replica {

class ReplicaBatcher;

struct Dispatch {
  using Clock = std::chrono::steady_clock;

  explicit Dispatch(Clock::time_point now = Clock::now()) : last_change_(now) {}

  std::string replica_id;
  // Written by the replica actor before `ready` is set, read-only after.
  std::vector<caf::actor> workers;
  std::unique_ptr<std::atomic<bool>[]> busy;
  // With a data channel (a replica process): its request threads, and
  // max_ongoing_requests; `workers` stays empty.
  std::shared_ptr<channel::ReplicaEnd> channel;
  uint32_t limit = 0;
  std::atomic<bool> ready{false};
  std::atomic<bool> stopping{false};
  // The replica actor, for everything but requests. Weak: the replica actor
  // holds this object.
  caf::weak_actor_ptr replica;
  // What the user's ModelCache holds (model multiplexing); set before the
  // replica starts, constant after. Answers to requests that name a model
  // carry it (runtime/multiplex.hpp).
  std::shared_ptr<ModelReport> models;
  // The replica's metrics (replica/replica_metrics.hpp); set before the
  // replica starts, constant after.
  std::shared_ptr<ReplicaMetrics> metrics;
  // An in-process replica's inline entry (replica/inline_replica.hpp). When
  // its deployment declares its handler non-blocking, requests that come
  // over CAF (other nodes' proxies) run in the sender's context too, on the
  // thread that delivers them. Set before `ready`; empty once the replica
  // closes it.
  std::weak_ptr<local::LocalReplica> inline_replica;
  // The requests running now, by call key: cancellation and stream credits.
  Inflight inflight;
  // A replica whose class implements handle_batch(): its batcher
  // (replica/batching.hpp), which the request paths hand their requests to
  // while it is active(). Set before `ready`, constant after; null for a
  // class that cannot batch.
  std::shared_ptr<ReplicaBatcher> batcher;

  // Claims an idle request thread (CAF's request workers); false when all
  // are busy, or when `limit` requests run (counting the inline calls of an
  // in-process replica, which are admitted with admit()/finish()).
  bool claim(size_t& index, Clock::time_point now = Clock::now());
  // A request thread finished; true when it was the last one of a stopping
  // replica (then the caller tells the replica actor).
  bool release(size_t index, Clock::time_point now = Clock::now());

  // With a data channel, or an inline call (replica/inline_replica.hpp):
  // admits a request unless max_ongoing_requests are running.
  bool admit(Clock::time_point now = Clock::now());
  // After admit(): a request ended; tells a stopping replica actor
  // (done) when it was the last, and returns true then.
  bool finish(Clock::time_point now = Clock::now());

  // Requests that came over CAF, queued into the channel as `local` frames:
  // the request threads take them by token. park() returns the token;
  // take() returns null for a token already taken (or never parked).
  uint64_t park(caf::mailbox_element_ptr m);
  caf::mailbox_element_ptr take(uint64_t token);

  uint32_t in_flight();
  // Requests finished since the replica started.
  uint64_t finished();

  // Whether the replica makes progress. A replica is stuck when all `limit`
  // request slots have been busy for at least `threshold`, with no request
  // finished since (a handler that never returns holds its slot for good:
  // once every slot is held, every later request fails, while the user's
  // check_health() may still pass). Then returns errc::unavailable with
  // "stuck: all 2 request threads busy for 31.0 s with none finished"; else
  // ok. A threshold <= 0 turns the check off.
  Status check_progress(Clock::duration threshold, Clock::time_point now = Clock::now());
  // When a request last finished; nullopt before the first.
  std::optional<Clock::time_point> last_finished();

  // Average requests in flight over [window_start, now], weighted by time;
  // starts the next window at `now`. (With window_start == now: the number
  // in flight.)
  double take_average(Clock::time_point window_start, Clock::time_point now);

 private:
  void account_locked(Clock::time_point now);
  // After a request started: starts the all-busy period when it took the
  // last free slot.
  void started_locked(Clock::time_point now);
  // After a request ended: no slot is all-busy any more.
  void ended_locked(Clock::time_point now);

  // Requests in flight and the time-weighted integral of that number since
  // the last metrics report.
  std::mutex mutex_;
  uint32_t ongoing_ = 0;
  double ongoing_area_ = 0;
  Clock::time_point last_change_;
  // Set while ongoing_ >= limit: since when. Every finish clears it, so it
  // also means "no request finished since".
  std::optional<Clock::time_point> all_busy_since_;
  std::optional<Clock::time_point> last_finished_;
  uint64_t finished_ = 0;

  std::mutex tokens_mutex_;
  std::unordered_map<uint64_t, caf::mailbox_element_ptr> tokens_;
  uint64_t next_token_ = 0;
};

using DispatchPtr = std::shared_ptr<Dispatch>;

// The policy of the replica's handle (a CAF actor pool): requests to an idle
// request thread (or into the data channel), refused with errc::overloaded
// at max_ongoing_requests and errc::unavailable while stopping; everything
// else, and requests before the replica is ready, to the replica actor.
caf::actor_pool::policy dispatch_policy(DispatchPtr d);

}  // namespace troupe::replica
