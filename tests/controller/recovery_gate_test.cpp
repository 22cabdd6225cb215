// Recovery after a controller restart as plain code: when it ends, what it
// collects, what it refuses meanwhile; and the file of live nodes it reads.
#include "controller/shell/recovery_gate.hpp"

#include <filesystem>
#include <fstream>
#include <string>

#include <doctest/doctest.h>

#include "tests/controller/fakes.hpp"
#include "tests/support/temp_dir.hpp"

using namespace troupe;
using namespace troupe::controller;
using troupe::controller::testing::FakeClock;

namespace {

std::map<std::string, NodeRecord> nodes(std::map<std::string, NodeState> states) {
  std::map<std::string, NodeRecord> out;
  for (const auto& [id, s] : states) {
    NodeRecord r;
    r.id = id;
    r.state = s;
    out[id] = r;
  }
  return out;
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("recovery: once finished every call is admitted") {
  // Also how the controller starts on an empty checkpoint: finished at once.
  FakeClock clock;
  RecoveryGate gate(clock, 3.0, {"a"});
  CHECK(gate.finish().empty());
  CHECK_FALSE(gate.is_recovering());
  CHECK(gate.require_ready().is_ok());
  CHECK_FALSE(gate.window_over());
  CHECK_FALSE(gate.all_expected_back(nodes({{"a", NodeState::alive}})));
}

TEST_CASE("recovery: user calls are refused while recovering") {
  FakeClock clock;
  RecoveryGate gate(clock, 3.0, {"a"});
  CHECK(gate.is_recovering());
  auto s = gate.require_ready();
  CHECK(s.code() == errc::unavailable);
  CHECK(s.message() ==
        "the controller is recovering its state after a restart; retry in a few seconds");
  gate.finish();
  CHECK(gate.require_ready().is_ok());
}

TEST_CASE("recovery: the window ends it when a node does not come back") {
  FakeClock clock;
  clock.set(100);
  RecoveryGate gate(clock, 3.0, {"a", "b"});
  CHECK(gate.deadline() == doctest::Approx(103));
  auto known = nodes({{"a", NodeState::alive}});
  CHECK_FALSE(gate.all_expected_back(known));
  clock.set(102.9);
  CHECK_FALSE(gate.window_over());
  clock.set(103);
  CHECK(gate.window_over());
  gate.finish();
  CHECK_FALSE(gate.window_over());  // over and done
}

TEST_CASE("recovery: nodes still arriving keep the window open - up to ten windows") {
  FakeClock clock;
  clock.set(100);
  RecoveryGate gate(clock, 3.0, {"a", "b", "c"});
  // One node every 2.5 s: each arrival gives the others a window from then.
  for (double t = 102.5; t < 130; t += 2.5) {
    clock.set(t - 0.01);
    INFO("t " << t);
    CHECK_FALSE(gate.window_over());
    clock.set(t);
    gate.arrived();
    CHECK(gate.deadline() == doctest::Approx(std::min(t + 3, 130.0)));
  }
  // The cap: ten windows after the start, however many still arrive.
  clock.set(129.99);
  CHECK_FALSE(gate.window_over());
  clock.set(130);
  gate.arrived();
  CHECK(gate.window_over());
  CHECK(gate.deadline() == doctest::Approx(130));
  gate.finish();
  gate.arrived();  // over: nothing changes
  CHECK_FALSE(gate.window_over());
}

TEST_CASE("recovery: a silence of one window after the last arrival ends it") {
  FakeClock clock;
  RecoveryGate gate(clock, 3.0, {"a", "b"});
  clock.set(0.5);
  gate.arrived();
  CHECK(gate.deadline() == doctest::Approx(3.5));
  clock.set(3.49);
  CHECK_FALSE(gate.window_over());
  clock.set(3.5);
  CHECK(gate.window_over());  // "b" stayed away a whole window after "a"
}

TEST_CASE("recovery: ends early once every expected node registered again") {
  FakeClock clock;
  RecoveryGate gate(clock, 3.0, {"a", "b"});
  CHECK_FALSE(gate.all_expected_back(nodes({})));
  CHECK_FALSE(gate.all_expected_back(nodes({{"a", NodeState::alive}})));
  // A node known but DEAD has not come back.
  CHECK_FALSE(gate.all_expected_back(nodes({{"a", NodeState::alive}, {"b", NodeState::dead}})));
  // DRAINING counts: it registered. A node not expected changes nothing.
  CHECK(gate.all_expected_back(
      nodes({{"a", NodeState::alive}, {"b", NodeState::draining}, {"c", NodeState::alive}})));
  CHECK_FALSE(gate.window_over());
  gate.finish();
  CHECK(gate.expected_nodes().empty());
  CHECK_FALSE(gate.all_expected_back(nodes({{"a", NodeState::alive}, {"b", NodeState::alive}})));
}

TEST_CASE("recovery: without known nodes it never ends early") {
  FakeClock clock;
  RecoveryGate gate(clock, 3.0, {});
  CHECK_FALSE(gate.all_expected_back(nodes({{"a", NodeState::alive}})));
  clock.advance(3);
  CHECK(gate.window_over());
}

TEST_CASE("recovery: the replicas nodes report are handed over once") {
  FakeClock clock;
  RecoveryGate gate(clock, 3.0, {"a"});
  gate.collect({{"r1", "app", "D", "a", false}});
  gate.collect({{"r2", "app", "D", "b", true}, {"r3", "app", "E", "b", false}});
  CHECK(gate.collected().size() == 3);
  auto hosted = gate.finish();
  REQUIRE(hosted.size() == 3);
  CHECK(hosted[0].replica_id == "r1");
  CHECK(hosted[1].stopping);
  CHECK(hosted[2].node_id == "b");
  CHECK(gate.collected().empty());
  CHECK(gate.finish().empty());
}

TEST_CASE("nodes file: the live nodes - written only when they change") {
  troupe::testing::TempDir tmp;
  const std::string dir = tmp.path();
  NodesFile file(dir);
  CHECK(file.path() == dir + "/nodes");
  CHECK(file.load().empty());  // none yet
  auto view = nodes({{"a", NodeState::alive}, {"b", NodeState::dead}, {"c", NodeState::draining}});
  CHECK(NodesFile::render(view) == "a\nc\n");
  REQUIRE(file.save(view));
  CHECK(read(dir + "/nodes") == "a\nc\n");
  CHECK(file.load() == std::set<std::string>{"a", "c"});
  // Unchanged: not rewritten (an edit by hand survives).
  { std::ofstream(dir + "/nodes") << "x\n"; }
  REQUIRE(file.save(view));
  CHECK(read(dir + "/nodes") == "x\n");
  REQUIRE(file.save(nodes({{"a", NodeState::alive}})));
  CHECK(read(dir + "/nodes") == "a\n");
  // A restarted controller reads what its predecessor wrote; blank lines are
  // no nodes.
  { std::ofstream(dir + "/nodes") << "a\n\nb\n"; }
  CHECK(NodesFile(dir).load() == std::set<std::string>{"a", "b"});
}

TEST_CASE("nodes file: without a state directory there is none") {
  NodesFile file("");
  CHECK(file.path().empty());
  CHECK(file.load().empty());
  CHECK(file.save(nodes({{"a", NodeState::alive}})));
}

TEST_CASE("nodes file: kept elsewhere (a head candidate's in etcd) - read and written through its functions") {
  std::string stored = "a\n\nb\n";
  bool fail = false;
  int writes = 0;
  NodesFile list(
      "etcd key /troupe/nodes", [&] { return stored; },
      [&](const std::string& content) {
        ++writes;
        if (fail)
          return false;
        stored = content;
        return true;
      });
  CHECK(list.path() == "etcd key /troupe/nodes");
  CHECK(list.load() == std::set<std::string>{"a", "b"});
  auto view = nodes({{"a", NodeState::alive}, {"c", NodeState::alive}});
  REQUIRE(list.save(view));
  CHECK(stored == "a\nc\n");
  REQUIRE(list.save(view));  // unchanged: not written again
  CHECK(writes == 1);
  fail = true;
  CHECK_FALSE(list.save(nodes({{"a", NodeState::alive}})));
  CHECK(stored == "a\nc\n");
  // Not taken as written: the next save tries again.
  fail = false;
  REQUIRE(list.save(nodes({{"a", NodeState::alive}})));
  CHECK(stored == "a\n");
  CHECK(writes == 3);
}

TEST_CASE("nodes file: after a failed write the next save writes even what it wrote last") {
  // etcd may commit a write it did not confirm once it has a quorum again:
  // after a failure the list holds either content.
  std::string stored;
  bool fail = false;
  int writes = 0;
  NodesFile list(
      "etcd key /troupe/nodes", [&] { return stored; },
      [&](const std::string& content) {
        ++writes;
        if (fail) {
          stored = content;  // taken, but not confirmed
          return false;
        }
        stored = content;
        return true;
      });
  REQUIRE(list.save(nodes({{"a", NodeState::alive}})));
  fail = true;
  CHECK_FALSE(list.save(nodes({{"a", NodeState::alive}, {"b", NodeState::alive}})));
  CHECK(stored == "a\nb\n");
  fail = false;
  REQUIRE(list.save(nodes({{"a", NodeState::alive}})));
  CHECK(stored == "a\n");
  CHECK(writes == 3);
}

TEST_CASE("nodes file: a rename that fails is a failed write") {
  troupe::testing::TempDir tmp;
  const std::string dir = tmp.path();
  std::filesystem::create_directory(dir + "/nodes");  // the rename onto it fails
  NodesFile file(dir);
  CHECK_FALSE(file.save(nodes({{"a", NodeState::alive}})));
  std::filesystem::remove(dir + "/nodes");
  REQUIRE(file.save(nodes({{"a", NodeState::alive}})));
  CHECK(read(dir + "/nodes") == "a\n");
}

TEST_CASE("nodes file: a failed write reports it") {
  NodesFile file("/nonexistent/troupe-state");
  CHECK_FALSE(file.save(nodes({{"a", NodeState::alive}})));
}
