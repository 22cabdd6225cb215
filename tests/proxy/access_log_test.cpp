// The access log's batches (proxy/access_log.hpp): the lines an io thread
// adds are written in one piece, in order, with the time each was added, and
// none is lost when a batch fills or is flushed.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "proxy/access_log.hpp"
#include "runtime/log.hpp"

using namespace troupe;
using namespace troupe::proxy;
using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::system_clock;

namespace {

struct LogDir {
  std::filesystem::path dir;
  LogDir() {
    dir = std::filesystem::temp_directory_path() /
          ("troupe-access-log-test-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~LogDir() { std::filesystem::remove_all(dir); }
  std::string file() const { return (dir / "access.log").string(); }
  std::vector<std::string> lines() const {
    std::vector<std::string> out;
    std::ifstream in(file());
    for (std::string line; std::getline(in, line);)
      out.push_back(line);
    return out;
  }
};

AccessEntry entry(const std::string& id) {
  AccessEntry e;
  e.request_id = id;
  e.method = "GET";
  e.path = "/echo/x";
  e.status = 200;
  e.seconds = 0.0015;
  e.app = "echo";
  e.deployment = "Echo";
  e.replica = "echo#Echo#1";
  return e;
}

// 2027-01-15 08:00:00.123 UTC
const system_clock::time_point kT0 = system_clock::time_point(seconds(1800000000)) + milliseconds(123);

}  // namespace

TEST_CASE("access log: a batch's lines reach the file at its flush - in order - each with the time it was added") {
  LogDir d;
  auto log = AccessLog::open(AccessLogMode::on, d.file(), "n1", false);
  REQUIRE(log);
  AccessBatch batch;
  // The same second twice, the next second, and an hour later: the batch
  // formats a second's date once and must notice each change.
  const std::vector<system_clock::time_point> times = {
      kT0, kT0 + milliseconds(1), kT0 + milliseconds(1005), kT0 + seconds(3600) + milliseconds(876)};
  const std::vector<std::string> ids = {"a-1", "a-2", "a-3", "a-4"};
  for (size_t i = 0; i < times.size(); ++i)
    log.value()->add(entry(ids[i]), batch, times[i]);
  CHECK(batch.lines() == 4);
  CHECK(d.lines().empty());

  log.value()->flush(batch);
  CHECK(batch.lines() == 0);
  auto lines = d.lines();
  REQUIRE(lines.size() == 4);
  for (size_t i = 0; i < times.size(); ++i) {
    CHECK(lines[i] == log::utc_timestamp(times[i]) + " n1 " + ids[i] +
                          " GET /echo/x 200 1.500ms echo/Echo echo#Echo#1");
  }
  // The line format() makes for the same request, but for its time.
  auto formatted = log.value()->format(entry("a-1"));
  CHECK(formatted.substr(formatted.find(' ')) == lines[0].substr(lines[0].find(' ')));
  CHECK(lines[2].rfind("2027-01-15T08:00:01.128Z ", 0) == 0);
  CHECK(lines[3].rfind("2027-01-15T09:00:00.999Z ", 0) == 0);
}

TEST_CASE("access log: a full batch writes itself - no line lost or reordered across batches") {
  LogDir d;
  auto log = AccessLog::open(AccessLogMode::on, d.file(), "n1", false);
  REQUIRE(log);
  AccessBatch batch;
  const size_t n = 3 * AccessLog::kBatchBytes / 64;  // lines are over 64 bytes: 3+ batches
  size_t writes = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t before = batch.lines();
    log.value()->add(entry("b-" + std::to_string(i)), batch, kT0 + milliseconds(i));
    if (batch.lines() < before + 1)
      ++writes;
  }
  CHECK(writes >= 3);
  log.value()->flush(batch);
  auto lines = d.lines();
  REQUIRE(lines.size() == n);
  for (size_t i = 0; i < n; ++i) {
    const std::string want = " n1 b-" + std::to_string(i) + " GET ";
    CHECK_MESSAGE(lines[i].find(want) != std::string::npos, lines[i]);
  }
}

TEST_CASE("access log: JSON lines from a batch parse - with the time each was added") {
  LogDir d;
  auto log = AccessLog::open(AccessLogMode::on, d.file(), "n1", true);
  REQUIRE(log);
  AccessBatch batch;
  log.value()->add(entry("j-1"), batch, kT0);
  log.value()->add(entry("j-2"), batch, kT0 + seconds(2));
  log.value()->flush(batch);
  auto lines = d.lines();
  REQUIRE(lines.size() == 2);
  auto j1 = nlohmann::json::parse(lines[0]);
  auto j2 = nlohmann::json::parse(lines[1]);
  CHECK(j1["ts"] == "2027-01-15T08:00:00.123Z");
  CHECK(j2["ts"] == "2027-01-15T08:00:02.123Z");
  CHECK(j1["request_id"] == "j-1");
  CHECK(j1["status"] == 200);
  CHECK(j1["duration_ms"] == 1.5);
  CHECK(j1["application"] == "echo");
  CHECK(j1["replica"] == "echo#Echo#1");
}
