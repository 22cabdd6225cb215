#include "tools/chaos/process.hpp"

#include <signal.h>
#include <unistd.h>

#include <thread>

namespace chaos {

std::atomic<bool> g_interrupted{false};

namespace {

void on_signal(int) {
  if (g_interrupted.exchange(true)) {
    troupe::proc::kill_all_children();
    ::_exit(130);
  }
}

}  // namespace

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  // A load client writing to a socket its peer closed gets EPIPE, not a signal.
  ::signal(SIGPIPE, SIG_IGN);
}

bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds deadline,
                std::chrono::milliseconds poll_interval, bool interruptible) {
  return troupe::proc::wait_until(condition, deadline, poll_interval,
                                  interruptible ? &g_interrupted : nullptr);
}

void sleep_until(Clock::time_point t) {
  while (!g_interrupted.load()) {
    auto now = Clock::now();
    if (now >= t)
      return;
    std::this_thread::sleep_for(std::min<Clock::duration>(t - now, 50ms));
  }
}

}  // namespace chaos
