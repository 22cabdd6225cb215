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
