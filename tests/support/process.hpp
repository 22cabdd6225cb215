// Helpers for multi-process tests: start troupe binaries, wait on conditions
// with deadlines (never fixed sleeps), and stop every process a test started,
// even when the test fails. The process helpers are shared with the chaos
// tool (tools/common/process.hpp).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "tests/support/temp_dir.hpp"
#include "tools/common/process.hpp"

namespace troupe::testing {

using namespace std::chrono_literals;

// Directory of the built binaries (build/bin).
std::string bin_dir();
std::string bin(const std::string& name);

// A child process whose stdout and stderr go to a file. The destructor kills
// (SIGKILL) and reaps it if it still runs. The child also gets SIGKILL if the
// test process dies first.
using ChildProcess = proc::Child;
using proc::free_port;  // below the ephemeral range, never the same twice
using proc::RunResult;
using proc::wait_until;

// Runs a command to completion (killing it at the timeout) and captures its
// output.
inline RunResult run(const std::vector<std::string>& argv,
                     std::chrono::milliseconds timeout = 30s) {
  return proc::run(argv, timeout);
}

}  // namespace troupe::testing
