// The ready configs in examples/ name deployments that exist: every
// import_path resolves and its class is the app's (ingress) deployment.
#include <doctest/doctest.h>

#include <filesystem>
#include <set>
#include <string>

#include <yaml-cpp/yaml.h>

#include "plugin_test_util.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;

TEST_CASE("every examples/*.yaml resolves through the plugin loader") {
  PluginLoader loader({testing::kPluginDir});
  std::set<std::string> route_prefixes;
  int files = 0;
  for (const auto& entry : fs::directory_iterator(TROUPE_TEST_EXAMPLES_DIR)) {
    // demo.yaml combines the apps of the others (checked by config_test).
    if (entry.path().extension() != ".yaml" || entry.path().filename() == "demo.yaml")
      continue;
    ++files;
    CAPTURE(entry.path().string());
    const YAML::Node config = YAML::LoadFile(entry.path().string());
    // Every example declares a request timeout, and no host or port (which
    // a deploy does not apply: troupectl would warn).
    CHECK(config["http_options"]["request_timeout_s"].as<double>() == 30);
    CHECK_FALSE(config["http_options"]["port"]);
    CHECK_FALSE(config["http_options"]["host"]);
    const YAML::Node apps = config["applications"];
    REQUIRE(apps.size() == 1);
    const YAML::Node app = apps[0];
    const std::string import_path = app["import_path"].as<std::string>();
    CAPTURE(import_path);
    CHECK(route_prefixes.insert(app["route_prefix"].as<std::string>()).second);

    auto parsed = parse_import_path(import_path);
    REQUIRE(parsed);
    // The XGBoost example is a library of its own, built when Debian's
    // libxgboost-dev is installed (`./troupe test` installs it); so is the
    // gRPC example (examples/grpc/, with its protobuf code).
    const bool xgboost = app["name"].as<std::string>() == "xgboost";
    const bool grpc = app["name"].as<std::string>() == "grpc-greeter";
    CHECK(parsed->library == (xgboost ? "libtroupe_xgboost.so"
                              : grpc  ? "libtroupe_grpc_example.so"
                                      : "libtroupe_examples.so"));
    if (xgboost && !TROUPE_TEST_XGBOOST_BUILT) {
      FAIL_CHECK("libtroupe_xgboost.so was not built: install libxgboost-dev (./troupe test does)");
      continue;
    }
    const DeploymentFactory* factory = testing::require_factory(loader, import_path);
    CHECK(std::string(factory->class_name) == parsed->class_name);
    // The ingress first; compose.yaml lists two further deployments of the
    // same library, named after their classes.
    REQUIRE(app["deployments"].size() >= 1);
    CHECK(app["deployments"][0]["name"].as<std::string>() == parsed->class_name);
    for (const auto& deployment : app["deployments"]) {
      const std::string name = deployment["name"].as<std::string>();
      CAPTURE(name);
      const DeploymentFactory* f = testing::require_factory(loader, parsed->library + ":" + name);
      CHECK(std::string(f->class_name) == name);
      CHECK(deployment["num_replicas"].as<int>() >= 1);
      // A batching deployment (xgboost.yaml) admits a whole batch, and its
      // class implements handle_batch(); the others keep the default.
      if (deployment["max_batch_size"]) {
        const int batch = deployment["max_batch_size"].as<int>();
        CHECK(batch > 1);
        CHECK(deployment["max_ongoing_requests"].as<int>() >= batch);
        CHECK(f->batches);
      } else {
        CHECK(deployment["max_ongoing_requests"].as<int>() == 5);
      }
    }
  }
  CHECK(files == 16);
  CHECK(route_prefixes == std::set<std::string>{"/burn", "/compose", "/counter", "/crash", "/echo",
                                                "/fail", "/fixed", "/flaky", "/greet", "/greeter",
                                                "/models", "/noop", "/release", "/sleep", "/stream",
                                                "/xgboost"});
}

}  // namespace
}  // namespace troupe
