// `troupectl new` without building anything: the names it takes, the class
// name it derives, the files it writes, and that it never leaves a
// half-written or overwritten project. (The starter building and passing its
// test against an install prefix: tests/integration/package_test.cpp.)
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "tests/support/temp_dir.hpp"
#include "tools/troupectl/new_project.hpp"

using namespace troupe::ctl;
using troupe::testing::TempDir;
namespace fs = std::filesystem;

namespace {

// The entries of `dir` (a staging directory left behind would be one more).
std::size_t entries(const fs::path& dir) {
  return static_cast<std::size_t>(
      std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

}  // namespace

TEST_CASE("new project: names it takes and refuses") {
  CHECK(check_project_name("hello"));
  CHECK(check_project_name("my_models"));
  CHECK(check_project_name("my-models2"));
  CHECK(check_project_name(std::string(64, 'a')));
  for (const char* bad : {"", "2fast", "_x", "-x", "a b", "a/b", "a.b", "a#b", "test", "all"}) {
    INFO(bad);
    auto st = check_project_name(bad);
    CHECK_FALSE(st);
    CHECK(st.message().find("NAME \"" + std::string(bad) + "\"") == 0);
  }
  CHECK_FALSE(check_project_name(std::string(65, 'a')));
}

TEST_CASE("new project: the class name is the name in CamelCase") {
  CHECK(project_class_name("hello") == "Hello");
  CHECK(project_class_name("my_models") == "MyModels");
  CHECK(project_class_name("my-models_v2") == "MyModelsV2");
  CHECK(project_class_name("Already") == "Already");
}

TEST_CASE("new project: the starter's files name the project and its class") {
  auto files = starter_files("my_models");
  std::map<std::string, std::string> by_path;
  for (auto& f : files)
    by_path[f.path] = f.text;
  REQUIRE(by_path.count("CMakeLists.txt"));
  REQUIRE(by_path.count("src/my_models.hpp"));
  REQUIRE(by_path.count("src/my_models.cpp"));
  REQUIRE(by_path.count("test/my_models_test.cpp"));
  REQUIRE(by_path.count("config.yaml"));
  CHECK(by_path["CMakeLists.txt"].find("find_package(troupe REQUIRED)") != std::string::npos);
  CHECK(by_path["CMakeLists.txt"].find("troupe_add_deployment(my_models src/my_models.cpp)") !=
        std::string::npos);
  CHECK(by_path["src/my_models.cpp"].find("TROUPE_DEPLOYMENT(MyModels)") != std::string::npos);
  CHECK(by_path["test/my_models_test.cpp"].find("#include <troupe/testing.hpp>") !=
        std::string::npos);
  // The build of the project, uploaded by troupectl deploy.
  CHECK(by_path["config.yaml"].find("import_path: ./build/libmy_models.so:MyModels") !=
        std::string::npos);
  for (auto& [path, text] : by_path) {
    INFO(path);
    CHECK(text.find('@') == std::string::npos);  // every placeholder filled
  }
}

TEST_CASE("new project: written into DIR/NAME and never over a project") {
  TempDir tmp;
  const fs::path dir = tmp.path();
  auto written = write_starter_project("hello", dir.string());
  REQUIRE(written);
  CHECK(*written == (dir / "hello").string());
  CHECK(fs::exists(dir / "hello" / "CMakeLists.txt"));
  CHECK(fs::exists(dir / "hello" / "src" / "hello.cpp"));
  CHECK(entries(dir) == 1);  // no staging directory left

  // Again: refused, and the first project is untouched.
  std::ofstream(dir / "hello" / "src" / "hello.cpp") << "mine";
  auto again = write_starter_project("hello", dir.string());
  REQUIRE_FALSE(again);
  CHECK(again.status().message() ==
        "\"" + (dir / "hello").string() + "\" exists and is not an empty directory");
  std::ifstream in(dir / "hello" / "src" / "hello.cpp");
  std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(kept == "mine");
  CHECK(entries(dir) == 1);
}

TEST_CASE("new project: an empty directory of that name is filled") {
  TempDir tmp;
  const fs::path dir = tmp.path();
  fs::create_directory(dir / "empty");
  REQUIRE(write_starter_project("empty", dir.string()));
  CHECK(fs::exists(dir / "empty" / "config.yaml"));
}

TEST_CASE("new project: a file of that name or a missing dir is refused") {
  TempDir tmp;
  const fs::path dir = tmp.path();
  std::ofstream(dir / "taken") << "x";
  CHECK_FALSE(write_starter_project("taken", dir.string()));
  auto missing = write_starter_project("hello", (dir / "nope").string());
  REQUIRE_FALSE(missing);
  CHECK(missing.status().message().find("is not a directory") != std::string::npos);
  CHECK_FALSE(write_starter_project("bad name", dir.string()));
  CHECK(entries(dir) == 1);
}
