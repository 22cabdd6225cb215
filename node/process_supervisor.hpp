// The supervision of a node's replica processes: plain C++ and POSIX, no CAF.
//
// spawn() starts a process (posix_spawn, every descriptor of the node but
// the pipes closed in the child), registers its pidfd and its output pipe
// with one epoll loop on the supervisor's own thread, and from then on:
//   - it runs in log_dir (a core file it dumps lands there);
//   - the process's stdout and stderr go to <log_dir>/<id>.log, rotated at
//     log_max_bytes (one older file, <id>.log.1, is kept), and the file stays
//     after the exit so that a crash can be read; logs of exited processes
//     are pruned (older than log_keep_s, beyond log_keep_files);
//   - its exit is known at once (its pidfd turns readable), it is reaped
//     (waitid on the pidfd: no zombie), and on_exit gets the cause: exit
//     code, or signal and core dump, or that it exceeded its memory limit;
//   - a memory limit is enforced with cgroup v2 memory.max when this node can
//     create cgroups (a writable cgroup2 mount with the memory controller
//     delegated), else with RLIMIT_AS. Both are applied before the process
//     reads its stdin, which is the first thing troupe-replica does, so no
//     user code runs before the limit holds.
// The destructor kills (SIGKILL) and reaps every process still running.
//
// A process never outlives its node: troupe-replica sets PR_SET_PDEATHSIG
// itself and checks that its parent is still the pid it was given.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/resources.hpp"  // format_bytes, for exit causes
#include "runtime/status.hpp"

namespace troupe::node {

// How a process ended.
struct ProcessExit {
  pid_t pid = 0;
  int exit_code = -1;  // >= 0 when it exited by itself
  int signal = 0;      // > 0 when a signal ended it
  bool core_dumped = false;
  // Killed by the OOM killer in its cgroup, or exited with
  // kExitMemoryLimit (an allocation failed under RLIMIT_AS).
  bool memory_limit_exceeded = false;
  uint64_t memory_limit_bytes = 0;  // the limit it ran with (0: none)

  bool clean() const { return exit_code == 0 && !memory_limit_exceeded; }
  // "exited with status 3", "killed by SIGSEGV (core dumped)",
  // "exceeded its memory limit of 512 MiB (killed by SIGKILL)".
  std::string describe() const;
};

// The exit status troupe-replica uses when an allocation fails (under
// RLIMIT_AS that is how a memory limit shows).
constexpr int kExitMemoryLimit = 86;

// "SIGSEGV"; "signal 77" for one without a name.
std::string signal_name(int signal);

struct ProcessSpec {
  std::string id;  // names its log file and cgroup (a replica id)
  std::string executable;
  std::vector<std::string> args;  // argv[1..]
  // Written to its stdin, which is then closed (a one-time secret).
  std::string stdin_data;
  uint64_t memory_limit_bytes = 0;  // 0: none
  // Added to (or replacing in) the node's environment.
  std::vector<std::pair<std::string, std::string>> env;
  // Descriptors the process gets as fds 3, 4, ... in this order (every other
  // descriptor of the node is closed in it). The caller keeps its own.
  std::vector<int> fds;
  // The node's end of the process's doorbell (runtime/gate_link.hpp), or
  // -1: handed over to the supervisor, which closes it when the process is
  // reaped (or not started) and calls SupervisorOptions::on_doorbell when
  // the process rings.
  int doorbell = -1;
};

struct SupervisorOptions {
  // Where output files go; "" discards the output.
  std::string log_dir;
  uint64_t log_max_bytes = 10ull << 20;
  // Logs of exited processes are removed when older than this, or when
  // there are more than log_keep_files of them (oldest first).
  double log_keep_s = 7 * 24 * 3600.0;
  size_t log_keep_files = 200;
  // Parent of the cgroups made for memory limits; "" finds one: a
  // troupe-<pid> child of this process's cgroup2 cgroup, when the memory
  // controller can be delegated there.
  std::string cgroup_root;
  bool use_cgroups = true;
  // Runs on the supervisor's thread once per process, after it is reaped.
  std::function<void(const std::string& id, const ProcessExit& exit)> on_exit;
  // Runs on the supervisor's thread when process `id` rang its doorbell
  // (it asks for a connection to the node), at most once per
  // doorbell_interval_s per process: rings in between are dropped (the
  // process rings again when no connection came).
  std::function<void(const std::string& id, int doorbell)> on_doorbell;
  double doorbell_interval_s = 0.25;
};

class ProcessSupervisor {
 public:
  static Result<std::unique_ptr<ProcessSupervisor>> start(SupervisorOptions options);
  // Kills (SIGKILL) and reaps every process still running, and stops the
  // thread; on_exit is not called for them. Idempotent; the destructor calls it.
  void shutdown();
  ~ProcessSupervisor();
  ProcessSupervisor(const ProcessSupervisor&) = delete;
  ProcessSupervisor& operator=(const ProcessSupervisor&) = delete;

  // Starts the process; its pid. Thread-safe. An id may run once at a time.
  Result<pid_t> spawn(const ProcessSpec& spec);
  // Sends `sig` to the process of `id` if it still runs (pid-reuse safe:
  // through its pidfd). False when no such process runs.
  bool signal(const std::string& id, int sig);
  size_t running() const;
  // The file the output of replica `id` goes to (whether or not it runs or
  // ever ran); "" without a log_dir.
  std::string log_path(const std::string& id) const;
  // "cgroup v2 memory.max (<root>)" or "RLIMIT_AS".
  std::string memory_enforcement() const;

  struct Impl;

 private:
  explicit ProcessSupervisor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::node
