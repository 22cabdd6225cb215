// Streamed answers and cancellation on the proxy's data path (part of the
// call state machine, call.hpp). A replica that streams answers with a head
// (HttpResponse::stream, over CAF; a `head` frame over a data channel), then
// chunks, then an end. The head goes to the client at once
// (Exchange::begin_stream: chunked transfer encoding), each chunk as it
// comes; once a chunk is in the client's socket the replica gets credit for
// its bytes, so a replica never has more than its window
// (replica/streams.hpp) unacknowledged and a slow client slows it down: this
// io thread holds at most a window per stream. The replica's slot stays taken
// until the stream ends. A stream is never retried (its first bytes may have
// reached the client): a replica lost mid-stream, a deadline that passes or
// a stream that stalls ends it early — the client's connection closes
// without the final chunk, which clients detect.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "proxy/call.hpp"
#include "proxy/core.hpp"
#include "proxy/grpc_fields.hpp"

namespace troupe::proxy {

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Room for `bytes` more at the replica.
void grant(const CallPtr& c, uint64_t bytes) {
  if (!c->slot || !c->streaming || !c->via)
    return;  // the stream ended (or was given up) meanwhile
  c->via->credit(c, bytes);
}

}  // namespace

void cancel_at_replica(const CallPtr& c, bool deadline_passed) {
  if (!c->slot || c->key == 0 || !c->via)
    return;
  c->via->cancel(c, deadline_passed);
}

void on_stream_head(const CallPtr& c, HttpResponse& head) {
  auto* core = c->worker->core;
  c->streaming = true;
  c->stream_status = head.status;
  c->sent_at = Clock::now();  // progress, for the sweep
  if (c->shadow) {
    // A copy's answer is discarded: counted by its status, and the replica
    // stops producing.
    end_shadow(c, std::to_string(head.status));
    cancel_at_replica(c);
    return;
  }
  if (c->done) {
    // The client had its answer (504) or left: nobody reads the stream.
    cancel_at_replica(c);
    return;
  }
  // The same head as a whole answer would have.
  auto r = client_head(c, head);
  if (!r || past_deadline(c)) {
    // Ends the stream before it began: the client gets the 502 (or the 504:
    // the deadline passed before the head came).
    c->streaming = false;
    cancel_at_replica(c, r.has_value());
    if (r)
      on_timeout(c);
    else
      finish(c, invalid_status(c, head.status));
    c->streaming = true;  // the replica's end still comes, and frees the slot
    return;
  }
  r->set("X-Request-Id", c->request.request_id);
  core->metrics.first_byte(c->route->app, seconds_since(c->start));
  c->exchange->begin_stream(std::move(*r));
}

void on_stream_chunk(const CallPtr& c, std::string data) {
  c->sent_at = Clock::now();
  if (c->done || data.empty())
    return;  // cancelled at the replica already; it stops soon
  uint64_t bytes = data.size();
  c->exchange->write_chunk(std::move(data), [c, bytes](bool ok) {
    if (ok)
      grant(c, bytes);
  });
}

void on_stream_end(const CallPtr& c, bool complete, const std::string& why) {
  auto* w = c->worker;
  auto* core = w->core;
  if (c->via)
    c->via->forget(c);
  w->untrack(c.get());
  release(c, Outcome::answered);
  c->streaming = false;
  if (c->done || c->shadow)
    return;
  c->done = true;
  if (c->timer)
    c->timer->cancel();
  double elapsed = seconds_since(c->start);
  core->metrics.observe(c->route->app, c->stream_status, elapsed);
  core->metrics.request_finished();
  // A gRPC stream that ends early ends INTERNAL (GrpcExchange::end_stream).
  account_answer(c, c->stream_status, elapsed, complete ? -1 : int(grpc::Code::internal));
  core->metrics.stream_ended(c->route->app, complete ? "complete" : "early");
  if (!complete) {
    core->log->warn("request {} {} {}: stream ended early after {:.1f} ms: {}",
                    c->request.request_id, c->request.method, path_of(*c), elapsed * 1000, why);
  }
  auto ex = std::move(c->exchange);
  ex->end_stream(complete);
}

void forget_stream(const CallPtr& c) {
  if (c->via)
    c->via->forget(c);
  c->streaming = false;
}

void client_gone(const CallPtr& c) {
  if (c->done)
    return;
  auto* core = c->worker->core;
  core->log->debug("request {} {} {}: the client went away", c->request.request_id,
                   c->request.method, path_of(*c));
  if (c->streaming) {
    cancel_at_replica(c);
    c->done = true;
    if (c->timer)
      c->timer->cancel();
    core->metrics.observe(c->route->app, 499, seconds_since(c->start));
    core->metrics.request_finished();
    account_answer(c, 499, seconds_since(c->start));
    core->metrics.stream_ended(c->route->app, "client_gone");
    auto ex = std::move(c->exchange);
    ex->end_stream(false);
    return;
  }
  // In flight: the replica learns it (a handler that looks at
  // Request::cancelled() stops; its slot frees when it returns). Queued:
  // finish() takes it out of the queue, and it never runs.
  if (c->slot)
    cancel_at_replica(c);
  Response r{static_cast<http::status>(499), 11};
  r.set(http::field::content_type, "application/json");
  r.body() = nlohmann::json{{"error", "the client closed the connection"},
                            {"request_id", c->request.request_id}}
                 .dump();
  finish(c, std::move(r));
}

// Used by finish() for a call whose stream began: the client cannot get
// another answer, so the stream ends early (and the replica stops).
void end_stream_early(const CallPtr& c, int status) {
  auto* core = c->worker->core;
  cancel_at_replica(c, status == 504);
  c->done = true;
  if (c->timer)
    c->timer->cancel();
  core->metrics.observe(c->route->app, c->stream_status, seconds_since(c->start));
  core->metrics.request_finished();
  account_answer(c, c->stream_status, seconds_since(c->start), int(grpc::Code::internal));
  core->metrics.stream_ended(c->route->app, "early");
  core->log->warn("request {} {} {}: stream ended early ({})", c->request.request_id,
                  c->request.method, path_of(*c), status == 504 ? "its deadline passed" : "failed");
  auto ex = std::move(c->exchange);
  ex->end_stream(false);
}

void stream_lost(const CallPtr& c, Outcome outcome, const std::string& why) {
  release(c, outcome);
  if (!c->done && !c->shadow) {
    c->worker->core->log->warn("request {}: {}", c->request.request_id, why);
    end_stream_early(c, 502);
  }
  forget_stream(c);
}

}  // namespace troupe::proxy
