// node/replica_reports.hpp: what a node's replicas report, gathered into
// one message per node.
#include <doctest/doctest.h>

#include "node/replica_reports.hpp"

using troupe::ReplicaLoad;
using troupe::ReplicaModels;
using troupe::node::ReplicaReports;

TEST_CASE("replica reports: loads go out in the order they came - several of one replica too") {
  ReplicaReports r;
  CHECK(r.take_loads().empty());
  r.add_load(ReplicaLoad{"a#D#1", 1.5, 10});
  r.add_load(ReplicaLoad{"a#D#2", 0.5, 20});
  r.add_load(ReplicaLoad{"a#D#1", 2.5, 30});
  CHECK(r.pending_loads() == 3);
  auto loads = r.take_loads();
  REQUIRE(loads.size() == 3);
  CHECK(loads[0].replica_id == "a#D#1");
  CHECK(loads[0].ongoing == 1.5);
  CHECK(loads[1].replica_id == "a#D#2");
  CHECK(loads[2].replica_id == "a#D#1");
  CHECK(loads[2].finished == 30);
  // Taken means gone: the next heartbeat carries only what came after.
  CHECK(r.pending_loads() == 0);
  CHECK(r.take_loads().empty());
  r.add_load(ReplicaLoad{"a#D#3", 0, 1});
  loads = r.take_loads();
  REQUIRE(loads.size() == 1);
  CHECK(loads[0].replica_id == "a#D#3");
}

TEST_CASE("replica reports: past the bound the oldest loads are dropped and counted") {
  ReplicaReports r;
  const size_t extra = 7;
  for (size_t i = 0; i < ReplicaReports::kMaxLoads + extra; ++i)
    r.add_load(ReplicaLoad{"r" + std::to_string(i), 0, i});
  CHECK(r.pending_loads() == ReplicaReports::kMaxLoads);
  CHECK(r.dropped_loads() == extra);
  auto loads = r.take_loads();
  REQUIRE(loads.size() == ReplicaReports::kMaxLoads);
  CHECK(loads.front().finished == extra);
  CHECK(loads.back().finished == ReplicaReports::kMaxLoads + extra - 1);
  size_t out_of_order = 0;
  for (size_t i = 1; i < loads.size(); ++i)
    out_of_order += loads[i].finished != loads[i - 1].finished + 1;
  CHECK(out_of_order == 0);
  CHECK(r.pending_loads() == 0);
  // It keeps working after a take.
  r.add_load(ReplicaLoad{"x", 0, 99});
  CHECK(r.take_loads().at(0).finished == 99);
}

TEST_CASE(
    "replica reports: model lists - one per replica - the newest kept - the first starts the "
    "window") {
  ReplicaReports r;
  CHECK(r.add_models(ReplicaModels{"a#D#1", 3, {"m1"}}));
  // Others join the window that is open.
  CHECK_FALSE(r.add_models(ReplicaModels{"a#D#2", 1, {"m2"}}));
  CHECK_FALSE(r.add_models(ReplicaModels{"a#D#1", 4, {"m1", "m3"}}));
  // An older list of a replica (reordered) does not replace a newer one.
  CHECK_FALSE(r.add_models(ReplicaModels{"a#D#1", 2, {"old"}}));
  CHECK(r.pending_models() == 2);
  auto lists = r.take_models();
  REQUIRE(lists.size() == 2);
  CHECK(lists[0].replica_id == "a#D#1");
  CHECK(lists[0].seq == 4);
  CHECK(lists[0].model_ids == std::vector<std::string>{"m1", "m3"});
  CHECK(lists[1].replica_id == "a#D#2");
  CHECK(lists[1].model_ids == std::vector<std::string>{"m2"});
  CHECK(r.pending_models() == 0);
  CHECK(r.take_models().empty());
  // A list after the take opens the next window.
  CHECK(r.add_models(ReplicaModels{"a#D#2", 2, {}}));
}
