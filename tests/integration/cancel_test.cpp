// Cancellation on a real one-node cluster (replicas in their own
// processes): a client that leaves a Ticker stream stops its producer while
// it waits for its next event, not at its next write; a Sleep request whose
// client left ends before the next request is answered, having freed its
// slot (max_ongoing_requests 1) for it; a queued request whose client left
// never reaches the replica. The deployments record, in their /stats, the
// steady_clock time (CLOCK_MONOTONIC, the same clock as this test's on one
// host) at which they noticed a cancellation, so the checks are orderings
// of those times, or bounds in seconds far below the wait they contrast
// with (two busy cores must not fail them). Every wait is a condition with a
// deadline; the fixture stops every process it starts.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <future>
#include <optional>
#include <string>

#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"
#include "tests/support/stream_client.hpp"

using namespace troupe::testing;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

using Clock = std::chrono::steady_clock;

// Ticker streams at /stream; Sleep at /sleep with one slot and a long queue;
// at /compose a Gateway that calls a Sleep of its application through a
// deployment handle (/compose/timed/Sleep?ms=N).
const char* kCancel = R"(http_options: {request_timeout_s: 120}
applications:
  - name: stream
    route_prefix: /stream
    import_path: libtroupe_examples.so:Ticker
    deployments:
      - name: Ticker
        num_replicas: 1
        max_ongoing_requests: 10
  - name: sleep
    route_prefix: /sleep
    import_path: libtroupe_examples.so:Sleep
    deployments:
      - name: Sleep
        num_replicas: 1
        max_ongoing_requests: 1
        max_queued_requests: 1000
  - name: compose
    route_prefix: /compose
    import_path: libtroupe_examples.so:Gateway
    deployments:
      - name: Gateway
        num_replicas: 1
      - name: Sleep
        import_path: libtroupe_examples.so:Sleep
        num_replicas: 1
        max_ongoing_requests: 10
)";

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

struct CancelCluster {
  Cluster cluster;
  uint16_t proxy = 0;
  uint16_t admin = 0;  // the head's admin listener

  // `sleep_in_process`: Sleep runs in the node's process (its blocking
  // handler called by the proxy's io thread while its calls are short, the
  // io thread's loop taken over by another thread while one waits).
  explicit CancelCluster(bool sleep_in_process = false) {
    cluster.start();
    proxy = cluster.http_ports.at("head");
    admin = cluster.admin_ports.at("head");
    std::string yaml = kCancel;
    if (sleep_in_process) {
      const std::string queue = "        max_queued_requests: 1000\n";
      auto at = yaml.find(queue);
      REQUIRE(at != std::string::npos);
      yaml.insert(at + queue.size(), "        isolation: in_process\n");
    }
    cluster.deploy_yaml("cancel.yaml", yaml, 60s);
    REQUIRE(cluster.wait_all_answer("head", {"/stream/stats", "/sleep/stats"}));
  }

  json stats(const std::string& prefix) {
    auto r = http_get(proxy, prefix + "/stats", 10);
    if (!r || r->status != 200)
      return json();
    return json::parse(r->body, nullptr, false);
  }

  // The proxy's view of (app, deployment) in /-/routes: {queued, replicas:
  // [{in_flight, ...}]}; null when it did not answer.
  json route(const std::string& app, const std::string& deployment) {
    auto r = http_get(admin, "/-/routes", 5);
    if (!r || r->status != 200)
      return json();
    json view = json::parse(r->body, nullptr, false);
    if (!view.is_object())
      return json();
    for (const auto& d : view.value("deployments", json::array())) {
      if (d.value("application", "") == app && d.value("deployment", "") == deployment)
        return d;
    }
    return json();
  }

  // Requests the proxy has at Sleep's replica right now (-1: unknown).
  int64_t in_flight(const std::string& app, const std::string& deployment) {
    json d = route(app, deployment);
    if (!d.is_object() || d.value("replicas", json::array()).size() != 1)
      return -1;
    return d["replicas"][0].value("in_flight", int64_t{-1});
  }

  int64_t sleep_in_flight() {
    json d = route("sleep", "Sleep");
    if (!d.is_object() || d.value("replicas", json::array()).size() != 1)
      return -1;
    return d["replicas"][0].value("in_flight", int64_t{-1});
  }

  int64_t sleep_queued() {
    json d = route("sleep", "Sleep");
    return d.is_object() ? d.value("queued", int64_t{-1}) : -1;
  }
};

}  // namespace

TEST_CASE("cancel: a client that leaves a Ticker stream cancels its producer while it waits for its next event") {
  CancelCluster c;
  json before = c.stats("/stream");
  REQUIRE(before.is_object());
  const int64_t cancelled_before = before.value("streams_cancelled", int64_t{0});

  // Events 10 s apart: after event 0 the producer waits 10 s for event 1. A
  // producer that learnt of the cancellation only when a write failed would
  // learn it then.
  StreamClient stream;
  REQUIRE(stream.get(c.proxy, "/stream?n=1000&ms=10000"));
  // The head and the first event ("data: 0" and the blank line ending it).
  const auto deadline = Clock::now() + 10s;
  REQUIRE(stream.read_head(deadline));
  StreamClient::Chunk first;
  REQUIRE(stream.next_chunk(first, deadline) == StreamClient::Next::chunk);
  REQUIRE(first.data == "data: 0\n\n");
  const int64_t t0 = now_ns();
  stream.close();

  json after;
  REQUIRE(wait_until(
      [&] {
        after = c.stats("/stream");
        return after.is_object() && after.value("streams_cancelled", int64_t{0}) > cancelled_before;
      },
      20s, 20ms));
  CAPTURE(after.dump());
  const int64_t noticed = after.value("last_cancel_ns", int64_t{0}) - t0;
  CAPTURE(noticed);
  // Noticed after the client left ...
  CHECK(noticed >= 0);
  // ... and in the wait for event 1, due 10 s after event 0 (which came
  // before t0): the cancellation reached the waiting producer by itself.
  // 5 s leaves two busy cores room and is still half that wait.
  CHECK(noticed < 5'000'000'000);

  // The producer stopped at once: it returned (streams_cancelled counts
  // that) having sent event 0 only, and sends nothing after.
  CHECK(after.value("events_sent", int64_t{-1}) == 1);
  json last = c.stats("/stream");
  CAPTURE(last.dump());
  CHECK(last.value("events_sent", int64_t{-1}) == 1);
  CHECK(last.value("streams_completed", int64_t{-1}) == 0);
  CHECK(last.value("streams_started", int64_t{-1}) == 1);
}

namespace {

void cancelled_request_frees_its_slot(CancelCluster& c) {
  StreamClient held;
  REQUIRE(held.get(c.proxy, "/sleep?ms=20000"));
  // The request runs at the replica (its only slot).
  REQUIRE(wait_until([&] { return c.sleep_in_flight() == 1; }, 10s, 20ms));

  const int64_t t0 = now_ns();
  held.close();
  const auto sent = Clock::now();
  auto next = http_get(c.proxy, "/sleep?ms=0", 10);
  const int64_t answered = now_ns();
  const double took = std::chrono::duration<double>(Clock::now() - sent).count();
  REQUIRE(next.has_value());
  CAPTURE(next->body);
  CHECK(next->status == 200);
  CHECK(took < 5.0);  // not after the 20 s sleep

  json stats = c.stats("/sleep");
  CAPTURE(stats.dump());
  CHECK(stats.value("cancelled", int64_t{-1}) == 1);
  CHECK(stats.value("completed", int64_t{-1}) == 1);  // request 2
  const int64_t cancel_ns = stats.value("last_cancel_ns", int64_t{0});
  CAPTURE(cancel_ns - t0);
  CAPTURE(answered - cancel_ns);
  // In order: the client left, the held request noticed it and returned,
  // freeing the only slot, and then the next request ran there and was
  // answered.
  CHECK(cancel_ns >= t0);
  CHECK(cancel_ns <= answered);
  // Soon, not at the end of the 20 s sleep: 5 s leaves two busy cores room.
  CHECK(cancel_ns - t0 < 5'000'000'000);
}

}  // namespace

TEST_CASE("cancel: a Sleep request cancelled by its client frees its slot for the next request") {
  CancelCluster c;
  cancelled_request_frees_its_slot(c);
}

TEST_CASE("cancel: a Sleep request in process cancelled by its client frees its slot for the next request") {
  CancelCluster c(true);
  cancelled_request_frees_its_slot(c);
}

TEST_CASE("cancel: a queued request whose client left never runs") {
  CancelCluster c;
  // A holds Sleep's only slot for 1.5 s.
  auto a = std::async(std::launch::async, [&] { return http_get(c.proxy, "/sleep?ms=1500", 30); });
  REQUIRE(wait_until([&] { return c.sleep_in_flight() == 1; }, 10s, 20ms));
  {
    // B waits in the proxy's queue, then its client leaves.
    StreamClient b;
    REQUIRE(b.get(c.proxy, "/sleep?ms=0"));
    REQUIRE(wait_until([&] { return c.sleep_queued() == 1; }, 5s, 10ms));
    b.close();
  }
  auto answer = a.get();
  REQUIRE(answer.has_value());
  CHECK(answer->status == 200);
  // B is dropped from the queue, by the time A is done or moments later.
  CHECK(wait_until([&] { return c.sleep_queued() == 0; }, 5s, 20ms));
  // Had B been sent to the replica, it would have run (0 ms) before this
  // /stats request, queued behind it on the one slot.
  json stats = c.stats("/sleep");
  CAPTURE(stats.dump());
  CHECK(stats.value("completed", int64_t{-1}) == 1);  // A only
  CHECK(stats.value("cancelled", int64_t{-1}) == 0);
}

TEST_CASE("cancel: a client that leaves cancels the handle calls its request made") {
  CancelCluster c;
  // Gateway calls Sleep (20 s) through a handle and waits for its answer.
  StreamClient held;
  REQUIRE(held.get(c.proxy, "/compose/timed/Sleep?wait_ms=0&ms=20000"));
  REQUIRE(wait_until(
      [&] { return c.in_flight("compose", "Sleep") == 1 && c.in_flight("compose", "Gateway") == 1; },
      10s, 20ms));

  const auto left = Clock::now();
  held.close();
  // The Gateway's request is cancelled at its replica, which cancels the
  // call it is waiting for: Sleep notices and returns, and both slots free
  // long before the 20 s.
  CHECK(wait_until(
      [&] { return c.in_flight("compose", "Sleep") == 0 && c.in_flight("compose", "Gateway") == 0; },
      10s, 20ms));
  const double took = std::chrono::duration<double>(Clock::now() - left).count();
  CAPTURE(took);
  CHECK(took < 5.0);
  auto metrics = http_get(c.admin, "/-/metrics", 10);
  REQUIRE(metrics.has_value());
  // The client's request and the cancelled handle call, both counted as 499.
  CHECK(metrics->body.find("troupe_proxy_requests_total{application=\"compose\",code=\"499\"} 2") !=
        std::string::npos);
}
