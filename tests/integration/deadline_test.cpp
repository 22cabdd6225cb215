// Deadlines across calls on a real loopback cluster (two nodes, replicas in
// their own processes): a client asks for a shorter deadline with
// X-Request-Timeout-Seconds; a deployment handle call inherits what is left
// of its caller's deadline instead of getting the callee's own timeout, on
// the caller's node and across nodes. The application's request_timeout_s
// is 10 s, so a call bounded by it would take 10 s, not the fractions of a
// second asserted here. Every wait is a condition with a deadline; the
// fixture stops every process it starts.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <string>

#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"

using namespace troupe::testing;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// Gateway (one replica) calls Sleep through a handle (/timed/Sleep); Sleep
// has a replica on each node, so the call may cross nodes.
const char* kDeadline = R"(http_options: {request_timeout_s: 10}
applications:
  - name: deadline
    route_prefix: /deadline
    import_path: libtroupe_examples.so:Gateway
    deployments:
      - name: Gateway
        num_replicas: 1
      - name: Sleep
        import_path: libtroupe_examples.so:Sleep
        num_replicas: 2
        max_ongoing_requests: 10
)";

struct DeadlineCluster {
  Cluster cluster;
  uint16_t proxy = 0;

  DeadlineCluster() {
    cluster.start({"w1"});
    proxy = cluster.http_ports.at("head");
    cluster.deploy_yaml("deadline.yaml", kDeadline, 60s);
    REQUIRE(wait_until(
        [&] {
          auto a = http_get(proxy, "/deadline/timed/Sleep?ms=1", 10);
          return a && a->status == 200 && json::parse(a->body, nullptr, false).value("status", 0) == 200;
        },
        20s, 100ms));
  }

  // One request with X-Request-Timeout-Seconds: its reply and duration.
  std::pair<std::optional<HttpReply>, double> timed_get(const std::string& target,
                                                        const std::string& timeout) {
    auto start = std::chrono::steady_clock::now();
    auto r = http_request(proxy, "GET", target, "", 30, {{"X-Request-Timeout-Seconds", timeout}});
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return {r, s};
  }

  // The Gateway's record of its /timed call tagged `tag`, once it is there
  // (the client may have had its own 504 a moment before the Gateway wrote
  // it).
  json last_timed(const std::string& tag) {
    json last;
    bool seen = wait_until(
        [&] {
          auto r = http_get(proxy, "/deadline/last", 10);
          if (!r || r->status != 200)
            return false;
          last = json::parse(r->body, nullptr, false);
          return last.is_object() &&
                 last.value("query", "").find("tag=" + tag) != std::string::npos;
        },
        10s, 20ms);
    CAPTURE(last.dump());
    REQUIRE(seen);
    return last;
  }
};

}  // namespace

TEST_CASE("deadline: X-Request-Timeout-Seconds 0.5 gives 504 at about 0.5 s - capped by request_timeout_s") {
  DeadlineCluster d;
  auto [r, took] = d.timed_get("/deadline/timed/Sleep?ms=5000", "0.5");
  REQUIRE(r.has_value());
  CHECK(r->status == 504);
  CHECK(took >= 0.45);
  CHECK(took < 3.0);  // far from Sleep's 5 s and the application's 10 s

  // A longer one than request_timeout_s is capped by it: the 1 s sleep ends
  // in time and answers 200.
  auto [ok, took_ok] = d.timed_get("/deadline/timed/Sleep?ms=1000", "3600");
  REQUIRE(ok.has_value());
  CHECK(ok->status == 200);

  // Not a number of seconds > 0: 400 naming the header.
  for (const char* bad : {"abc", "0", "-1", "nan", "1e9"}) {
    CAPTURE(bad);
    auto [b, t] = d.timed_get("/deadline/timed/Sleep?ms=1", bad);
    REQUIRE(b.has_value());
    CHECK(b->status == 400);
    CHECK(b->body.find("X-Request-Timeout-Seconds") != std::string::npos);
  }
}

TEST_CASE("deadline: a handle call made with 300 ms left fails with 504 at about 300 ms") {
  DeadlineCluster d;
  // The Gateway waits 700 ms of the client's 1 s, then calls Sleep (5 s):
  // the call gets the 300 ms left, not Sleep's own 10 s.
  for (int i = 0; i < 4; ++i) {  // Sleep's replicas are on both nodes
    CAPTURE(i);
    const std::string tag = "t" + std::to_string(i);
    auto [r, took] = d.timed_get("/deadline/timed/Sleep?wait_ms=700&ms=5000&tag=" + tag, "1");
    REQUIRE(r.has_value());
    CHECK(r->status == 504);  // the client's own deadline
    CHECK(took < 3.0);
    json last = d.last_timed(tag);
    CHECK(last.value("status", 0) == 504);
    const int64_t elapsed = last.value("elapsed_ms", int64_t{-1});
    CHECK(elapsed >= 200);
    CHECK(elapsed < 2000);  // far below Sleep's 5 s and the 10 s timeout
  }
  // A call made after the caller's deadline passed fails at once: 504,
  // without waiting for Sleep's 5 s or the application's 10 s timeout.
  // 2 s is far from both and leaves two busy cores room.
  auto [late, took_late] = d.timed_get("/deadline/timed/Sleep?wait_ms=1200&ms=5000&tag=late", "1");
  REQUIRE(late.has_value());
  CHECK(late->status == 504);
  json last = d.last_timed("late");
  CHECK(last.value("status", 0) == 504);
  CHECK(last.value("elapsed_ms", int64_t{-1}) < 2000);
}
