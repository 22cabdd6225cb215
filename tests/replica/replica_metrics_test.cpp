// A replica's metrics (replica/replica_metrics.hpp) and the registry they
// live in (runtime/metrics.hpp): the series and their labels, user metrics
// through the MetricsSink a ReplicaContext carries, refusals, the removal of
// every series when the last holder lets go, and a replica process's report
// served by its node (encode, set_remote, render).
#include <doctest/doctest.h>

#include <memory>
#include <stdexcept>
#include <string>

#include <troupe/deployment.hpp>

#include "replica/replica_metrics.hpp"
#include "runtime/metrics.hpp"

using namespace troupe;
using troupe::replica::ReplicaMetrics;

namespace {

bool has(const std::string& text, const std::string& line) {
  return text.find(line) != std::string::npos;
}

const char* kLabels = "application=\"shop\",deployment=\"Cart\",replica=\"shop#Cart#1\"";

}  // namespace

TEST_CASE("replica metrics: requests - errors - processing time and health - with the replica's labels") {
  auto registry = std::make_shared<metrics::Registry>();
  auto m = ReplicaMetrics::make(registry, "shop", "Cart", "shop#Cart#1");
  m->started();
  m->started();
  std::string text = registry->render();
  CHECK(has(text, std::string("troupe_replica_processing_requests{") + kLabels + "} 2"));
  m->finished(false, 0.002);
  m->finished(true, 0.2);
  m->health(false, 0.01);
  text = registry->render();
  CHECK(has(text, std::string("troupe_replica_processing_requests{") + kLabels + "} 0"));
  CHECK(has(text, std::string("troupe_deployment_requests_total{") + kLabels + "} 2"));
  CHECK(has(text, std::string("troupe_deployment_errors_total{") + kLabels + "} 1"));
  CHECK(has(text, std::string("troupe_deployment_processing_duration_seconds_count{") + kLabels +
                      "} 2"));
  CHECK(has(text, std::string("troupe_deployment_processing_duration_seconds_bucket{") + kLabels +
                      ",le=\"0.0025\"} 1"));
  CHECK(has(text, std::string("troupe_replica_healthy{") + kLabels + "} 0"));
  CHECK(has(text, std::string("troupe_health_check_duration_seconds_count{") + kLabels + "} 1"));
  m->set_healthy(true);
  CHECK(has(registry->render(), std::string("troupe_replica_healthy{") + kLabels + "} 1"));
}

TEST_CASE("replica metrics: a user counter - gauge and histogram carry the replica's labels and their own") {
  auto registry = std::make_shared<metrics::Registry>();
  auto m = ReplicaMetrics::make(registry, "shop", "Cart", "shop#Cart#1");
  ReplicaContext ctx{"shop", "Cart", "shop#Cart#1", "n1", "v1", nullptr};
  ctx.metrics = m->user_sink();
  auto hits = ctx.counter("cart_hits_total", "Hits.", {{"kind", "warm"}});
  hits->inc();
  hits->inc(2.5);
  hits->inc(-1);  // ignored
  CHECK(hits->value() == doctest::Approx(3.5));
  // The same name and labels: the same counter.
  CHECK(ctx.counter("cart_hits_total", "Hits.", {{"kind", "warm"}}) == hits);
  auto items = ctx.gauge("cart_items", "Items.");
  items->set(7);
  items->dec();
  auto sizes = ctx.histogram("cart_size", "Sizes.", {1, 10});
  sizes->observe(5);
  std::string text = registry->render();
  CHECK(has(text, "# TYPE cart_hits_total counter"));
  // Labels in name order.
  CHECK(has(text, "cart_hits_total{application=\"shop\",deployment=\"Cart\",kind=\"warm\","
                  "replica=\"shop#Cart#1\"} 3.5"));
  CHECK(has(text, std::string("cart_items{") + kLabels + "} 6"));
  CHECK(has(text, std::string("cart_size_bucket{") + kLabels + ",le=\"10\"} 1"));
}

TEST_CASE("replica metrics: bad names - reserved labels and a name of another type are refused") {
  auto registry = std::make_shared<metrics::Registry>();
  auto m = ReplicaMetrics::make(registry, "shop", "Cart", "shop#Cart#1");
  ReplicaContext ctx{"shop", "Cart", "shop#Cart#1", "n1", "v1", nullptr};
  ctx.metrics = m->user_sink();
  CHECK_THROWS_WITH_AS(ctx.counter("9lives", "x"), "'9lives' is not a valid Prometheus metric name",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(ctx.counter("a-b", "x"), "'a-b' is not a valid Prometheus metric name",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(ctx.counter("ok_total", "x", {{"replica", "mine"}}),
                       "the label 'replica' is set by troupe: a user metric cannot set it",
                       std::invalid_argument);
  ctx.counter("taken", "x");
  CHECK_THROWS_WITH_AS(ctx.gauge("taken", "x"), "the metric 'taken' exists with another type",
                       std::invalid_argument);
  CHECK_THROWS_AS(ctx.histogram("sizes", "x", {10, 1}), std::invalid_argument);
  // Another deployment of the same process took the name as a gauge.
  auto other = ReplicaMetrics::make(registry, "shop", "Other", "shop#Other#1");
  other->user_sink()->gauge("shared_name", "x", {});
  CHECK_THROWS_AS(ctx.counter("shared_name", "x"), std::invalid_argument);
  // Nothing half-made: the registry still renders.
  CHECK(has(registry->render(), "troupe_deployment_requests_total"));
}

TEST_CASE("replica metrics: the series go when the replica and every user metric are gone") {
  auto registry = std::make_shared<metrics::Registry>();
  auto m = ReplicaMetrics::make(registry, "shop", "Cart", "shop#Cart#1");
  auto keep = ReplicaMetrics::make(registry, "shop", "Cart", "shop#Cart#2");
  auto sink = m->user_sink();
  auto hits = sink->counter("cart_hits_total", "Hits.", {});
  hits->inc();
  m.reset();
  // A user object may outlive the replica's actor: its counter still works.
  hits->inc();
  CHECK(has(registry->render(), "replica=\"shop#Cart#1\""));
  hits.reset();
  std::string text = registry->render();
  CHECK_FALSE(has(text, "replica=\"shop#Cart#1\""));
  CHECK(has(text, "troupe_deployment_requests_total{application=\"shop\",deployment=\"Cart\","
                  "replica=\"shop#Cart#2\"} 0"));
  // The sink of a replica that is gone makes nothing.
  CHECK_THROWS_AS(sink->counter("late_total", "x", {}), std::logic_error);
}

TEST_CASE("metrics registry: a replica process's report is served with the node's own - merged by family") {
  auto process = std::make_shared<metrics::Registry>();
  auto m = ReplicaMetrics::make(process, "shop", "Cart", "shop#Cart#9");
  m->started();
  m->finished(false, 0.004);
  m->user_sink()->counter("cart_hits_total", "Hits.", {})->inc(4);

  auto node = std::make_shared<metrics::Registry>();
  auto local = ReplicaMetrics::make(node, "shop", "Cart", "shop#Cart#1");
  local->finished(true, 0.5);
  REQUIRE(node->set_remote("shop#Cart#9", process->encode()).is_ok());
  CHECK(node->remote_sources() == 1);
  std::string text = node->render();
  // One family, both replicas' series.
  size_t type_lines = 0;
  for (size_t at = 0; (at = text.find("# TYPE troupe_deployment_requests_total ", at)) !=
                      std::string::npos;
       ++at)
    ++type_lines;
  CHECK(type_lines == 1);
  CHECK(has(text, "troupe_deployment_requests_total{application=\"shop\",deployment=\"Cart\","
                  "replica=\"shop#Cart#1\"} 1"));
  CHECK(has(text, "troupe_deployment_requests_total{application=\"shop\",deployment=\"Cart\","
                  "replica=\"shop#Cart#9\"} 1"));
  CHECK(has(text, "troupe_deployment_processing_duration_seconds_bucket{application=\"shop\","
                  "deployment=\"Cart\",replica=\"shop#Cart#9\",le=\"0.005\"} 1"));
  CHECK(has(text, "cart_hits_total{application=\"shop\",deployment=\"Cart\","
                  "replica=\"shop#Cart#9\"} 4"));

  // A report that does not decode is refused and the last one kept.
  auto bad = node->set_remote("shop#Cart#9", "not a report");
  CHECK_FALSE(bad.is_ok());
  CHECK(has(bad.message(), "metrics report"));
  CHECK(has(node->render(), "replica=\"shop#Cart#9\""));
  node->drop_remote("shop#Cart#9");
  CHECK(node->remote_sources() == 0);
  CHECK_FALSE(has(node->render(), "replica=\"shop#Cart#9\""));
}

TEST_CASE("replica context without a runtime: user metrics work and are kept in the context") {
  ReplicaContext ctx{"shop", "Cart", "shop#Cart#1", "n1", "v1", nullptr};
  auto hits = ctx.counter("hits_total", "Hits.");
  hits->inc();
  ReplicaContext copy = ctx;
  CHECK(copy.counter("hits_total", "Hits.")->value() == 1);
  CHECK_THROWS_AS(ctx.gauge("hits_total", "x"), std::invalid_argument);
  CHECK_THROWS_AS(ctx.counter("bad name", "x"), std::invalid_argument);
}
