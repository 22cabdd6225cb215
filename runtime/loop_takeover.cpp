#include "runtime/loop_takeover.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstring>
#include <string_view>
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

int LoopTakeover::this_tid() {
  static thread_local const int tid = static_cast<int>(::gettid());
  return tid;
}

namespace {

// Up to `size` bytes of a /proc file (one read, as the kernel renders these
// files whole); empty when it cannot be read.
std::string_view read_proc(const char* path, char* buf, size_t size) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return {};
  ssize_t n = ::read(fd, buf, size);
  ::close(fd);
  return n > 0 ? std::string_view(buf, static_cast<size_t>(n)) : std::string_view{};
}

}  // namespace

LoopTakeover::ThreadState LoopTakeover::read_thread(int tid) {
  ThreadState t;
  if (tid <= 0)
    return t;
  char path[64];
  char buf[1024];
  // stat: "tid (comm) S ...": the state follows the last ')' (comm may hold
  // any character).
  std::snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
  std::string_view stat = read_proc(path, buf, sizeof buf);
  size_t close = stat.rfind(')');
  if (close == std::string_view::npos || close + 2 >= stat.size())
    return t;
  const char state = stat[close + 2];
  // schedstat: "<ns on a CPU> <ns waiting for one> <slices>".
  std::snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", tid);
  std::string_view sched = read_proc(path, buf, sizeof buf);
  int64_t cpu = 0;
  auto [end, ec] = std::from_chars(sched.data(), sched.data() + sched.size(), cpu);
  if (ec != std::errc{} || end == sched.data())
    return t;
  t.known = true;
  t.runnable = state == 'R';
  t.cpu_ns = cpu;
  return t;
}

LoopTakeover::Verdict LoopTakeover::judge(const Options& o, int64_t elapsed_ns,
                                          const ThreadState& first, const ThreadState& now) {
  using std::chrono::nanoseconds;
  const int64_t threshold = std::chrono::duration_cast<nanoseconds>(o.threshold).count();
  if (elapsed_ns < threshold)
    return Verdict::wait;
  if (!now.known || !first.known || !now.runnable)
    return Verdict::take_over;
  if (now.cpu_ns - first.cpu_ns >= threshold / 2)
    return Verdict::take_over;
  if (elapsed_ns >= std::chrono::duration_cast<nanoseconds>(o.runnable_limit).count())
    return Verdict::take_over;
  return Verdict::wait;
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
  // Per loop: the call (its `since`) the watcher looked at past threshold / 2,
  // and its thread's state then.
  struct Seen {
    int64_t since = 0;
    ThreadState first;
  };
  std::vector<Seen> seen(loops_.size());
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
      if (now - since < threshold / 2)
        continue;
      const int tid = loops_[i]->tid.load(std::memory_order_relaxed);
      if (seen[i].since != since) {
        // First look at this call: the baseline of its thread's CPU time.
        seen[i].since = since;
        seen[i].first = read_thread(tid);
        if (now - since < threshold)
          continue;
      }
      if (judge(o_, now - since, seen[i].first, read_thread(tid)) != Verdict::take_over)
        continue;
      // Its thread has been blocked in that code for `threshold` (or
      // computed as long): the loop is another thread's from now on, unless
      // that code just returned.
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
