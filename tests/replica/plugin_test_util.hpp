// Helpers shared by the plugin loader and example tests.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

#include <doctest/doctest.h>

#include "replica/plugin/plugin_loader.hpp"

namespace troupe::testing {

inline const std::string kPluginDir = TROUPE_TEST_PLUGIN_DIR;

inline ReplicaContext example_context() {
  return {"app", "Dep", "app#Dep#r1", "node-1", "v7", nullptr};
}

// A fresh directory from mkdtemp, removed with its content on destruction.
class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "troupe_plugin_test.XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Resolves `import_path` from the test plugin dir, failing the test if it
// cannot.
inline const DeploymentFactory* require_factory(PluginLoader& loader,
                                                const std::string& import_path) {
  auto factory = loader.resolve(import_path);
  INFO(factory.status().to_string());
  REQUIRE(factory);
  return *factory;
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace troupe::testing
