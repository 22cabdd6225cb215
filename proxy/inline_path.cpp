// Requests to this node's in-process replicas, run on the io thread
// (runtime/local_replicas.hpp): the io thread calls handle() itself and
// answers, with no CAF message and no hand-off to a request thread and back
// (docs/benchmarks.md: those wake-ups were most of a request's cost). Part
// of the call state machine (call.hpp): the slot was taken by Router::admit
// as for any send, the answer goes to on_answer() (which releases it and
// answers the client, with the metrics), a refusal to on_error() (placed
// again), and a replica that is gone (closed) sends the request the normal
// way, over its handle. A streamed answer goes on over CAF: its producer
// runs on a thread of its own, which answers a CAF request of this io
// thread's companion like a request thread does.
//
// Non-blocking handlers (the deployment declared it) run within send(); such
// a call cannot be cancelled (the io thread is busy running it; the client's
// leaving and the call's deadline are seen when it returns). Its
// RequestControl carries the deadline.
//
// Blocking handlers (the default) run inline while their replica's gate is
// open (runtime/inline_gate.hpp: while their calls are short). send() queues
// the call, and the io thread runs the queue after each pass over its ready
// handlers (drain(), HttpServer::on_pass), outside them, under its
// LoopTakeover (runtime/loop_takeover.hpp): the requests that arrived together
// are answered together, as the non-blocking ones are. Such a call is kept
// here with its RequestControl, so a client that leaves or a deadline that
// passes cancels it like a request on a request thread. If the handler
// blocks for longer than the takeover threshold, another thread takes over
// this io thread's loop (and runs the rest of the queue): the old thread,
// once the handler returns, posts the answer to the loop and ends. The gate
// then sends the replica's next requests to its request threads for a
// while.
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include <boost/asio/post.hpp>
#include <troupe/deployment.hpp>

#include "proxy/call.hpp"
#include "proxy/core.hpp"
#include "proxy/paths.hpp"
#include "runtime/local_replicas.hpp"
#include "runtime/time.hpp"

namespace troupe::proxy {

namespace {

// An inline handler that runs longer than this stalls every connection of
// its io thread: worth a warning (the deployment should not be declared
// non-blocking), at most one per kSlowWarningGap per io thread.
constexpr auto kSlowInline = std::chrono::milliseconds(10);
constexpr auto kSlowWarningGap = std::chrono::seconds(10);

struct SlowLog {
  Clock::time_point last{};
  uint64_t quiet = 0;  // slow calls since, not logged
};
thread_local SlowLog slow_log;

void note_duration(const CallPtr& c, Clock::time_point began, Clock::time_point ended) {
  if (ended - began < kSlowInline)
    return;
  if (slow_log.last != Clock::time_point{} && ended - slow_log.last < kSlowWarningGap) {
    ++slow_log.quiet;
    return;
  }
  c->worker->core->log->warn(
      "replica {} of {}/{}: its non-blocking handler took {:.1f} ms on io thread {} (request "
      "{}), stalling every connection of that thread; a handler that waits must not declare "
      "itself non-blocking ({} more slow calls since the last warning)",
      c->slot->replica_id, c->route->app, c->route->deployment,
      std::chrono::duration<double, std::milli>(ended - began).count(), c->worker->index,
      c->request.request_id, slow_log.quiet);
  slow_log.last = ended;
  slow_log.quiet = 0;
}

}  // namespace

bool InlinePath::send(const CallPtr& c) {
  const auto& replica = c->slot->local_replica;
  if (!replica || replica->batching())
    return false;  // its request threads, over CAF
  if (!replica->blocking())
    return send_nonblocking(c);
  const auto now = Clock::now();
  if (!replica->gate.open(now))
    return false;  // its request threads, over CAF
  auto deadline = RequestControl::Clock::time_point::max();
  if (c->request.timeout_s > 0)
    deadline = now + seconds_as<Clock::duration>(c->request.timeout_s);
  c->via = this;
  c->sent_at = now;
  t_.track(c.get());
  t_.core->metrics.sent_inline();
  blocking_[c->key] = Blocking{c, std::make_shared<RequestControl>(deadline)};
  queue_.push_back(c->key);  // run by drain(), after this pass of the loop
  return true;
}

bool InlinePath::send_nonblocking(const CallPtr& c) {
  const auto& replica = c->slot->local_replica;
  auto* w = &t_;
  HttpResponse answer;
  auto began = Clock::now();
  auto result = replica->serve(c->request, answer);
  auto ended = Clock::now();
  switch (result.kind) {
    case local::InlineResult::closed:
      // The replica is exiting: its handle tells the call what became of it.
      return false;
    case local::InlineResult::stopping:
    case local::InlineResult::overloaded:
      w->core->metrics.sent_inline();
      c->via = this;
      on_error(c, to_caf_error(Status(result.kind == local::InlineResult::overloaded
                                          ? errc::overloaded
                                          : errc::unavailable,
                                      result.why)));
      return true;
    case local::InlineResult::streaming: {
      w->core->metrics.sent_inline();
      note_duration(c, began, ended);
      auto id = w->caf.await(c);
      result.stream->start(caf::actor_cast<caf::strong_actor_ptr>(w->companion_handle), id);
      return true;
    }
    case local::InlineResult::answered:
      break;
  }
  w->core->metrics.sent_inline();
  note_duration(c, began, ended);
  c->via = this;
  c->sent_at = began;
  on_answer(c, answer);
  return true;
}

struct InlinePath::Ran {
  local::InlineResult result;
  HttpResponse answer;
  Clock::time_point began;
  Clock::time_point ended;
  // Its io thread was taken over meanwhile (its gate was told then).
  bool taken_over = false;
};

bool InlinePath::drain() {
  while (!queue_.empty()) {
    const uint64_t key = queue_.front();
    queue_.pop_front();
    auto it = blocking_.find(key);
    if (it == blocking_.end())
      continue;  // forgotten while it waited
    CallPtr c = it->second.call;
    if (c->done) {
      // Its client left, or had its 504, while it waited: it never runs.
      blocking_.erase(it);
      late_answer(c, Outcome::abandoned);
      continue;
    }
    // Read now, while this thread runs the loop: a retry elsewhere changes
    // the request's key and timeout (local::InlineCall).
    const local::InlineCall call{c->key, c->request.timeout_s, it->second.control};
    auto replica = c->slot->local_replica;
    auto ran = std::make_shared<Ran>();
    auto run = [&] {
      ran->began = Clock::now();
      ran->result = replica->serve(c->request, call, ran->answer);
      ran->ended = Clock::now();
    };
    auto* loops = t_.core->server ? t_.core->server->loops() : nullptr;
    if (!loops) {
      run();  // no server (unit tests): nothing takes the loop over
    } else {
      running_ = replica;
      running_since_ = Clock::now();
      if (!loops->run_blocking(t_.index, run)) {
        // Another thread runs this loop now: the answer goes to it, and
        // this thread leaves the loop, touching nothing of it on the way.
        ran->taken_over = true;
        t_.core->post(t_.io, [this, key, ran] { ended_elsewhere(key, ran); });
        return false;
      }
      running_ = nullptr;
    }
    blocking_.erase(key);
    ended(c, *ran);
  }
  return true;
}

void InlinePath::ended_elsewhere(uint64_t key, const std::shared_ptr<Ran>& ran) {
  auto it = blocking_.find(key);
  if (it == blocking_.end())
    return;  // forgotten meanwhile (a stream of it ends at the replica)
  CallPtr c = std::move(it->second.call);
  blocking_.erase(it);
  ended(c, *ran);
}

void InlinePath::ended(const CallPtr& c, Ran& ran) {
  if (c->slot && c->slot->local_replica && !ran.taken_over)
    c->slot->local_replica->gate.record(ran.began, ran.ended);
  auto& result = ran.result;
  switch (result.kind) {
    case local::InlineResult::closed:
      // The replica is exiting: its handle tells the call what became of it.
      t_.untrack(c.get());
      if (c->done) {
        late_answer(c, Outcome::abandoned);
        return;
      }
      t_.caf.send(c);
      return;
    case local::InlineResult::stopping:
    case local::InlineResult::overloaded:
      if (c->done)
        return late_answer(c, Outcome::refused);
      on_error(c, to_caf_error(Status(result.kind == local::InlineResult::overloaded
                                          ? errc::overloaded
                                          : errc::unavailable,
                                      result.why)));
      return;
    case local::InlineResult::streaming: {
      t_.untrack(c.get());
      auto id = t_.caf.await(c);
      result.stream->start(caf::actor_cast<caf::strong_actor_ptr>(t_.companion_handle), id);
      return;
    }
    case local::InlineResult::answered:
      break;
  }
  c->sent_at = ran.began;
  if (c->done)
    return late_answer(c, Outcome::answered);
  on_answer(c, ran.answer);
}

void InlinePath::taken_over() {
  // The call that blocked closes its replica's gate now, not when it ends:
  // the replica's next requests go to its request threads meanwhile.
  if (running_) {
    running_->gate.blocked(running_since_, Clock::now());
    running_ = nullptr;
  }
}

void InlinePath::cancel(const CallPtr& c, bool deadline_passed) {
  auto it = blocking_.find(c->key);
  if (it != blocking_.end() && it->second.call == c)
    it->second.control->cancel(deadline_passed);
}

void InlinePath::forget(const CallPtr& c) {
  auto it = blocking_.find(c->key);
  if (it != blocking_.end() && it->second.call == c)
    blocking_.erase(it);
}

void InlinePath::expire(const CallPtr& c) {
  auto it = blocking_.find(c->key);
  if (it == blocking_.end() || it->second.call != c)
    return;
  // Still running on a thread that was taken over, or waiting: fails with
  // request_timeout (a late answer finds nothing here).
  it->second.control->cancel(true);
  blocking_.erase(it);
  if (c->done)
    return late_answer(c, Outcome::abandoned);
  on_error(c, caf::make_error(caf::sec::request_timeout));
}

void InlinePath::clear() {
  blocking_.clear();
  queue_.clear();
}

}  // namespace troupe::proxy
