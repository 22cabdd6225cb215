// Request batching (issue 44; Ray Serve's @serve.batch, Triton's dynamic
// batcher): requests of one replica wait in a queue until a batch closes —
// it holds max_batch_size requests, or its oldest has waited the batch wait —
// and the batch runs as one call of the deployment's batch handler, each
// request then answered with its own element of the result.
//
// Two parts, so that the decisions are tested step by step with a clock the
// test moves (tests/replica/batcher_test.cpp):
//   - BatchQueue: plain state, no threads, no clock of its own. When a batch
//     closes, what goes into it (requests cancelled or past their deadline
//     are left out: their clients have their 499 or 504 already), and, with
//     the adaptive wait, how long to wait.
//   - Batcher: a BatchQueue under a mutex and the thread that runs the
//     batches (or, without a thread, step() driven by a test). submit() never
//     blocks; every request's `done` is called exactly once: with its answer,
//     with a 500 for every request of a batch whose handler threw or returned
//     the wrong number of answers, with 499/504 for a request left out, or
//     with 503 for one still queued when the Batcher stops.
//
// The adaptive wait (`batch_wait_timeout_s: auto`, BentoML's idea): waiting
// pays only when more requests arrive while one waits, and costs latency at
// light load. The queue keeps a moving average of the time between arrivals
// (a) and of the time a batch takes to run (L). A lone request does not wait
// at all when a >= L (the next request would come after a batch of one is
// done: light load); otherwise it waits for the batch to fill, (max - 1) * a,
// but never longer than L (a batch that waits longer than it runs would
// halve the throughput it buys) nor than the cap, kAdaptiveCap. While a batch
// runs requests queue anyway, and the next batch closes when the runner is
// free and the wait of its oldest request has passed.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <troupe/deployment.hpp>

namespace troupe::replica {

struct BatchOptions {
  // 1: no batching (every request runs alone, at once).
  size_t max_batch_size = 1;
  // Ray Serve's batch_wait_timeout_s (its default, 0.01 s).
  double wait_s = 0.01;
  // batch_wait_timeout_s: auto (above); wait_s is then ignored.
  bool adaptive = false;
};

class BatchQueue {
 public:
  using Clock = std::chrono::steady_clock;
  // The longest the adaptive wait ever waits.
  static constexpr double kAdaptiveCap = 0.05;

  struct Item {
    Request request;
    std::function<void(Response)> done;
    Clock::time_point arrived;
  };
  // What take() hands out: the batch to run now (empty: none) and the
  // requests left out of it, each with the status that ends it.
  struct Taken {
    std::vector<Item> batch;
    std::vector<std::pair<Item, int>> dropped;
  };

  explicit BatchQueue(BatchOptions options = {}) : options_(options) {}

  void set_options(BatchOptions options) { options_ = options; }
  const BatchOptions& options() const { return options_; }

  void push(Request request, std::function<void(Response)> done, Clock::time_point now);
  size_t size() const { return items_.size(); }

  // With the runner free (`idle`): the batch that closed by `now`, if one
  // did. Cancelled or expired requests at its front are dropped first
  // (returned with 499 or 504), so they neither run nor hold a batch open.
  // A runner that is busy gets only the dropped ones.
  Taken take(Clock::time_point now, bool idle);

  // When the queued batch closes if nothing else arrives (its oldest
  // request's wait ends); nullopt when nothing is queued. A full batch: now.
  std::optional<Clock::time_point> closes_at() const;

  // Everything queued, in order (a Batcher that stops answers it).
  std::vector<Item> drain();

  // A batch ran for `took`: the adaptive wait learns from it.
  void ran(Clock::duration took);

  // The wait a batch's oldest request gets now, in seconds.
  double wait_s() const;
  // The adaptive wait's averages (seconds; 0 before the first measurement).
  double mean_interarrival_s() const { return interarrival_s_; }
  double mean_batch_s() const { return batch_s_; }

 private:
  BatchOptions options_;
  std::deque<Item> items_;
  std::optional<Clock::time_point> last_arrival_;
  double interarrival_s_ = 0;
  double batch_s_ = 0;
};

class Batcher {
 public:
  using Clock = BatchQueue::Clock;
  // Runs one batch: an answer per request, in their order.
  using Run = std::function<std::vector<Response>(const std::vector<Request>&)>;
  // What a batch looked like: its size and how long its oldest request
  // waited (for the metrics).
  using Observe = std::function<void(size_t size, double waited_s)>;

  // `threaded`: a thread of its own runs the batches; otherwise step() does
  // (tests), with `now` as the clock.
  Batcher(BatchOptions options, Run run, bool threaded = true,
          std::function<Clock::time_point()> now = [] { return Clock::now(); },
          Observe observe = nullptr);
  // Stops (and joins) its own thread; requests still queued get 503.
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  void submit(Request request, std::function<void(Response)> done);
  // Called after every run of `done`s (a batch's answers, the requests it
  // left out, what a stopping Batcher answers 503), on the thread that
  // ran them: a caller that collects answers sends them together here.
  // Set before the first submit().
  void on_answered(std::function<void()> f);
  // From now on (the queued requests included): a redeploy that changed
  // max_batch_size or batch_wait_timeout_s.
  void set_options(BatchOptions options);
  BatchOptions options();

  // Without a thread: runs what is due by the clock now (drops, and at most
  // one batch); the size of the batch it ran (0: none).
  size_t step();
  // Without a thread of its own: runs the batches on the calling thread
  // until stop(). A replica runs it on a detached thread that holds the
  // Batcher (replica/batching.hpp), so that nothing ever waits for a batch
  // to end in order to let the Batcher go.
  void run();
  // Ends run() (after the batch that runs, if one does); what is queued
  // then is answered 503 when the Batcher is destroyed. Idempotent.
  void stop();
  // Requests queued now.
  size_t queued();

 private:
  void loop();
  // Outside the mutex: answers what take() dropped, then runs its batch.
  void deliver(BatchQueue::Taken& taken, Clock::time_point closed);
  // Runs `batch` (outside the mutex) and answers every request of it.
  void run_batch(std::vector<BatchQueue::Item>& batch, Clock::time_point closed);
  static void drop(std::vector<std::pair<BatchQueue::Item, int>>& dropped);

  Run run_;
  std::function<void()> answered_;
  std::function<Clock::time_point()> now_;
  Observe observe_;
  std::mutex mutex_;
  std::condition_variable changed_;
  BatchQueue queue_;
  bool stopping_ = false;
  // The runner waits for the queue (until sleeping_until_; max: no
  // deadline): submit() wakes it only when that time moves closer.
  bool sleeping_ = false;
  Clock::time_point sleeping_until_;
  std::thread thread_;
};

}  // namespace troupe::replica
