// The controller's deployment libraries (controller/shell/library_store.hpp):
// pinning on deploy, uploads, and removing what no deployment names.
#include "controller/shell/library_store.hpp"

#include <doctest/doctest.h>
#include <spdlog/logger.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tools/common/process.hpp"

namespace troupe::controller {
namespace {

namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::shared_ptr<spdlog::logger> quiet() { return std::make_shared<spdlog::logger>("test"); }

ApplicationSpec app_with(const std::string& import_path, const std::string& sha = "") {
  ApplicationSpec app;
  app.name = "a";
  app.route_prefix = "/a";
  app.ingress = "M";
  DeploymentSpec d;
  d.name = "M";
  d.import_path = import_path;
  d.library_sha256 = sha;
  app.deployments.push_back(d);
  return app;
}

struct Fixture {
  proc::TempDir tmp;
  std::string plugins = tmp / "plugins";
  std::string store_dir = tmp / "libraries";
  LibraryStore store{store_dir, {plugins}, 600, quiet()};

  Fixture() { fs::create_directories(plugins); }
  void build(const std::string& name, const std::string& bytes) {
    fs::remove(fs::path(plugins) / name);
    std::ofstream(fs::path(plugins) / name, std::ios::binary) << bytes;
  }
};

TEST_CASE("a plugin-path library is pinned by its content and kept") {
  Fixture f;
  f.build("libm.so", "build one");
  auto app = app_with("libm.so:M");
  REQUIRE(f.store.pin(app));
  const std::string one = libraries::sha256_hex("build one");
  CHECK(app.deployments[0].library_sha256 == one);
  CHECK(app.deployments[0].import_path == "libm.so:M");  // as the user wrote it
  CHECK(f.store.size_of(one) == std::string("build one").size());

  // A rebuild: another pin.
  f.build("libm.so", "build two, longer");
  auto again = app_with("libm.so:M");
  REQUIRE(f.store.pin(again));
  CHECK(again.deployments[0].library_sha256 == libraries::sha256_hex("build two, longer"));

  // Only the workers have it: loaded by name, as before.
  auto elsewhere = app_with("libother.so:M");
  REQUIRE(f.store.pin(elsewhere));
  CHECK(elsewhere.deployments[0].library_sha256.empty());
}

TEST_CASE("pin refuses what it cannot serve and names the deployment") {
  Fixture f;
  auto local = app_with("./build/libm.so:M");
  auto st = f.store.pin(local);
  CHECK(st.code() == errc::invalid_argument);
  CHECK(contains(st.message(), "application 'a' deployment 'M'"));
  CHECK(contains(st.message(), "is a path on the operator's machine"));

  auto missing = app_with("./build/libm.so:M", std::string(64, 'b'));
  st = f.store.pin(missing);
  CHECK(contains(st.message(), "was not uploaded to the controller"));

  auto reserved = app_with("libm.so@" + std::string(64, 'c') + ":M");
  st = f.store.pin(reserved);
  CHECK(contains(st.message(), "reserved for libraries pinned"));
}

TEST_CASE("an upload must begin with an ELF shared object and end with its hash") {
  Fixture f;
  const std::string elf =
      [] {
        std::ifstream in(std::string(TROUPE_TEST_PLUGIN_DIR) + "/libtroupe_bad_abi.so",
                         std::ios::binary);
        return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      }();
  const std::string sha = libraries::sha256_hex(elf);
  auto not_elf = f.store.upload(libraries::sha256_hex("text"), 4, 0, "text");
  REQUIRE_FALSE(not_elf);
  CHECK(contains(not_elf.status().message(), "the uploaded library is not an ELF file"));

  auto first = f.store.upload(sha, elf.size(), 0, elf.substr(0, 1000));
  REQUIRE(first);
  CHECK(*first == 1000);
  CHECK(f.store.size_of(sha) == 0);
  auto rest = f.store.upload(sha, elf.size(), 1000, elf.substr(1000));
  REQUIRE(rest);
  CHECK(*rest == elf.size());
  CHECK(f.store.size_of(sha) == elf.size());
  auto piece = f.store.read(sha, 0);
  REQUIRE(piece);
  CHECK(*piece == elf);

  // Now a deploy may name it.
  auto app = app_with("./build/libm.so:M", sha);
  CHECK(f.store.pin(app));
}

TEST_CASE("a controller without a state dir keeps no libraries") {
  proc::TempDir tmp;
  fs::create_directories(tmp / "plugins");
  std::ofstream(fs::path(tmp / "plugins") / "libm.so") << "bytes";
  LibraryStore none("", {tmp / "plugins"}, 600, quiet());
  auto app = app_with("libm.so:M");
  REQUIRE(none.pin(app));
  CHECK(app.deployments[0].library_sha256.empty());
  auto up = none.upload(std::string(64, 'a'), 5, 0, "bytes");
  REQUIRE_FALSE(up);
  CHECK(contains(up.status().message(), "--state-dir"));
}

TEST_CASE("libraries no deployment names are removed after the retention") {
  Fixture f;
  f.build("libm.so", "first");
  auto app = app_with("libm.so:M");
  REQUIRE(f.store.pin(app));
  const std::string first = app.deployments[0].library_sha256;
  TargetState state;
  state.applications["a"] = app;
  const double now = static_cast<double>(std::time(nullptr));

  // Named: kept however old.
  CHECK(f.store.collect(state, now + 100000).empty());
  CHECK(f.store.size_of(first) > 0);

  // A rebuild replaces it: the first is unnamed from now on.
  f.build("libm.so", "second");
  auto next = app_with("libm.so:M");
  REQUIRE(f.store.pin(next));
  state.applications["a"] = next;
  const double t0 = now + 200000;
  CHECK(f.store.collect(state, t0).empty());        // first seen unnamed
  CHECK(f.store.collect(state, t0 + 599).empty());  // within the retention
  CHECK(f.store.size_of(first) > 0);
  auto removed = f.store.collect(state, t0 + 601);
  REQUIRE(removed.size() == 1);
  CHECK(removed[0] == first);
  CHECK(f.store.size_of(first) == 0);
  CHECK(f.store.size_of(next.deployments[0].library_sha256) > 0);
}

}  // namespace
}  // namespace troupe::controller
