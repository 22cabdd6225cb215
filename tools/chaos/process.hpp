// The chaos tool's processes: the shared helpers (tools/common/process.hpp),
// plus the tool's interruption. Its nodes are spawned from the main thread
// (see PR_SET_PDEATHSIG there).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>

#include "tools/common/process.hpp"

namespace chaos {

using namespace std::chrono_literals;
using troupe::proc::Child;
using troupe::proc::Clock;
using troupe::proc::free_port;
using troupe::proc::processes_mentioning;
using troupe::proc::run;  // not cut short by an interruption: the shutdown needs troupectl
using troupe::proc::RunResult;
using troupe::proc::slurp;

// Set by SIGINT/SIGTERM; every wait of the tool gives up when it is set.
extern std::atomic<bool> g_interrupted;
// Installs the SIGINT/SIGTERM handler (a second signal kills every child
// with SIGKILL and exits 130 at once).
void install_signal_handlers();

// Polls `condition` until it holds, the deadline passes or (when
// `interruptible`) the tool is interrupted. The shutdown's waits are not
// interruptible: they are what an interruption leads to.
bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds deadline,
                std::chrono::milliseconds poll_interval = 50ms, bool interruptible = true);

// Sleeps until `t` (or interruption). The fault schedule is time-based by
// nature; this is its clock, never a stand-in for a condition.
void sleep_until(Clock::time_point t);

// The run directory: /tmp/troupe-chaos-XXXXXX.
class TempDir : public troupe::proc::TempDir {
 public:
  TempDir() : troupe::proc::TempDir("troupe-chaos") {}
};

}  // namespace chaos
