#include "tools/troupectl/new_project.hpp"

#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <system_error>

#include <CLI/CLI.hpp>

namespace troupe::ctl {

namespace fs = std::filesystem;

namespace {

// The starter's files; @NAME@ and @CLASS@ are replaced. Kept here rather
// than in files beside it so that troupectl is one self-contained binary.
const char* const kCMakeLists = R"(# @NAME@: a troupe deployment library (lib@NAME@.so) and its test.
#   cmake -B build -DCMAKE_PREFIX_PATH=<troupe's install prefix>  (not needed for /usr)
#   cmake --build build
#   ctest --test-dir build --output-on-failure
cmake_minimum_required(VERSION 3.16)
project(@NAME@ LANGUAGES CXX)

set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
if(NOT CMAKE_BUILD_TYPE)
  set(CMAKE_BUILD_TYPE RelWithDebInfo CACHE STRING "" FORCE)
endif()

# troupe::deployment (the headers) and troupe_add_deployment().
find_package(troupe REQUIRED)

# build/lib@NAME@.so, which `troupectl deploy config.yaml` uploads.
troupe_add_deployment(@NAME@ src/@NAME@.cpp)
target_compile_options(@NAME@ PRIVATE -Wall -Wextra)

# The test runs the deployment in this process (troupe/testing.hpp): no node.
enable_testing()
add_executable(@NAME@_test test/@NAME@_test.cpp src/@NAME@.cpp)
target_include_directories(@NAME@_test PRIVATE src)
target_link_libraries(@NAME@_test PRIVATE troupe::deployment)
target_compile_options(@NAME@_test PRIVATE -Wall -Wextra)
add_test(NAME @NAME@_test COMMAND @NAME@_test)
)";

const char* const kHeader = R"(// @CLASS@: the deployment of @NAME@. It answers every request with a JSON
// greeting for ?name= (default "world"); the greeting is the deployment's
// user_config {greeting: ...}, which a new config changes without restarting
// the replicas (reconfigure()). See <troupe/deployment.hpp> for the rest of
// the API: handles to other deployments, streaming, metrics, logs.
#pragma once

#include <mutex>
#include <string>

#include <troupe/deployment.hpp>

class @CLASS@ : public troupe::Deployment {
 public:
  @CLASS@(const troupe::Json& init_args, const troupe::ReplicaContext& ctx);

  void reconfigure(const troupe::Json& user_config) override;
  troupe::Response handle(const troupe::Request& request) override;

 private:
  const troupe::ReplicaContext ctx_;
  // handle() runs on several threads at once, reconfigure() meanwhile.
  std::mutex mutex_;
  std::string greeting_ = "Hello";
};
)";

const char* const kSource = R"(#include "@NAME@.hpp"

#include <stdexcept>

@CLASS@::@CLASS@(const troupe::Json& /*init_args*/, const troupe::ReplicaContext& ctx)
    : ctx_(ctx) {}

// An exception here fails the replica's start (the first call) or the update
// (a later one), with its message in `troupectl status`.
void @CLASS@::reconfigure(const troupe::Json& user_config) {
  std::string greeting = "Hello";
  if (user_config.is_object() && user_config.contains("greeting")) {
    const troupe::Json& value = user_config.at("greeting");
    if (!value.is_string())
      throw std::invalid_argument("user_config.greeting must be a string, got " + value.dump());
    greeting = value.get<std::string>();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  greeting_ = std::move(greeting);
}

troupe::Response @CLASS@::handle(const troupe::Request& request) {
  const std::string name = request.query_param("name", "world");
  if (name.size() > 100)
    return troupe::Response::json({{"error", "name is longer than 100 characters"}}, 400);
  std::string greeting;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    greeting = greeting_;
  }
  return troupe::Response::json(
      {{"message", greeting + ", " + name + "!"}, {"replica_id", ctx_.replica_id}});
}

TROUPE_DEPLOYMENT(@CLASS@)
)";

const char* const kTest = R"(// Tests of @CLASS@, run in this process by troupe's test harness
// (troupe/testing.hpp): no node, no cluster. `ctest` runs it.
#include <cstdio>
#include <stdexcept>
#include <string>

#include <troupe/testing.hpp>

#include "@NAME@.hpp"

namespace {

int failures = 0;

void expect(bool ok, const char* what, int line) {
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "%s:%d: FAILED: %s\n", __FILE__, line, what);
  }
}

#define EXPECT(condition) expect((condition), #condition, __LINE__)

std::string message_of(const troupe::Response& r) {
  troupe::Json body = troupe::Json::parse(r.body, nullptr, false);
  return body.is_object() ? body.value("message", "") : "";
}

}  // namespace

int main() {
  // The application of config.yaml: the deployment with its user_config.
  troupe::testing::App app("@NAME@");
  app.add<@CLASS@>("@CLASS@", troupe::Json::object(), {{"greeting", "Hi"}});

  troupe::Response r = app.get("/?name=troupe");
  EXPECT(r.status == 200);
  EXPECT(message_of(r) == "Hi, troupe!");
  EXPECT(app.get("/?name=" + std::string(101, 'x')).status == 400);

  // A new user_config reaches the running deployment.
  app.reconfigure("@CLASS@", {{"greeting", "Hello"}});
  EXPECT(message_of(app.get("/")) == "Hello, world!");

  // A bad one fails the update, and the deployment keeps its greeting.
  bool refused = false;
  try {
    app.reconfigure("@CLASS@", {{"greeting", 42}});
  } catch (const std::invalid_argument&) {
    refused = true;
  }
  EXPECT(refused);
  EXPECT(message_of(app.get("/")) == "Hello, world!");

  if (failures == 0)
    std::printf("@NAME@_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
)";

const char* const kConfig = R"(# Deploys @NAME@: troupectl deploy config.yaml
# The library is this project's build (the path is relative to this file):
# troupectl uploads it to the cluster, every node fetches it, and deploying
# a rebuild rolls the replicas. To load it from the nodes' --plugin-path
# instead, name it by its file name: import_path: lib@NAME@.so:@CLASS@
#   curl 'http://127.0.0.1:8000/@NAME@/?name=you'  -> {"message": "Hi, you!", ...}
applications:
  - name: @NAME@
    route_prefix: /@NAME@
    import_path: ./build/lib@NAME@.so:@CLASS@
    deployments:
      - name: @CLASS@
        num_replicas: 2
        user_config: {greeting: Hi}
)";

const char* const kReadme = R"(# @NAME@

A troupe deployment library: `src/@NAME@.cpp` (the class @CLASS@), built into
`lib@NAME@.so` with `find_package(troupe)` and `troupe_add_deployment()`.

    cmake -B build -DCMAKE_PREFIX_PATH=<troupe's install prefix>   # not needed for /usr
    cmake --build build
    ctest --test-dir build --output-on-failure    # test/@NAME@_test.cpp, in process

Deploy it (`troupectl deploy` uploads `build/lib@NAME@.so`; after a rebuild,
deploying again rolls the replicas):

    troupe-node --head --state-dir /tmp/@NAME@-node &
    troupectl deploy config.yaml --wait
    curl 'http://127.0.0.1:8000/@NAME@/?name=you'
)";

const char* const kGitignore = "build/\n";

std::string replace_all(std::string text, const std::string& key, const std::string& value) {
  for (std::size_t at = text.find(key); at != std::string::npos;
       at = text.find(key, at + value.size()))
    text.replace(at, key.size(), value);
  return text;
}

std::string fill(const char* text, const std::string& name, const std::string& cls) {
  return replace_all(replace_all(text, "@NAME@", name), "@CLASS@", cls);
}

Status invalid(const std::string& message) { return Status(errc::invalid_argument, message); }

}  // namespace

Status check_project_name(const std::string& name) {
  static const std::set<std::string> reserved = {"all",     "clean", "help", "install",
                                                 "package", "test",  "troupe"};
  bool ok = !name.empty() && name.size() <= 64 && std::isalpha(static_cast<unsigned char>(name[0]));
  for (char c : name)
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-');
  if (!ok) {
    return invalid("NAME \"" + name +
                   "\" must be a letter, then letters, digits, '_' or '-' (at most 64)");
  }
  if (reserved.count(name))
    return invalid("NAME \"" + name + "\" is a name CMake or troupe keeps for itself; pick another");
  return Status::ok();
}

std::string project_class_name(const std::string& name) {
  std::string out;
  bool start = true;
  for (char c : name) {
    if (c == '_' || c == '-') {
      start = true;
      continue;
    }
    out.push_back(start ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c);
    start = false;
  }
  return out;
}

std::vector<StarterFile> starter_files(const std::string& name) {
  const std::string cls = project_class_name(name);
  return {{"CMakeLists.txt", fill(kCMakeLists, name, cls)},
          {"src/" + name + ".hpp", fill(kHeader, name, cls)},
          {"src/" + name + ".cpp", fill(kSource, name, cls)},
          {"test/" + name + "_test.cpp", fill(kTest, name, cls)},
          {"config.yaml", fill(kConfig, name, cls)},
          {"README.md", fill(kReadme, name, cls)},
          {".gitignore", kGitignore}};
}

Result<std::string> write_starter_project(const std::string& name, const std::string& dir) {
  if (auto st = check_project_name(name); !st)
    return st;
  std::error_code ec;
  const fs::path parent = dir.empty() ? fs::path(".") : fs::path(dir);
  if (!fs::is_directory(parent, ec))
    return invalid("--dir \"" + parent.string() + "\" is not a directory");
  const fs::path target = parent / name;
  if (fs::exists(fs::symlink_status(target, ec))) {
    if (!fs::is_directory(fs::symlink_status(target, ec)) || !fs::is_empty(target, ec) || ec)
      return invalid("\"" + target.string() + "\" exists and is not an empty directory");
  }
  // Written aside, then renamed into place (rename(2) replaces an empty
  // directory): a failure leaves nothing behind.
  std::random_device random;
  const fs::path staging =
      parent / ("." + name + ".new-" + std::to_string(::getpid()) + "-" + std::to_string(random()));
  auto failed = [&](const std::string& what) -> Result<std::string> {
    std::error_code ignored;
    fs::remove_all(staging, ignored);
    return invalid("cannot write \"" + target.string() + "\": " + what);
  };
  if (!fs::create_directory(staging, ec))
    return failed(ec ? ec.message() : "a file of that name appeared");
  for (const auto& file : starter_files(name)) {
    const fs::path path = staging / file.path;
    fs::create_directories(path.parent_path(), ec);
    if (ec)
      return failed(ec.message());
    std::ofstream out(path, std::ios::binary);
    out << file.text;
    out.close();
    if (!out)
      return failed("writing " + file.path + " failed");
  }
  fs::rename(staging, target, ec);
  if (ec)
    return failed(ec.message());
  return target.string();
}

void add_new_command(CLI::App& app, NewCommand& c) {
  c.command = app.add_subcommand(
      "new", "write a starter project NAME/: a deployment, its CMake build, a config, a test");
  c.command->add_option("NAME", c.name, "project, library and application name")->required();
  c.command->add_option("--dir", c.dir, "where to create NAME/")->capture_default_str();
}

int run_new_command(const NewCommand& c) {
  auto written = write_starter_project(c.name, c.dir);
  if (!written) {
    std::fprintf(stderr, "troupectl: error: %s\n", written.status().message().c_str());
    return 1;
  }
  std::printf("wrote %s/ (deployment class %s); build and test it:\n"
              "  cd %s && cmake -B build && cmake --build build && ctest --test-dir build\n",
              written->c_str(), project_class_name(c.name).c_str(), written->c_str());
  return 0;
}

}  // namespace troupe::ctl
