// ctx.log() of user code (replica/user_log.hpp) and the request id on every
// line a thread logs while it handles a request (runtime/log.hpp, set by
// RequestIdScope): in the text and the JSON form of the log.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <troupe/deployment.hpp>

#include "replica/handle_transport.hpp"
#include "replica/user_log.hpp"
#include "runtime/log.hpp"
#include "tests/support/temp_dir.hpp"

using namespace troupe;
namespace fs = std::filesystem;

namespace {

// Logs through ctx.log() and the runtime's own logger, in and out of a
// request, into a log file of `format`; returns its lines.
std::vector<std::string> log_lines(const std::string& format) {
  testing::TempDir dir("troupe-user-log");
  auto file = dir / ("log-" + format + ".log");
  log::Options options;
  options.file = file;
  options.format = format;
  options.process = "n1";
  REQUIRE(log::init(options).is_ok());
  ReplicaContext ctx{"shop", "Cart", "shop#Cart#1", "n1", "v1", nullptr};
  ctx.logger = replica::make_user_log(ctx.replica_id);
  {
    const std::string id = "req-42";  // the scope keeps a pointer to it
    replica::RequestIdScope scope(id);
    ctx.log(LogLevel::info, "hello from the handler");
    log::get("replica")->warn("a runtime line while the request runs");
  }
  ctx.log(LogLevel::error, "outside any request");
  log::shutdown();
  std::ifstream in(file);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

}  // namespace

TEST_CASE("user log: ctx.log lines name the replica and carry the request id - so do runtime lines written meanwhile") {
  auto lines = log_lines("text");
  REQUIRE(lines.size() == 3);
  CHECK(lines[0].find("info  [n1] user: [request req-42] shop#Cart#1: hello from the handler") !=
        std::string::npos);
  CHECK(lines[1].find("replica: [request req-42] a runtime line while the request runs") !=
        std::string::npos);
  CHECK(lines[2].find("user: shop#Cart#1: outside any request") != std::string::npos);
  CHECK(lines[2].find("[request") == std::string::npos);
}

TEST_CASE("user log: in JSON every line parses and the request id is a field") {
  auto lines = log_lines("json");
  REQUIRE(lines.size() == 3);
  auto first = nlohmann::json::parse(lines[0]);
  CHECK(first["component"] == "user");
  CHECK(first["level"] == "info");
  CHECK(first["request_id"] == "req-42");
  CHECK(first["msg"] == "shop#Cart#1: hello from the handler");
  CHECK(nlohmann::json::parse(lines[1])["request_id"] == "req-42");
  auto last = nlohmann::json::parse(lines[2]);
  CHECK(last["level"] == "error");
  CHECK_FALSE(last.contains("request_id"));
}

TEST_CASE("user log: an in-process replica's lines also go to its own file - in the node's format - a bad path falls back to the node's log") {
  testing::TempDir dir("troupe-user-log-own");
  auto node_file = dir / "node.log";
  const std::string own_file = dir / "replicas/shop#Cart#2.log";
  log::Options options;
  options.file = node_file;
  options.format = "json";
  options.process = "n1";
  REQUIRE(log::init(options).is_ok());
  ReplicaContext ctx{"shop", "Cart", "shop#Cart#2", "n1", "v1", nullptr};
  ctx.logger = replica::make_user_log(ctx.replica_id, own_file);
  {
    const std::string id = "req-7";
    replica::RequestIdScope scope(id);
    ctx.log(LogLevel::info, "only mine");
  }
  log::get("replica")->info("a line of the node");
  // A directory where the file should be: it cannot be opened.
  fs::create_directories(dir / "taken.log");
  ReplicaContext other{"shop", "Cart", "shop#Cart#3", "n1", "v1", nullptr};
  other.logger = replica::make_user_log(other.replica_id, dir / "taken.log");
  other.log(LogLevel::warn, "still logged");
  log::shutdown();

  auto read = [](const fs::path& p) {
    std::ifstream in(p);
    std::vector<nlohmann::json> out;
    for (std::string line; std::getline(in, line);)
      out.push_back(nlohmann::json::parse(line));
    return out;
  };
  auto own = read(own_file);
  REQUIRE(own.size() == 1);
  CHECK(own[0]["msg"] == "shop#Cart#2: only mine");
  CHECK(own[0]["component"] == "user");
  CHECK(own[0]["node"] == "n1");
  CHECK(own[0]["request_id"] == "req-7");
  std::string node_text;
  for (const auto& line : read(node_file))
    node_text += line["msg"].get<std::string>() + "\n";
  CHECK(node_text.find("shop#Cart#2: only mine") != std::string::npos);
  CHECK(node_text.find("a line of the node") != std::string::npos);
  CHECK(node_text.find("shop#Cart#3: its lines go to the node's log only: cannot open log file") !=
        std::string::npos);
  CHECK(node_text.find("shop#Cart#3: still logged") != std::string::npos);
}
