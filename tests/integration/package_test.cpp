// Issue 21 parts 3 and 4, acceptance: a project made by `troupectl new`
// builds against an install prefix with find_package(troupe) and its own test
// (the in-process harness, troupe/testing.hpp) passes; `cpack -G DEB` builds
// the package, and what `dpkg-deb -x` unpacks holds the binaries, the headers,
// the CMake package and the systemd units. Everything under one temporary
// directory, removed at the end.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/process.hpp"

using namespace troupe::testing;
namespace fs = std::filesystem;

namespace {

// Runs a step and fails the test with its output when it fails.
RunResult step(const std::string& what, const std::vector<std::string>& argv,
               std::chrono::milliseconds timeout = 180s) {
  RunResult r = run(argv, timeout);
  MESSAGE(what << ": " << r.seconds << " s");
  INFO(what << " exited " << r.exit_code << "\nstdout:\n"
            << troupe::proc::tail_lines(r.out, 40) << "\nstderr:\n"
            << troupe::proc::tail_lines(r.err, 40));
  REQUIRE(r.exit_code == 0);
  return r;
}

}  // namespace

TEST_CASE("package: a troupectl new project builds against an install prefix and the deb holds the files") {
  TempDir tmp("troupe-package");
  const std::string prefix = tmp / "prefix";
  step("install", {TROUPE_CMAKE, "--install", TROUPE_BUILD_DIR, "--prefix", prefix, "--strip"});
  for (const char* f : {"bin/troupe-node", "bin/troupe-replica", "bin/troupectl",
                        "include/troupe/deployment.hpp", "include/troupe/testing.hpp",
                        "lib/cmake/troupe/troupeConfig.cmake"})
    CHECK_MESSAGE(fs::exists(prefix + "/" + f), f);

  // The installed node finds the installed example deployments by itself:
  // its default --plugin-path is the prefix's, never the build tree's.
  RunResult help = step("troupe-node --help", {prefix + "/bin/troupe-node", "--help"});
  CHECK_MESSAGE(help.out.find("(default: " + prefix + "/lib/troupe/plugins)") != std::string::npos,
                help.out);
  CHECK(help.out.find(TROUPE_BUILD_DIR) == std::string::npos);

  // The installed troupectl writes the project; it refuses to write it twice.
  step("troupectl new", {prefix + "/bin/troupectl", "new", "hello_app", "--dir", tmp.path()});
  RunResult again = run({prefix + "/bin/troupectl", "new", "hello_app", "--dir", tmp.path()}, 30s);
  CHECK(again.exit_code == 1);
  CHECK(again.err.find("exists and is not an empty directory") != std::string::npos);

  const std::string project = tmp / "hello_app";
  const std::string build = project + "/build";
  // -O0: the test is about the build working, and it compiles faster.
  step("configure the project",
       {TROUPE_CMAKE, "-S", project, "-B", build, "-G", TROUPE_GENERATOR,
        "-DCMAKE_PREFIX_PATH=" + prefix, "-DCMAKE_BUILD_TYPE=Debug",
        "-DCMAKE_CXX_COMPILER=" TROUPE_CXX_COMPILER});
  step("build the project", {TROUPE_CMAKE, "--build", build, "--parallel", "2"});
  CHECK(fs::exists(build + "/libhello_app.so"));
  RunResult tested =
      step("the project's test", {TROUPE_CTEST, "--test-dir", build, "--output-on-failure"});
  CHECK(tested.out.find("100% tests passed") != std::string::npos);

  // The package, as docs/packaging.md says (cpack in the build dir).
  step("cpack", {TROUPE_CPACK, "-G", "DEB", "--config", TROUPE_BUILD_DIR "/CPackConfig.cmake",
                 "-B", tmp / "pkg"});
  std::string deb;
  for (const auto& e : fs::directory_iterator(tmp / "pkg")) {
    if (e.path().extension() == ".deb")
      deb = e.path().string();
  }
  REQUIRE_MESSAGE(!deb.empty(), "no .deb in " << tmp / "pkg");
  CHECK(fs::path(deb).filename().string().rfind("troupe_", 0) == 0);
  RunResult depends = step("dpkg-deb -f", {TROUPE_DPKG_DEB, "-f", deb, "Depends"});
  CHECK(depends.out.find("nlohmann-json3-dev") != std::string::npos);
  CHECK(depends.out.find("libc6") != std::string::npos);  // dpkg-shlibdeps ran
  const std::string root = tmp / "root";
  step("dpkg-deb -x", {TROUPE_DPKG_DEB, "-x", deb, root});
  for (const char* f :
       {"usr/bin/troupe-node", "usr/bin/troupe-replica", "usr/bin/troupectl",
        "usr/include/troupe/deployment.hpp", "usr/include/troupe/testing.hpp",
        "usr/lib/cmake/troupe/troupeConfig.cmake", "usr/lib/cmake/troupe/troupeConfigVersion.cmake",
        "usr/lib/cmake/troupe/troupeTargets.cmake", "usr/lib/cmake/troupe/troupeDeployment.cmake",
        "usr/lib/systemd/system/troupe-head.service",
        "usr/lib/systemd/system/troupe-worker@.service", "usr/lib/troupe/troupe-wait-ready",
        "usr/lib/troupe/plugins/libtroupe_examples.so", "usr/share/troupe/demo.yaml"})
    CHECK_MESSAGE(fs::exists(root + "/" + f), f);
  // The units start the package's own binaries.
  const std::string head = troupe::proc::slurp(root + "/usr/lib/systemd/system/troupe-head.service");
  CHECK(head.find("ExecStart=/usr/bin/troupe-node --head") != std::string::npos);
  const std::string worker = troupe::proc::slurp(root + "/usr/lib/systemd/system/troupe-worker@.service");
  CHECK(worker.find("--node-id %i") != std::string::npos);
  // Its postinst makes the system user replica processes run as on a root
  // node (node/replica_user.hpp). Running it would change this machine's
  // users: it is checked to be an executable shell script that creates that
  // user.
  const std::string control = tmp / "control";
  step("dpkg-deb -e", {TROUPE_DPKG_DEB, "-e", deb, control});
  const std::string postinst = troupe::proc::slurp(control + "/postinst");
  CHECK(postinst.find("useradd --system") != std::string::npos);
  CHECK(postinst.find("troupe-replica") != std::string::npos);
  CHECK((fs::status(control + "/postinst").permissions() & fs::perms::owner_exec) !=
        fs::perms::none);
  CHECK(run({"/bin/sh", "-n", control + "/postinst"}, 10s).exit_code == 0);
}
