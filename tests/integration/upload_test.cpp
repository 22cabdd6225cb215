// Shipping user code (issue 21): `troupectl deploy` of a config that names a
// library on the operator's side uploads it to the controller; every node
// fetches it, checks its SHA-256 and serves from it. A rebuilt library (other
// content) rolls the replicas; the identical file changes nothing. Bad
// libraries are refused by troupectl before anything is sent, and a cached
// library someone changed is refused by the node that holds it.
//
// The libraries: libupload_v1.so and libupload_v2.so (fixtures/upload_model.cpp
// built with two answers) in a directory that is in no node's plugin path.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "runtime/libraries.hpp"
#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"

using namespace troupe::testing;
using nlohmann::json;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = TROUPE_UPLOAD_FIXTURES;  // libupload_v1.so, libupload_v2.so

// A node's library cache, counted on its /-/metrics (node/node_agent.cpp):
// libraries fetched whole from the controller, and cached copies refused
// because their content no longer hashed to their pin.
const std::string kFetched = "troupe_library_cache_events_total{event=\"fetched\"}";
const std::string kRefused = "troupe_library_cache_events_total{event=\"cached_copy_refused\"}";

// The count of `series` on `node`'s /-/metrics; 0 while it has none.
double count_of(const Cluster& c, const std::string& node, const std::string& series) {
  return metric_value(c.admin_ports.at(node), series).value_or(0);
}

// One application, "up", whose ingress deployment is the class of
// `import_path` ("<library>:<Class>").
std::string config_for(const std::string& import_path, int replicas) {
  const std::string class_name = import_path.substr(import_path.find(':') + 1);
  return "applications:\n"
         "  - name: up\n"
         "    route_prefix: /up\n"
         "    import_path: " +
         import_path +
         "\n"
         "    deployments:\n"
         "      - name: " +
         class_name +
         "\n"
         "        num_replicas: " +
         std::to_string(replicas) +
         "\n"
         "        max_replicas_per_node: 1\n";
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The operator's side: <dir>/op/app.yaml naming ./build/libmodels.so.
struct Operator {
  fs::path dir;
  fs::path library;
  fs::path config;

  explicit Operator(const fs::path& root) : dir(root / "op") {
    fs::create_directories(dir / "build");
    library = dir / "build" / "libmodels.so";
    config = dir / "app.yaml";
  }
  // Puts a build in place, as a compiler's link step would (a new file).
  void build(const std::string& fixture) {
    fs::remove(library);
    fs::copy_file(fs::path(kFixtures) / fixture, library);
  }
  void write_config(const std::string& import_path, int replicas) {
    std::ofstream(config) << config_for(import_path, replicas);
  }
};

// Replica id -> node id of up/UploadModel's RUNNING replicas.
std::map<std::string, std::string> running_replicas(const Cluster& c) {
  return c.running_replicas("up", "UploadModel", 10s);
}

// GETs /up/ on every node's proxy until answers from replicas on each of
// `nodes` were seen, every answer being `answer`; false at the deadline or at
// the first other answer.
bool serves_everywhere(Cluster& c, const std::set<std::string>& nodes, const std::string& answer,
                       std::chrono::milliseconds deadline, std::set<std::string>& served_by) {
  served_by.clear();
  std::string other;
  bool ok = wait_until(
      [&] {
        for (const auto& [id, port] : c.http_ports) {
          auto r = http_get(port, "/up/", 5);
          if (!r || r->status != 200)
            continue;
          auto body = json::parse(r->body, nullptr, false);
          if (body.is_discarded())
            continue;
          if (body.value("answer", "") != answer) {
            other = r->body;
            return true;
          }
          served_by.insert(body.value("node_id", ""));
        }
        return served_by == nodes;
      },
      deadline, 100ms);
  if (!other.empty()) {
    MESSAGE("another answer: " << other);
    return false;
  }
  return ok;
}

}  // namespace

TEST_CASE(
    "upload: a library only on the operator's side serves on three nodes and rolls on a rebuild") {
  Cluster c;
  c.start({"a", "b"}, 30s);
  Operator op(c.dir.path());
  op.build("libupload_v1.so");
  op.write_config("./build/libmodels.so:UploadModel", 3);
  const std::string v1 = troupe::libraries::sha256_hex(read_file(op.library));

  auto first = c.ctl({"deploy", op.config.string(), "--wait"}, 90s);
  CAPTURE(first.out);
  CAPTURE(first.err);
  REQUIRE(first.exit_code == 0);
  CHECK(first.out.find("uploaded " + fs::canonical(op.library).string()) != std::string::npos);
  CHECK(first.out.find("sha256 " + v1) != std::string::npos);
  // `troupectl config` says which bytes were deployed, and where the path
  // it prints is relative to.
  auto printed = c.ctl({"config"});
  CAPTURE(printed.out);
  REQUIRE(printed.exit_code == 0);
  CHECK(printed.out.find("import_path: ./build/libmodels.so:UploadModel") != std::string::npos);
  CHECK(printed.out.find("# uploaded: the library deployed has SHA-256 " + v1 +
                         "; its path is relative to the directory of the config it was deployed "
                         "from") != std::string::npos);

  std::set<std::string> served_by;
  CHECK(serves_everywhere(c, {"head", "a", "b"}, "v1", 30s, served_by));
  auto before = running_replicas(c);
  CHECK(before.size() == 3);
  // Kept by the controller; fetched by the workers, which have no copy.
  CHECK(fs::exists(fs::path(c.dir / "head") / "libraries" / (v1 + ".so")));
  for (const std::string w : {"a", "b"}) {
    CAPTURE(w);
    CHECK(fs::exists(fs::path(c.dir / w) / "library-cache" / (v1 + ".so")));
    // Fetched from the controller: the only library, so the one above.
    CHECK(count_of(c, w, kFetched) >= 1);
  }

  SUBCASE("a rebuild with another answer rolls every replica") {
    op.build("libupload_v2.so");
    const std::string v2 = troupe::libraries::sha256_hex(read_file(op.library));
    REQUIRE(v2 != v1);
    auto second = c.ctl({"deploy", op.config.string(), "--wait"}, 90s);
    CAPTURE(second.out);
    CAPTURE(second.err);
    REQUIRE(second.exit_code == 0);
    CHECK(second.out.find("up/UploadModel: restart") != std::string::npos);
    std::map<std::string, std::string> after;
    REQUIRE(wait_until(
        [&] {
          after = running_replicas(c);
          if (after.size() != 3)
            return false;
          for (const auto& [id, node] : after) {
            if (before.count(id))
              return false;
          }
          return true;
        },
        60s, 200ms));
    CHECK(serves_everywhere(c, {"head", "a", "b"}, "v2", 30s, served_by));

    // The same file again: nothing is uploaded, nothing changes.
    auto third = c.ctl({"deploy", op.config.string()}, 90s);
    CAPTURE(third.out);
    REQUIRE(third.exit_code == 0);
    CHECK(third.out.find("unchanged") != std::string::npos);
    CHECK(third.out.find("uploaded") == std::string::npos);
    CHECK(running_replicas(c) == after);
  }

  SUBCASE("the identical file changes nothing") {
    op.build("libupload_v1.so");  // a new file with the same bytes
    auto again = c.ctl({"deploy", op.config.string()}, 90s);
    CAPTURE(again.out);
    REQUIRE(again.exit_code == 0);
    CHECK(again.out.find("unchanged") != std::string::npos);
    CHECK(running_replicas(c) == before);
  }
}

// A library of several pieces (libraries::kChunkBytes each): troupectl
// uploads it piece by piece, the controller hashes the pieces as they come,
// and a worker fetches it piece by piece, hashing as it goes.
TEST_CASE("upload: a library of several pieces goes up and out to a worker whole") {
  Cluster c;
  c.start({"a"}, 30s);
  Operator op(c.dir.path());
  op.build("libupload_large.so");
  const std::string bytes = read_file(op.library);
  REQUIRE(bytes.size() > 2 * troupe::libraries::kChunkBytes);
  const std::string sha = troupe::libraries::sha256_hex(bytes);
  op.write_config("./build/libmodels.so:UploadModel", 2);

  auto deployed = c.ctl({"deploy", op.config.string(), "--wait"}, 90s);
  CAPTURE(deployed.out);
  CAPTURE(deployed.err);
  REQUIRE(deployed.exit_code == 0);
  CHECK(deployed.out.find("(" + std::to_string(bytes.size()) + " bytes, sha256 " + sha + ")") !=
        std::string::npos);
  std::set<std::string> served_by;
  CHECK(serves_everywhere(c, {"head", "a"}, "large", 30s, served_by));
  CHECK(read_file((fs::path(c.dir / "head") / "libraries" / (sha + ".so")).string()) == bytes);
  CHECK(read_file((fs::path(c.dir / "a") / "library-cache" / (sha + ".so")).string()) == bytes);
  // a fetched it from the controller (whole: its cached copy above).
  CHECK(count_of(c, "a", kFetched) >= 1);
  CHECK(c.nodes.at("head").output().find("library " + sha + " uploaded (" +
                                         std::to_string(bytes.size()) + " bytes)") !=
        std::string::npos);
}

TEST_CASE("upload: a cached library someone changed is refused by the node and fetched again") {
  Cluster c;
  c.start({"a"}, 30s);
  Operator op(c.dir.path());
  op.build("libupload_v1.so");
  op.write_config("./build/libmodels.so:UploadModel", 2);
  const std::string v1 = troupe::libraries::sha256_hex(read_file(op.library));
  auto deployed = c.ctl({"deploy", op.config.string(), "--wait"}, 90s);
  CAPTURE(deployed.err);
  REQUIRE(deployed.exit_code == 0);
  std::set<std::string> served_by;
  REQUIRE(serves_everywhere(c, {"head", "a"}, "v1", 30s, served_by));

  // Someone puts other code in a's cache under v1's name: a valid library,
  // which answers v2.
  const fs::path cached = fs::path(c.dir / "a") / "library-cache" / (v1 + ".so");
  REQUIRE(fs::exists(cached));
  fs::remove(cached);
  fs::copy_file(fs::path(kFixtures) / "libupload_v2.so", cached);

  // a's replica is replaced on a (one per node): the new one needs the
  // library again.
  std::string victim;
  for (const auto& [id, node] : running_replicas(c)) {
    if (node == "a")
      victim = id;
  }
  REQUIRE(!victim.empty());
  auto killed = c.ctl({"kill", "replica", victim}, 10s);
  CAPTURE(killed.err);
  REQUIRE(killed.exit_code == 0);
  REQUIRE(wait_until(
      [&] {
        auto now = running_replicas(c);
        return now.size() == 2 && !now.count(victim);
      },
      60s, 200ms));
  // a refused its changed copy and fetched v1 again (after its first fetch).
  CHECK(count_of(c, "a", kRefused) >= 1);
  CHECK(count_of(c, "a", kFetched) >= 2);
  // Served from v1 again, never from the changed file.
  CHECK(serves_everywhere(c, {"head", "a"}, "v1", 30s, served_by));
  CHECK(troupe::libraries::sha256_hex(read_file(cached)) == v1);
}

TEST_CASE("upload: a restarted head still has the library for a node that joins later") {
  Cluster c;
  c.start({"a"}, 30s);
  Operator op(c.dir.path());
  op.build("libupload_v1.so");
  op.write_config("./build/libmodels.so:UploadModel", 2);
  auto deployed = c.ctl({"deploy", op.config.string(), "--wait"}, 90s);
  CAPTURE(deployed.err);
  REQUIRE(deployed.exit_code == 0);
  // The operator's file is gone: only the cluster has the library now.
  fs::remove(op.library);

  // The head dies and comes back over its state dir.
  c.nodes.at("head").signal(SIGKILL);
  REQUIRE(c.nodes.at("head").wait_exit(10s).has_value());
  c.start_head();
  c.start_worker("b");
  REQUIRE(c.wait_states({{"head", "ALIVE"}, {"a", "ALIVE"}, {"b", "ALIVE"}}, 30s));
  auto scaled = c.ctl({"scale", "up/UploadModel", "3"}, 30s);
  CAPTURE(scaled.err);
  REQUIRE(scaled.exit_code == 0);
  std::set<std::string> served_by;
  CHECK(serves_everywhere(c, {"head", "a", "b"}, "v1", 60s, served_by));
  // b, which joined after the restart, fetched it from the restarted head.
  CHECK(count_of(c, "b", kFetched) >= 1);
}

TEST_CASE("upload: troupectl refuses a bad library before it contacts anyone") {
  // No controller listens at this address: an error about the library (not
  // about connecting) shows nothing was sent.
  TempDir dir;
  const std::string address = "127.0.0.1:" + std::to_string(free_port());
  Operator op{fs::path(dir.path())};
  fs::create_directories(fs::path(dir.path()) / "outside");

  struct Case {
    std::string name;
    std::function<void()> prepare;
    std::string import_path;
    std::string expected;
  };
  const std::string v1 = fs::path(kFixtures) / "libupload_v1.so";
  std::vector<Case> cases = {
      {"not ELF", [&] { std::ofstream(op.library) << "#!/bin/sh\necho hi\n"; },
       "./build/libmodels.so:UploadModel", "is not an ELF file"},
      {"too large",
       [&] {
         fs::remove(op.library);
         std::ofstream(op.library).close();
         fs::resize_file(op.library, troupe::libraries::kMaxLibraryBytes + 1);  // sparse
       },
       "./build/libmodels.so:UploadModel", "over the limit of 268435456 bytes"},
      {"other architecture",
       [&] {
         auto bytes = read_file(v1);
         bytes[18] = static_cast<char>(bytes[18] == 0x3e ? 0xb7 : 0x3e);  // e_machine
         std::ofstream(op.library, std::ios::binary | std::ios::trunc) << bytes;
       },
       "./build/libmodels.so:UploadModel", "is an ELF file for another architecture"},
      {"an executable",
       [&] {
         fs::remove(op.library);
         fs::copy_file(bin("troupectl"), op.library);
       },
       "./build/libmodels.so:UploadModel", "cannot be loaded"},
      {"missing deployment", [&] { op.build("libupload_v1.so"); }, "./build/libmodels.so:Missing",
       "has no deployment 'Missing'"},
      {"other ABI",
       [&] {
         fs::remove(op.library);
         fs::copy_file(fs::path(TROUPE_PLUGIN_DIR) / "libtroupe_bad_abi.so", op.library);
       },
       "./build/libmodels.so:BadAbi", "was built against deployment ABI 999"},
      {"outside the config's tree",
       [&] {
         fs::remove(fs::path(dir.path()) / "outside" / "libmodels.so");
         fs::copy_file(v1, fs::path(dir.path()) / "outside" / "libmodels.so");
       },
       "../outside/libmodels.so:UploadModel", "outside the config's directory"},
      {"missing file", [&] { fs::remove(op.library); }, "./build/libmodels.so:UploadModel",
       "cannot be read"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    c.prepare();
    op.write_config(c.import_path, 1);
    auto r = run(
        {bin("troupectl"), "--address", address, "--timeout", "2", "deploy", op.config.string()},
        60s);
    CAPTURE(r.err);
    CHECK(r.exit_code == 1);
    CHECK(r.err.find(c.expected) != std::string::npos);
    const std::string class_name = c.import_path.substr(c.import_path.find(':') + 1);
    CHECK(r.err.find("application 'up' deployment '" + class_name + "'") != std::string::npos);
    // One line.
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.out.empty());
  }
}

TEST_CASE(
    "upload: troupectl refuses batching for a class without handle_batch before it "
    "contacts anyone") {
  TempDir dir;
  const std::string address = "127.0.0.1:" + std::to_string(free_port());
  Operator op{fs::path(dir.path())};
  op.build("libupload_v1.so");
  for (const std::string fields : {"        max_ongoing_requests: 8\n        max_batch_size: 8\n",
                                   "        batch_wait_timeout_s: auto\n"}) {
    CAPTURE(fields);
    std::ofstream(op.config) << config_for("./build/libmodels.so:UploadModel", 1) + fields;
    auto r = run(
        {bin("troupectl"), "--address", address, "--timeout", "2", "deploy", op.config.string()},
        60s);
    CAPTURE(r.err);
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("has deployment 'UploadModel', which does not implement handle_batch(), "
                     "but application 'up' deployment 'UploadModel' sets " +
                     std::string(fields.find("auto") != std::string::npos
                                     ? "batch_wait_timeout_s: auto"
                                     : "max_batch_size: 8")) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.out.empty());
  }
}
