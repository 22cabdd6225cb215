// The process supervisor with plain /bin/sh children: exit causes (status,
// signal, core dump, memory limit), output files and their rotation, the
// stdin hand-over, no zombies, and shutdown. Waits are conditions with
// deadlines.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "node/process_supervisor.hpp"
#include "runtime/doorbell.hpp"
#include "tools/common/process.hpp"

using namespace troupe;
using namespace troupe::node;
using troupe::format_bytes;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

// Collects on_exit reports.
struct Exits {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::string, ProcessExit> by_id;

  void add(const std::string& id, const ProcessExit& e) {
    std::lock_guard<std::mutex> lock(mutex);
    by_id[id] = e;
    changed.notify_all();
  }
  std::optional<ProcessExit> wait(const std::string& id, std::chrono::milliseconds deadline = 10s) {
    std::unique_lock<std::mutex> lock(mutex);
    if (!changed.wait_for(lock, deadline, [&] { return by_id.count(id) > 0; }))
      return std::nullopt;
    return by_id.at(id);
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mutex);
    return by_id.size();
  }
};

struct Fixture {
  proc::TempDir dir{"troupe-supervisor-test"};
  Exits exits;
  std::unique_ptr<ProcessSupervisor> sup;

  explicit Fixture(uint64_t log_max_bytes = 10ull << 20) {
    SupervisorOptions o;
    o.log_dir = dir / "replicas";
    o.log_max_bytes = log_max_bytes;
    o.use_cgroups = false;  // RLIMIT_AS: the same on every machine
    o.on_exit = [this](const std::string& id, const ProcessExit& e) { exits.add(id, e); };
    auto started = ProcessSupervisor::start(std::move(o));
    REQUIRE(started.has_value());
    sup = std::move(started.value());
  }

  pid_t sh(const std::string& id, const std::string& script, const std::string& input = "",
           uint64_t memory_limit = 0) {
    ProcessSpec spec;
    spec.id = id;
    spec.executable = "/bin/sh";
    spec.args = {"-c", script};
    spec.stdin_data = input;
    spec.memory_limit_bytes = memory_limit;
    auto pid = sup->spawn(spec);
    REQUIRE(pid.has_value());
    return *pid;
  }

  std::string log_of(const std::string& id) { return proc::slurp(dir / ("replicas/" + id + ".log")); }
};

bool is_zombie_or_gone(pid_t pid) {
  auto stat = proc::slurp("/proc/" + std::to_string(pid) + "/stat");
  if (stat.empty())
    return true;
  auto close = stat.rfind(')');
  return close != std::string::npos && stat.size() > close + 2 && stat[close + 2] == 'Z';
}

}  // namespace

TEST_CASE("process supervisor: exit status - signal - output - stdin - and no zombie") {
  Fixture f;
  pid_t pid = f.sh("a#1", "read secret; echo \"got $secret\"; echo oops >&2; exit 3", "s3cr3t\n");
  auto e = f.exits.wait("a#1");
  REQUIRE(e.has_value());
  CHECK(e->pid == pid);
  CHECK(e->exit_code == 3);
  CHECK(e->signal == 0);
  CHECK(!e->clean());
  CHECK(e->describe() == "exited with status 3");
  auto log = f.log_of("a#1");
  CHECK(log.find("got s3cr3t") != std::string::npos);
  CHECK(log.find("oops") != std::string::npos);
  CHECK(log.find("[troupe] process " + std::to_string(pid) + " of replica a#1 exited with status 3") !=
        std::string::npos);
  // Reaped: the pid is gone, not a zombie of ours.
  CHECK(proc::slurp("/proc/" + std::to_string(pid) + "/stat").empty());

  f.sh("b#1", "kill -SEGV $$");
  e = f.exits.wait("b#1");
  REQUIRE(e.has_value());
  CHECK(e->signal == SIGSEGV);
  CHECK(e->describe().rfind("killed by SIGSEGV", 0) == 0);

  f.sh("c#1", "exit 0");
  e = f.exits.wait("c#1");
  REQUIRE(e.has_value());
  CHECK(e->clean());
  CHECK(f.sup->running() == 0);
}

TEST_CASE("process supervisor: signal() reaches a running process - and nothing after its exit") {
  Fixture f;
  f.sh("s#1", "echo up; exec sleep 60");
  REQUIRE(proc::wait_until([&] { return f.log_of("s#1").find("up") != std::string::npos; }, 10s));
  CHECK(f.sup->running() == 1);
  CHECK(f.sup->signal("s#1", SIGKILL));
  auto e = f.exits.wait("s#1");
  REQUIRE(e.has_value());
  CHECK(e->signal == SIGKILL);
  CHECK(!f.sup->signal("s#1", SIGKILL));
  CHECK(!f.sup->signal("nobody", SIGKILL));
}

TEST_CASE("process supervisor: a memory limit is in force before the process reads its stdin") {
  Fixture f;
  // The shell reports its own address-space limit once it has read stdin.
  f.sh("m#1", "read x; ulimit -v", "go\n", 256ull << 20);
  auto e = f.exits.wait("m#1");
  REQUIRE(e.has_value());
  CHECK(e->exit_code == 0);
  CHECK(f.log_of("m#1").find(std::to_string((256ull << 20) / 1024)) != std::string::npos);
  CHECK(f.sup->memory_enforcement() == "RLIMIT_AS");

  // troupe-replica's exit status for a failed allocation reads as the limit.
  f.sh("m#2", "exit " + std::to_string(kExitMemoryLimit), "", 256ull << 20);
  e = f.exits.wait("m#2");
  REQUIRE(e.has_value());
  CHECK(e->memory_limit_exceeded);
  CHECK(e->describe() == "exceeded its memory limit of 256 MiB (exited with status 86)");
  // Without a limit that status is just a status.
  f.sh("m#3", "exit " + std::to_string(kExitMemoryLimit));
  e = f.exits.wait("m#3");
  REQUIRE(e.has_value());
  CHECK(!e->memory_limit_exceeded);
}

TEST_CASE("process supervisor: output is rotated at its size limit - and kept after the exit") {
  Fixture f(4096);
  // 200 lines of 50 bytes: 10,000 bytes through a 4 KiB limit.
  f.sh("r#1", "i=0; while [ $i -lt 200 ]; do echo "
              "\"line-$i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"; i=$((i+1)); done");
  REQUIRE(f.exits.wait("r#1").has_value());
  auto current = f.log_of("r#1");
  auto older = proc::slurp(f.dir / "replicas/r#1.log.1");
  CHECK(!older.empty());
  CHECK(current.size() <= 4096);
  CHECK(older.size() == 4096);
  // The newest output and the exit line are in the current file.
  CHECK(current.find("line-199-") != std::string::npos);
  CHECK(current.find("exited with status 0") != std::string::npos);
}

TEST_CASE("process supervisor: a grandchild holding the output pipe does not hold the exit report") {
  Fixture f;
  f.sh("g#1", "sleep 3 & echo started; exit 5");
  auto e = f.exits.wait("g#1", 5s);
  REQUIRE(e.has_value());
  CHECK(e->exit_code == 5);
  // A second process of another id still works (the loop is healthy).
  f.sh("g#2", "exit 0");
  CHECK(f.exits.wait("g#2").has_value());
}

TEST_CASE("process supervisor: shutdown kills and reaps what still runs - and spawns no more") {
  Fixture f;
  pid_t pid = f.sh("z#1", "exec sleep 60");
  f.sup->shutdown();
  CHECK(is_zombie_or_gone(pid));
  CHECK(proc::slurp("/proc/" + std::to_string(pid) + "/stat").empty());
  CHECK(f.exits.size() == 0);  // no report for processes ended by the shutdown
  ProcessSpec spec;
  spec.id = "late#1";
  spec.executable = "/bin/true";
  auto late = f.sup->spawn(spec);
  REQUIRE(!late.has_value());
  CHECK(late.status().message() == "the node is shutting down");
}

TEST_CASE("process supervisor: a missing executable is an error naming it") {
  Fixture f;
  ProcessSpec spec;
  spec.id = "x#1";
  spec.executable = "/nonexistent/troupe-replica";
  auto r = f.sup->spawn(spec);
  REQUIRE(!r.has_value());
  CHECK(r.status().message().find("/nonexistent/troupe-replica") != std::string::npos);
  CHECK(f.sup->running() == 0);
}

TEST_CASE("process supervisor: signal names and byte sizes as status messages print them") {
  CHECK(signal_name(SIGSEGV) == "SIGSEGV");
  CHECK(signal_name(SIGKILL) == "SIGKILL");
  CHECK(format_bytes(512ull << 20) == "512 MiB");
  CHECK(format_bytes(1536ull << 20) == "1.5 GiB");
  CHECK(format_bytes(100) == "100 bytes");
}

TEST_CASE("process supervisor: a process that rings its doorbell is offered a connection once per interval - the doorbell closes when it is reaped") {
  proc::TempDir dir{"troupe-supervisor-test"};
  Exits exits;
  std::mutex mutex;
  std::vector<std::string> offers;
  SupervisorOptions o;
  o.log_dir = dir / "replicas";
  o.use_cgroups = false;
  // One offer in this test, however the rings are read; longer than the
  // machine has been up, so that the first ring's offer cannot depend on
  // the time since boot (the steady clock's zero).
  o.doorbell_interval_s = 1e9;
  o.on_exit = [&](const std::string& id, const ProcessExit& e) { exits.add(id, e); };
  o.on_doorbell = [&](const std::string& id, int doorbell) {
    std::lock_guard<std::mutex> lock(mutex);
    offers.push_back(id);
    // The descriptor is the node's end, open: a ring can be answered.
    CHECK(gate_link::pass_fd(doorbell, 0).is_ok());
  };
  auto started = ProcessSupervisor::start(std::move(o));
  REQUIRE(started.has_value());
  auto sup = std::move(started.value());

  auto bell = gate_link::make_doorbell();
  REQUIRE(bell.has_value());
  REQUIRE(gate_link::ring(bell->process.get()).is_ok());  // rung before it starts
  ProcessSpec spec;
  spec.id = "r1";
  spec.executable = "/bin/sh";
  // It waits for the offer (one byte; the descriptor that came with it is
  // dropped), then rings twice more, within the interval.
  spec.args = {"-c", "printf r >&3; head -c 1 <&3 >/dev/null; printf r >&3; printf r >&3"};
  spec.fds = {bell->process.get()};
  spec.doorbell = bell->node.release();
  REQUIRE(sup->spawn(spec).has_value());
  auto exit = exits.wait("r1");
  REQUIRE(exit.has_value());
  CHECK(exit->exit_code == 0);
  // on_doorbell runs on the thread that reports the exit, before it.
  {
    std::lock_guard<std::mutex> lock(mutex);
    CHECK(offers == std::vector<std::string>{"r1"});
  }
  // The node's end was closed when the process was reaped.
  auto after = gate_link::take_fd(bell->process.get(), 1s);
  REQUIRE_FALSE(after.has_value());
  CHECK(after.status().code() == errc::unavailable);
}
