// node/replica_user.hpp: who replica processes run as, and what of the
// node's files that user could reach, judged from modes and owners (the
// real switch: tests/integration/replica_user_test.cpp).
#include <sys/stat.h>

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "node/replica_user.hpp"
#include "tests/support/temp_dir.hpp"

using namespace troupe;
using namespace troupe::node;
namespace fs = std::filesystem;

namespace {

// Users by name, as getpwnam would answer.
UserLookup users(std::map<std::string, RunAs> known) {
  return [known](const std::string& name) -> std::optional<RunAs> {
    auto it = known.find(name);
    if (it == known.end())
      return std::nullopt;
    return it->second;
  };
}

const RunAs kReplica{"troupe-replica", 990, 990};
const RunAs kAlice{"alice", 1000, 1000};

}  // namespace

TEST_CASE("replica user: a root node runs replicas as troupe-replica when it exists - else as itself with a warning") {
  std::string warning;
  auto chosen = choose_replica_user("", 0, true, users({{"troupe-replica", kReplica}}), warning);
  REQUIRE(chosen.has_value());
  REQUIRE(chosen.value().has_value());
  CHECK(chosen.value()->uid == 990);
  CHECK(warning.empty());

  chosen = choose_replica_user("", 0, true, users({}), warning);
  REQUIRE(chosen.has_value());
  CHECK_FALSE(chosen.value().has_value());
  CHECK(warning.find("replica processes run as root") != std::string::npos);
  CHECK(warning.find("no user 'troupe-replica'") != std::string::npos);
}

TEST_CASE("replica user: a node that is not root and names no user runs replicas as itself - as before") {
  std::string warning;
  auto chosen = choose_replica_user("", 1000, false, users({{"troupe-replica", kReplica}}), warning);
  REQUIRE(chosen.has_value());
  CHECK_FALSE(chosen.value().has_value());
  CHECK(warning.empty());
}

TEST_CASE("replica user: --replica-user names a user that must exist and that the node can switch to") {
  std::string warning;
  auto known = users({{"troupe-replica", kReplica}, {"alice", kAlice}});
  auto chosen = choose_replica_user("alice", 0, true, known, warning);
  REQUIRE(chosen.has_value());
  REQUIRE(chosen.value().has_value());
  CHECK(chosen.value()->name == "alice");

  auto missing = choose_replica_user("bob", 0, true, known, warning);
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.status().message() == "--replica-user bob: no such user");

  auto cannot = choose_replica_user("troupe-replica", 1000, false, known, warning);
  REQUIRE_FALSE(cannot.has_value());
  CHECK(cannot.status().message().find("cannot start processes as another user") !=
        std::string::npos);
  // Its own user: nothing to switch.
  auto own = choose_replica_user("alice", 1000, false, known, warning);
  REQUIRE(own.has_value());
  CHECK_FALSE(own.value().has_value());
  // A node with CAP_SETUID and CAP_SETGID, not root, may switch.
  auto capable = choose_replica_user("troupe-replica", 1000, true, known, warning);
  REQUIRE(capable.has_value());
  CHECK(capable.value().has_value());
}

TEST_CASE("replica user: reach is judged from every directory on the way and the file's own mode") {
  testing::TempDir dir("troupe-reach");
  ::chmod(dir.path().c_str(), 0755);
  fs::create_directories(dir / "open/inner");
  fs::create_directories(dir / "closed/inner");
  ::chmod((dir / "open").c_str(), 0755);
  ::chmod((dir / "open/inner").c_str(), 0755);
  ::chmod((dir / "closed").c_str(), 0700);
  std::ofstream(dir / "open/inner/lib.so") << "x";
  ::chmod((dir / "open/inner/lib.so").c_str(), 0644);
  std::ofstream(dir / "open/inner/node.key") << "secret";
  ::chmod((dir / "open/inner/node.key").c_str(), 0600);
  std::ofstream(dir / "closed/inner/loose.key") << "secret";
  ::chmod((dir / "closed/inner/loose.key").c_str(), 0644);

  // The files belong to this test's user (root in the suite), not to the
  // replica user: the "other" bits apply to it.
  CHECK(reachable_by(dir / "open/inner", kReplica).is_ok());
  CHECK(reachable_by(dir / "open/inner/lib.so", kReplica).is_ok());
  auto blocked = reachable_by(dir / "closed/inner", kReplica);
  REQUIRE_FALSE(blocked.is_ok());
  CHECK(blocked.message().find("user troupe-replica (uid 990) cannot search " + (dir / "closed") +
                               " (mode 0700") != std::string::npos);
  auto unreadable = reachable_by(dir / "open/inner/node.key", kReplica);
  REQUIRE_FALSE(unreadable.is_ok());
  CHECK(unreadable.message().find("cannot read " + (dir / "open/inner/node.key")) !=
        std::string::npos);

  CHECK(unreadable_by(dir / "open/inner/node.key", kReplica).is_ok());
  // 0644, but in a directory it cannot search: out of reach as well.
  CHECK(unreadable_by(dir / "closed/inner/loose.key", kReplica).is_ok());
  ::chmod((dir / "open/inner/node.key").c_str(), 0640);
  CHECK(unreadable_by(dir / "open/inner/node.key", kReplica).is_ok());
  ::chmod((dir / "open/inner/node.key").c_str(), 0644);
  auto readable = unreadable_by(dir / "open/inner/node.key", kReplica);
  REQUIRE_FALSE(readable.is_ok());
  CHECK(readable.message().find("is readable by user troupe-replica (uid 990) (mode 0644") !=
        std::string::npos);
}
