#include "replica/plugin/plugin_loader.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "plugin_test_util.hpp"
#include "runtime/libraries.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using testing::contains;
using testing::kPluginDir;
using testing::TempDir;

TEST_CASE("resolve returns the same factory on every call") {
  PluginLoader loader({kPluginDir});
  auto first = loader.resolve("libtroupe_examples.so:Echo");
  REQUIRE(first);
  CHECK((*first)->abi_version == kDeploymentAbiVersion);
  CHECK(std::string((*first)->class_name) == "Echo");
  auto second = loader.resolve("libtroupe_examples.so:Echo");
  REQUIRE(second);
  CHECK(*first == *second);
}

TEST_CASE("resolve is thread-safe and loads a library once") {
  PluginLoader loader({kPluginDir});
  const char* classes[] = {"Echo", "Hello", "Counter", "Sleep"};
  std::vector<const DeploymentFactory*> seen(8 * 50, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        auto f = loader.resolve(std::string("libtroupe_examples.so:") + classes[(t + i) % 4]);
        seen[t * 50 + i] = f ? *f : nullptr;
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  for (int t = 0; t < 8; ++t) {
    for (int i = 0; i < 50; ++i) {
      const DeploymentFactory* f = seen[t * 50 + i];
      REQUIRE(f != nullptr);
      CHECK(std::string(f->class_name) == classes[(t + i) % 4]);
    }
  }
}

TEST_CASE("plugin dirs are searched in order - missing dirs are skipped") {
  PluginLoader loader({"/nonexistent/troupe/plugins", kPluginDir});
  CHECK(loader.resolve("libtroupe_examples.so:Hello"));
}

TEST_CASE("a malformed import path is refused before any file is touched") {
  PluginLoader loader({kPluginDir});
  auto r = loader.resolve("libtroupe_examples.so");
  REQUIRE_FALSE(r);
  CHECK(r.status().code() == errc::invalid_argument);
  CHECK(contains(r.status().message(), "import_path 'libtroupe_examples.so'"));
}

TEST_CASE("a missing library is not_found and names the plugin path") {
  PluginLoader loader({kPluginDir, "/nonexistent/dir"});
  auto r = loader.resolve("libx.so:Echo");
  REQUIRE_FALSE(r);
  CHECK(r.status().code() == errc::not_found);
  CHECK(r.status().message() ==
        "library 'libx.so' not found in plugin path [" + kPluginDir + ", /nonexistent/dir]");
}

TEST_CASE("a class the library does not export is not_found with the dlerror text") {
  PluginLoader loader({kPluginDir});
  auto r = loader.resolve("libtroupe_examples.so:NoSuchClass");
  REQUIRE_FALSE(r);
  CHECK(r.status().code() == errc::not_found);
  const std::string message = r.status().message();
  const std::string path = fs::canonical(kPluginDir + "/libtroupe_examples.so").string();
  CHECK(contains(message, "library '" + path +
                              "' has no deployment 'NoSuchClass' (symbol "
                              "troupe_deployment_NoSuchClass: "));
  CHECK(contains(message, "undefined symbol"));  // from dlerror()
}

TEST_CASE("a library built against another deployment ABI is refused") {
  PluginLoader loader({kPluginDir});
  auto r = loader.resolve("libtroupe_bad_abi.so:BadAbi");
  REQUIRE_FALSE(r);
  CHECK(r.status().code() == errc::invalid_argument);
  CHECK(contains(r.status().message(), "libtroupe_bad_abi.so"));
  CHECK(contains(r.status().message(), "built against deployment ABI 999, this node supports " +
                                            std::to_string(kDeploymentAbiVersion)));
}

TEST_CASE("a file that is not a loadable library reports the dlopen error") {
  TempDir dir;
  { std::ofstream(dir / "libjunk.so") << "not an ELF file\n"; }
  PluginLoader loader({dir.path()});
  auto r = loader.resolve("libjunk.so:Echo");
  REQUIRE_FALSE(r);
  CHECK(r.status().code() == errc::invalid_argument);
  const std::string message = r.status().message();
  CHECK(contains(message,
                 "cannot load library '" + fs::canonical(dir.path()).string() + "/libjunk.so': "));
  CHECK(contains(message, "libjunk.so"));  // dlerror names the file too
}

TEST_CASE("an absolute library path is refused") {
  PluginLoader loader({kPluginDir});
  auto r = loader.resolve(kPluginDir + "/libtroupe_examples.so:Echo");
  REQUIRE_FALSE(r);
  CHECK(r.status().code() == errc::invalid_argument);
  CHECK(contains(r.status().message(),
                 "library '" + kPluginDir + "/libtroupe_examples.so' is an absolute path"));
}

TEST_CASE("a library path with a '..' component is refused") {
  // The plugin dir's parent would hold it: the name must not escape.
  TempDir dir;
  fs::create_directory(dir / "plugins");
  fs::copy_file(kPluginDir + "/libtroupe_examples.so", dir / "libtroupe_examples.so");
  PluginLoader loader({dir / "plugins"});
  for (const char* value :
       {"../libtroupe_examples.so:Echo", "sub/../../libtroupe_examples.so:Echo", "./..:Echo"}) {
    CAPTURE(value);
    auto r = loader.resolve(value);
    REQUIRE_FALSE(r);
    CHECK(r.status().code() == errc::invalid_argument);
    CHECK(contains(r.status().message(), "contains a '..' component"));
  }
}

TEST_CASE("a symlink in the plugin dir that leads outside it is refused") {
  TempDir dir;
  fs::create_symlink(fs::path(kPluginDir) / "libtroupe_examples.so", dir / "libout.so");
  // A symlinked subdirectory leading outside is refused the same way.
  fs::create_directory_symlink(kPluginDir, dir / "sub");
  PluginLoader loader({dir.path()});

  auto r = loader.resolve("libout.so:Echo");
  REQUIRE_FALSE(r);
  CHECK(r.status().code() == errc::invalid_argument);
  CHECK(contains(r.status().message(), "library 'libout.so' in plugin dir '" + dir.path() +
                                           "' resolves to '" + fs::canonical(kPluginDir).string() +
                                           "/libtroupe_examples.so', outside the plugin dir"));

  auto sub = loader.resolve("sub/libtroupe_examples.so:Echo");
  REQUIRE_FALSE(sub);
  CHECK(sub.status().code() == errc::invalid_argument);
  CHECK(contains(sub.status().message(), "outside the plugin dir"));
}

TEST_CASE("symlinks that stay inside the plugin dir - and a symlinked plugin dir - are fine") {
  TempDir dir;
  fs::create_directory(dir / "real");
  fs::copy_file(kPluginDir + "/libtroupe_examples.so", dir / "real/libtroupe_examples.so");
  fs::create_symlink("libtroupe_examples.so", dir / "real/libcurrent.so");
  fs::create_directory_symlink(dir / "real", dir / "link");

  PluginLoader loader({dir / "link"});
  auto r = loader.resolve("libcurrent.so:Echo");
  INFO(r.status().to_string());
  REQUIRE(r);
  auto d = (*r)->create(Json(), testing::example_context());
  CHECK(d->handle(Request{}).status == 200);
}

TEST_CASE("a dangling symlink is reported as not resolvable") {
  TempDir dir;
  fs::create_symlink(dir / "nowhere.so", dir / "libdangling.so");
  PluginLoader loader({dir.path()});
  auto r = loader.resolve("libdangling.so:Echo");
  REQUIRE_FALSE(r);
  CHECK(r.status().code() == errc::not_found);
  CHECK(contains(r.status().message(),
                 "library 'libdangling.so' in plugin dir '" + dir.path() + "' cannot be resolved"));
}

// A library pinned by its SHA-256 ("<name>@<sha256>:<Class>") loads from the
// library cache, and only when its content hashes to the pin.
TEST_CASE("a pinned library loads from the cache only with the content it is pinned to") {
  TempDir cache;
  const std::string examples = std::string(kPluginDir) + "/libtroupe_examples.so";
  auto sha = libraries::sha256_file(examples);
  REQUIRE(sha);
  libraries::LibraryDir dir(cache.path());
  const std::string pinned = "libtroupe_examples.so@" + *sha + ":Hello";

  SUBCASE("not in the cache") {
    PluginLoader loader({kPluginDir}, cache.path());
    auto r = loader.resolve(pinned);
    REQUIRE_FALSE(r);
    CHECK(r.status().code() == errc::not_found);
    CHECK(contains(r.status().message(), "is not in the library cache"));
  }
  SUBCASE("no cache") {
    PluginLoader loader({kPluginDir});
    auto r = loader.resolve(pinned);
    REQUIRE_FALSE(r);
    CHECK(contains(r.status().message(), "has no library cache"));
  }
  SUBCASE("the right content") {
    REQUIRE(dir.put_file(*sha, examples));
    PluginLoader loader({}, cache.path());
    auto r = loader.resolve(pinned);
    REQUIRE(r);
    CHECK(std::string((*r)->class_name) == "Hello");
  }
  SUBCASE("other content under the pin's name is refused and never loaded") {
    // Another valid library (it exports BadAbi) in the pinned file's place.
    fs::copy_file(std::string(kPluginDir) + "/libtroupe_bad_abi.so", dir.path_of(*sha));
    PluginLoader loader({}, cache.path());
    auto r = loader.resolve("libtroupe_examples.so@" + *sha + ":BadAbi");
    REQUIRE_FALSE(r);
    CHECK(r.status().code() == errc::corrupt);
    CHECK(contains(r.status().message(), "refusing to load it"));
    // Had it been loaded, the ABI check would have refused it as built
    // against ABI 999. (Not a search for "999": the message holds two
    // SHA-256s in hex and a random temporary path, which may contain it.)
    CHECK_FALSE(contains(r.status().message(), "was built against deployment ABI"));
  }
}

}  // namespace
}  // namespace troupe
