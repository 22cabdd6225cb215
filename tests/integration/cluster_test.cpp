// A real cluster of troupe-node processes on loopback, driven through
// troupectl exactly as an operator would.
#include <signal.h>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>

#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"

using namespace troupe::testing;
using nlohmann::json;

TEST_CASE("a head and two workers form a cluster - dead nodes are seen and come back") {
  Cluster c;
  c.start({"w1", "w2"});

  // The JSON rows carry the documented fields.
  auto r = c.ctl({"nodes", "--json"}, 30s);
  REQUIRE(r.exit_code == 0);
  auto rows = json::parse(r.out);
  REQUIRE(rows.size() == 3);
  for (const auto& row : rows) {
    CHECK(row.contains("address"));
    CHECK(row.at("resources").contains("cpu"));
    CHECK(row.at("last_heartbeat_age_s").get<double>() >= 0);
  }
  // Every node's proxy passes the controller's health checks.
  CHECK(wait_until(
      [&] {
        auto nodes = c.ctl({"nodes", "--json"}, 30s);
        if (nodes.exit_code != 0)
          return false;
        for (const auto& row : json::parse(nodes.out)) {
          if (row.at("proxy") != "HEALTHY")
            return false;
        }
        return true;
      },
      20s, 100ms));

  // kill -9 a worker: DEAD within node-timeout (2 s) + 2 s.
  c.nodes.at("w1").signal(SIGKILL);
  CHECK(c.wait_states({{"head", "ALIVE"}, {"w1", "DEAD"}, {"w2", "ALIVE"}}, 4s));

  // Restart it with the same node id: ALIVE again.
  c.start_worker("w1");
  CHECK(c.wait_states({{"head", "ALIVE"}, {"w1", "ALIVE"}, {"w2", "ALIVE"}}, 20s));

  // SIGTERM everything: each process exits 0 within 10 s.
  for (auto& [id, proc] : c.nodes)
    proc.signal(SIGTERM);
  for (auto& [id, proc] : c.nodes) {
    CAPTURE(id);
    auto code = proc.wait_exit(10s);
    REQUIRE(code.has_value());
    CHECK(*code == 0);
  }
}

TEST_CASE("a frozen worker is declared DEAD by heartbeat timeout and returns when resumed") {
  Cluster c;
  c.start({"w1"});
  c.nodes.at("w1").signal(SIGSTOP);
  CHECK(c.wait_states({{"head", "ALIVE"}, {"w1", "DEAD"}}, 4s));
  c.nodes.at("w1").signal(SIGCONT);
  CHECK(c.wait_states({{"head", "ALIVE"}, {"w1", "ALIVE"}}, 15s));
}

TEST_CASE("workers re-register on their own when the head restarts with the same state dir") {
  Cluster c;
  c.start({"w1", "w2"});
  c.nodes.at("head").signal(SIGKILL);
  REQUIRE(c.nodes.at("head").wait_exit(5s).has_value());
  CHECK(c.states().empty());  // nobody answers while the head is down
  c.start_head();
  CHECK(c.wait_states({{"head", "ALIVE"}, {"w1", "ALIVE"}, {"w2", "ALIVE"}}, 20s));
}

TEST_CASE("troupectl drain marks a node DRAINING - and it stays so across a reconnect") {
  Cluster c;
  c.start({"w1"});
  auto r = c.ctl({"drain", "w1"}, 30s);
  CHECK(r.exit_code == 0);
  CHECK(c.wait_states({{"head", "ALIVE"}, {"w1", "DRAINING"}}, 5s));
  auto unknown = c.ctl({"drain", "nope"}, 30s);
  CHECK(unknown.exit_code == 1);
  CHECK(unknown.err.find("no node named 'nope'") != std::string::npos);
  c.nodes.at("w1").signal(SIGKILL);
  REQUIRE(c.wait_states({{"head", "ALIVE"}, {"w1", "DEAD"}}, 4s));
  c.start_worker("w1");
  CHECK(c.wait_states({{"head", "ALIVE"}, {"w1", "DRAINING"}}, 20s));
}

TEST_CASE("troupectl names the address it cannot reach and exits non-zero within its timeout") {
  auto port = std::to_string(free_port());
  auto started = std::chrono::steady_clock::now();
  auto r = run({bin("troupectl"), "--address", "127.0.0.1:" + port, "--timeout", "3", "nodes"});
  auto took = std::chrono::steady_clock::now() - started;
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("cannot reach the controller at 127.0.0.1:" + port) != std::string::npos);
  CHECK(took < 10s);  // bounded by --timeout, with room for a loaded machine

  auto env = run({"/usr/bin/env", "TROUPE_ADDRESS=127.0.0.1:" + port, bin("troupectl"), "--timeout",
                  "3", "nodes"});
  CHECK(env.exit_code == 1);
  CHECK(env.err.find("127.0.0.1:" + port) != std::string::npos);
}

TEST_CASE("a joining node that cannot reach the head keeps retrying and says where") {
  TempDir dir;
  auto port = std::to_string(free_port());
  auto http_port = free_port();
  ChildProcess w({bin("troupe-node"), "--join", "127.0.0.1:" + port, "--node-id", "lonely",
                  "--http-port", std::to_string(http_port), "--admin-port", "0"},
                 dir / "w.log");
  CHECK(wait_until(
      [&] {
        return w.output().find("cannot reach the controller at 127.0.0.1:" + port) !=
               std::string::npos;
      },
      10s));
  CHECK(w.running());
  // Its proxy has no route table yet: "retry shortly" (503), not "no such
  // application" (404).
  std::optional<HttpReply> reply;
  CHECK(wait_until([&] { return (reply = http_get(http_port, "/anything", 5)).has_value(); }, 10s));
  REQUIRE(reply.has_value());
  CHECK(reply->status == 503);
  CHECK(reply->head.find("Retry-After: 1") != std::string::npos);
  CHECK(reply->body.find("no route table yet") != std::string::npos);
  w.signal(SIGTERM);
  auto code = w.wait_exit(10s);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
}

TEST_CASE("bad command lines are refused with one line naming the problem and exit code 2") {
  TempDir dir;
  auto file = dir / "file";
  { std::ofstream(file) << "x"; }
  struct Case {
    std::vector<std::string> args;
    std::string fragment;
  };
  std::vector<Case> cases = {
      {{"--head", "--state-dir", dir / "s", "--bogus"}, "--bogus"},
      {{"--state-dir", dir / "s"}, "give either --head or --join"},
      {{"--join", "localhost"}, "address 'localhost' is not HOST:PORT"},
      {{"--join", "localhost:99999"}, "port 99999 is outside 1-65535"},
      {{"--head", "--state-dir", dir / "s", "--resources", "cpu=four"}, "resource 'cpu'"},
      {{"--head", "--state-dir", dir / "s", "--node-id", "bad id"}, "node id 'bad id'"},
      {{"--head"}, "--head needs --state-dir"},
      {{"--head", "--state-dir", file + "/sub"}, "state dir '" + file + "/sub'"},
      {{"--head", "--state-dir", dir / "s", "--node-timeout", "0"}, "--node-timeout"},
      {{"--head", "--join", "127.0.0.1:1"}, "excludes"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> argv = {bin("troupe-node")};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    auto r = run(argv, 10s);
    CAPTURE(c.fragment);
    CAPTURE(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(c.fragment) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }

  for (auto args : std::vector<std::vector<std::string>>{
           {"--address", "nohost", "nodes"}, {"nodes", "--bogus"}, {"frobnicate"}, {}}) {
    std::vector<std::string> argv = {bin("troupectl")};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = run(argv, 10s);
    CAPTURE(r.err);
    CHECK(r.exit_code == 2);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
}

TEST_CASE("a head refuses a port that is in use - and starts nothing") {
  Cluster c;
  c.start();
  TempDir other;
  auto r = run({bin("troupe-node"), "--head", "--port", std::to_string(c.port), "--state-dir",
                other / "s", "--http-port", std::to_string(free_port()), "--admin-port", "0"},
               10s);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("cannot listen on 127.0.0.1:" + std::to_string(c.port)) != std::string::npos);
  // The running head is untouched.
  CHECK(c.states() == std::map<std::string, std::string>{{"head", "ALIVE"}});
}

TEST_CASE("a node on a non-loopback address without TLS needs --insecure - and then warns") {
  TempDir dir;
  auto refused =
      run({bin("troupe-node"), "--head", "--state-dir", dir / "a", "--bind", "0.0.0.0", "--port",
           std::to_string(free_port()), "--http-port", std::to_string(free_port()), "--admin-port",
           "0"},
          10s);
  CHECK(refused.exit_code == 2);
  CHECK(refused.err.find("is not a loopback address") != std::string::npos);
  // Allowed with --insecure, with a warning at start. (0.0.0.0 is still only
  // reached over loopback by this test.)
  ChildProcess node(
      {bin("troupe-node"), "--head", "--state-dir", dir / "b", "--bind", "0.0.0.0", "--insecure",
       "--port", std::to_string(free_port()), "--http-port", std::to_string(free_port()),
       "--admin-port", "0"},
      dir / "b.log");
  CHECK(wait_until(
      [&] { return node.output().find("INSECURE: listening on 0.0.0.0") != std::string::npos; },
      10s));
  node.signal(SIGTERM);
  CHECK(node.wait_exit(10s) == std::optional<int>(0));
}

TEST_CASE("the exit check reports a node that crashed - with its signal - log - and backtrace") {
  Cluster c;
  c.start({"w1"});
  // A crash the test did not ask the helpers for: as if the node had one.
  pid_t pid = c.nodes.at("w1").pid();
  REQUIRE(::kill(pid, SIGSEGV) == 0);
  REQUIRE(wait_until([&] { return !c.nodes.at("w1").running(); }, 20s));
  auto problems = c.stop_all();
  // The head stopped cleanly; the worker is reported.
  REQUIRE(problems.size() == 1);
  const auto& report = problems.front();
  CHECK(report.find("node w1 (pid " + std::to_string(pid) + ") killed by SIGSEGV") !=
        std::string::npos);
  CHECK(report.find("during the test") != std::string::npos);
  CHECK(report.find("last lines of its output") != std::string::npos);
  CHECK(report.find("node w1 started") != std::string::npos);  // a line of its log
  // With the usual core_pattern the node dumped core in its state dir, and
  // the report carries gdb's backtrace of its threads.
  std::ifstream pattern_file("/proc/sys/kernel/core_pattern");
  std::string pattern;
  std::getline(pattern_file, pattern);
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer turns core dumps off in the processes it runs (their
  // shadow memory would make terabyte cores).
  pattern = "(none under AddressSanitizer)";
#endif
  if (pattern == "core") {
    CHECK(report.find("(core dumped)") != std::string::npos);
    CHECK(report.find("--- backtrace ---") != std::string::npos);
    CHECK(report.find("Thread 1") != std::string::npos);
  } else {
    MESSAGE("core_pattern is '" << pattern << "': no core file in the state dir to check");
  }
  CHECK(c.nodes.empty());
}
