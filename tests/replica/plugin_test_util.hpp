// Helpers shared by the plugin loader and example tests.
#pragma once

#include <filesystem>
#include <string>

#include <doctest/doctest.h>

#include "replica/plugin/plugin_loader.hpp"
#include "tests/support/temp_dir.hpp"

namespace troupe::testing {

inline const std::string kPluginDir = TROUPE_TEST_PLUGIN_DIR;

inline ReplicaContext example_context() {
  return {"app", "Dep", "app#Dep#r1", "node-1", "v7", nullptr};
}

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
