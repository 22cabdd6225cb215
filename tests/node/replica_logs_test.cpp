// Reading a replica's log for `troupectl logs` (node/replica_logs.hpp): the
// last lines, what was appended since an offset in whole lines, a filter,
// a rotated file and a missing one.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "node/replica_logs.hpp"
#include "tests/support/temp_dir.hpp"

using namespace troupe;
namespace fs = std::filesystem;

namespace {

// A log file in a directory of its own, removed with it.
struct TempLog {
  testing::TempDir dir{"troupe-replica-logs"};
  fs::path path = dir / "replica.log";
  void append(const std::string& text) const {
    std::ofstream(path, std::ios::app | std::ios::binary) << text;
  }
};

}  // namespace

TEST_CASE("replica logs: the last lines - then what is appended - in whole lines") {
  TempLog log;
  log.append("one\ntwo\nthree\nfour\n");
  auto last = node::read_log(log.path, "", node::kLogTail, 2);
  REQUIRE(last);
  CHECK(last->text == "three\nfour\n");
  CHECK(last->next_offset == 19);
  // A line without its newline yet waits for the next read.
  log.append("five\nsi");
  auto more = node::read_log(log.path, "", last->next_offset, 0);
  REQUIRE(more);
  CHECK(more->text == "five\n");
  log.append("x\n");
  auto rest = node::read_log(log.path, "", more->next_offset, 0);
  REQUIRE(rest);
  CHECK(rest->text == "six\n");
  auto nothing = node::read_log(log.path, "", rest->next_offset, 0);
  REQUIRE(nothing);
  CHECK(nothing->text.empty());
  CHECK(nothing->next_offset == rest->next_offset);
  // tail 0: nothing printed, only where to follow from.
  auto none = node::read_log(log.path, "", node::kLogTail, 0);
  REQUIRE(none);
  CHECK(none->text.empty());
  CHECK(none->next_offset == rest->next_offset);
}

TEST_CASE("replica logs: a filter keeps the lines of one replica - a window drops a partial first line") {
  TempLog log;
  log.append("a#1: x\nb#2: y\na#1: z\nb#2: w\n");
  auto a = node::read_log(log.path, "a#1", node::kLogTail, 10);
  REQUIRE(a);
  CHECK(a->text == "a#1: x\na#1: z\n");
  auto from = node::read_log(log.path, "b#2", 7, 0);
  REQUIRE(from);
  CHECK(from->text == "b#2: y\nb#2: w\n");
  // The last 10 bytes start inside "a#1: z": that line is left out.
  auto window = node::read_log(log.path, "", node::kLogTail, 10, 1 << 20, 10);
  REQUIRE(window);
  CHECK(window->text == "b#2: w\n");
}

TEST_CASE("replica logs: a rotated file is read from its start - a missing one is not_found") {
  TempLog log;
  log.append("old line that was long\n");
  auto end = node::read_log(log.path, "", node::kLogTail, 1);
  REQUIRE(end);
  fs::remove(log.path);
  auto missing = node::read_log(log.path, "", end->next_offset, 0);
  REQUIRE_FALSE(missing);
  CHECK(missing.status().code() == errc::not_found);
  log.append("new\n");
  auto after = node::read_log(log.path, "", end->next_offset, 0);
  REQUIRE(after);
  CHECK(after->text == "new\n");
  CHECK(after->next_offset == 4);
}
