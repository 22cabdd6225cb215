#include "runtime/loop_takeover.hpp"

#include <utility>

namespace troupe {

LoopTakeover::LoopTakeover(size_t loops, std::function<void(size_t, bool)> run_loop, Options o)
    : o_(o), run_loop_(std::move(run_loop)) {
  for (size_t i = 0; i < loops; ++i)
    loops_.push_back(std::make_unique<Loop>());
}

LoopTakeover::~LoopTakeover() {
  join();
}

int64_t LoopTakeover::now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void LoopTakeover::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (watcher_.joinable() || stopping_)
    return;
  for (size_t i = 0; i < loops_.size(); ++i)
    spawn(i, false);
  watcher_ = std::thread([this] { watch(); });
}

// With mutex_ held.
void LoopTakeover::spawn(size_t i, bool taking_over) {
  ++live_;
  std::thread([this, i, taking_over] {
    run_loop_(i, taking_over);
    std::lock_guard<std::mutex> lock(mutex_);
    --live_;
    changed_.notify_all();
  }).detach();
}

size_t LoopTakeover::threads() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_;
}

void LoopTakeover::wake_watcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    poked_ = true;
  }
  changed_.notify_all();
}

void LoopTakeover::watch() {
  using Clock = std::chrono::steady_clock;
  const int64_t threshold =
      std::chrono::duration_cast<std::chrono::nanoseconds>(o_.threshold).count();
  std::unique_lock<std::mutex> lock(mutex_);
  auto last_busy = Clock::now();
  auto blocked = [&] {
    for (const auto& l : loops_) {
      if (l->since.load(std::memory_order_seq_cst) != 0)
        return true;
    }
    return false;
  };
  while (!stopping_) {
    bool busy = false;
    const int64_t now = now_ns();
    for (size_t i = 0; i < loops_.size(); ++i) {
      int64_t since = loops_[i]->since.load(std::memory_order_acquire);
      if (since == 0)
        continue;
      busy = true;
      if (now - since < threshold)
        continue;
      // Its thread has been in blocking code for `threshold`: the loop is
      // another thread's from now on, unless that code just returned.
      if (loops_[i]->since.compare_exchange_strong(since, 0, std::memory_order_acq_rel)) {
        takeovers_.fetch_add(1, std::memory_order_relaxed);
        spawn(i, true);
      }
    }
    auto t = Clock::now();
    if (busy)
      last_busy = t;
    if (t - last_busy >= o_.linger) {
      // Nothing blocked for a while: sleep until run_blocking() wakes us.
      // It reads parked_ after it set its loop's `since`, and we look at
      // every `since` after we set parked_, so one of us sees the other.
      parked_.store(true, std::memory_order_seq_cst);
      if (!blocked())
        changed_.wait(lock, [&] { return stopping_ || poked_; });
      poked_ = false;
      parked_.store(false, std::memory_order_seq_cst);
      last_busy = Clock::now();
      continue;
    }
    changed_.wait_for(lock, o_.poll, [&] { return stopping_; });
  }
}

void LoopTakeover::join() {
  {
    // A thread can only be started for one that still runs (in
    // run_blocking()), so once none runs, none will.
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return live_ == 0; });
    stopping_ = true;
  }
  changed_.notify_all();
  if (watcher_.joinable())
    watcher_.join();
}

}  // namespace troupe
