// How a controller incarnation starts: its snapshot epoch and replica id tag,
// and whom it waits for before it reconciles.
#include "controller/shell/startup.hpp"

#include <doctest/doctest.h>

#include "tests/support/temp_dir.hpp"

using namespace troupe;
using namespace troupe::controller;
using troupe::testing::TempDir;

namespace {

std::map<std::string, NodeRecord> alive(std::initializer_list<std::string> ids) {
  std::map<std::string, NodeRecord> out;
  for (const auto& id : ids) {
    NodeRecord r;
    r.id = id;
    out[id] = r;
  }
  return out;
}

}  // namespace

TEST_CASE("startup: an incarnation's replica ids carry the seed's top 24 bits") {
  Limits limits;
  limits.max_replicas_per_deployment = 7;
  auto o = incarnation_options(0xabcdef0123456789ull, limits);
  CHECK(o.replica_id_tag == "abcdef");
  CHECK(o.snapshot_epoch == 0xabcdef0123456789ull);  // odd already
  CHECK(o.limits.max_replicas_per_deployment == 7);
  // Leading zeros are kept: every tag has six digits.
  CHECK(incarnation_options(0x00000a0000000000ull, limits).replica_id_tag == "00000a");
  // Seeds that differ only below the top 24 bits share a tag, not an epoch.
  auto a = incarnation_options(0x1234560000000002ull, limits);
  auto b = incarnation_options(0x1234560000000004ull, limits);
  CHECK(a.replica_id_tag == b.replica_id_tag);
  CHECK(a.snapshot_epoch != b.snapshot_epoch);
}

TEST_CASE("startup: the snapshot epoch is never 0 - the id of \"nothing yet\"") {
  auto o = incarnation_options(0, Limits{});
  CHECK(o.snapshot_epoch == 1);
  CHECK(o.replica_id_tag == "000000");
  CHECK(incarnation_options(0x10, Limits{}).snapshot_epoch == 0x11);
}

TEST_CASE("startup: an empty checkpoint means nothing to wait for") {
  TempDir tmp;
  NodesFile file(tmp.path());
  REQUIRE(file.save(alive({"n1", "n2"})));
  Result<std::optional<TargetState>> empty = std::optional<TargetState>{};
  CHECK_FALSE(nodes_to_await(empty, file).has_value());
}

TEST_CASE("startup: a checkpoint to recover waits for the nodes alive before") {
  TempDir tmp;
  NodesFile file(tmp.path());
  REQUIRE(file.save(alive({"n1", "n2"})));
  TargetState saved;
  saved.generation = 3;
  Result<std::optional<TargetState>> loaded = std::optional<TargetState>{saved};
  auto nodes = nodes_to_await(loaded, file);
  REQUIRE(nodes.has_value());
  CHECK(*nodes == std::set<std::string>{"n1", "n2"});
  // No file (no state dir): nobody known, the window runs in full.
  auto unknown = nodes_to_await(loaded, NodesFile(""));
  REQUIRE(unknown.has_value());
  CHECK(unknown->empty());
}

TEST_CASE("startup: an unreadable checkpoint is recovered - not taken for an empty one") {
  TempDir tmp;
  NodesFile file(tmp.path());
  REQUIRE(file.save(alive({"n1"})));
  Result<std::optional<TargetState>> failed = Status(errc::corrupt, "checkpoint: bad record");
  auto nodes = nodes_to_await(failed, file);
  REQUIRE(nodes.has_value());
  CHECK(*nodes == std::set<std::string>{"n1"});
}
