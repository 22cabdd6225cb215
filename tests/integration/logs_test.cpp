// Logs on a real node: the proxy's access log (troupe-node --access-log),
// its lines in JSON with --log-format json, and the node's own log lines in
// JSON. Each line must parse; the access log has one line per request
// answered (on), only those of status 400 and above (errors), or no file at
// all (off).
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"

using namespace troupe::testing;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

const char* kConfig = R"(applications:
  - name: probe
    route_prefix: /probe
    import_path: libtroupe_examples.so:InlineProbe
    deployments:
      - name: InlineProbe
        num_replicas: 1
)";

std::vector<std::string> lines_of(const std::filesystem::path& file) {
  std::vector<std::string> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty())
      out.push_back(line);
  }
  return out;
}

struct LogNode {
  Cluster cluster;
  uint16_t port = 0;
  std::filesystem::path logs;

  explicit LogNode(const std::vector<std::string>& args) {
    cluster.start({}, args);
    port = cluster.http_ports.at("head");
    logs = std::filesystem::path(cluster.dir / "head") / "logs";
    cluster.deploy_yaml("logs.yaml", kConfig);
    REQUIRE(cluster.wait_answers("head", "/probe/"));
  }

  // GET `target` with X-Request-Id `id`; the status.
  int get(const std::string& target, const std::string& id) {
    auto r = http_request(port, "GET", target, "", 10, {{"X-Request-Id", id}});
    REQUIRE(r);
    return r->status;
  }

  // The access log's lines that carry one of `ids`, by id, once all are
  // there (the proxy writes the file at least once a second).
  std::map<std::string, std::string> access_lines(const std::vector<std::string>& ids) {
    std::map<std::string, std::string> found;
    wait_until(
        [&] {
          found.clear();
          for (const auto& line : lines_of(logs / "access.log")) {
            for (const auto& id : ids) {
              if (line.find(id) != std::string::npos)
                found[id] = line;
            }
          }
          return found.size() == ids.size();
        },
        10s, 50ms);
    return found;
  }
};

}  // namespace

TEST_CASE("logs: --log-format json - every line of the node's log and access log parses - one access line per request with its fields") {
  LogNode node({"--log-format", "json", "--access-log", "on"});
  CHECK(node.get("/probe/items?secret=1", "acc-ok-1") == 200);
  CHECK(node.get("/probe/?mode=throw", "acc-err-1") == 500);
  CHECK(node.get("/nothing/here", "acc-404-1") == 404);

  auto found = node.access_lines({"acc-ok-1", "acc-err-1", "acc-404-1"});
  REQUIRE(found.size() == 3);
  CAPTURE(found["acc-ok-1"]);
  auto ok = json::parse(found["acc-ok-1"]);
  CHECK(ok["request_id"] == "acc-ok-1");
  CHECK(ok["method"] == "GET");
  CHECK(ok["path"] == "/probe/items");  // never the query
  CHECK(ok["status"] == 200);
  CHECK(ok["duration_ms"].get<double>() >= 0);
  CHECK(ok["application"] == "probe");
  CHECK(ok["deployment"] == "InlineProbe");
  CHECK(ok["replica"].get<std::string>().find("probe#InlineProbe#") == 0);
  CHECK(ok["node"] == "head");
  CHECK(ok["ts"].get<std::string>().size() == 24);  // 2026-12-01T23:00:00.000Z
  CHECK(found["acc-ok-1"].find("secret") == std::string::npos);
  auto err = json::parse(found["acc-err-1"]);
  CHECK(err["status"] == 500);
  CHECK(err["replica"] == ok["replica"]);
  auto missing = json::parse(found["acc-404-1"]);
  CHECK(missing["status"] == 404);
  CHECK(missing["path"] == "/nothing/here");
  CHECK(missing["application"] == "");

  // Every access line parses, and so does every line of the node's own log.
  for (const auto& line : lines_of(node.logs / "access.log")) {
    CAPTURE(line);
    CHECK(json::accept(line));
  }
  auto own = lines_of(node.logs / "troupe-node.log");
  REQUIRE(own.size() >= 3);
  bool saw_proxy = false;
  for (const auto& line : own) {
    CAPTURE(line);
    REQUIRE(json::accept(line));
    auto j = json::parse(line);
    CHECK(j.contains("ts"));
    CHECK(j.contains("level"));
    CHECK(j["node"] == "head");
    CHECK(j.contains("component"));
    CHECK(j.contains("msg"));
    saw_proxy = saw_proxy || j["component"] == "proxy";
  }
  CHECK(saw_proxy);
  // The replica's process was given the format too: its own lines (all of
  // them, while it runs: the probe prints nothing) are JSON.
  size_t replica_lines = 0;
  for (const auto& entry : std::filesystem::directory_iterator(node.logs / "replicas")) {
    for (const auto& line : lines_of(entry.path())) {
      CAPTURE(line);
      CHECK(json::accept(line));
      ++replica_lines;
    }
  }
  CHECK(replica_lines >= 1);
  auto reports = node.cluster.stop_all();
  for (const auto& r : reports)
    FAIL_CHECK(r);
}

TEST_CASE("logs: --access-log errors writes only status 400 and above - off writes no access log") {
  {
    LogNode node({"--access-log", "errors"});
    CHECK(node.get("/probe/", "err-mode-ok") == 200);
    CHECK(node.get("/probe/?mode=throw", "err-mode-500") == 500);
    CHECK(node.get("/nothing", "err-mode-404") == 404);
    auto found = node.access_lines({"err-mode-500", "err-mode-404"});
    REQUIRE(found.size() == 2);
    // Text lines: time, node, request id, method, path, status, duration,
    // application/deployment, replica.
    CAPTURE(found["err-mode-500"]);
    std::istringstream words(found["err-mode-500"]);
    std::vector<std::string> w;
    for (std::string x; words >> x;)
      w.push_back(x);
    REQUIRE(w.size() == 9);
    CHECK(w[1] == "head");
    CHECK(w[2] == "err-mode-500");
    CHECK(w[3] == "GET");
    CHECK(w[4] == "/probe/");
    CHECK(w[5] == "500");
    CHECK(w[6].find("ms") != std::string::npos);
    CHECK(w[7] == "probe/InlineProbe");
    CHECK(w[8].find("probe#InlineProbe#") == 0);
    // The 200 before them was not written.
    for (const auto& line : lines_of(node.logs / "access.log"))
      CHECK(line.find("err-mode-ok") == std::string::npos);
    auto reports = node.cluster.stop_all();
    for (const auto& r : reports)
      FAIL_CHECK(r);
  }
  {
    LogNode node({"--access-log", "off"});
    CHECK(node.get("/probe/?mode=throw", "off-mode-500") == 500);
    auto reports = node.cluster.stop_all();
    for (const auto& r : reports)
      FAIL_CHECK(r);
    // Stopped: whatever it would have written is flushed by now.
    CHECK_FALSE(std::filesystem::exists(node.logs / "access.log"));
  }
}

namespace {

// One replica of InlineProbe on w1 only (the resource `w1`), in a process
// or in the node's own process.
std::string pinned_app(const std::string& name, const std::string& isolation) {
  return "  - name: " + name + "\n    route_prefix: /" + name +
         "\n    import_path: libtroupe_examples.so:InlineProbe\n    deployments:\n"
         "      - name: InlineProbe\n        num_replicas: 1\n        isolation: " +
         isolation + "\n        resources: {w1: 0.5}\n";
}

}  // namespace

TEST_CASE("logs: troupectl logs shows what a replica on another node printed - in a process and in process - --follow within 1 s - JSON lines parse") {
  Cluster cluster;
  cluster.start({"w1"}, {"--log-format", "json"},
                {{"w1", {"--log-format", "json", "--resources", "cpu=2,w1=1"}}}, 30s);
  cluster.deploy_yaml("pinned.yaml", "applications:\n" + pinned_app("remote", "process") +
                                         pinned_app("local", "in_process"));
  const uint16_t head_port = cluster.http_ports.at("head");
  // A line printed by each replica (ctx.log) while it handles a request that
  // entered at the head; the answer names the replica.
  auto print = [&](const std::string& app, const std::string& text, const std::string& id) {
    std::optional<HttpReply> r;
    REQUIRE(wait_until(
        [&] {
          r = http_request(head_port, "GET", "/" + app + "/?mode=log&text=" + text, "", 10,
                           {{"X-Request-Id", id}});
          return r && r->status == 200;
        },
        30s, 100ms));
    return json::parse(r->body).value("replica_id", "");
  };
  std::map<std::string, std::string> replica_of;  // app -> its replica
  for (const std::string app : {"remote", "local"}) {
    CAPTURE(app);
    const std::string marker = app + "-marker-1";
    const std::string request_id = "req-" + app + "-1";
    const std::string replica = print(app, marker, request_id);
    replica_of[app] = replica;
    REQUIRE(replica.rfind(app + "#InlineProbe#", 0) == 0);
    // The line may take a moment to reach the file (a replica process's
    // output goes through its node's supervisor).
    RunResult shown;
    CHECK(wait_until(
        [&] {
          shown = cluster.ctl({"logs", replica, "--tail", "50"}, 30s);
          return shown.exit_code == 0 && shown.out.find(marker) != std::string::npos;
        },
        10s, 200ms));
    CAPTURE(shown.out);
    CAPTURE(shown.err);
    // Every line is JSON; the marker's carries the request's id.
    bool found = false;
    std::istringstream lines(shown.out);
    for (std::string line; std::getline(lines, line);) {
      auto parsed = json::parse(line, nullptr, false);
      CHECK_MESSAGE(!parsed.is_discarded(), line);
      if (!parsed.is_discarded() && parsed.value("msg", "").find(marker) != std::string::npos) {
        found = true;
        CHECK(parsed.value("request_id", "") == request_id);
        CHECK(parsed.value("component", "") == "user");
        CHECK(parsed.value("node", "") == (app == "remote" ? replica : "w1"));
      }
    }
    CHECK(found);
    // The application's logs: each line prefixed with its replica.
    auto by_app = cluster.ctl({"logs", app}, 30s);
    CHECK(by_app.exit_code == 0);
    CHECK(by_app.out.find("[" + replica + "] ") != std::string::npos);
    CHECK(by_app.out.find(marker) != std::string::npos);

    // --follow: a new line is shown within 1 s of the request that printed
    // it (troupectl reads 4 times a second).
    ChildProcess follow({bin("troupectl"), "--address", cluster.address, "logs", replica,
                         "--follow", "--tail", "0"},
                        (cluster.dir / ("follow-" + app + ".txt")));
    const std::string marker2 = app + "-marker-2";
    // Ready once it has read the end of the log: the first line printed
    // after that is shown. Wait for its first round to go by with a line
    // it must show.
    REQUIRE(wait_until(
        [&] {
          print(app, app + "-ping", "req-ping");
          return follow.output().find(app + "-ping") != std::string::npos;
        },
        20s, 300ms));
    print(app, marker2, "req-" + app + "-2");
    auto printed = std::chrono::steady_clock::now();
    CHECK(wait_until([&] { return follow.output().find(marker2) != std::string::npos; }, 10s,
                     10ms));
    double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - printed).count();
    MESSAGE("--follow showed the line " << after << " s after it was printed");
    CHECK(after < 1.0);
    follow.stop(5s);
  }

  // Bad input: each a one-line error, exit 1.
  auto unknown = cluster.ctl({"logs", "nope#X#1"}, 30s);
  CHECK(unknown.exit_code == 1);
  CHECK(unknown.err.find("no node has a log of replica nope#X#1") != std::string::npos);
  auto no_app = cluster.ctl({"logs", "nosuch"}, 30s);
  CHECK(no_app.exit_code == 1);
  CHECK(no_app.err.find("no application 'nosuch'") != std::string::npos);
  auto no_dep = cluster.ctl({"logs", "remote/Other"}, 30s);
  CHECK(no_dep.exit_code == 1);
  CHECK(no_dep.err.find("application 'remote' has no deployment 'Other'") != std::string::npos);
  auto bad_tail = cluster.ctl({"logs", "remote", "--tail", "-3"}, 30s);
  CHECK(bad_tail.exit_code == 1);
  CHECK(bad_tail.err.find("--tail") != std::string::npos);

  // Each replica's lines are in a file of its own on its node, the
  // in-process one's too (not only in the node's log), and are still shown
  // once the replica is gone.
  for (const std::string app : {"remote", "local"}) {
    CAPTURE(app);
    const std::string file = cluster.dir / ("w1/logs/replicas/" + replica_of[app] + ".log");
    CHECK_MESSAGE(std::filesystem::exists(file), file);
    auto deleted = cluster.ctl({"delete", app}, 30s);
    REQUIRE(deleted.exit_code == 0);
  }
  REQUIRE(wait_until([&] { return cluster.status()["applications"].empty(); }, 30s, 100ms));
  for (const std::string app : {"remote", "local"}) {
    CAPTURE(app);
    auto after = cluster.ctl({"logs", replica_of[app], "--tail", "100"}, 30s);
    CAPTURE(after.err);
    CHECK(after.exit_code == 0);
    CHECK(after.out.find(app + "-marker-1") != std::string::npos);
    CHECK(after.out.find(app + "-marker-2") != std::string::npos);
  }

  auto reports = cluster.stop_all();
  for (const auto& r : reports)
    FAIL_CHECK(r);
}
