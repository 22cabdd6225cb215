// The per-request call state machine of the proxy's data path (internal to
// proxy/). A Call is one HTTP request or one deployment handle call on its
// way to a replica; it lives on its worker's io thread, and every function
// here runs there.
//
//   start_call ─► dispatch ─► Router::admit ─► assigned: send (data channel,
//                    ▲             │                      else CAF)
//                    │             └─► queued: resumed() when a slot frees
//                    │
//   on_answer ◄── answer     on_error ◄── error, refusal, request_timeout
//                               ├─► refused(): placed again (backoff)
//                               ├─► retry(): a replica lost with it
//                               └─► finish(): 502 / 504
//
// finish() answers the client exactly once; the replica's slot stays taken
// until the replica really answers (late_answer()), so the router never
// believes a busy replica is free. The counts behind retry() and refused()
// are Attempts (attempts.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/steady_timer.hpp>
#include <boost/beast/http/status.hpp>
#include <caf/error.hpp>
#include <caf/message_id.hpp>

#include "proxy/attempts.hpp"
#include "proxy/http_server.hpp"
#include "proxy/router.hpp"
#include "proxy/transport.hpp"
#include "runtime/wire.hpp"

namespace troupe::proxy {

namespace http = boost::beast::http;
using Clock = std::chrono::steady_clock;

struct IoThread;

// One request on its way through the data path. Lives on its worker's io
// thread: every member is touched only there.
struct Call : std::enable_shared_from_this<Call> {
  ExchangePtr exchange;
  IoThread* worker = nullptr;
  const Route* route = nullptr;
  std::shared_ptr<const RouteTable> routes;  // keeps `route` alive
  // A deployment handle's call: its target, which `route` points to.
  std::shared_ptr<const Route> handle_route;
  HttpRequest request;
  // Model multiplexing: the model the request names ("" none), set by
  // start_call from its headers (runtime/multiplex.hpp).
  std::string model_id;
  std::vector<std::string> tried;  // replica ids that refused or died
  SlotPtr slot;
  // The slot last released: the replica that answered (or was tried last),
  // for the access log.
  SlotPtr last_slot;
  uint32_t sends = 0;
  Attempts attempts;  // replicas lost, crashed and refused (see retry())
  std::unique_ptr<asio::steady_timer> backoff;
  // The current attempt: the transport that carries it (null: none, or it
  // ended before send() returned) and when it went or last made progress
  // (the sweep's clock). Whatever else an attempt needs is its transport's.
  Transport* via = nullptr;
  Clock::time_point sent_at;
  size_t active_index = SIZE_MAX;  // in worker->active while a replica has it
  Clock::time_point start;
  Clock::time_point deadline = Clock::time_point::max();
  std::unique_ptr<asio::steady_timer> timer;
  uint64_t ticket = 0;
  bool queued = false;
  bool done = false;
  // A shadow copy (shadow.cpp): its answer is counted and discarded; it is
  // never queued, retried or placed again.
  bool shadow = false;
  // The current attempt's name at its replica (HttpRequest::call_key; the
  // call id of a data channel frame): cancellations and credits use it.
  uint64_t key = 0;
  // The replica answered with a stream (streams.cpp): its head went to the
  // client (unless the call was done), the body follows in chunks; the slot
  // is held until the replica ends the stream. Never retried from here on.
  bool streaming = false;
  int stream_status = 0;
  // A handle call from another process: the caller's key for it, by which
  // the caller cancels it (IoThread::handle_calls); 0: none.
  uint64_t caller_key = 0;
};
using CallPtr = std::shared_ptr<Call>;

// A JSON error answer: {"error": message, "request_id": id}.
Response json_error(http::status status, const std::string& message, const std::string& id);

// Arms the call's deadline, `timeout_s` after `start` (none when 0): its
// timer answers 504 then (on_timeout).
void arm_deadline(const CallPtr& c, IoThread* w, Clock::time_point start, double timeout_s);

// Arms the call's deadline and routes it: the common start of HTTP requests
// and handle calls. The call's exchange, worker, route and request are set.
void start_call(const CallPtr& c, IoThread* w, Clock::time_point start, double timeout_s);

// Places the call on a replica (Router::admit): sent, queued, or answered
// 503/404 when it cannot be.
void dispatch(const CallPtr& c);

// Sends the call to `slot`'s replica: inline when it is an in-process replica
// with a non-blocking handler (inline_path.cpp), over its data channel when
// it has one, else as a CAF request through the worker's companion.
void send(const CallPtr& c, SlotPtr slot);

// A queued call got a slot (null: its deployment is gone).
void resumed(const CallPtr& c, SlotPtr slot);

// Answers the client, once; later calls do nothing. Does not release the
// slot: the replica may still work on the request.
void finish(const CallPtr& c, Response&& r);
// The call's troupe_http_* metrics, and its line in the access log when the
// log wants its status.
// `grpc_code`: a gRPC call's status code when its answer named one (-1: the
// one its HTTP status maps to, grpc::code_for_http).
void account_answer(const CallPtr& c, int status, double seconds, int grpc_code = -1);

// Gives the call's slot back to the router, if it holds one.
void release(const CallPtr& c, Outcome outcome);

// The replica's answer (the call is not done). After the call's deadline
// it is answered 504 instead (on_timeout), as if the timer had fired first.
void on_answer(const CallPtr& c, HttpResponse& answer);
bool past_deadline(const CallPtr& c);

// The status and headers the client gets for a replica's answer or a
// stream's head (headers the proxy sets itself dropped; the held-models
// header learned and removed); nullopt when the status is invalid
// (answered with invalid_status()).
std::optional<Response> client_head(const CallPtr& c, HttpResponse& answer);
Response invalid_status(const CallPtr& c, int status);
// The answer a client gets when its replica's answer frame did not decode
// (`sender` names who sent it: "replica X", "node N"; `why` what is wrong).
HttpResponse malformed_answer(const CallPtr& c, const std::string& sender, const std::string& why);

// The request failed at its replica (the call is not done): a refusal is
// placed again, a lost replica retried (see retry()), a request_timeout
// answers 504, anything else 502.
void on_error(const CallPtr& c, const caf::error& err);

// The replica is gone before answering: `crash` when it died while it had
// the request in flight. Retried on another replica (after one crash at
// most), else answered 502 (crashed) or 503 (max_attempts). The call's slot
// is already released and its replica in `tried`.
void retry(const CallPtr& c, const std::string& why, bool crash);

// The replica refused (at its limit or stopping): placed again, at once or
// after a backoff, or answered 503 after Attempts::kMaxRefusals.
void refused(const CallPtr& c, const std::string& why);

// The client already got its answer (504); the replica finished only now, so
// only now does its slot become free.
void late_answer(const CallPtr& c, Outcome outcome);

// The call's deadline passed: 504 (the slot stays taken, see late_answer()).
void on_timeout(const CallPtr& c);

// Every second on each io thread: requests whose replica has not answered
// within max_request_time_s fail with request_timeout. Re-arms itself.
void sweep(IoThread* w);

// On the worker's io thread: the requests in flight there on a replica that
// `gone` selects will never be answered; each is retried on another replica
// now, not at its timeout. `crash`: the replica died with them (see retry()).
void fail_over(IoThread* w, const std::function<bool(const ReplicaSlot&)>& gone, const char* what,
               bool crash, Outcome outcome = Outcome::died);

// The path of the request as the client sent it, without the query (for log
// lines: never the query's or the body's content).
std::string_view path_of(Call& c);

// The transports (inline, data channel, data port, CAF) are in
// transport.hpp and paths.hpp; send() offers each attempt to them in turn.

// A replica's handle that ended with user_shutdown (it stopped on request).
bool stopped_on_request(const ReplicaActor& handle);

// --- streamed answers and cancellation (streams.cpp) ---------------------------

// The replica began a stream (a head with HttpResponse::stream, over CAF, or
// a head frame): the head goes to the client, chunks and the end follow.
void on_stream_head(const CallPtr& c, HttpResponse& head);
// A piece of the body: written to the client; once it is in the socket the
// replica gets credit for as many bytes.
void on_stream_chunk(const CallPtr& c, std::string data);
// The replica ended the stream: with the final chunk when `complete`, else
// the client's connection closes without it.
void on_stream_end(const CallPtr& c, bool complete, const std::string& why);
// Tells the replica that has the call's current attempt that it is
// cancelled: its client left, or (`deadline_passed`) its deadline passed.
void cancel_at_replica(const CallPtr& c, bool deadline_passed = false);
// The client went away: a queued call is dropped (never sent), one in
// flight or streaming is cancelled at its replica. Counted as 499.
void client_gone(const CallPtr& c);
// The call's stream is forgotten here (its replica is lost or it stalled):
// no end will come.
void forget_stream(const CallPtr& c);
// finish() of a call whose stream began: the client cannot get another
// answer, so its stream ends early (no final chunk) and the replica stops.
void end_stream_early(const CallPtr& c, int status);
// The replica of a streaming call is lost (or the stream stalled): the slot
// is released with `outcome`, the stream ends early, and is forgotten.
void stream_lost(const CallPtr& c, Outcome outcome, const std::string& why);

// --- shadow traffic (shadow.cpp) ------------------------------------------------

// After a request to an application (`route`: its route, which the table
// keeps alive) was started: copies of `request` to the shadows pick_shadows()
// draws, each placed only on a free slot (Router::admit_if_free) and sent at
// once, else dropped and counted. Never delays or changes the request itself;
// runs on the worker's io thread. `timeout_s`: the copies' deadline, like the
// request's (0: none).
void send_shadows(IoThread* w, const Route& route, const std::shared_ptr<const RouteTable>& table,
                  const HttpRequest& request, double timeout_s);

// A shadow copy ends (once; later calls do nothing): counted under `outcome`
// (a status code as text, or "dropped"), its answer discarded. Like finish(),
// it does not release the slot.
void end_shadow(const CallPtr& c, const std::string& outcome);

}  // namespace troupe::proxy
