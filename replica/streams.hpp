// Running one request in a replica, streamed answers and cancellation
// (internal to replica/; the user's side is include/troupe/deployment.hpp:
// RequestControl, StreamWriter, Response::stream).
//
// Every request a replica runs is registered by its call key (the sender's
// name for it, HttpRequest::call_key) in the replica's Inflight table with a
// Flow: the request's RequestControl, which a cancel from the proxy sets,
// and, for a streamed answer, its credit window. A stream may have at most
// kStreamWindow bytes sent and not yet acknowledged by the receiver (the
// proxy acknowledges bytes once they are in the client's socket): write()
// blocks beyond that, so a slow client slows the producer and no hop buffers
// more than a window per stream.
//
// Where the answer goes is a Sink: the lane of a data channel (a replica
// process and its node's proxy) or CAF (the request's sender: a proxy of any
// node). Credits and cancellations come back as frames on the lanes (read
// by one thread of the process, lane_reader) or as (credit, key, bytes) and
// (cancel, key) messages to the replica's handle (applied in the dispatch
// policy, in the sender's context).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include <caf/message_id.hpp>
#include <caf/actor_addr.hpp>
#include <caf/actor_control_block.hpp>
#include <troupe/deployment.hpp>

#include "replica/model_report.hpp"
#include "runtime/wire.hpp"

namespace troupe::replica {

class ReplicaMetrics;

// Bytes a stream may have in flight unacknowledged.
constexpr uint64_t kStreamWindow = 256 << 10;
// A stream whose receiver acknowledges nothing for this long while the
// window is full ends (early): its receiver is taken as gone. Longer than
// the proxy's own limit for a client that reads nothing (its idle timeout).
constexpr std::chrono::seconds kStallLimit{180};

// One request in flight: its cancellation and, when it streams, its window.
class Flow {
 public:
  explicit Flow(std::shared_ptr<RequestControl> control, bool windowed);

  const std::shared_ptr<RequestControl>& control() const { return control_; }

  // Waits until `bytes` more may be sent (at most kStreamWindow unacknowledged;
  // a larger piece waits until nothing is), then counts them as sent. False
  // when the request is cancelled or its deadline passed first.
  bool acquire(size_t bytes);
  // The receiver passed `bytes` on.
  void grant(uint64_t bytes);
  // `deadline_passed`: why (RequestControl::cancel).
  void cancel(bool deadline_passed);

 private:
  std::shared_ptr<RequestControl> control_;
  const bool windowed_;
  std::mutex mutex_;
  std::condition_variable changed_;
  uint64_t unacknowledged_ = 0;
  bool cancelled_ = false;
};
using FlowPtr = std::shared_ptr<Flow>;

// The requests a replica runs, by call key. Thread-safe.
//
// A cancellation can overtake its request: it comes on another path (the
// lane reader, the actor) than the request's worker, which registers the
// request only when it picks it up. Such a cancellation is kept, and the
// request starts cancelled: its handler sees cancelled() at once. The kept
// cancellations are bounded (kEarlyKept, the oldest dropped first), since
// most of them are for requests that already ended.
class Inflight {
 public:
  static constexpr size_t kEarlyKept = 1024;

  // Registers a request (key 0: not registered; nothing can cancel it).
  FlowPtr add(uint64_t key, std::shared_ptr<RequestControl> control);
  void remove(uint64_t key);
  void grant(uint64_t key, uint64_t bytes);
  void cancel(uint64_t key, bool deadline_passed);
  size_t size();
  // Cancellations kept for requests not registered (now or any more).
  size_t early_size();

 private:
  FlowPtr find(uint64_t key);
  std::mutex mutex_;
  std::unordered_map<uint64_t, FlowPtr> flows_;
  // key -> deadline_passed, and the keys in the order they came.
  std::unordered_map<uint64_t, bool> early_;
  std::deque<uint64_t> early_order_;
};

// Where one request's answer goes.
class Sink {
 public:
  virtual ~Sink() = default;
  // A whole answer.
  virtual void answer(HttpResponse&& answer) = 0;
  // A stream: its head (head.stream is the call key), its pieces, its end.
  // False when the receiver is gone.
  virtual bool head(HttpResponse&& head) = 0;
  virtual bool chunk(std::string_view data) = 0;
  virtual void end(bool complete, const std::string& why) = 0;
};

// What handle() answered: the answer and, for a streamed one, its producer.
struct Handled {
  HttpResponse out;
  std::function<void(StreamWriter&)> produce;
};

// The RequestControl of a request that has `timeout_s` left (0: no deadline).
std::shared_ptr<RequestControl> request_control(double timeout_s);

// Runs handle(in) (the first half of serve()): an exception becomes a 500
// with a JSON body; the answer gets X-Request-Id (`request_id`, unless
// empty) and, with `models` and a request that names a model, the models
// the replica holds after it. With `metrics`, the call is counted and timed
// there.
Handled run_handler(Deployment& d, const Request& in, const std::string& request_id,
                    const ModelReport* models, ReplicaMetrics* metrics);

// The rest of a streamed answer (the second half of serve()): the head
// (h.out, named `key`), then what h.produce writes under `flow`'s window,
// then the end (complete, or early when the producer threw or the stream
// could not go on). With `metrics`, the stream counts as in progress
// meanwhile.
void run_stream(Handled& h, uint64_t key, Flow& flow, Sink& sink, ReplicaMetrics* metrics);

// Runs `req` in the user's handle() and sends what it answers to `sink`: a
// Response, or a stream (the head, then what the producer writes under the
// flow control above, then the end: complete, or early when the producer
// threw or the stream could not go on). An exception from handle() becomes
// a 500 with a JSON body. With `models` (the replica's ModelCache report)
// and a request that names a model, the answer carries the models the
// replica holds after it (multiplex::kHeldModelsHeader), for the proxy's
// router. The request is in `inflight` while it runs.
void serve(Deployment& d, HttpRequest& req, const ModelReport* models, ReplicaMetrics* metrics,
           Inflight& inflight, Sink& sink);

// Answers over CAF to the request (`sender`, `request_id`): the answer or the
// head as the response, the pieces of a stream as (chunk, ...) messages.
class CafSink : public Sink {
 public:
  CafSink(caf::strong_actor_ptr sender, caf::message_id request_id)
      : sender_(std::move(sender)), request_id_(request_id) {}
  void answer(HttpResponse&& answer) override;
  bool head(HttpResponse&& head) override;
  bool chunk(std::string_view data) override;
  void end(bool complete, const std::string& why) override;

 private:
  caf::strong_actor_ptr sender_;
  caf::message_id request_id_;
  uint64_t key_ = 0;
  uint64_t seq_ = 0;
};

}  // namespace troupe::replica
