// Autoscaling on ongoing requests: the policy and the metrics window alone,
// then through the state manager with fake replicas and a fake clock (1 s per
// tick; answers to a tick's commands arrive at the next tick).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "controller/core/autoscaling.hpp"
#include "tests/controller/fakes.hpp"

using namespace troupe;
using namespace troupe::controller;
using namespace troupe::controller::testing;
using V = std::vector<std::string>;

namespace {

AutoscalingConfig bounded(uint32_t min, uint32_t max) {
  AutoscalingConfig a;
  a.min_replicas = min;
  a.max_replicas = max;
  return a;
}

AutoscalingInput input(double now, double total, uint32_t running, uint32_t current, uint32_t lower,
                       uint32_t upper) {
  AutoscalingInput in;
  in.now = now;
  in.total_ongoing = total;
  in.running = running;
  in.current = current;
  in.lower = lower;
  in.upper = upper;
  return in;
}

bool all_running(const std::string&) {
  return true;
}

const DeploymentId kD{"a", "D"};

DeploymentSpec autoscaled(const AutoscalingConfig& a, const std::string& code = "v1") {
  DeploymentSpec d = make_deployment("D", 1, code);
  d.config.autoscaling_config = a;
  return d;
}

void deploy(Harness& h, const DeploymentSpec& d) {
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {d})).has_value());
}

void expect_status(Harness& h, DeploymentStatus s, DeploymentTrigger t) {
  auto st = h.status("a", "D");
  CHECK(to_string(st.status) == std::string(to_string(s)));
  CHECK(to_string(st.trigger) == std::string(to_string(t)));
}

V starts_and_stops(V ops) {
  return without_nodes(std::move(ops));
}

// A load on a/D: `total` ongoing requests spread evenly over its RUNNING
// replicas, each of which reports every `interval` seconds (at multiples of
// it); every handle in `handles` reports its queued + in-flight count at the
// same moments. Each tick advances the clock by 1 s, reports when due, then
// runs the core's tick.
struct Load {
  Harness& h;
  double total = 0;
  double interval = 10;
  std::map<std::string, double> handles = {};

  void report() {
    V running;
    for (const auto& r : h.core->replicas(kD)) {
      if (r.state == ReplicaState::running)
        running.push_back(r.id);
    }
    for (const auto& id : running)
      h.core->record_replica_metrics(id, total / static_cast<double>(running.size()));
    for (const auto& [reporter, n] : handles)
      h.core->record_handle_metrics(reporter, kD, n);
  }

  V tick() {
    h.clock.advance(1);
    if (std::fmod(h.clock.now_s(), interval) == 0)
      report();
    return starts_and_stops(h.tick(0));
  }

  // Ticks until the clock reads `t`; returns the commands of all those ticks.
  V until(double t) {
    V all;
    while (h.clock.now_s() < t) {
      V v = tick();

      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  }
};

const AutoscalingDecision& last_decision(Harness& h) {
  const DeploymentState* d = h.core->deployment(kD);
  REQUIRE(d != nullptr);
  REQUIRE(d->last_decision().has_value());
  return *d->last_decision();
}

std::size_t running(Harness& h) {
  return h.count("a", "D", ReplicaState::running);
}

}  // namespace

// ================================================================ metrics

TEST_CASE("autoscaling metrics: each reporter is averaged over look_back_period_s - then summed") {
  OngoingRequestMetrics m(30);
  m.record_replica("r1", 2, 0);
  m.record_replica("r1", 4, 10);
  m.record_replica("r1", 6, 20);
  m.record_replica("r2", 10, 20);
  CHECK(m.replica_total(20) == 4 + 10);
  // At 35 the window is [5, 35]: r1's sample at 0 is out.
  CHECK(m.replica_total(35) == 5 + 10);
  // The window includes its start: at 50 the samples at 20 still count ...
  CHECK(m.replica_total(50) == 6 + 10);
  // ... at 50.5 nothing does: both stopped reporting.
  CHECK(m.replica_total(50.5) == 0);
  CHECK(m.replica_reporters() == 2);
  m.prune(50.5, all_running);
  CHECK(m.replica_reporters() == 0);
  // Negative reports count as 0.
  m.record_replica("r3", -4, 60);
  CHECK(m.replica_total(60) == 0);
}

TEST_CASE("autoscaling metrics: old samples are dropped as new ones arrive") {
  OngoingRequestMetrics m(30);
  for (int t = 0; t <= 1000; t += 10)
    m.record_handle("proxy", t, t);
  // Only 970, 980, 990 and 1000 are left.
  CHECK(m.handle_total(1000) == (970 + 980 + 990 + 1000) / 4.0);
  m.set_look_back_s(10);
  CHECK(m.handle_total(1000) == (990 + 1000) / 2.0);
}

TEST_CASE("autoscaling metrics: replicas that are no longer RUNNING are dropped at once") {
  OngoingRequestMetrics m(30);
  m.record_replica("a#D#1", 5, 0);
  m.record_replica("a#D#2", 7, 0);
  m.prune(1, [](const std::string& id) { return id != "a#D#1"; });
  CHECK(m.replica_reporters() == 1);
  CHECK(m.replica_total(1) == 7);
}

TEST_CASE("autoscaling metrics: the total is the larger of the replicas' and the handles' sums") {
  OngoingRequestMetrics m(30);
  // Three saturated replicas run 5 requests each; the proxy queues 25 more in
  // front of them: it reports 40 (in flight and queued).
  for (const char* r : {"r1", "r2", "r3"})
    m.record_replica(r, 5, 0);
  m.record_handle("proxy", 40, 0);
  CHECK(m.total(0) == 40);
  m.record_handle("proxy", 6, 1);
  CHECK(m.total(1) == 23);  // the proxy's mean (40 + 6) / 2 is above the replicas' 15
  // Callers that do not report (a deployment calling another through an
  // unreported handle): the replicas see more than the handles.
  m.record_handle("proxy", 0, 31);
  m.record_replica("r1", 5, 31);
  CHECK(m.total(31) == 5);  // proxy (6 + 0) / 2 = 3 < r1's 5 (r2, r3 are stale)
}

// ================================================================ policy

TEST_CASE("autoscaling policy: a steady load keeps the target") {
  AutoscalingPolicy p(bounded(1, 10));
  for (double t = 0; t <= 3600; t += 10) {
    auto d = p.decide(input(t, 6.0, 3, 3, 1, 10));
    CHECK(d.desired == 3);
    CHECK(d.direction == ScaleDirection::none);
    CHECK_FALSE(d.apply);
  }
  CHECK(p.pending() == ScaleDirection::none);
}

TEST_CASE("autoscaling policy: a step up applies after upscale_delay_s - exactly at it") {
  AutoscalingPolicy p(bounded(1, 20));  // upscale_delay_s = 30
  auto d = p.decide(input(100, 24.0, 3, 3, 1, 20));
  CHECK(d.desired == 12);
  CHECK(d.proposed == 12);
  CHECK(d.direction == ScaleDirection::up);
  CHECK(d.since == 100);
  CHECK(d.due_at == 130);
  CHECK_FALSE(d.apply);
  CHECK_FALSE(p.decide(input(129.9, 24.0, 3, 3, 1, 20)).apply);
  d = p.decide(input(130, 24.0, 3, 3, 1, 20));
  CHECK(d.apply);
  CHECK(d.proposed == 12);
  // Applied: the target is now 12 and the load asks for nothing more.
  d = p.decide(input(131, 24.0, 3, 12, 1, 20));
  CHECK(d.direction == ScaleDirection::none);
  CHECK(p.pending() == ScaleDirection::none);
}

TEST_CASE("autoscaling policy: a step down applies after downscale_delay_s - exactly at it") {
  AutoscalingPolicy p(bounded(1, 20));  // downscale_delay_s = 600
  auto d = p.decide(input(0, 3.0, 12, 12, 1, 20));
  CHECK(d.desired == 2);
  CHECK(d.direction == ScaleDirection::down);
  CHECK(d.due_at == 600);
  for (double t = 1; t < 600; t += 1)
    CHECK_FALSE(p.decide(input(t, 3.0, 12, 12, 1, 20)).apply);
  d = p.decide(input(600, 3.0, 12, 12, 1, 20));
  CHECK(d.apply);
  CHECK(d.proposed == 2);
}

TEST_CASE("autoscaling policy: the delay restarts unless the decision held continuously") {
  AutoscalingConfig a = bounded(1, 20);
  a.upscale_delay_s = 30;
  a.downscale_delay_s = 60;
  AutoscalingPolicy p(a);
  CHECK(p.decide(input(0, 24.0, 3, 3, 1, 20)).since == 0);
  // The load falls back for one evaluation: the pending upscale is forgotten.
  CHECK(p.decide(input(20, 6.0, 3, 3, 1, 20)).direction == ScaleDirection::none);
  CHECK(p.pending() == ScaleDirection::none);
  auto d = p.decide(input(25, 24.0, 3, 3, 1, 20));
  CHECK(d.since == 25);
  CHECK_FALSE(p.decide(input(30, 24.0, 3, 3, 1, 20)).apply);  // 30 s after the first
  // Flipping to the other direction restarts too.
  d = p.decide(input(40, 2.0, 3, 3, 1, 20));
  CHECK(d.direction == ScaleDirection::down);
  CHECK(d.since == 40);
  CHECK(d.due_at == 100);
  d = p.decide(input(50, 24.0, 3, 3, 1, 20));
  CHECK(d.since == 50);
  CHECK_FALSE(p.decide(input(79, 24.0, 3, 3, 1, 20)).apply);
  CHECK(p.decide(input(80, 24.0, 3, 3, 1, 20)).apply);
  // After applying, the next move waits a full delay again.
  d = p.decide(input(81, 40.0, 12, 12, 1, 20));
  CHECK(d.since == 81);
  CHECK_FALSE(d.apply);
  // reset() (a new config) forgets what pends.
  p.reset(a);
  CHECK(p.pending() == ScaleDirection::none);
  CHECK(p.decide(input(90, 40.0, 12, 12, 1, 20)).since == 90);
}

TEST_CASE("autoscaling policy: zero delays apply at once") {
  AutoscalingConfig a = bounded(1, 20);
  a.upscale_delay_s = 0;
  a.downscale_delay_s = 0;
  AutoscalingPolicy p(a);
  auto d = p.decide(input(7, 24.0, 3, 3, 1, 20));
  CHECK(d.apply);
  CHECK(d.proposed == 12);
  d = p.decide(input(8, 4.0, 12, 12, 1, 20));
  CHECK(d.apply);
  CHECK(d.proposed == 2);
}

TEST_CASE("autoscaling policy: smoothing moves a fraction of the way - rounding away from current") {
  AutoscalingConfig a = bounded(0, 20);
  a.upscale_delay_s = 0;
  a.downscale_delay_s = 0;
  a.upscale_smoothing_factor = 0.5;
  a.downscale_smoothing_factor = 0.5;
  AutoscalingPolicy p(a);
  // Up: 20 requests want 10. 2 -> 6 -> 8 -> 9 -> 10 (9.5 rounds up).
  std::vector<uint32_t> path = {2};
  while (path.back() != 10 && path.size() < 10) {
    auto d = p.decide(input(0, 20.0, path.back(), path.back(), 0, 20));
    REQUIRE(d.apply);
    CHECK(d.factor == 0.5);
    path.push_back(d.proposed);
  }
  CHECK(path == std::vector<uint32_t>{2, 6, 8, 9, 10});
  // Down: no load wants 0. 10 -> 5 -> 2 -> 1 -> 0 (floors reach zero).
  path = {10};
  while (path.back() != 0 && path.size() < 10) {
    auto d = p.decide(input(0, 0.0, path.back(), path.back(), 0, 20));
    REQUIRE(d.apply);
    path.push_back(d.proposed);
  }
  CHECK(path == std::vector<uint32_t>{10, 5, 2, 1, 0});

  // A factor above 1 never goes beyond what the load wants.
  a.upscale_smoothing_factor = 3.0;
  a.downscale_smoothing_factor = 3.0;
  p.reset(a);
  CHECK(p.decide(input(0, 8.0, 2, 2, 0, 20)).proposed == 4);  // 2 + 2 * 3 = 8 -> 4
  CHECK(p.decide(input(0, 2.0, 8, 8, 0, 20)).proposed == 1);  // 8 - 7 * 3 < 0 -> 1

  // Without the specific factors, smoothing_factor applies both ways.
  AutoscalingConfig b = bounded(0, 20);
  b.upscale_delay_s = 0;
  b.downscale_delay_s = 0;
  b.smoothing_factor = 0.25;
  AutoscalingPolicy q(b);
  CHECK(q.decide(input(0, 40.0, 4, 4, 0, 20)).proposed == 8);  // 4 + 16 / 4
  CHECK(q.decide(input(0, 0.0, 8, 8, 0, 20)).proposed == 6);   // 8 - 8 / 4
}

TEST_CASE("autoscaling policy: the target stays within [min - max]") {
  AutoscalingConfig a = bounded(2, 6);
  a.upscale_delay_s = 0;
  a.downscale_delay_s = 0;
  AutoscalingPolicy p(a);
  auto d = p.decide(input(0, 24.0, 3, 3, 2, 6));
  CHECK(d.desired == 12);
  CHECK(d.smoothed == 12);
  CHECK(d.proposed == 6);
  d = p.decide(input(1, 0.0, 6, 6, 2, 6));
  CHECK(d.desired == 0);
  CHECK(d.proposed == 2);
  // At a bound, a load pushing beyond it decides nothing.
  d = p.decide(input(2, 100.0, 6, 6, 2, 6));
  CHECK(d.direction == ScaleDirection::none);
  CHECK_FALSE(d.apply);
  d = p.decide(input(3, 0.0, 2, 2, 2, 6));
  CHECK(d.direction == ScaleDirection::none);
}

TEST_CASE("autoscaling policy: from zero replicas - queued requests scale up at once") {
  AutoscalingPolicy p(bounded(0, 5));  // upscale_delay_s = 30 does not apply
  auto d = p.decide(input(10, 1.0, 0, 0, 0, 5));
  CHECK(d.cold_start);
  CHECK(d.apply);
  CHECK(d.proposed == 1);
  d = p.decide(input(11, 7.0, 0, 0, 0, 5));
  CHECK(d.apply);
  CHECK(d.proposed == 4);
  // A tiny smoothing factor still starts one replica.
  AutoscalingConfig a = bounded(0, 5);
  a.upscale_smoothing_factor = 0.01;
  AutoscalingPolicy q(a);
  CHECK(q.decide(input(0, 7.0, 0, 0, 0, 5)).proposed == 1);
  // No queued request, or target_capacity 0 (upper bound 0): nothing.
  CHECK_FALSE(p.decide(input(12, 0.0, 0, 0, 0, 5)).apply);
  CHECK_FALSE(p.decide(input(13, 7.0, 0, 0, 0, 0)).apply);
  // Replicas of a target above zero are still starting: wait for them.
  d = p.decide(input(14, 50.0, 0, 2, 0, 5));
  CHECK(d.direction == ScaleDirection::none);
  CHECK_FALSE(d.apply);
}

TEST_CASE("autoscaling policy: to zero after downscale_delay_s without load") {
  AutoscalingPolicy p(bounded(0, 5));
  for (double t = 0; t < 600; t += 10)
    CHECK_FALSE(p.decide(input(t, 0.0, 1, 1, 0, 5)).apply);
  auto d = p.decide(input(600, 0.0, 1, 1, 0, 5));
  CHECK(d.apply);
  CHECK(d.proposed == 0);
}

TEST_CASE("autoscaling policy: the status message carries the numbers") {
  AutoscalingConfig a = bounded(1, 6);
  a.upscale_delay_s = 0;
  AutoscalingPolicy p(a);
  auto in = input(0, 24.0, 3, 3, 1, 6);
  auto d = p.decide(in);
  CHECK(describe(a, in, d) ==
        "24.0 ongoing requests over 3 running replicas at a target of 2 per replica want 12; "
        "smoothing factor 1 gives 12, bounds [1, 6] give 6");
  AutoscalingConfig z = bounded(0, 6);
  z.target_ongoing_requests = 1.5;
  AutoscalingPolicy q(z);
  in = input(0, 3.0, 0, 0, 0, 6);
  d = q.decide(in);
  CHECK(describe(z, in, d) ==
        "3.0 requests queued at handles with no running replica at a target of 1.5 per replica "
        "want 2; smoothing factor 1 gives 2, bounds [0, 6] give 2");
}

// ================================================================ state manager

TEST_CASE("autoscaling: a steady load keeps the target - nothing starts or stops") {
  Harness h;
  AutoscalingConfig a = bounded(1, 10);
  a.initial_replicas = 3;
  deploy(h, autoscaled(a));
  Load load{h, 6.0};
  CHECK(load.until(2) == V{"start a#D#1", "start a#D#2", "start a#D#3"});
  CHECK(load.until(2000) == V{});
  CHECK(h.core->target_replicas(kD) == 3u);
  CHECK(running(h) == 3);
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
  CHECK(last_decision(h).desired == 3);
}

TEST_CASE("autoscaling: a step up applies after upscale_delay_s - bounded by max_replicas") {
  Harness h;
  AutoscalingConfig a = bounded(1, 6);  // Ray Serve's defaults otherwise
  a.initial_replicas = 3;
  deploy(h, autoscaled(a));
  Load load{h, 6.0};
  load.until(100);
  CHECK(running(h) == 3);
  load.total = 24.0;
  // The report at 110 moves each replica's 30 s mean to (2 + 2 + 2 + 8) / 4:
  // 10.5 in all want 6 > 3. The decision holds from 110 on, so it applies at
  // 140, not a second earlier.
  CHECK(load.until(139) == V{});
  CHECK(last_decision(h).direction == ScaleDirection::up);
  CHECK(last_decision(h).since == 110);
  CHECK(last_decision(h).due_at == 140);
  CHECK(h.core->target_replicas(kD) == 3u);
  CHECK(load.tick() == V{"start a#D#4", "start a#D#5", "start a#D#6"});
  CHECK(h.core->target_replicas(kD) == 6u);
  expect_status(h, DeploymentStatus::upscaling, DeploymentTrigger::autoscaling);
  CHECK(h.status("a", "D").message ==
        "Upscaling from 3 to 6 replicas: 24.0 ongoing requests over 3 running replicas at a "
        "target of 2 per replica want 12; smoothing factor 1 gives 12, bounds [1, 6] give 6.");
  CHECK(h.core->application_status("a")->status == ApplicationStatus::running);
  load.tick();
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::upscale_completed);
  // 24 over 6 replicas still wants 12: at max, nothing more happens.
  CHECK(load.until(1000) == V{});
  CHECK(running(h) == 6);
}

TEST_CASE("autoscaling: a step down applies after downscale_delay_s") {
  Harness h;
  AutoscalingConfig a = bounded(1, 6);
  a.initial_replicas = 6;
  deploy(h, autoscaled(a));
  Load load{h, 24.0};
  load.until(100);
  CHECK(running(h) == 6);
  load.total = 4.0;
  // Means over 30 s: at 110 (4 + 4 + 4 + 2/3) / 4 per replica, 19 in all,
  // want 10; at 120 14 want 7 (both above 6: no decision); at 130 9 want 5:
  // the downscale decision holds from 130, so it applies at 130 + 600.
  CHECK(load.until(729) == V{});
  CHECK(last_decision(h).direction == ScaleDirection::down);
  CHECK(last_decision(h).since == 130);
  CHECK(h.core->target_replicas(kD) == 6u);
  // The nodes with the fewest replicas empty first (n3, then n2), newest
  // first (Ray Serve's scheduler).
  CHECK(load.tick() == V{"stop a#D#6 20", "stop a#D#3 20", "stop a#D#5 20", "stop a#D#2 20"});
  CHECK(h.core->target_replicas(kD) == 2u);
  expect_status(h, DeploymentStatus::downscaling, DeploymentTrigger::autoscaling);
  CHECK(h.status("a", "D").message ==
        "Downscaling from 6 to 2 replicas: 4.0 ongoing requests over 6 running replicas at a "
        "target of 2 per replica want 2; smoothing factor 1 gives 2, bounds [1, 6] give 2.");
  load.tick();
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::downscale_completed);
  CHECK(load.until(2000) == V{});
  CHECK(h.cluster.alive_not_stopping("a", "D") == 2);
}

TEST_CASE("autoscaling: smoothing and delays step the target gradually") {
  Harness h;
  AutoscalingConfig a = bounded(1, 10);
  a.initial_replicas = 2;
  a.metrics_interval_s = 1;
  a.look_back_period_s = 0.5;  // each reporter's latest report only
  a.upscale_delay_s = 5;
  a.upscale_smoothing_factor = 0.5;
  deploy(h, autoscaled(a));
  Load load{h, 4.0, 1.0};
  load.until(10);
  load.total = 20.0;  // wants 10: 2 -> 6 -> 8 -> 9 -> 10, 5 s apart
  CHECK(load.until(15) == V{});
  CHECK(load.tick() == V{"start a#D#3", "start a#D#4", "start a#D#5", "start a#D#6"});
  CHECK(h.status("a", "D").message ==
        "Upscaling from 2 to 6 replicas: 20.0 ongoing requests over 2 running replicas at a "
        "target of 2 per replica want 10; smoothing factor 0.5 gives 6, bounds [1, 10] give 6.");
  CHECK(load.until(21) == V{});
  CHECK(load.tick() == V{"start a#D#7", "start a#D#8"});
  CHECK(load.until(27) == V{});
  CHECK(load.tick() == V{"start a#D#9"});
  CHECK(load.until(33) == V{});
  CHECK(load.tick() == V{"start a#D#10"});
  CHECK(load.until(100) == V{});
  CHECK(running(h) == 10);
}

TEST_CASE("autoscaling: reporters that stop reporting or stop RUNNING are dropped") {
  Harness h;
  AutoscalingConfig a = bounded(1, 6);
  a.upscale_delay_s = 60;
  deploy(h, autoscaled(a));
  Load load{h, 1.0};
  load.until(9);
  CHECK(running(h) == 1);
  // One report of 10 from a proxy, never repeated: wants 5 from 10 on ...
  load.handles["proxy-n1"] = 10;
  load.tick();
  load.handles.clear();
  CHECK(last_decision(h).direction == ScaleDirection::up);
  CHECK(h.core->deployment(kD)->metrics().handle_reporters() == 1);
  // ... and counts until 40 (look_back_period_s), not after.
  load.until(40);
  CHECK(last_decision(h).direction == ScaleDirection::up);
  load.tick();
  CHECK(last_decision(h).direction == ScaleDirection::none);
  CHECK(h.core->deployment(kD)->metrics().handle_reporters() == 0);
  CHECK(load.until(100) == V{});
  CHECK(h.core->target_replicas(kD) == 1u);

  // A replica reporting a high load, then crashing: its report goes with it.
  h.core->record_replica_metrics("a#D#1", 20);
  h.cluster.crash("a#D#1");
  CHECK(starts_and_stops(h.tick()) == V{"kill a#D#1", "start a#D#2"});
  CHECK(h.core->deployment(kD)->metrics().replica_reporters() == 0);
  // Reports from a replica not RUNNING yet, from unknown replicas and for
  // unknown deployments are ignored.
  h.core->record_replica_metrics("a#D#2", 20);
  h.core->record_replica_metrics("a#D#99", 20);
  h.core->record_handle_metrics("proxy-n1", {"a", "X"}, 20);
  CHECK(h.core->deployment(kD)->metrics().replica_reporters() == 0);
  load.tick();
  CHECK(running(h) == 1);
  CHECK(load.until(300) == V{});
  CHECK(h.core->target_replicas(kD) == 1u);
}

TEST_CASE("autoscaling: requests queued at a proxy in front of saturated replicas count") {
  Harness h;
  AutoscalingConfig a = bounded(1, 20);
  a.initial_replicas = 3;
  a.metrics_interval_s = 1;
  a.look_back_period_s = 0.5;
  a.upscale_delay_s = 0;
  deploy(h, autoscaled(a));
  Load load{h, 15.0, 1.0};        // 5 per replica: wants 8 ...
  load.handles["proxy-n1"] = 40;  // ... but 25 more wait at the proxy: wants 20
  load.until(5);
  CHECK(last_decision(h).desired == 20);
  CHECK(h.core->target_replicas(kD) == 20u);
  CHECK(h.core->deployment(kD)->metrics().replica_total(5) == 15);
}

TEST_CASE("autoscaling: scale from zero on a proxy's queued request - and back to zero") {
  Harness h;
  AutoscalingConfig a = bounded(0, 5);  // no initial_replicas: starts at 0
  deploy(h, autoscaled(a));
  CHECK(h.core->target_replicas(kD) == 0u);
  Load load{h};
  CHECK(load.until(4) == V{});
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
  // A request arrives at a proxy, which queues it and reports it: a replica
  // starts in the same tick, without waiting for upscale_delay_s.
  h.clock.advance(1);
  h.core->record_handle_metrics("proxy-n1", kD, 1);
  CHECK(starts_and_stops(h.tick(0)) == V{"start a#D#1"});
  expect_status(h, DeploymentStatus::upscaling, DeploymentTrigger::autoscaling);
  CHECK(h.status("a", "D").message ==
        "Upscaling from 0 to 1 replicas: 1.0 requests queued at handles with no running replica "
        "at a target of 2 per replica want 1; smoothing factor 1 gives 1, bounds [0, 5] give 1.");
  // One tick later it runs and is published to the proxies, which send it the
  // queued request.
  load.tick();
  CHECK(running(h) == 1);
  auto snap = h.core->changes_since({});
  REQUIRE(snap);
  REQUIRE(snap->deployments.size() == 1);
  REQUIRE(snap->deployments[0].replicas.size() == 1);
  CHECK(snap->deployments[0].replicas[0].replica_id == "a#D#1");
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::upscale_completed);

  // It serves one request at a time for a while, then nothing: the 30 s means
  // reach 0 at 131, when the last report of 1 (at 100) leaves the window, and
  // 600 s later the replica stops.
  load.total = 1.0;
  load.handles["proxy-n1"] = 1.0;
  load.until(100);
  load.total = 0;
  load.handles["proxy-n1"] = 0;
  CHECK(load.until(730) == V{});
  CHECK(last_decision(h).since == 131);
  CHECK(load.tick() == V{"stop a#D#1 20"});
  expect_status(h, DeploymentStatus::downscaling, DeploymentTrigger::autoscaling);
  CHECK(h.status("a", "D").message ==
        "Downscaling from 1 to 0 replicas: 0.0 ongoing requests over 1 running replica at a "
        "target of 2 per replica want 0; smoothing factor 1 gives 0, bounds [0, 5] give 0.");
  load.tick();
  CHECK(h.replicas("a", "D").empty());
  CHECK(h.cluster.actors.empty());
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::downscale_completed);

  // Cold again: the proxy reports 3 queued requests from 810 on. Their 30 s
  // mean, 0.75, starts one replica at once; once the mean wants 2 (from 830:
  // (0 + 3 + 3 + 3) / 4 = 2.25), the second starts after upscale_delay_s.
  CHECK(load.until(800) == V{});
  load.handles["proxy-n1"] = 3;
  CHECK(load.until(810) == V{"start a#D#2"});
  CHECK(h.status("a", "D").message ==
        "Upscaling from 0 to 1 replicas: 0.8 requests queued at handles with no running replica "
        "at a target of 2 per replica want 1; smoothing factor 1 gives 1, bounds [0, 5] give 1.");
  CHECK(load.until(859) == V{});
  CHECK(last_decision(h).since == 830);
  CHECK(load.tick() == V{"start a#D#3"});
  CHECK(h.core->target_replicas(kD) == 2u);
}

TEST_CASE("autoscaling: target_capacity scales the bounds the policy moves within") {
  Harness h;
  AutoscalingConfig a = bounded(2, 6);
  a.initial_replicas = 4;
  a.metrics_interval_s = 1;
  a.look_back_period_s = 0.5;
  a.upscale_delay_s = 0;
  // Not 0: replicas that just started have not reported yet and look idle.
  a.downscale_delay_s = 2;
  REQUIRE(h.core->set_target_capacity(50.0).is_ok());
  deploy(h, autoscaled(a));
  CHECK(h.core->target_replicas(kD) == 2u);  // initial 4 at 50 %
  Load load{h, 24.0, 1.0};                   // wants 12
  CHECK(load.until(2) == V{"start a#D#1", "start a#D#2"});
  CHECK(load.tick() == V{"start a#D#3"});  // max 6 at 50 %: 3
  CHECK(h.status("a", "D").message ==
        "Upscaling from 2 to 3 replicas: 24.0 ongoing requests over 2 running replicas at a "
        "target of 2 per replica want 12; smoothing factor 1 gives 12, bounds [1, 3] give 3 "
        "(target_capacity 50%).");
  CHECK(load.until(20) == V{});
  CHECK(h.core->target_replicas(kD) == 3u);
  // Back to 100 %: the load takes it to 6.
  REQUIRE(h.core->set_target_capacity(std::nullopt).is_ok());
  CHECK(load.tick() == V{"start a#D#4", "start a#D#5", "start a#D#6"});
  load.until(30);
  // Down to 50 % again: at once to 3, and the policy agrees.
  REQUIRE(h.core->set_target_capacity(50.0).is_ok());
  CHECK(h.core->target_replicas(kD) == 3u);
  CHECK(load.tick().size() == 3);
  CHECK(load.until(40) == V{});
  // No load: min 2 at 50 % is 1.
  load.total = 0;
  CHECK(load.until(42) == V{});
  CHECK(load.tick() == V{"stop a#D#2 20", "stop a#D#4 20"});  // fewest-replica nodes first
  CHECK(h.core->target_replicas(kD) == 1u);
  // 0 %: nothing runs, and a queued request does not start a replica.
  REQUIRE(h.core->set_target_capacity(0.0).is_ok());
  load.handles["proxy-n1"] = 5;
  CHECK(load.until(50) == V{"stop a#D#1 20"});
  CHECK(h.core->target_replicas(kD) == 0u);
  CHECK(h.replicas("a", "D").empty());
}

TEST_CASE("autoscaling: initial_replicas - else min_replicas - num_replicas is ignored") {
  Harness h;
  AutoscalingConfig a = bounded(1, 10);
  a.initial_replicas = 4;
  DeploymentSpec d = autoscaled(a);
  d.config.num_replicas = 7;  // ignored next to autoscaling_config
  deploy(h, d);
  CHECK(h.core->target_replicas(kD) == 4u);
  CHECK(h.tick().size() == 4);

  Harness g;
  a.initial_replicas.reset();
  a.min_replicas = 2;
  deploy(g, autoscaled(a));
  CHECK(g.core->target_replicas(kD) == 2u);
}

TEST_CASE("autoscaling: a redeploy keeps the autoscaled count - switching it on or off") {
  Harness h;
  AutoscalingConfig a = bounded(1, 10);
  a.initial_replicas = 2;
  a.metrics_interval_s = 1;
  a.look_back_period_s = 0.5;
  a.upscale_delay_s = 0;
  deploy(h, autoscaled(a));
  Load load{h, 10.0, 1.0};  // wants 5
  load.until(3);
  CHECK(h.core->target_replicas(kD) == 5u);
  load.until(5);
  // New code: the rollout keeps 5 replicas, not initial_replicas.
  deploy(h, autoscaled(a, "v2"));
  CHECK(h.core->target_replicas(kD) == 5u);
  load.until(40);
  CHECK(running(h) == 5);
  for (const auto& r : h.replicas("a", "D"))
    CHECK(r.version.code.rfind("v2", 0) == 0);
  // Off: num_replicas rules again.
  DeploymentSpec fixed = make_deployment("D", 3, "v2");
  deploy(h, fixed);
  CHECK(h.core->target_replicas(kD) == 3u);
  CHECK(h.core->deployment(kD)->last_decision() == std::nullopt);
  // On again without initial_replicas: starts from the current count.
  a.initial_replicas.reset();
  deploy(h, autoscaled(a, "v2"));
  CHECK(h.core->target_replicas(kD) == 3u);
}

TEST_CASE(
    "autoscaling: a new autoscaling_config is UPDATING - CONFIG_UPDATE_STARTED as in Ray Serve") {
  Harness h;
  deploy(h, make_deployment("D", 2));
  h.ticks(2);
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
  // Switched on, with initial_replicas above the current count.
  AutoscalingConfig a = bounded(1, 10);
  a.initial_replicas = 4;
  auto r = h.core->deploy_application(make_app("a", "/a", {autoscaled(a)}));
  REQUIRE(r.has_value());
  CHECK(r->deployments.at("D") == ChangeKind::scaled);  // no replica restarts
  expect_status(h, DeploymentStatus::updating, DeploymentTrigger::config_update_started);
  h.ticks(2);
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
  // New bounds that move the target down: still a config update.
  a.initial_replicas = 3;
  a.max_replicas = 3;
  REQUIRE(h.core->deploy_application(make_app("a", "/a", {autoscaled(a)})).has_value());
  CHECK(h.core->target_replicas(kD) == 3u);
  expect_status(h, DeploymentStatus::updating, DeploymentTrigger::config_update_started);
  h.ticks(3);
  expect_status(h, DeploymentStatus::healthy, DeploymentTrigger::config_update_completed);
  // A manual num_replicas change of a fixed deployment is still a scale.
  deploy(h, make_deployment("D", 3));  // autoscaling off: the count stays 3
  expect_status(h, DeploymentStatus::updating, DeploymentTrigger::config_update_started);
  h.ticks(2);
  deploy(h, make_deployment("D", 5));
  expect_status(h, DeploymentStatus::upscaling, DeploymentTrigger::config_update_started);
}

TEST_CASE("target_capacity_direction: Ray Serve's rule - from the capacities and the applications") {
  TargetState a;
  a.applications["x"] = make_app("x", "/x", {make_deployment("D", 1)});
  TargetState b = a;
  // Same applications.
  b.target_capacity = 50;  // from none (100 %) to a value: down
  CHECK(next_capacity_direction(a, b) == CapacityDirection::down);
  a.target_capacity = 20;
  CHECK(next_capacity_direction(a, b) == CapacityDirection::up);
  a.target_capacity = 80;
  CHECK(next_capacity_direction(a, b) == CapacityDirection::down);
  a.target_capacity = 50;  // unchanged: keeps the current direction
  a.target_capacity_direction = CapacityDirection::up;
  CHECK(next_capacity_direction(a, b) == CapacityDirection::up);
  b.target_capacity.reset();  // to none
  CHECK(next_capacity_direction(a, b) == CapacityDirection::none);
  // Other applications: up with a capacity, else none.
  b.applications["y"] = make_app("y", "/y", {make_deployment("E", 1)});
  CHECK(next_capacity_direction(a, b) == CapacityDirection::none);
  b.target_capacity = 10;
  CHECK(next_capacity_direction(a, b) == CapacityDirection::up);
}

TEST_CASE("autoscaling: while target_capacity rises initial_replicas is the floor - then min_replicas") {
  Harness h;
  AutoscalingConfig a = bounded(1, 10);
  a.initial_replicas = 6;
  a.downscale_delay_s = 0;
  a.metrics_interval_s = 1;
  a.look_back_period_s = 1;
  deploy(h, autoscaled(a));
  Load load{h, 0.0, 1.0};  // no load: the policy wants min_replicas
  load.until(5);
  CHECK(h.core->target_replicas(kD) == 1u);
  // The cluster is brought down, then back up in steps.
  REQUIRE(h.core->set_target_capacity(0.0).is_ok());
  CHECK(h.core->target_state().target_capacity_direction == CapacityDirection::down);
  load.until(10);
  CHECK(h.core->target_replicas(kD) == 0u);
  REQUIRE(h.core->set_target_capacity(50.0).is_ok());
  CHECK(h.core->target_state().target_capacity_direction == CapacityDirection::up);
  // Rising: at least initial_replicas at 50 % (3), though no load asks.
  load.until(30);
  CHECK(h.core->target_replicas(kD) == 3u);
  CHECK(h.core->deployment(kD)->autoscaling_bounds() == std::make_pair(3u, 5u));
  // Written ahead: a restarted controller knows the direction.
  REQUIRE(h.store->saved.has_value());
  CHECK(h.store->saved->target_capacity_direction == CapacityDirection::up);
  // Falling again: min_replicas is the floor, the idle deployment goes to 1.
  REQUIRE(h.core->set_target_capacity(40.0).is_ok());
  CHECK(h.core->target_state().target_capacity_direction == CapacityDirection::down);
  load.until(60);
  CHECK(h.core->target_replicas(kD) == 1u);
  // Without a capacity: no direction, min_replicas.
  REQUIRE(h.core->set_target_capacity(std::nullopt).is_ok());
  CHECK(h.core->target_state().target_capacity_direction == CapacityDirection::none);
  CHECK(h.core->deployment(kD)->autoscaling_bounds() == std::make_pair(1u, 10u));
}

TEST_CASE("autoscaling: a restarted controller keeps the replicas its predecessor scaled to") {
  Harness h;
  AutoscalingConfig a = bounded(1, 10);
  a.metrics_interval_s = 1;
  a.look_back_period_s = 0.5;
  a.upscale_delay_s = 0;
  deploy(h, autoscaled(a));
  Load load{h, 12.0, 1.0};  // wants 6
  load.until(5);
  CHECK(running(h) == 6);
  h.restart();
  CHECK(h.core->target_replicas(kD) == 6u);
  V cmds = load.until(30);
  for (const auto& c : cmds)
    CHECK(c.rfind("recover ", 0) == 0);
  CHECK(cmds.size() == 6);
  CHECK(running(h) == 6);
  CHECK(h.cluster.alive_not_stopping("a", "D") == 6);
}

TEST_CASE("autoscaling property: random loads - crashes - capacity changes and restarts") {
  // Invariants after every tick: the target stays within the capacity-adjusted
  // bounds, replicas alive (not stopping) never exceed target + rollout_size,
  // and once the load and faults stop, the deployment converges to what the
  // last load wants.
  int autoscaled_changes = 0;  // shows the runs are not vacuous
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    INFO("seed " << seed);
    std::mt19937_64 gen(seed);
    auto pick = [&](uint32_t n) { return static_cast<uint32_t>(gen() % n); };
    Harness h;
    AutoscalingConfig a = bounded(pick(3), 3 + pick(8));
    a.metrics_interval_s = 1 + pick(3);
    a.look_back_period_s = 1 + pick(10);
    a.upscale_delay_s = pick(5);
    a.downscale_delay_s = pick(20);
    if (pick(2))
      a.upscale_smoothing_factor = 0.5;
    if (pick(2))
      a.downscale_smoothing_factor = 0.7;
    DeploymentSpec d = autoscaled(a);
    d.config.graceful_shutdown_timeout_s = 2;
    d.config.health_check_period_s = 2;
    d.config.health_check_timeout_s = 1;
    deploy(h, d);
    Load load{h, 0.0, a.metrics_interval_s};
    std::optional<double> capacity;
    uint32_t last_target = *h.core->target_replicas(kD);
    for (int step = 0; step < 300; ++step) {
      const uint32_t action = pick(100);
      if (action < 10) {
        load.total = pick(40);
      } else if (action < 14) {
        load.handles["proxy-" + std::to_string(pick(2))] = pick(10);
      } else if (action < 17 && !h.cluster.actors.empty()) {
        auto it = h.cluster.actors.begin();
        std::advance(it, pick(static_cast<uint32_t>(h.cluster.actors.size())));
        h.cluster.crash(it->first);
      } else if (action < 19) {
        const std::optional<double> choices[] = {std::nullopt, 0.0, 40.0, 100.0};
        capacity = choices[pick(4)];
        REQUIRE(h.core->set_target_capacity(capacity).is_ok());
      } else if (action < 20) {
        h.restart();
      }
      load.tick();
      INFO("step " << step);
      const uint32_t target = *h.core->target_replicas(kD);
      CHECK(target >= capacity_adjusted(a.min_replicas, capacity));
      CHECK(target <= capacity_adjusted(a.max_replicas, capacity));
      CHECK(h.cluster.alive_not_stopping("a", "D") <= target + std::max<uint32_t>(target / 5, 1));
      if (target != last_target && h.status("a", "D").trigger == DeploymentTrigger::autoscaling) {
        ++autoscaled_changes;
      }
      last_target = target;
    }
    // Quiet: full capacity, a steady load of 10 (which a proxy also reports,
    // so that a deployment at zero starts again).
    REQUIRE(h.core->set_target_capacity(std::nullopt).is_ok());
    load.handles.clear();
    load.handles["proxy-0"] = 10;
    load.total = 10;
    load.until(h.clock.now_s() + 200);
    const uint32_t want = std::clamp<uint32_t>(5, a.min_replicas, a.max_replicas);
    CHECK(h.core->target_replicas(kD) == want);
    CHECK(running(h) == want);
    CHECK(h.cluster.alive_not_stopping("a", "D") == want);
    CHECK(h.status("a", "D").status == DeploymentStatus::healthy);
  }
  MESSAGE("target changes by the autoscaler in the 20 runs: " << autoscaled_changes);
  CHECK(autoscaled_changes > 50);
}

TEST_CASE("autoscaling: a new autoscaling_config restarts the delay - other changes do not") {
  Harness h;
  AutoscalingConfig a = bounded(1, 10);
  a.initial_replicas = 2;
  a.metrics_interval_s = 1;
  a.look_back_period_s = 0.5;
  DeploymentSpec d = autoscaled(a);
  deploy(h, d);
  Load load{h, 2.0, 1.0};
  load.until(10);
  load.total = 20.0;  // wants 10 from 11 on: due at 41
  load.until(20);
  CHECK(last_decision(h).since == 11);
  d.config.num_replicas = 9;  // ignored: the pending decision stays
  deploy(h, d);
  load.until(21);
  CHECK(last_decision(h).since == 11);
  a.upscale_delay_s = 40;  // a new config starts over: due at 22 + 40
  deploy(h, autoscaled(a));
  CHECK(load.until(61) == V{});
  CHECK(last_decision(h).since == 22);
  CHECK(load.tick().size() == 8);
  CHECK(h.core->target_replicas(kD) == 10u);
}

// ================================================================ write-ahead

namespace {

// A store whose saves fail while `failing` is set (a full disk for a while).
class ToggleStore final : public MemoryStore {
 public:
  bool failing = false;
  Status save(const TargetState& state) override {
    if (failing)
      return Status(errc::io_error, "write /var/lib/troupe/checkpoint: No space left on device");
    return MemoryStore::save(state);
  }
};

AutoscalingConfig eager(uint32_t min, uint32_t max) {
  AutoscalingConfig a = bounded(min, max);
  a.metrics_interval_s = 1;
  a.look_back_period_s = 0.5;
  a.upscale_delay_s = 0;
  a.downscale_delay_s = 0;
  return a;
}

}  // namespace

TEST_CASE("autoscaling: each decision is written ahead - without a new generation") {
  Harness h;
  deploy(h, autoscaled(eager(1, 10)));
  const uint64_t generation = h.store->saved->generation;
  CHECK(h.store->saved->autoscaled_replicas.empty());
  Load load{h, 12.0, 1.0};  // wants 6
  // Every save the decision makes already holds it (the store sees the count
  // before the core acts on it).
  std::vector<uint32_t> targets_at_save;
  h.store->on_save = [&](const TargetState&) {
    targets_at_save.push_back(h.core->target_replicas(kD).value_or(0));
  };
  load.until(5);
  CHECK(h.core->target_replicas(kD) == 6u);
  REQUIRE(h.store->saved.has_value());
  CHECK(h.store->saved->autoscaled_replicas.at("a").at("D") == 6u);
  CHECK(h.store->saved->generation == generation);  // not a user change
  REQUIRE_FALSE(targets_at_save.empty());
  CHECK(targets_at_save.front() == 1u);  // written before the target moved
  // The manual override is written ahead the same way (clamped to the bounds).
  REQUIRE(h.core->set_autoscaled_target(kD, 40).is_ok());
  CHECK(h.store->saved->autoscaled_replicas.at("a").at("D") == 10u);
  CHECK(h.core->target_replicas(kD) == 10u);
}

TEST_CASE("autoscaling: a restarted controller resumes the written count - not the replicas it finds") {
  Harness h;
  DeploymentSpec d = autoscaled(eager(1, 10));
  d.config.max_replicas_per_node = 1;  // 3 nodes: at most 3 of the 6 can run
  deploy(h, d);
  Load load{h, 12.0, 1.0};  // wants 6
  load.until(6);
  CHECK(h.core->target_replicas(kD) == 6u);
  CHECK(running(h) == 3);
  h.restart();
  // Three replicas are adopted, yet the target is the autoscaler's 6 (the
  // three missing ones are still wanted when a node joins), as in Ray Serve.
  CHECK(h.core->target_replicas(kD) == 6u);
  load.until(9);
  CHECK(h.core->target_replicas(kD) == 6u);
  CHECK(h.cluster.alive_not_stopping("a", "D") == 3);
  auto nodes = h.nodes;
  nodes.push_back({"n4", NodeState::alive, *parse_resources("cpu=100")});
  h.set_nodes(nodes);
  load.until(11);
  CHECK(h.cluster.alive_not_stopping("a", "D") == 4);
}

TEST_CASE("autoscaling: a decision the checkpoint refuses is not taken - it is retried") {
  Harness h;
  h.replace_store(std::make_unique<ToggleStore>());
  auto* store = static_cast<ToggleStore*>(h.store);
  deploy(h, autoscaled(eager(1, 10)));
  Load load{h, 12.0, 1.0};  // wants 6
  store->failing = true;
  CHECK(load.until(10) == V{"start a#D#r1-1"});  // only the first replica
  CHECK(h.core->target_replicas(kD) == 1u);
  CHECK(h.core->set_autoscaled_target(kD, 4).code() == errc::io_error);
  CHECK(h.core->target_replicas(kD) == 1u);
  store->failing = false;
  load.until(15);
  CHECK(h.core->target_replicas(kD) == 6u);
  CHECK(store->saved->autoscaled_replicas.at("a").at("D") == 6u);
}

TEST_CASE("autoscaling: a deploy keeps the counts of deployments that stay autoscaled - drops the rest") {
  Harness h;
  deploy(h, autoscaled(eager(1, 10)));
  Load load{h, 12.0, 1.0};  // wants 6
  load.until(5);
  REQUIRE(h.store->saved->autoscaled_replicas.at("a").at("D") == 6u);
  // New code, still autoscaled: kept, and a restart resumes it.
  deploy(h, autoscaled(eager(1, 10), "v2"));
  CHECK(h.store->saved->autoscaled_replicas.at("a").at("D") == 6u);
  // A declaration cannot set the counts: they are the autoscaler's.
  TargetState declared;
  declared.applications.emplace("a", make_app("a", "/a", {autoscaled(eager(1, 10), "v2")}));
  declared.autoscaled_replicas["a"]["D"] = 9;
  REQUIRE(h.core->apply(declared).has_value());
  CHECK(h.store->saved->autoscaled_replicas.at("a").at("D") == 6u);
  // Autoscaling switched off: dropped.
  deploy(h, make_deployment("D", 2, "v2"));
  CHECK(h.store->saved->autoscaled_replicas.empty());
  CHECK(h.core->target_replicas(kD) == 2u);
  h.ticks(30);  // the rollout to v2 and the downscale complete
  CHECK(running(h) == 2);
  // On again: starts afresh (initial_replicas), even after a restart.
  AutoscalingConfig a = eager(1, 10);
  a.initial_replicas = 3;
  deploy(h, autoscaled(a, "v2"));
  CHECK(h.store->saved->autoscaled_replicas.empty());
  h.restart();
  CHECK(h.core->target_replicas(kD) == 3u);
}

TEST_CASE("autoscaling: holds while a node is UNREACHABLE - decides again once it is back") {
  Harness h;
  AutoscalingConfig a = bounded(1, 6);
  a.initial_replicas = 3;
  a.upscale_delay_s = 0;
  a.downscale_delay_s = 0;
  deploy(h, autoscaled(a));
  Load load{h, 6.0};
  load.until(100);
  REQUIRE(running(h) == 3);
  // Two nodes cut off from the controller: their replicas' reports stop.
  auto nodes = h.nodes;
  nodes[1].state = NodeState::unreachable;
  nodes[2].state = NodeState::unreachable;
  h.set_nodes(nodes);
  load.total = 0.5;  // what the reports still arriving say: want 1
  CHECK(load.until(200) == V{});
  CHECK(h.core->target_replicas(kD) == 3u);
  load.total = 24.0;  // want 6
  CHECK(load.until(300) == V{});
  CHECK(h.core->target_replicas(kD) == 3u);
  // Back: the policy decides on what it hears from then on.
  nodes[1].state = NodeState::alive;
  nodes[2].state = NodeState::alive;
  h.set_nodes(nodes);
  load.until(320);
  CHECK(h.core->target_replicas(kD) == 6u);
}
