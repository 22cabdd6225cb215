// A replica's request batching (internal to replica/; the user's side is
// Deployment::handle_batch() in include/troupe/deployment.hpp): the Batcher
// (replica/batcher.hpp) of a replica whose class implements handle_batch(),
// and what every path that brings requests to the replica (CAF request
// threads, the data channel's request loop) hands it.
//
// While max_batch_size is 1 the paths call handle() as always; once a
// reconfigure sets it above 1 (active()), they submit their requests here
// instead and go on reading: the answer comes back on the batcher's thread,
// through the `done` the path gave. In-process replicas are never called
// inline while batching (InlineReplica::batching()): their requests go to
// the request threads, which submit them here.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "replica/batcher.hpp"
#include "replica/instance.hpp"
#include "runtime/status.hpp"
#include "runtime/wire.hpp"

namespace troupe::replica {

class ModelReport;
class ReplicaMetrics;

// Whether `s` asks for batching (max_batch_size above 1, or the adaptive
// wait), and, when it does and the class (`import_path`) does not implement
// handle_batch() (`batches` false), the error that says so, naming the
// field; else ok.
bool wants_batching(const BatchSettings& s);
Status check_batching(const BatchSettings& s, bool batches, const std::string& import_path);

class ReplicaBatcher {
 public:
  // `instance` is held weakly: the replica's request threads hold it (a
  // batch that finds it gone answers 503).
  ReplicaBatcher(const Instance& instance, const BatchSettings& settings,
                 std::shared_ptr<ReplicaMetrics> metrics, std::shared_ptr<ModelReport> models);
  // Stops the batcher's thread without waiting for it (it may be in a
  // batch, and this may run on any thread, the batcher's own included).
  ~ReplicaBatcher();
  ReplicaBatcher(const ReplicaBatcher&) = delete;
  ReplicaBatcher& operator=(const ReplicaBatcher&) = delete;

  // max_batch_size > 1.
  bool active() const { return active_.load(std::memory_order_acquire); }
  void apply(const BatchSettings& settings);
  BatchSettings settings() const;

  // Queues `req` (its RequestControl `control`) for a batch; `done` gets its
  // answer exactly once, on the batcher's thread (or here, when the batcher
  // has stopped): the element of handle_batch()'s result with X-Request-Id
  // (and the models the replica holds, for a request that names one), a
  // 500 for a batch that failed, a 499/504 for a request cancelled or past
  // its deadline before its batch ran, a 503 once the replica stops.
  void submit(HttpRequest&& req, std::shared_ptr<RequestControl> control,
              std::function<void(HttpResponse&&)> done);
  // Batcher::on_answered: after the `done`s of a batch ran (a replica
  // process sends a batch's answers together). Set before requests come.
  void on_answered(std::function<void()> f) { batcher_->on_answered(std::move(f)); }

 private:
  static BatchOptions options_of(const BatchSettings& s);

  const std::shared_ptr<ReplicaMetrics> metrics_;
  const std::shared_ptr<ModelReport> models_;
  std::atomic<bool> active_{false};
  // Shared with its detached thread, which runs it until stop().
  std::shared_ptr<Batcher> batcher_;
};

}  // namespace troupe::replica
