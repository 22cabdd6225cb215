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
  InlineReplica(Instance instance, DispatchPtr dispatch);

  const std::string& replica_id() const override { return dispatch_->replica_id; }

  // Admitted like a request over CAF (Dispatch::admit: refused while
  // stopping or at max_ongoing_requests), counted in the replica's requests
  // in flight, and ended with Dispatch::finish (which tells a stopping
  // replica actor when its last request ended). A streamed answer keeps its
  // admission until its producer returns on its own thread.
  local::InlineResult serve(const HttpRequest& request, HttpResponse& answer) override;

  // From now on serve() answers `closed`. Waits for the serve() calls that
  // run (each is short: the deployment declared its handler non-blocking),
  // then drops this object's reference to the instance. Idempotent.
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
};

}  // namespace troupe::replica
