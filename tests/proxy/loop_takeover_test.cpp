// Event loops whose thread may block (runtime/loop_takeover.hpp), on a real
// asio io_context with real threads. Every wait is a condition with a
// deadline; the blocking code waits on a latch the test opens.
#include "runtime/loop_takeover.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

using troupe::LoopTakeover;
namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {

// Polls `condition` every millisecond until it holds (true) or 10 s passed.
template <class Condition>
bool eventually(Condition condition) {
  auto until = std::chrono::steady_clock::now() + 10s;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > until)
      return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

struct Latch {
  std::mutex mutex;
  std::condition_variable opened;
  bool open = false;
  void wait() {
    std::unique_lock<std::mutex> lock(mutex);
    opened.wait(lock, [&] { return open; });
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      open = true;
    }
    opened.notify_all();
  }
};

// One io_context run by a LoopTakeover, as HttpServer runs its loops: after
// each handler, outside it, the blocking work a handler left in `pending`
// (false: the thread was taken over and leaves the loop).
struct Loop {
  asio::io_context io{1};
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::atomic<int> takeover_hooks{0};
  std::function<bool()> pending;  // the loop's state: its running thread only
  LoopTakeover loops;

  explicit Loop(LoopTakeover::Options o)
      : loops(1,
              [this](size_t, bool taking_over) {
                if (taking_over)
                  ++takeover_hooks;
                while (!io.stopped()) {
                  io.run_one();
                  if (pending) {
                    auto f = std::move(pending);
                    pending = nullptr;
                    if (!f())
                      return;
                  }
                }
              },
              o) {
    loops.start();
  }
  ~Loop() { stop(); }
  void stop() {
    work.reset();
    io.stop();
    loops.join();
  }
};

LoopTakeover::Options quick() {
  LoopTakeover::Options o;
  o.threshold = 2ms;
  o.poll = 1ms;
  o.linger = 50ms;
  return o;
}

}  // namespace

TEST_CASE("loop takeover: a loop whose thread blocks is run by another thread meanwhile - the blocked code's result comes back as a post") {
  Loop loop(quick());
  Latch latch;
  std::atomic<bool> still_owner{false};
  std::atomic<bool> left{false};
  std::atomic<bool> result_on_loop{false};
  std::atomic<std::thread::id> blocked_thread{};
  std::atomic<std::thread::id> later_thread{};
  asio::post(loop.io, [&] {
    loop.pending = [&] {
      blocked_thread = std::this_thread::get_id();
      if (loop.loops.run_blocking(0, [&] { latch.wait(); })) {
        still_owner = true;
        return true;
      }
      left = true;
      asio::post(loop.io, [&] { result_on_loop = true; });
      return false;
    };
  });
  // Taken over: work posted now runs although the first thread still waits.
  REQUIRE(eventually([&] { return loop.loops.takeovers() == 1; }));
  std::atomic<bool> second{false};
  asio::post(loop.io, [&] {
    later_thread = std::this_thread::get_id();
    second = true;
  });
  REQUIRE(eventually([&] { return second.load(); }));
  CHECK(later_thread.load() != blocked_thread.load());
  CHECK(loop.takeover_hooks == 1);
  CHECK(loop.loops.threads() == 2);
  CHECK_FALSE(left);

  // The blocked code returns: run_blocking says the loop is not its thread's
  // any more, the result reaches the loop as a post, and that thread ends.
  latch.release();
  REQUIRE(eventually([&] { return result_on_loop.load(); }));
  CHECK(left);
  CHECK_FALSE(still_owner);
  CHECK(eventually([&] { return loop.loops.threads() == 1; }));
  CHECK(loop.loops.takeovers() == 1);
}

TEST_CASE("loop takeover: code that returns within the threshold keeps its thread - join waits for a taken-over thread still blocked") {
  LoopTakeover::Options o = quick();
  o.threshold = 3600s;  // never, for the first part
  {
    Loop loop(o);
    std::atomic<int> owner{0};
    for (int i = 0; i < 100; ++i) {
      asio::post(loop.io, [&] {
        loop.pending = [&] {
          if (loop.loops.run_blocking(0, [] {}))
            ++owner;
          return true;
        };
      });
    }
    REQUIRE(eventually([&] { return owner.load() == 100; }));
    CHECK(loop.loops.takeovers() == 0);
    CHECK(loop.loops.threads() == 1);
  }
  Loop loop(quick());
  Latch latch;
  std::atomic<bool> left{false};
  asio::post(loop.io, [&] {
    loop.pending = [&] {
      if (loop.loops.run_blocking(0, [&] { latch.wait(); }))
        return true;
      left = true;
      return false;
    };
  });
  REQUIRE(eventually([&] { return loop.loops.takeovers() == 1; }));
  // Stopped while the old thread still waits: join() returns only once that
  // thread came back and left.
  std::thread opener([&] { latch.release(); });
  loop.stop();
  CHECK(left);
  CHECK(loop.loops.threads() == 0);
  opener.join();
}

TEST_CASE("loop takeover: judge - a blocked thread is taken over at the threshold - a computing one once it ran threshold/2 of CPU - a preempted one only at runnable_limit") {
  using Verdict = LoopTakeover::Verdict;
  LoopTakeover::Options o;
  o.threshold = 2ms;
  o.runnable_limit = 50ms;
  const int64_t ms = 1000000;
  LoopTakeover::ThreadState first{true, true, 10 * ms};
  LoopTakeover::ThreadState sleeping{true, false, 10 * ms};
  LoopTakeover::ThreadState preempted{true, true, 10 * ms + ms / 2};
  LoopTakeover::ThreadState computing{true, true, 11 * ms};
  LoopTakeover::ThreadState unknown{};
  // Under the threshold nothing is taken over, whatever the thread does.
  CHECK(LoopTakeover::judge(o, 2 * ms - 1, first, sleeping) == Verdict::wait);
  CHECK(LoopTakeover::judge(o, 2 * ms - 1, first, computing) == Verdict::wait);
  // Blocked (not runnable), or the kernel could not tell: at the threshold.
  CHECK(LoopTakeover::judge(o, 2 * ms, first, sleeping) == Verdict::take_over);
  CHECK(LoopTakeover::judge(o, 2 * ms, first, unknown) == Verdict::take_over);
  CHECK(LoopTakeover::judge(o, 2 * ms, unknown, computing) == Verdict::take_over);
  // Runnable and running: once it ran threshold/2 of CPU since the first look.
  CHECK(LoopTakeover::judge(o, 2 * ms, first, computing) == Verdict::take_over);
  // Runnable without running much: waiting for a CPU, until runnable_limit.
  CHECK(LoopTakeover::judge(o, 2 * ms, first, preempted) == Verdict::wait);
  CHECK(LoopTakeover::judge(o, 50 * ms - 1, first, preempted) == Verdict::wait);
  CHECK(LoopTakeover::judge(o, 50 * ms, first, preempted) == Verdict::take_over);
}

TEST_CASE("loop takeover: read_thread tells a sleeping thread from a running one and counts its CPU time") {
  Latch latch;
  std::atomic<int> sleeper_tid{0};
  std::thread sleeper([&] {
    sleeper_tid = static_cast<int>(::gettid());
    latch.wait();
  });
  REQUIRE(eventually([&] {
    auto t = LoopTakeover::read_thread(sleeper_tid.load());
    return t.known && !t.runnable;
  }));
  latch.release();
  sleeper.join();
  // This thread is running while it reads itself; its CPU time grows.
  const int self = static_cast<int>(::gettid());
  auto before = LoopTakeover::read_thread(self);
  REQUIRE(before.known);
  CHECK(before.runnable);
  CHECK(eventually([&] {
    volatile uint64_t x = 0;
    for (int i = 0; i < 1000000; ++i)
      x = x + static_cast<uint64_t>(i);
    return LoopTakeover::read_thread(self).cpu_ns > before.cpu_ns;
  }));
  CHECK_FALSE(LoopTakeover::read_thread(0).known);
}

TEST_CASE("loop takeover: code that computes is taken over - code whose thread only waits for a CPU is not") {
  {
    LoopTakeover::Options o = quick();
    Loop loop(o);
    std::atomic<bool> stop{false};
    std::atomic<bool> left{false};
    asio::post(loop.io, [&] {
      loop.pending = [&] {
        if (loop.loops.run_blocking(0, [&] {
              auto until = std::chrono::steady_clock::now() + 20s;
              while (!stop.load() && std::chrono::steady_clock::now() < until) {
              }
            }))
          return true;
        left = true;
        return false;
      };
    });
    CHECK(eventually([&] { return loop.loops.takeovers() == 1; }));
    stop = true;
    CHECK(eventually([&] { return left.load(); }));
  }
  // The blocking code's thread runs at SCHED_IDLE on one CPU, next to a
  // thread that spins there: runnable nearly all the time, on a CPU rarely.
  LoopTakeover::Options o = quick();
  o.threshold = 10ms;
  o.runnable_limit = 3600s;
  Loop loop(o);
  std::atomic<bool> spin{true};
  std::atomic<bool> spinning{false};
  // The first CPU this process may use.
  cpu_set_t allowed;
  REQUIRE(sched_getaffinity(0, sizeof allowed, &allowed) == 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &allowed))
    ++cpu;
  REQUIRE(cpu < CPU_SETSIZE);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  std::atomic<bool> pinned{false};
  std::thread competitor([&] {
    pinned = pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0;
    spinning = true;
    while (spin.load()) {
    }
  });
  REQUIRE(eventually([&] { return spinning.load(); }));
  CHECK(pinned);
  std::atomic<bool> kept{false};
  std::atomic<bool> done{false};
  std::atomic<int64_t> wall_ns{0};
  std::atomic<int64_t> cpu_ns{0};
  asio::post(loop.io, [&] {
    loop.pending = [&] {
      cpu_set_t before;
      pthread_getaffinity_np(pthread_self(), sizeof before, &before);
      const bool kept_loop = loop.loops.run_blocking(0, [&] {
        sched_param idle{};
        bool set = pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0 &&
                   pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle) == 0;
        timespec c0{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
        auto t0 = std::chrono::steady_clock::now();
        while (set && std::chrono::steady_clock::now() - t0 < 200ms) {
        }
        timespec c1{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
        wall_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - t0)
                      .count();
        cpu_ns = (c1.tv_sec - c0.tv_sec) * 1000000000LL + (c1.tv_nsec - c0.tv_nsec);
        sched_param normal{};
        pthread_setschedparam(pthread_self(), SCHED_OTHER, &normal);
        pthread_setaffinity_np(pthread_self(), sizeof before, &before);
      });
      kept = kept_loop;
      done = true;
      return kept_loop;
    };
  });
  const bool finished = eventually([&] { return done.load(); });
  spin = false;
  competitor.join();
  REQUIRE(finished);
  // The setting held: the code ran for a fraction of its wall time.
  REQUIRE(wall_ns.load() >= 200000000);
  REQUIRE(cpu_ns.load() < wall_ns.load() / 4);
  CHECK(kept);
  CHECK(loop.loops.takeovers() == 0);
}
