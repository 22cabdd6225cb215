// The dashboard's record of what happened: the newest events, request and
// error rates from the counters replicas report with the rest of their load,
// and each deployment's restarts, on an explicit clock.
#include "controller/shell/activity.hpp"

#include <doctest/doctest.h>

using namespace troupe::controller;
using troupe::ReplicaLoad;

namespace {

ReplicaLoad finished(const std::string& id, uint64_t n) {
  ReplicaLoad load;
  load.replica_id = id;
  load.finished = n;
  return load;
}

}  // namespace

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
  a.report(finished("r1", 100), 10.0);
  CHECK(a.rate("r1", 10.0) == 0);  // one report: no rate yet
  a.report(finished("r1", 600), 20.0);
  CHECK(a.rate("r1", 20.0) == doctest::Approx(50.0));
  CHECK(a.rate("r1", 45.0) == doctest::Approx(50.0));
  // No report for longer than stale_s: no rate.
  CHECK(a.rate("r1", 51.0) == 0);
  // A counter that went down is a new process under the same id: it starts over.
  a.report(finished("r1", 5), 30.0);
  CHECK(a.rate("r1", 30.0) == 0);
  a.report(finished("r1", 25), 32.0);
  CHECK(a.rate("r1", 32.0) == doctest::Approx(10.0));
  a.report(finished("r2", 1), 32.0);
  a.prune([](const std::string& id) { return id == "r2"; });
  CHECK(a.rate("r1", 32.0) == 0);
}

TEST_CASE("activity: errors per second - requests and streams in progress - the p99 - as the last report says") {
  Activity a;
  CHECK_FALSE(a.load("r1", 0).has_value());
  a.report(ReplicaLoad{"r1", 2.5, 100, 10, 1, 0.004}, 10.0);
  auto l = a.load("r1", 10.0);
  REQUIRE(l.has_value());
  CHECK(l->errors_per_s == 0);  // one report: no rate yet
  CHECK(l->in_flight == 2.5);
  CHECK(l->streams == 1);
  CHECK(l->p99_s == 0.004);
  a.report(ReplicaLoad{"r1", 0.5, 300, 30, 0, -1}, 12.0);
  l = a.load("r1", 12.0);
  REQUIRE(l.has_value());
  CHECK(l->requests_per_s == doctest::Approx(100.0));
  CHECK(l->errors_per_s == doctest::Approx(10.0));
  CHECK(l->in_flight == 0.5);
  CHECK(l->streams == 0);
  CHECK(l->p99_s < 0);  // nothing finished in that interval
  CHECK_FALSE(a.load("r1", 43.0).has_value());  // stale
  // An error count that went down is a new process: both rates start over.
  a.report(ReplicaLoad{"r1", 0, 400, 2, 0, 0.001}, 14.0);
  CHECK(a.load("r1", 14.0)->errors_per_s == 0);
  CHECK(a.load("r1", 14.0)->requests_per_s == 0);
}

TEST_CASE("activity: each crash counts as a restart of its replica's deployment") {
  Activity a(2);
  CHECK(a.restarts("shop", "Cart") == 0);
  a.record(1.0, "crash", "shop#Cart#1", "replica shop#Cart#1 went down: killed", true);
  a.record(2.0, "crash", "shop#Cart#4", "replica shop#Cart#4 went down: SIGSEGV", true);
  a.record(3.0, "crash", "shop#Pay#2", "replica shop#Pay#2 went down: killed", true);
  a.record(4.0, "status", "shop/Cart", "deployment shop/Cart: HEALTHY -> UNHEALTHY", true);
  a.record(5.0, "crash", "not-a-replica", "went down", true);
  // Counted apart from the events, which keep only the newest two.
  CHECK(a.restarts("shop", "Cart") == 2);
  CHECK(a.restarts("shop", "Pay") == 1);
  CHECK(a.restarts("shop", "Other") == 0);
}
