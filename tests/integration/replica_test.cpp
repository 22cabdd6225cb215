// Replicas of example deployments on a real 3-node loopback cluster, driven
// through the controller's actor interface (the client library troupectl
// uses). Every wait is a condition with a deadline.
#include <signal.h>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "runtime/system_setup.hpp"
#include "tests/support/client_cluster.hpp"
#include "tests/support/cluster.hpp"
#include "tests/support/specs.hpp"
#include "tools/troupectl/client.hpp"

using namespace troupe;
using namespace troupe::testing;
using nlohmann::json;

namespace {

controller::ApplicationSpec app_spec(const std::string& name, const std::string& prefix,
                                     const std::string& cls, uint32_t replicas,
                                     const std::string& user_config = "",
                                     const std::string& version = "v1",
                                     const std::string& library = "libtroupe_examples.so") {
  auto app = example_app(name, prefix, cls, replicas);
  auto& d = app.deployments[0];
  d.import_path = library + ":" + cls;
  d.code_version = version;
  d.config.user_config = user_config;
  return app;
}

struct Fixture : ClientCluster {
  explicit Fixture(std::vector<std::string> worker_ids = {"w1", "w2"}) { start(worker_ids); }

  std::vector<ReplicaEndpoint> endpoints(const std::string& app, const std::string& dep) {
    auto snap = client->snapshot();
    REQUIRE(snap.has_value());
    for (auto& d : snap->deployments) {
      if (d.app == app && d.deployment == dep)
        return d.replicas;
    }
    return {};
  }

  Result<HttpResponse> call(const ReplicaActor& replica, const std::string& path,
                            const std::string& query = "", double timeout_s = 10) {
    caf::scoped_actor self{*sys};
    Result<HttpResponse> out(errc::internal, "no answer");
    HttpRequest req{"GET", path, query, {}, "", "test"};
    self->request(replica, std::chrono::milliseconds(static_cast<int>(timeout_s * 1000)),
                  handle_atom::value, req)
        .receive([&](HttpResponse& r) { out = std::move(r); },
                 [&](caf::error& e) { out = from_caf_error(e); });
    return out;
  }

  std::map<std::string, int> per_node(const json& dep) {
    std::map<std::string, int> out;
    for (const auto& r : dep.at("replicas"))
      out[r.at("node").get<std::string>()]++;
    return out;
  }

  std::set<std::string> replica_ids(const json& dep) {
    std::set<std::string> out;
    for (const auto& r : dep.at("replicas"))
      out.insert(r.at("id").get<std::string>());
    return out;
  }
};

}  // namespace

TEST_CASE("echo with 6 replicas runs 2-2-2 over three nodes - and counter answers from every node") {
  Fixture f;
  REQUIRE(f.client->deploy(app_spec("echo", "/echo", "Echo", 6)).has_value());
  REQUIRE(f.wait_healthy("echo", "Echo", 6));
  auto spread = f.per_node(f.deployment("echo", "Echo"));
  CHECK(spread == std::map<std::string, int>{{"head", 2}, {"w1", 2}, {"w2", 2}});

  REQUIRE(f.client->deploy(app_spec("counter", "/counter", "Counter", 3)).has_value());
  REQUIRE(f.wait_healthy("counter", "Counter", 3));
  std::set<std::string> nodes_seen;
  auto eps = f.endpoints("counter", "Counter");
  REQUIRE(eps.size() == 3);
  for (auto& ep : eps) {
    for (int i = 1; i <= 2; ++i) {
      auto r = f.call(ep.handle, "/");
      REQUIRE(r.has_value());
      CHECK(r->status == 200);
      auto body = json::parse(r->body);
      CHECK(body.at("count") == i);  // per-replica state
      CHECK(body.at("replica_id") == ep.replica_id);
      nodes_seen.insert(body.at("node_id").get<std::string>());
    }
  }
  CHECK(nodes_seen == std::set<std::string>{"head", "w1", "w2"});
}

TEST_CASE("a killed replica is replaced - the others are untouched") {
  Fixture f;
  REQUIRE(f.client->deploy(app_spec("echo", "/echo", "Echo", 3)).has_value());
  REQUIRE(f.wait_healthy("echo", "Echo", 3));
  auto before = f.replica_ids(f.deployment("echo", "Echo"));
  auto victim = *before.begin();
  REQUIRE(f.client->kill_replica(victim).is_ok());
  // Wait until the replacement runs: three RUNNING replicas, the victim gone.
  REQUIRE(wait_until(
      [&] {
        auto dep = f.deployment("echo", "Echo");
        return dep.value("status", "") == "HEALTHY" && f.replica_ids(dep).size() == 3 &&
               f.replica_ids(dep).count(victim) == 0;
      },
      30s, 50ms));
  // The controller logs every status transition; the crash showed as UNHEALTHY.
  auto log = f.cluster.nodes.at("head").output();
  CHECK(log.find("deployment echo/Echo: HEALTHY -> UNHEALTHY (HEALTH_CHECK_FAILED): Replica " +
                 victim + " crashed") != std::string::npos);
  CHECK(log.find("deployment echo/Echo: UNHEALTHY -> HEALTHY") != std::string::npos);
  auto after = f.replica_ids(f.deployment("echo", "Echo"));
  CHECK(after.count(victim) == 0);
  for (const auto& id : before) {
    if (id != victim)
      CHECK(after.count(id) == 1);
  }
}

TEST_CASE("a constructor that throws makes the deployment DEPLOY_FAILED - other apps run on") {
  Fixture f;
  REQUIRE(f.client->deploy(app_spec("echo", "/echo", "Echo", 2)).has_value());
  REQUIRE(f.wait_healthy("echo", "Echo", 2));
  REQUIRE(f.client->deploy(app_spec("fail", "/fail", "FailInit", 1)).has_value());
  json last;
  bool failed = wait_until(
      [&] {
        last = f.deployment("fail", "FailInit");
        return last.value("status", "") == "DEPLOY_FAILED";
      },
      30s, 100ms);
  CHECK(failed);
  CHECK(last.value("message", "").find("FailInit always fails to start") != std::string::npos);
  CHECK(f.status()["applications"]["fail"]["status"] == "DEPLOY_FAILED");
  CHECK(f.deployment("echo", "Echo").value("status", "") == "HEALTHY");
}

TEST_CASE("a missing library or class is a DEPLOY_FAILED naming the path and the loader error") {
  Fixture f(std::vector<std::string>{});
  REQUIRE(f.client->deploy(app_spec("nolib", "/nolib", "Echo", 1, "", "v1", "libmissing.so"))
              .has_value());
  REQUIRE(f.client->deploy(app_spec("nocls", "/nocls", "NoSuchClass", 1)).has_value());
  json lib;
  json cls;
  bool failed = wait_until(
      [&] {
        lib = f.deployment("nolib", "Echo");
        cls = f.deployment("nocls", "NoSuchClass");
        return lib.value("status", "") == "DEPLOY_FAILED" &&
               cls.value("status", "") == "DEPLOY_FAILED";
      },
      30s, 100ms);
  CHECK(failed);
  CHECK(lib.value("message", "").find("library 'libmissing.so' not found in plugin path") !=
        std::string::npos);
  CHECK(cls.value("message", "").find("has no deployment 'NoSuchClass'") != std::string::npos);
  // The file the replica loaded: the node's cached copy of the head's build
  // of the library, pinned by its SHA-256 (docs/architecture.md, "Deployment
  // libraries").
  CHECK(cls.value("message", "").find("/library-cache/") != std::string::npos);
  CHECK(cls.value("message", "").find("(libtroupe_examples.so@") != std::string::npos);
}

TEST_CASE("a replica failing its health checks is replaced after exactly the threshold") {
  Fixture f(std::vector<std::string>{});
  auto app = app_spec("flaky", "/flaky", "FlakyHealth", 1, R"({"healthy_checks": 2})");
  app.deployments[0].config.health_check_period_s = 0.2;
  REQUIRE(f.client->deploy(app).has_value());
  REQUIRE(f.wait_healthy("flaky", "FlakyHealth", 1));
  auto first = *f.replica_ids(f.deployment("flaky", "FlakyHealth")).begin();
  // Replaced: a different replica runs.
  REQUIRE(wait_until(
      [&] {
        auto dep = f.deployment("flaky", "FlakyHealth");
        auto ids = f.replica_ids(dep);
        return !ids.empty() && ids.count(first) == 0;
      },
      30s, 50ms));
  auto log = f.cluster.nodes.at("head").output();
  size_t failures = 0;
  for (auto pos = log.find("health check of " + first + " failed"); pos != std::string::npos;
       pos = log.find("health check of " + first + " failed", pos + 1)) {
    ++failures;
  }
  CHECK(failures == 3);
  CHECK(log.find("deployment flaky/FlakyHealth: HEALTHY -> UNHEALTHY (HEALTH_CHECK_FAILED)") !=
        std::string::npos);
}

TEST_CASE(
    "a user_config change reconfigures the same replicas - a code change rolls 20 % at a time") {
  Fixture f;
  REQUIRE(f.client->deploy(app_spec("greet", "/greet", "Hello", 10, R"({"greeting": "hi"})"))
              .has_value());
  REQUIRE(f.wait_healthy("greet", "Hello", 10));
  auto ids = f.replica_ids(f.deployment("greet", "Hello"));
  for (auto& ep : f.endpoints("greet", "Hello")) {
    auto r = f.call(ep.handle, "/");
    REQUIRE(r.has_value());
    CHECK(json::parse(r->body).at("greeting") == "hi");
  }

  REQUIRE(f.client->deploy(app_spec("greet", "/greet", "Hello", 10, R"({"greeting": "hey"})"))
              .has_value());
  REQUIRE(wait_until(
      [&] {
        auto eps = f.endpoints("greet", "Hello");
        if (eps.size() != 10)
          return false;
        for (auto& ep : eps) {
          auto r = f.call(ep.handle, "/");
          if (!r || json::parse(r->body).at("greeting") != "hey")
            return false;
        }
        return true;
      },
      30s, 100ms));
  REQUIRE(f.wait_healthy("greet", "Hello", 10));
  CHECK(f.replica_ids(f.deployment("greet", "Hello")) == ids);  // nothing restarted

  // A code version change: at most max(20 % of 10, 1) = 2 replicas in
  // transition at any time, never more than 12 alive.
  REQUIRE(f.client->deploy(app_spec("greet", "/greet", "Hello", 10, R"({"greeting": "hey"})", "v2"))
              .has_value());
  size_t max_transition = 0;
  size_t max_alive = 0;
  size_t samples = 0;
  bool done = wait_until(
      [&] {
        auto dep = f.deployment("greet", "Hello");
        size_t transition = 0;
        size_t v2_running = 0;
        for (const auto& r : dep.at("replicas")) {
          auto state = r.at("state").get<std::string>();
          if (state != "RUNNING")
            ++transition;
          if (state == "RUNNING" && r.at("version").get<std::string>().rfind("v2", 0) == 0) {
            ++v2_running;
          }
        }
        ++samples;
        max_transition = std::max(max_transition, transition);
        max_alive = std::max(max_alive, dep.at("replicas").size());
        return dep.value("status", "") == "HEALTHY" && v2_running == 10 &&
               dep.at("replicas").size() == 10;
      },
      60s, 5ms);
  CHECK(done);
  CAPTURE(samples);
  CHECK(max_transition >= 1);  // the sampling saw the rollout
  CHECK(max_transition <= 2);
  CHECK(max_alive <= 12);
  for (const auto& id : f.replica_ids(f.deployment("greet", "Hello")))
    CHECK(ids.count(id) == 0);
}

TEST_CASE("kill -9 of a worker: its replicas are re-created on the other nodes") {
  Fixture f;
  REQUIRE(f.client->deploy(app_spec("echo", "/echo", "Echo", 6)).has_value());
  REQUIRE(f.wait_healthy("echo", "Echo", 6));
  f.cluster.nodes.at("w2").signal(SIGKILL);
  // node-timeout (2 s) + a few seconds.
  bool moved = wait_until(
      [&] {
        auto dep = f.deployment("echo", "Echo");
        if (dep.value("status", "") != "HEALTHY")
          return false;
        auto spread = f.per_node(dep);
        return spread == std::map<std::string, int>{{"head", 3}, {"w1", 3}};
      },
      7s, 50ms);
  if (!moved) {
    MESSAGE(f.deployment("echo", "Echo").dump(2));
    f.cluster.dump_output();
  }
  CHECK(moved);
}

TEST_CASE("a handler blocking for 5 s does not delay health checks of other replicas on its node") {
  Fixture f(std::vector<std::string>{});  // one node: every replica shares it
  auto sleep = app_spec("sleep", "/sleep", "Sleep", 1);
  sleep.deployments[0].config.max_ongoing_requests = 1;
  REQUIRE(f.client->deploy(sleep).has_value());
  REQUIRE(f.client->deploy(app_spec("echo", "/echo", "Echo", 2)).has_value());
  REQUIRE(f.wait_healthy("sleep", "Sleep", 1));
  REQUIRE(f.wait_healthy("echo", "Echo", 2));
  auto sleeper = f.endpoints("sleep", "Sleep").at(0).handle;
  auto others = f.endpoints("echo", "Echo");

  std::atomic<bool> slept{false};
  std::thread blocker([&] {
    // A probe below may hold the only request thread for a moment: retry.
    for (int attempt = 0; attempt < 100; ++attempt) {
      auto r = f.call(sleeper, "/", "ms=5000", 20);
      if (!r.has_value() && r.status().code() == errc::overloaded)
        continue;
      slept = r.has_value() && r->status == 200;
      return;
    }
  });
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable())
        t.join();
    }
  } join{blocker};
  // Wait until the sleeper is busy (its one request thread is taken).
  REQUIRE(wait_until(
      [&] {
        auto r = f.call(sleeper, "/", "ms=0", 2);
        return !r.has_value() && r.status().code() == errc::overloaded;
      },
      5s, 10ms));

  caf::scoped_actor self{*f.sys};
  std::vector<double> latencies_ms;
  auto check = [&](const ReplicaActor& replica) {
    auto start = std::chrono::steady_clock::now();
    bool ok = false;
    self->request(replica, std::chrono::seconds(5), health_atom::value)
        .receive([&](caf::ok_atom) { ok = true; }, [&](caf::error&) {});
    CHECK(ok);
    latencies_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  };
  for (int i = 0; i < 10; ++i) {
    for (auto& ep : others)
      check(ep.handle);
    check(sleeper);  // its own control thread is free too
  }
  blocker.join();
  CHECK(slept);
  std::sort(latencies_ms.begin(), latencies_ms.end());
  auto median = latencies_ms[latencies_ms.size() / 2];
  MESSAGE("health check latency while a handler blocks: median " << median << " ms, max "
                                                                 << latencies_ms.back() << " ms");
  CHECK(median < 50.0);
  CHECK(latencies_ms.back() < 250.0);  // generous: the machine is shared
}

TEST_CASE("a restarted head adopts the running replicas instead of restarting them") {
  Fixture f;
  REQUIRE(f.client->deploy(app_spec("echo", "/echo", "Echo", 4)).has_value());
  REQUIRE(f.wait_healthy("echo", "Echo", 4));
  auto dep = f.deployment("echo", "Echo");
  std::set<std::string> on_workers;
  for (const auto& r : dep.at("replicas")) {
    if (r.at("node") != "head")
      on_workers.insert(r.at("id").get<std::string>());
  }
  REQUIRE(!on_workers.empty());
  f.client.reset();
  f.cluster.nodes.at("head").signal(SIGKILL);
  REQUIRE(f.cluster.nodes.at("head").wait_exit(5s).has_value());
  f.cluster.start_head();
  auto endpoint = parse_endpoint(f.cluster.address).value();
  REQUIRE(wait_until(
      [&] {
        auto c = ControllerClient::connect(*f.sys, endpoint, 2);
        if (!c)
          return false;
        f.client.emplace(std::move(c.value()));
        return true;
      },
      20s, 100ms));
  REQUIRE(f.wait_healthy("echo", "Echo", 4));
  auto after = f.replica_ids(f.deployment("echo", "Echo"));
  for (const auto& id : on_workers)
    CHECK(after.count(id) == 1);  // adopted, not restarted
}
