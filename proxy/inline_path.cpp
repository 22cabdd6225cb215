// Requests to this node's in-process replicas whose deployment declared its
// handler non-blocking (Deployment::nonblocking(), runtime/local_replicas.hpp):
// the io thread calls handle() itself and answers, with no CAF message and
// no hand-off to a request thread and back (docs/benchmarks.md, "Where the
// time goes": those wake-ups were most of a request's cost). Part of the
// call state machine (call.hpp): the slot was taken by Router::admit as for
// any send, the answer goes to on_answer() (which releases it and answers
// the client, with the metrics), a refusal to on_error() (placed again), and
// a replica that is gone (closed) sends the request the normal way, over
// its handle. A streamed answer goes on over CAF: its producer runs on a
// thread of its own, which answers a CAF request of this io thread's
// companion like a request thread does.
//
// Cancellation: a call that runs inline cannot be cancelled (the io thread
// is busy running it; the client's leaving and the call's deadline are seen
// when it returns). Its RequestControl carries the deadline.
#include <chrono>
#include <string>

#include "proxy/call.hpp"
#include "proxy/core.hpp"
#include "proxy/paths.hpp"
#include "runtime/local_replicas.hpp"

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
  if (!replica)
    return false;
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

}  // namespace troupe::proxy
