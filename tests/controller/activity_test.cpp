// The dashboard's record of what happened: the newest events, and request
// rates from the counters replicas report, on an explicit clock.
#include "controller/shell/activity.hpp"

#include <doctest/doctest.h>

using namespace troupe::controller;

TEST_CASE("activity: events are kept newest first up to the capacity - with their age") {
  Activity a(3);
  a.record(1.0, "node", "n1", "node n1 joined");
  a.record(2.0, "deploy", "app", "deploy of app (generation 1)");
  a.record(3.0, "crash", "app#D#1", "replica app#D#1 went down: killed", true);
  a.record(4.0, "node", "n2", "node n2 joined");
  REQUIRE(a.events().size() == 3);
  CHECK(a.events().front().message == "deploy of app (generation 1)");  // the oldest went
  auto j = a.events_json(10.0, 2);
  REQUIRE(j.size() == 2);
  CHECK(j[0]["message"] == "node n2 joined");
  CHECK(j[0]["age_s"] == 6.0);
  CHECK(j[1]["kind"] == "crash");
  CHECK(j[1]["warn"] == true);
  CHECK(j[1]["subject"] == "app#D#1");
}

TEST_CASE("activity: a replica's rate is the growth of its counter between two reports") {
  Activity a;
  CHECK(a.rate("r1", 0) == 0);  // unknown
  a.count("r1", 100, 10.0);
  CHECK(a.rate("r1", 10.0) == 0);  // one report: no rate yet
  a.count("r1", 600, 20.0);
  CHECK(a.rate("r1", 20.0) == doctest::Approx(50.0));
  CHECK(a.rate("r1", 45.0) == doctest::Approx(50.0));
  // No report for longer than stale_s: no rate.
  CHECK(a.rate("r1", 51.0) == 0);
  // A counter that went down is a new process under the same id: it starts over.
  a.count("r1", 5, 30.0);
  CHECK(a.rate("r1", 30.0) == 0);
  a.count("r1", 25, 32.0);
  CHECK(a.rate("r1", 32.0) == doctest::Approx(10.0));
  a.count("r2", 1, 32.0);
  a.prune([](const std::string& id) { return id == "r2"; });
  CHECK(a.rate("r1", 32.0) == 0);
}
