// User code without the node's secrets (node/replica_user.hpp): on a node
// that runs as root, replica processes run as the user troupe-replica
// (`./troupe test` creates it), which cannot read the node's TLS key, the
// controller's checkpoint or another replica's log, nor write into the
// node's state directory; its own library, fetched into the library cache,
// loads, requests reach it over its data channel and its node's gate, and
// its memory limit holds. The deployment that tries is
// fixtures/snoop.cpp, uploaded by troupectl as users ship code.
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"

using namespace troupe::testing;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = TROUPE_UPLOAD_FIXTURES;  // libsnoop.so
const std::string kPlugins = TROUPE_PLUGIN_DIR;        // libtroupe_examples.so

struct User {
  uid_t uid = 0;
  gid_t gid = 0;
};

std::optional<User> replica_user() {
  passwd* p = ::getpwnam("troupe-replica");
  if (!p)
    return std::nullopt;
  return User{p->pw_uid, p->pw_gid};
}

// A TLS cluster of a head and w1 whose state dirs others may pass through
// (as /var/lib is): replicas load libraries from the nodes' caches, and the
// examples from a plugin dir of the cluster's own (the build tree may be
// where troupe-replica cannot search, e.g. under /root).
struct IsolatedCluster {
  Cluster cluster;
  std::string certs = cluster.dir / "certs";
  std::string app_dir = cluster.dir / "app";
  std::string plugins = cluster.dir / "plugins";

  RunResult certs_cmd(std::vector<std::string> args) {
    std::vector<std::string> argv = {bin("troupectl"), "certs"};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv, 30s);
  }

  IsolatedCluster() {
    REQUIRE(::chmod(cluster.dir.path().c_str(), 0711) == 0);
    REQUIRE(certs_cmd({"init", certs}).exit_code == 0);
    for (const char* node : {"head", "w1"})
      REQUIRE(certs_cmd({"issue", certs, "--name", node, "--role", "node"}).exit_code == 0);
    REQUIRE(certs_cmd({"issue", certs, "--name", "alice", "--role", "operator"}).exit_code == 0);
    cluster.identity = {"--tls-dir", certs, "--tls-name", "alice"};
    fs::create_directories(plugins);
    REQUIRE(::chmod(plugins.c_str(), 0755) == 0);
    fs::copy_file(fs::path(kPlugins) / "libtroupe_examples.so",
                  fs::path(plugins) / "libtroupe_examples.so");
    const std::vector<std::string> args = {"--tls-dir", certs, "--plugin-path", plugins};
    cluster.start({"w1"}, args, {{"w1", args}}, 30s);
    fs::create_directories(app_dir);
    fs::copy_file(fs::path(kFixtures) / "libsnoop.so", fs::path(app_dir) / "libsnoop.so");
  }

  // Deploys snoop (uploaded), echo and crash (from the plugin path), one
  // replica each.
  void deploy() {
    std::string yaml = R"(applications:
  - name: snoop
    route_prefix: /snoop
    import_path: ./libsnoop.so:Snoop
    deployments:
      - name: Snoop
        num_replicas: 1
  - name: echo
    route_prefix: /echo
    import_path: libtroupe_examples.so:Echo
    deployments:
      - name: Echo
        num_replicas: 1
  - name: crash
    route_prefix: /crash
    import_path: libtroupe_examples.so:Crash
    deployments:
      - name: Crash
        num_replicas: 1
        memory_limit: 384M
)";
    std::string file = app_dir + "/app.yaml";
    std::ofstream(file) << yaml;
    auto deployed = cluster.ctl({"--tls-dir", certs, "--tls-name", "alice", "deploy", file,
                                 "--wait"},
                                120s);
    CAPTURE(deployed.err);
    REQUIRE(deployed.exit_code == 0);
  }

  json snoop(const json& asked) {
    for (const auto& [node, port] : cluster.http_ports) {
      auto r = http_request(port, "POST", "/snoop/", asked.dump(), 10);
      if (r && r->status == 200)
        return json::parse(r->body);
    }
    return json();
  }
};

}  // namespace

TEST_CASE("replica user: user code reads no key checkpoint or other replica's log of its node and writes nothing into its state dir - its uploaded library loads and its memory limit holds") {
  auto user = replica_user();
  if (!user)
    FAIL("there is no user troupe-replica: `./troupe test` creates it (useradd --system)");
  REQUIRE(::geteuid() == 0);
  IsolatedCluster c;
  CHECK(c.cluster.nodes.at("w1").output().find("replica processes run as user troupe-replica") !=
        std::string::npos);
  c.deploy();
  auto echo = c.cluster.running_replicas("echo", "Echo");
  REQUIRE(echo.size() == 1);
  const std::string echo_id = echo.begin()->first;
  const std::string echo_node = echo.begin()->second;
  const std::string echo_log = c.cluster.dir / (echo_node + "/logs/replicas/" + echo_id + ".log");
  REQUIRE(fs::exists(echo_log));
  const std::string head_checkpoint = c.cluster.dir / "head/checkpoint/CURRENT";
  REQUIRE(fs::exists(head_checkpoint));

  auto snoops = c.cluster.running_replicas("snoop", "Snoop");
  REQUIRE(snoops.size() == 1);
  const std::string node = snoops.begin()->second;
  const std::string state = c.cluster.dir / node;
  std::string cached_library;
  for (const auto& entry : fs::directory_iterator(state + "/library-cache")) {
    if (entry.path().extension() == ".so")
      cached_library = entry.path().string();
  }
  REQUIRE(!cached_library.empty());
  const std::string key = c.certs + "/" + node + ".key";
  const std::string node_log = state + "/logs/troupe-node.log";
  json asked = {{"read", {key, head_checkpoint, echo_log, node_log, state + "/node_id",
                          cached_library, "/etc/passwd"}},
                {"write", {state, state + "/logs", state + "/library-cache", "/tmp"}}};
  auto seen = c.snoop(asked);
  CAPTURE(seen.dump(2));
  REQUIRE(seen.is_object());
  CHECK(seen.at("uid").get<uid_t>() == user->uid);
  CHECK(seen.at("gid").get<gid_t>() == user->gid);
  CHECK(seen.at("no_new_privs").get<int>() == 1);
  CHECK(seen.at("dumpable").get<int>() == 0);
  CHECK(seen.at("cap_eff").get<std::string>() == "0000000000000000");
  CHECK(seen.at("cap_prm").get<std::string>() == "0000000000000000");
  CHECK_FALSE(seen.at("became_root").get<bool>());
  const auto& reads = seen.at("read");
  for (const auto& secret : {key, head_checkpoint, echo_log, node_log, state + "/node_id"}) {
    CAPTURE(secret);
    CHECK(reads.at(secret).get<std::string>() == "Permission denied");
  }
  const auto& writes = seen.at("write");
  for (const auto& dir : {state, state + "/logs", state + "/library-cache"}) {
    CAPTURE(dir);
    CHECK(writes.at(dir).get<std::string>() == "Permission denied");
  }
  // What it may: its own library in the cache, the system's public files,
  // a temporary file.
  CHECK(reads.at(cached_library).get<std::string>() == "ok");
  CHECK(reads.at("/etc/passwd").get<std::string>() == "ok");
  CHECK(writes.at("/tmp").get<std::string>() == "ok");
  // The process is the one the node started, under that user.
  struct stat st {};
  REQUIRE(::stat(("/proc/" + std::to_string(seen.at("pid").get<int>())).c_str(), &st) == 0);
  CHECK(st.st_uid == user->uid);

  // Its log is kept by the node: what the replica prints is in it.
  auto printed = http_get(c.cluster.http_ports.at("w1"), "/crash/?print=marker-5be1", 10);
  REQUIRE(printed.has_value());
  CHECK(printed->status == 200);
  auto crash = c.cluster.running_replicas("crash", "Crash");
  REQUIRE(crash.size() == 1);
  const std::string crash_log =
      c.cluster.dir / (crash.begin()->second + "/logs/replicas/" + crash.begin()->first + ".log");
  CHECK(wait_until([&] { return troupe::proc::slurp(crash_log).find("marker-5be1") != std::string::npos; },
                   10s));
  // The memory limit holds under that user: over it, the replica is killed.
  auto over = http_get(c.cluster.http_ports.at("w1"), "/crash/?mode=alloc&mb=1024", 60);
  REQUIRE(over.has_value());
  CHECK(over->status == 502);
  CHECK(wait_until(
      [&] {
        return c.cluster.nodes.at("head").output().find("exceeded its memory limit of 384 MiB") !=
               std::string::npos;
      },
      20s));
}

TEST_CASE("replica user: a user that does not exist or cannot reach the node's libraries stops the node at start with an error naming it") {
  if (!replica_user())
    FAIL("there is no user troupe-replica: `./troupe test` creates it (useradd --system)");
  TempDir dir;
  auto node = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {bin("troupe-node"), "--head", "--port",
                                     std::to_string(free_port()), "--state-dir", dir / "head",
                                     "--http-port", std::to_string(free_port()), "--admin-port",
                                     "0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run(argv, 30s);
  };
  auto missing = node({"--replica-user", "no-such-user-7f3a"});
  CHECK(missing.exit_code == 2);
  CHECK(missing.err.find("--replica-user no-such-user-7f3a: no such user") != std::string::npos);
  // The temporary dir is 0700: troupe-replica cannot search it.
  fs::create_directories(dir / "plugins");
  auto unreachable = node({"--replica-user", "troupe-replica", "--plugin-path", dir / "plugins"});
  CAPTURE(unreachable.err);
  CHECK(unreachable.exit_code == 2);
  CHECK(unreachable.err.find("--replica-user troupe-replica: user troupe-replica (uid " +
                                std::to_string(replica_user()->uid) + ") cannot search " +
                                dir.path()) != std::string::npos);
}
