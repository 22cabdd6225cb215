// The access log's batches (proxy/access_log.hpp): the lines an io thread
// adds are written in one piece, in order, with the time each was added, and
// none is lost when a batch fills or is flushed.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <thread>

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

TEST_CASE("access log: the duration in milliseconds with three decimals and the status as a number") {
  LogDir d;
  auto log = AccessLog::open(AccessLogMode::on, d.file(), "n1", false);
  REQUIRE(log);
  auto e = entry("d-1");
  // seconds -> the line's duration (rounded to the microsecond).
  const std::vector<std::pair<double, std::string>> cases = {
      {0.0, " 0.000ms "},          {0.0000004, " 0.000ms "},   {0.0000016, " 0.002ms "},
      {0.000999, " 0.999ms "},     {0.0015, " 1.500ms "},      {0.02, " 20.000ms "},
      {12.3456789, " 12345.679ms "}, {3600.25, " 3600250.000ms "}, {-1.0, " 0.000ms "}};
  for (const auto& [seconds, text] : cases) {
    CAPTURE(seconds);
    e.seconds = seconds;
    auto line = log.value()->format(e);
    CHECK(line.find(" 200" + text + "echo/Echo ") != std::string::npos);
  }
  e.seconds = 0.0015;
  for (int status : {100, 404, 503, 599}) {
    e.status = status;
    CHECK(log.value()->format(e).find(" " + std::to_string(status) + " 1.500ms ") !=
          std::string::npos);
  }
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

TEST_CASE("access log: a writer stalled on its file never stalls the io thread - lines past the queue are dropped and counted - none lost unseen") {
  // The access log on a FIFO nobody reads for a while: the writer thread
  // blocks in write() once the pipe is full, as on a disk that stalls.
  LogDir d;
  const std::string fifo = (d.dir / "access.fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  REQUIRE(reader >= 0);
  auto log = AccessLog::open(AccessLogMode::on, fifo, "n1", false);
  REQUIRE(log);
  AccessBatch batch;
  // Well past the writer's queue: every add() returns (this thread is the
  // io thread), and what the queue cannot take is counted.
  const size_t line_bytes = log.value()->format(entry("s-000000")).size() + 1;
  const size_t total = 2 * AccessLog::kQueueBytes / line_bytes;
  for (size_t i = 0; i < total; ++i) {
    char id[16];
    std::snprintf(id, sizeof id, "s-%06zu", i);
    log.value()->add(entry(id), batch, kT0);
  }
  log.value()->pass_on(batch);
  const uint64_t dropped = log.value()->dropped_lines();
  CHECK(dropped > 0);
  CHECK(dropped < total);

  // Now the disk is back: read everything, then stop the log (its writer
  // writes what it holds, and ends).
  std::string text;
  std::thread drain([&] {
    ::fcntl(reader, F_SETFL, 0);  // blocking reads: until the writer closes
    char buf[1 << 16];
    for (ssize_t n; (n = ::read(reader, buf, sizeof buf)) != 0;) {
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0)
        break;
      text.append(buf, static_cast<size_t>(n));
    }
  });
  log = Result<std::shared_ptr<AccessLog>>(Status(errc::internal, "closed"));  // the last reference
  drain.join();
  ::close(reader);
  const auto written = static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
  CHECK(written + dropped == total);
  // Whole lines, in the order they were added, with a gap where batches
  // were dropped.
  size_t last = 0;
  bool ordered = true;
  size_t at = 0;
  for (size_t n = 0; n < written; ++n) {
    const size_t id_at = text.find(" n1 s-", at);
    const size_t end = text.find('\n', at);
    if (id_at == std::string::npos || id_at > end) {
      ordered = false;
      break;
    }
    const size_t id = std::stoul(text.substr(id_at + 6, 6));
    ordered = ordered && (n == 0 || id > last);
    last = id;
    at = end + 1;
  }
  CHECK(ordered);
}
