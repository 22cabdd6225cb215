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

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
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

TEST_CASE("a plugin-path library is pinned by its content and served from where it is") {
  Fixture f;
  f.build("libm.so", "build one");
  auto app = app_with("libm.so:M");
  REQUIRE(f.store.pin(app));
  const std::string one = libraries::sha256_hex("build one");
  CHECK(app.deployments[0].library_sha256 == one);
  CHECK(app.deployments[0].import_path == "libm.so:M");  // as the user wrote it
  const TargetState none;
  CHECK(f.store.size_of(one, none) == std::string("build one").size());
  CHECK(*f.store.read(one, 6, none) == "one");
  CHECK((!fs::exists(f.store_dir) || fs::is_empty(f.store_dir)));  // never copied

  // A restarted controller (nothing remembered) finds it through the
  // deployments pinned to it.
  LibraryStore restarted{f.store_dir, {f.plugins}, 600, quiet()};
  CHECK(restarted.size_of(one, none) == 0);
  TargetState state;
  state.applications["a"] = app;
  CHECK(restarted.size_of(one, state) == std::string("build one").size());

  // A rebuild: another pin, and the old build is no longer served.
  f.build("libm.so", "build two, longer");
  auto again = app_with("libm.so:M");
  REQUIRE(f.store.pin(again));
  CHECK(again.deployments[0].library_sha256 == libraries::sha256_hex("build two, longer"));
  CHECK(f.store.size_of(one, state) == 0);

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
  const std::string elf = read_bytes(std::string(TROUPE_TEST_PLUGIN_DIR) + "/libtroupe_bad_abi.so");
  const std::string sha = libraries::sha256_hex(elf);
  auto not_elf = f.store.upload(libraries::sha256_hex("text"), 4, 0, "text");
  REQUIRE_FALSE(not_elf);
  CHECK(contains(not_elf.status().message(), "the uploaded library is not an ELF file"));

  auto first = f.store.upload(sha, elf.size(), 0, elf.substr(0, 1000));
  REQUIRE(first);
  CHECK(*first == 1000);
  const TargetState none;
  CHECK(f.store.size_of(sha, none) == 0);
  auto rest = f.store.upload(sha, elf.size(), 1000, elf.substr(1000));
  REQUIRE(rest);
  CHECK(*rest == elf.size());
  CHECK(f.store.size_of(sha, none) == elf.size());
  auto piece = f.store.read(sha, 0, none);
  REQUIRE(piece);
  CHECK(*piece == elf);

  // Now a deploy may name it.
  auto app = app_with("./build/libm.so:M", sha);
  CHECK(f.store.pin(app));

  // Damaged on disk (say by a crash before it was flushed): a new
  // incarnation finds out the first time it is asked, removes it, and the
  // operator's next deploy uploads it again.
  std::ofstream(fs::path(f.store_dir) / (sha + ".so"), std::ios::binary | std::ios::trunc)
      << elf.substr(0, 100);
  LibraryStore restarted{f.store_dir, {f.plugins}, 600, quiet()};
  CHECK(restarted.size_of(sha, none) == 0);
  CHECK_FALSE(fs::exists(fs::path(f.store_dir) / (sha + ".so")));
  auto unpinned = app_with("./build/libm.so:M", sha);
  CHECK(contains(restarted.pin(unpinned).message(), "was not uploaded"));
}

TEST_CASE("a controller without a state dir keeps no uploads") {
  proc::TempDir tmp;
  fs::create_directories(tmp / "plugins");
  std::ofstream(fs::path(tmp / "plugins") / "libm.so") << "bytes";
  LibraryStore none("", {tmp / "plugins"}, 600, quiet());
  auto app = app_with("libm.so:M");
  REQUIRE(none.pin(app));  // the plugin path is still pinned and served
  CHECK(app.deployments[0].library_sha256 == libraries::sha256_hex("bytes"));
  auto up = none.upload(std::string(64, 'a'), 5, 0, "bytes");
  REQUIRE_FALSE(up);
  CHECK(contains(up.status().message(), "--state-dir"));
}

TEST_CASE("libraries no deployment names are removed after the retention") {
  Fixture f;
  std::string elf = read_bytes(std::string(TROUPE_TEST_PLUGIN_DIR) + "/libtroupe_bad_abi.so");
  const std::string first_bytes = elf + "1";
  const std::string second_bytes = elf + "2";
  const std::string first = libraries::sha256_hex(first_bytes);
  const std::string second = libraries::sha256_hex(second_bytes);
  REQUIRE(f.store.upload(first, first_bytes.size(), 0, first_bytes));
  REQUIRE(f.store.upload(second, second_bytes.size(), 0, second_bytes));
  const TargetState none;
  TargetState state;
  state.applications["a"] = app_with("./build/libm.so:M", first);
  const double now = static_cast<double>(std::time(nullptr));

  // Named: kept however old. Unnamed: kept for the retention from when it
  // was first seen unnamed.
  CHECK(f.store.collect(state, now).empty());
  CHECK(f.store.collect(state, now + 599).empty());
  CHECK(f.store.size_of(second, none) > 0);
  auto removed = f.store.collect(state, now + 601);
  REQUIRE(removed.size() == 1);
  CHECK(removed[0] == second);
  CHECK(f.store.size_of(second, none) == 0);
  CHECK(f.store.size_of(first, none) > 0);

  // A redeploy names another: the first goes a retention later.
  state.applications["a"] = app_with("./build/libm.so:M", second);
  CHECK(f.store.collect(state, now + 100000).empty());
  CHECK(f.store.size_of(first, none) > 0);
  CHECK(f.store.collect(state, now + 100601) == std::vector<std::string>{first});
}

TEST_CASE("a library only a last good declaration names is kept - a rollback can deploy it") {
  Fixture f;
  std::string elf = read_bytes(std::string(TROUPE_TEST_PLUGIN_DIR) + "/libtroupe_bad_abi.so");
  const std::string old_bytes = elf + "old";
  const std::string new_bytes = elf + "new";
  const std::string old_sha = libraries::sha256_hex(old_bytes);
  const std::string new_sha = libraries::sha256_hex(new_bytes);
  REQUIRE(f.store.upload(old_sha, old_bytes.size(), 0, old_bytes));
  REQUIRE(f.store.upload(new_sha, new_bytes.size(), 0, new_bytes));
  const TargetState none;
  const auto good = app_with("./build/libm.so:M", old_sha);
  // The release deployed now pins the new build; the one that last ran, the
  // old build.
  TargetState state;
  state.applications["a"] = app_with("./build/libm.so:M", new_sha);
  state.last_running["a"] = RunningDeclaration{good, 1};
  const double now = static_cast<double>(std::time(nullptr));
  CHECK(f.store.collect(state, now).empty());
  CHECK(f.store.collect(state, now + 601).empty());
  CHECK(f.store.collect(state, now + 100000).empty());
  CHECK(f.store.size_of(old_sha, none) == old_bytes.size());
  CHECK(f.store.check_available(good).is_ok());

  // Once no last good declaration names it either (the new release ran, or
  // the application was deleted), it goes a retention later.
  state.last_running["a"] = RunningDeclaration{state.applications["a"], 2};
  CHECK(f.store.collect(state, now + 200000).empty());
  CHECK(f.store.collect(state, now + 200601) == std::vector<std::string>{old_sha});
  auto gone = f.store.check_available(good);
  CHECK(gone.code() == errc::not_found);
  CHECK(contains(gone.message(),
                 "application 'a' deployment 'M': library './build/libm.so' (SHA-256 " + old_sha +
                     ") is no longer held by the controller"));

  // A plugin-path build rebuilt in place since it was pinned: not at hand.
  f.build("libp.so", "build one");
  auto plugin = app_with("libp.so:M");
  REQUIRE(f.store.pin(plugin));
  CHECK(f.store.check_available(plugin).is_ok());
  f.build("libp.so", "build two, longer");
  CHECK(f.store.check_available(plugin).code() == errc::not_found);
  // Unpinned (only the workers have it): nothing to check.
  CHECK(f.store.check_available(app_with("libother.so:M")).is_ok());
}

}  // namespace
}  // namespace troupe::controller
