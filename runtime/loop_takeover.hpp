// Event loops that may run code that blocks: when a loop's thread stays in
// such code for longer than `threshold`, another thread takes the loop over
// (Go's scheduler does the same with a goroutine blocked in a system call).
// Used by the proxy's io threads (proxy/http_server.cpp) to run in-process
// replicas' blocking handlers inline (proxy/inline_path.cpp), and by a
// replica process's request loop (replica/request_workers.cpp): most
// handlers return within microseconds, and the rare one that waits must not
// stall every request behind it. Plain threads and atomics (unit-tested in
// tests/proxy/loop_takeover_test.cpp on an asio loop).
//
// How: each loop's thread runs `run_loop(i, taking_over)` (the io_context's
// run(); `taking_over` is true for a thread that takes a loop over). Code
// that may block runs inside run_blocking(i, f), on loop i's thread, outside
// the loop's handlers (between passes over them: the handlers' own queued
// continuations are in the loop's queue then, not held by this thread). A
// watcher thread looks at the loops every `poll` while any of them ran such
// code within the last `linger` (it sleeps otherwise, and the next
// run_blocking() wakes it): a loop whose thread is in run_blocking() for
// `threshold` or longer is taken over, and a new thread runs run_loop(i,
// true) -- unless the kernel says that thread is not blocked but waiting for
// a CPU (preempted on a busy machine: another thread would wait as well, and
// a takeover only costs a thread and, in the callers, closes their inline
// gate). See judge() below. When `f` returns on the old thread, run_blocking() returns false:
// that thread must not touch the loop's state any more; it hands what `f`
// produced to the loop (a post, which is thread-safe) and returns from
// run_loop, and ends. A taken-over loop's state is thus only ever touched by
// one thread at a time: the old thread stops touching it before the watcher
// marks it taken (it is inside `f`), and never touches it again.
//
// Every thread this starts, taken-over ones still inside `f` included, is
// waited for by join().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace troupe {

class LoopTakeover {
 public:
  struct Options {
    std::chrono::microseconds threshold{2000};
    std::chrono::microseconds poll{1000};
    std::chrono::milliseconds linger{1000};
    // A thread that is runnable (not blocked) and has not run for
    // `threshold` / 2 of CPU time since the watcher first saw it over
    // `threshold` / 2 is waiting for a CPU: its loop is taken over only once
    // the call lasted `runnable_limit`.
    std::chrono::microseconds runnable_limit{50000};
  };

  // What the kernel says of a thread (/proc/self/task/<tid>/stat and
  // schedstat).
  struct ThreadState {
    bool known = false;     // read; false: no such thread, or not readable
    bool runnable = false;  // 'R': running or waiting for a CPU
    int64_t cpu_ns = 0;     // CPU time so far (updated at least every tick)
  };
  static ThreadState read_thread(int tid);

  enum class Verdict { wait, take_over };
  // The watcher's decision for a call in run_blocking() for `elapsed`; `first`
  // is the thread's state when the watcher first saw this call past
  // threshold / 2, `now` its state now:
  //   - under `threshold`: wait;
  //   - blocked (not runnable), or unknown: take over (as without the check);
  //   - runnable, and it ran threshold / 2 of CPU since `first`: it computes,
  //     another thread can serve the loop on another core: take over;
  //   - runnable without running (preempted, the machine is busy): wait,
  //     until `runnable_limit`.
  static Verdict judge(const Options& o, int64_t elapsed_ns, const ThreadState& first,
                       const ThreadState& now);

  LoopTakeover(size_t loops, std::function<void(size_t, bool)> run_loop, Options o);
  LoopTakeover(size_t loops, std::function<void(size_t, bool)> run_loop)
      : LoopTakeover(loops, std::move(run_loop), Options{}) {}
  ~LoopTakeover();
  LoopTakeover(const LoopTakeover&) = delete;
  LoopTakeover& operator=(const LoopTakeover&) = delete;

  // One thread per loop, and the watcher.
  void start();
  // Waits until every thread this started has returned from run_loop (the
  // loops were told to stop, or ended by themselves), taken-over ones
  // included, and ends the watcher.
  void join();

  // On loop i's thread, outside the loop's handlers: runs `f`. True when this
  // thread still runs the loop; false when it was taken over meanwhile (then
  // leave the loop, touching nothing of it but posts).
  template <class F>
  bool run_blocking(size_t i, F&& f) {
    auto& l = *loops_[i];
    l.tid.store(this_tid(), std::memory_order_relaxed);
    const int64_t stamp = now_ns();
    l.since.store(stamp, std::memory_order_seq_cst);
    if (parked_.load(std::memory_order_seq_cst))
      wake_watcher();
    f();
    int64_t expected = stamp;
    return l.since.compare_exchange_strong(expected, 0, std::memory_order_acq_rel);
  }

  // Loops taken over so far.
  uint64_t takeovers() const { return takeovers_.load(std::memory_order_relaxed); }
  // Threads running now (loops, and taken-over threads still in `f`).
  size_t threads() const;

 private:
  struct Loop {
    // When the thread in run_blocking() began it (steady-clock ns); 0: none
    // is in it, or the one in it was taken over.
    std::atomic<int64_t> since{0};
    // The kernel's id of the thread that set `since` last.
    std::atomic<int> tid{0};
  };
  static int64_t now_ns();
  static int this_tid();
  void spawn(size_t i, bool taking_over);
  void watch();
  void wake_watcher();

  const Options o_;
  const std::function<void(size_t, bool)> run_loop_;
  std::vector<std::unique_ptr<Loop>> loops_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;  // the watcher's wake-ups; a thread ended
  size_t live_ = 0;                  // threads started and not ended
  bool stopping_ = false;
  bool poked_ = false;
  std::atomic<bool> parked_{false};
  std::atomic<uint64_t> takeovers_{0};
  std::thread watcher_;
};

}  // namespace troupe
