// In-process replicas whose handler the node's proxy may call on its own io
// thread ("inline"): no CAF message, no hand-off to a request thread and
// back. Only a replica that runs `isolation: in_process` and whose
// deployment declared its handler non-blocking (Deployment::nonblocking(),
// include/troupe/deployment.hpp) is registered here, by the replica actor
// once its instance is built; it is closed and removed when the replica
// actor exits. The proxy's router looks a local replica up when a snapshot
// first names it (like its data channel), and calls serve() from any of its
// io threads.
//
// Lifetime: a LocalReplica is shared (the registry, the router's slots and
// the replica actor's exit hook hold it). close() waits until no serve() is
// running and then drops the replica's reference to the user's instance, so
// the proxy never calls an instance the replica is destroying, and an io
// thread never runs the user's destructor. serve() after close() answers
// `closed`, and the caller takes the normal path (the replica's handle).
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

#include "runtime/wire.hpp"

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

class LocalReplica {
 public:
  virtual ~LocalReplica() = default;
  virtual const std::string& replica_id() const = 0;
  // Runs `request` in the replica's handle() on the calling thread, under the
  // replica's own admission (max_ongoing_requests, stopping) and accounting
  // (requests in flight, the average the replica reports for autoscaling).
  // An exception from handle() is a 500, as on the replica's request threads.
  // The request cannot be cancelled while handle() runs (its RequestControl
  // carries the deadline only).
  virtual InlineResult serve(const HttpRequest& request, HttpResponse& answer) = 0;
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
