// In-process replicas whose handler the node's proxy may call on its own io
// thread ("inline"): no CAF message, no hand-off to a request thread and
// back. Every replica that runs `isolation: in_process` is registered here,
// by the replica actor once its instance passed its start-up check; it is
// closed and removed when the replica actor exits. A deployment that
// declared its handler non-blocking (Deployment::nonblocking(),
// include/troupe/deployment.hpp) is always called inline; one whose handler
// may block (blocking(), the default) is called inline while its gate says
// its calls are short (runtime/inline_gate.hpp), on an io thread that
// another thread takes over if a call blocks after all
// (runtime/loop_takeover.hpp), and through its request threads otherwise. The proxy's router looks a local replica up when a snapshot
// first names it (like its data channel), and calls serve() from any of its
// io threads.
//
// Lifetime: a LocalReplica is shared (the registry, the router's slots and
// the replica actor's exit hook hold it). After close() the replica's
// instance is let go by whoever ends the last serve() (a non-blocking
// replica's close() waits for it; a blocking one's hands the instance to a
// thread of its own), so the proxy never calls an instance the replica is
// destroying, and an io thread never runs the user's destructor. serve()
// after close() answers `closed`, and the caller takes the normal path (the
// replica's handle).
//
// The interface has no replica/ types: the proxy does not depend on the
// replica library; replica/inline_replica.hpp implements it.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <caf/actor_control_block.hpp>
#include <caf/message_id.hpp>

#include "runtime/inline_gate.hpp"
#include "runtime/wire.hpp"

namespace troupe {
class RequestControl;  // include/troupe/deployment.hpp
}  // namespace troupe

namespace troupe::local {

// A streamed answer of an inline call: handle() returned a producer. The
// producer may block (flow control), so it never runs on the io thread:
// start() runs it on a thread of its own, which sends the head as the
// response to the CAF request (`sender`, `request_id`) and the pieces as
// (chunk, ...) messages, exactly as the replica's request threads answer a
// CAF request (replica/streams.hpp, CafSink). Destroying it without start()
// ends the request at the replica (its slot there is given back).
class PendingStream {
 public:
  virtual ~PendingStream() = default;
  virtual void start(caf::strong_actor_ptr sender, caf::message_id request_id) = 0;
};

struct InlineResult {
  enum Kind {
    answered,    // `answer` holds the whole answer
    streaming,   // `stream` holds the rest of the answer; see PendingStream
    stopping,    // refused: the replica is stopping (errc::unavailable)
    overloaded,  // refused: at max_ongoing_requests (errc::overloaded)
    closed,      // the replica is gone: nothing ran; use the replica's handle
  };
  Kind kind = closed;
  std::string why;  // for refusals: the message the CAF path would give
  std::unique_ptr<PendingStream> stream;
};

// An inline call's attempt: its key (HttpRequest::call_key), what is left of
// its deadline (HttpRequest::timeout_s), and its RequestControl, made by the
// caller so that it can cancel the request while handle() runs (null: one is
// made with that deadline).
struct InlineCall {
  uint64_t key = 0;
  double timeout_s = 0;
  std::shared_ptr<RequestControl> control;
};

class LocalReplica {
 public:
  virtual ~LocalReplica() = default;
  virtual const std::string& replica_id() const = 0;
  // Runs `request` in the replica's handle() on the calling thread, under the
  // replica's own admission (max_ongoing_requests, stopping) and accounting
  // (requests in flight, the average the replica reports for autoscaling).
  // An exception from handle() is a 500, as on the replica's request threads.
  // `call` says what the attempt is beside its request (the caller reads it
  // from the request before the call: the proxy may send the request again
  // elsewhere while a blocking handler still runs, and changes its key and
  // timeout then; serve() reads nothing else of `request` that changes).
  virtual InlineResult serve(const HttpRequest& request, const InlineCall& call,
                             HttpResponse& answer) = 0;
  InlineResult serve(const HttpRequest& request, HttpResponse& answer) {
    return serve(request, InlineCall{request.call_key, request.timeout_s, nullptr}, answer);
  }
  // The deployment did not declare its handler non-blocking: it may wait.
  virtual bool blocking() const { return false; }
  // The replica batches its requests now (max_batch_size above 1): they go
  // to its request threads, which hand them to its batcher, never inline
  // (serve() answers `closed` then).
  virtual bool batching() const { return false; }
  // For a blocking handler: whether to call it inline now (see InlineGate).
  InlineGate gate;
};
using LocalReplicaPtr = std::shared_ptr<LocalReplica>;

// This node's inline-callable replicas by replica id. Thread-safe.
class LocalReplicas {
 public:
  void add(LocalReplicaPtr replica);
  // Removes `replica` (only that object: a newer one of the same id stays).
  void remove(const LocalReplicaPtr& replica);
  LocalReplicaPtr find(const std::string& replica_id) const;
  size_t size() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, LocalReplicaPtr> replicas_;
};

}  // namespace troupe::local
