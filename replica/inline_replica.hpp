// An in-process replica as the proxy calls it inline (runtime/local_replicas.hpp),
// internal to replica/: the user's instance, the replica's Dispatch (the
// same admission and accounting as its request threads) and the close()
// that ends inline calls before the replica actor lets its instance go.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "replica/dispatch.hpp"
#include "replica/instance.hpp"
#include "runtime/local_replicas.hpp"

namespace troupe::replica {

class InlineReplica final : public local::LocalReplica {
 public:
  // `blocking`: the deployment did not declare its handler non-blocking.
  InlineReplica(Instance instance, DispatchPtr dispatch, bool blocking = false);

  const std::string& replica_id() const override { return dispatch_->replica_id; }

  // Admitted like a request over CAF (Dispatch::admit: refused while
  // stopping or at max_ongoing_requests), counted in the replica's requests
  // in flight, and ended with Dispatch::finish (which tells a stopping
  // replica actor when its last request ended). A streamed answer keeps its
  // admission until its producer returns on its own thread.
  using local::LocalReplica::serve;
  local::InlineResult serve(const HttpRequest& request, const local::InlineCall& call,
                            HttpResponse& answer) override;
  bool blocking() const override { return blocking_; }
  bool batching() const override;

  // From now on serve() answers `closed`, and this object's reference to the
  // instance goes once no serve() runs: a non-blocking replica's close()
  // waits for the calls that run (each is short: the deployment declared it),
  // a blocking one's returns at once, and the last of its calls to end hands
  // the instance to a thread of its own, which lets it go there (a blocked
  // handler must not hold up the replica actor's exit, and the user's
  // destructor never runs on an io thread). Idempotent.
  void close();
  bool closed() const;

 private:
  // Counts a serve() in progress unless closed; the instance to call.
  Deployment* enter();
  void leave();

  mutable std::mutex mutex_;
  std::condition_variable idle_;
  uint32_t users_ = 0;
  bool closed_ = false;
  Instance instance_;
  const DispatchPtr dispatch_;
  const bool blocking_;
};

}  // namespace troupe::replica
