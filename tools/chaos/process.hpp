// Child processes of the chaos tool: spawned with their output in a file, in
// their own process group (a Ctrl-C reaches only the tool, which then stops
// them in order), killed with SIGKILL if the tool dies (PR_SET_PDEATHSIG), and
// killed and reaped by the destructor if still running.
//
// PR_SET_PDEATHSIG fires when the *thread* that forked exits, so long-lived
// children (nodes) must be spawned from the main thread. Short commands
// (`run`) may be run from any thread: they are waited for where they started.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace chaos {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Set by SIGINT/SIGTERM; every wait of the tool gives up when it is set.
extern std::atomic<bool> g_interrupted;
// Installs the SIGINT/SIGTERM handler (a second signal kills every child
// registered with SIGKILL and exits 130 at once).
void install_signal_handlers();

class Child {
 public:
  Child() = default;
  Child(std::vector<std::string> argv, std::string output_path);
  ~Child();
  Child(Child&& other) noexcept;
  Child& operator=(Child&& other) noexcept;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  bool running();
  // Sends a signal if the process still runs (SIGCONT first for SIGTERM and
  // SIGKILL, so that a stopped process can act on it).
  void signal(int sig);
  // Waits until the process exits or the deadline passes: the exit code, or
  // 128 + signal number when killed by a signal.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);
  std::optional<int> exit_code() const { return exit_code_; }
  const std::vector<std::string>& argv() const { return argv_; }
  const std::string& output_path() const { return output_path_; }

 private:
  void kill_now();
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::vector<std::string> argv_;
  std::string output_path_;
};

struct RunResult {
  int exit_code = -1;  // -1: killed at the timeout (or interrupted)
  std::string out;
  std::string err;
  double seconds = 0;  // wall time of the command
};

// Runs a command to completion, killing it at the timeout (also after an
// interruption: the shutdown needs troupectl).
RunResult run(const std::vector<std::string>& argv, std::chrono::milliseconds timeout);

// Polls `condition` until it holds, the deadline passes or (when
// `interruptible`) the tool is interrupted. The shutdown's waits are not
// interruptible: they are what an interruption leads to.
bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds deadline,
                std::chrono::milliseconds poll_interval = 50ms, bool interruptible = true);

// Sleeps until `t` (or interruption). The fault schedule is time-based by
// nature; this is its clock, never a stand-in for a condition.
void sleep_until(Clock::time_point t);

// A loopback TCP port below the ephemeral range (32768+) that was free a
// moment ago; never one handed out before by this process.
uint16_t free_port(uint32_t seed);

// A fresh directory under /tmp, removed with its content on destruction
// unless keep() was called.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  void keep() { keep_ = true; }

 private:
  std::string path_;
  bool keep_ = false;
};

// Pids of live processes whose command line contains `needle` (from /proc).
std::vector<pid_t> processes_mentioning(const std::string& needle);

std::string slurp(const std::string& path);

}  // namespace chaos
