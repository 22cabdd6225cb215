// Helpers for multi-process tests: start troupe binaries, wait on conditions
// with deadlines (never fixed sleeps), and stop every process a test started,
// even when the test fails.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace troupe::testing {

using namespace std::chrono_literals;

// Directory of the built binaries (build/bin).
std::string bin_dir();
std::string bin(const std::string& name);

// A child process whose stdout and stderr go to a file. The destructor kills
// (SIGKILL) and reaps it if it still runs. The child also gets SIGKILL if the
// test process dies first.
class ChildProcess {
 public:
  ChildProcess(std::vector<std::string> argv, std::string output_path);
  ~ChildProcess();
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  bool running();
  void signal(int sig);
  // Waits until the process exits or the deadline passes. The exit code, or
  // 128 + signal number when killed by a signal.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);
  // Everything the process wrote so far.
  std::string output() const;
  const std::vector<std::string>& argv() const { return argv_; }

 private:
  void reap(int status);
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::vector<std::string> argv_;
  std::string output_path_;
};

struct RunResult {
  int exit_code = -1;  // -1: killed at the timeout
  std::string out;
  std::string err;
};

// Runs a command to completion (killing it at the timeout) and captures its
// output.
RunResult run(const std::vector<std::string>& argv, std::chrono::milliseconds timeout = 30s);

// Polls `condition` until it holds or the deadline passes.
bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds deadline,
                std::chrono::milliseconds poll_interval = 50ms);

// A loopback TCP port that was free a moment ago (bound with port 0).
uint16_t free_port();

// A fresh directory under /tmp, removed with its content on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace troupe::testing
