// Child processes and the waits around them, for programs that drive troupe
// binaries: the multi-process tests (tests/support) and the chaos tool
// (tools/chaos). Plain C++ and POSIX; links nothing of troupe.
//
// A Child runs with its output in a file, in its own process group (a Ctrl-C
// in a terminal reaches only the driving program, which stops its children in
// order), is killed with SIGKILL if the driving program dies
// (PR_SET_PDEATHSIG), and is killed and reaped by its destructor if still
// running. PR_SET_PDEATHSIG fires when the *thread* that forked exits, so
// long-lived children must be spawned from a thread that outlives them.
// Short commands (`run`) may be run from any thread: they are waited for
// where they started.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tools/common/temp_dir.hpp"

namespace troupe::proc {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct ChildOptions {
  // Its working directory ("" : the driver's). Where a core file lands
  // when the kernel's core_pattern is a plain file name.
  std::string working_dir;
  // RLIMIT_CORE unlimited, so a crash leaves a core file to read.
  bool core_dumps = false;
};

class Child {
 public:
  Child() = default;
  Child(std::vector<std::string> argv, std::string output_path, ChildOptions options = {});
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
  // SIGTERM (unless one was sent already: a second one forces a troupe-node
  // to stop at once), then waits up to `grace`: the exit code, or nullopt
  // when it still ran then (it is killed, and its fate reported as "did not
  // exit").
  std::optional<int> stop(std::chrono::milliseconds grace);
  // "exited with status 0", "killed by SIGSEGV (core dumped)", "running".
  std::string describe_exit() const;
  bool core_dumped() const { return core_dumped_; }
  // True when the driver sent it a signal or waited for its exit: how it
  // ended is then the driver's business, not a crash to report.
  bool fate_owned() const { return fate_owned_; }
  const ChildOptions& options() const { return options_; }
  const std::vector<std::string>& argv() const { return argv_; }
  const std::string& output_path() const { return output_path_; }
  // Everything the process wrote so far.
  std::string output() const;

 private:
  void kill_now();
  void reaped(int status);
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  bool core_dumped_ = false;
  bool fate_owned_ = false;
  bool terminated_ = false;  // SIGTERM sent
  ChildOptions options_;
  std::vector<std::string> argv_;
  std::string output_path_;
};

struct RunResult {
  int exit_code = -1;  // -1: killed at the timeout
  std::string out;
  std::string err;
  double seconds = 0;  // wall time of the command
};

// Runs a command to completion, killing it at the timeout.
RunResult run(const std::vector<std::string>& argv, std::chrono::milliseconds timeout);

// Polls `condition` until it holds, the deadline passes, or `give_up` (when
// given) is set.
bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds deadline,
                std::chrono::milliseconds poll_interval = 50ms,
                const std::atomic<bool>* give_up = nullptr);

// A loopback TCP port below Linux's ephemeral range (32768+, so that no
// outgoing connection takes it between this check and its use) that was free
// a moment ago; never one handed out before by this process, nor in the last
// 15 minutes by another one on this machine (a claim file per port in
// /tmp/troupe-port-claims: test processes that run side by side pick their
// ports before their nodes bind them).
uint16_t free_port(uint32_t seed = 0);

// The last `lines` lines of `text`.
std::string tail_lines(const std::string& text, size_t lines);

// `gdb -batch` backtraces of every thread of `binary` from `core` (bounded
// in time); what went wrong when gdb or the core is missing.
std::string backtrace_of(const std::string& binary, const std::string& core);

// Pids of live processes whose command line contains `needle` (from /proc).
std::vector<pid_t> processes_mentioning(const std::string& needle);

std::string slurp(const std::string& path);

// SIGCONT and SIGKILL to every child not reaped yet. Async-signal-safe: for a
// signal handler's emergency stop.
void kill_all_children();

}  // namespace troupe::proc
