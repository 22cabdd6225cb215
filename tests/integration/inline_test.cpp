// The proxy's inline path on a real node (proxy/inline_path.cpp): an
// in_process replica whose deployment declares its handler non-blocking
// (examples/inline_probe.cpp) is called by the proxy's io threads. Checked
// through HTTP: answers (also a streamed one), max_ongoing_requests with the
// proxy's queue across two io threads, a handler that throws answered as on
// the normal path (the same class declaring nothing, at /normal), the
// proxy's metrics, and a rolling update and a delete while requests flow:
// no request is lost or failed, and the node exits cleanly. Blocking
// handlers in process are called inline too while their calls are short:
// one that waits has its io thread's loop taken over by another thread
// (runtime/loop_takeover.hpp), and the client's leaving still cancels it;
// the same in a replica process, whose request loop runs them.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"
#include "tests/support/stream_client.hpp"

using namespace troupe::testing;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// `probe_replicas` replicas of the probe, with `probe_args` and `isolation`;
// the same class declaring nothing (the normal path) at /normal.
std::string config(int probe_replicas, int max_ongoing, const std::string& probe_args,
                   const std::string& isolation = "in_process") {
  return R"(http_options: {request_timeout_s: 30}
applications:
  - name: probe
    route_prefix: /probe
    import_path: libtroupe_examples.so:InlineProbe
    args: )" + probe_args +
         R"(
    deployments:
      - name: InlineProbe
        num_replicas: )" +
         std::to_string(probe_replicas) + R"(
        max_ongoing_requests: )" +
         std::to_string(max_ongoing) + R"(
        isolation: )" + isolation + R"(
  - name: normal
    route_prefix: /normal
    import_path: libtroupe_examples.so:InlineProbe
    args: {nonblocking: false}
    deployments:
      - name: InlineProbe
        num_replicas: 1
        max_ongoing_requests: 2
        isolation: in_process
)";
}

// `clients` threads each GET `target` `per_client` times on `port`: how many
// answers had each status, and the most calls the probe ever ran at once
// (its max_running, from the answers).
struct Load {
  std::map<int, int> statuses;
  int most_running = 0;
  std::string replica;  // of the last answer
};
Load run_clients(uint16_t port, const std::string& target, int clients, int per_client) {
  Load load;
  std::mutex mutex;
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < per_client; ++k) {
        auto r = http_get(port, target, 30);
        std::lock_guard<std::mutex> lock(mutex);
        ++load.statuses[r ? r->status : 0];
        if (r && r->status == 200) {
          auto body = json::parse(r->body);
          load.most_running = std::max(load.most_running, body.value("max_running", 0));
          load.replica = body.value("replica_id", "");
        }
      }
    });
  }
  for (auto& t : threads)
    t.join();
  return load;
}

struct InlineNode {
  Cluster cluster;
  uint16_t port = 0;
  uint16_t admin = 0;  // its admin listener: /-/routes, /-/metrics

  // Two io threads by default: inline calls of both can overlap.
  explicit InlineNode(const std::string& io_threads = "2") {
    cluster.start({}, {"--proxy-io-threads", io_threads});
    port = cluster.http_ports.at("head");
    admin = cluster.admin_ports.at("head");
  }

  void deploy(const std::string& yaml) { cluster.deploy_yaml("inline.yaml", yaml); }

  // Waits until the proxy routes to `n` replicas of app's InlineProbe.
  void wait_replicas(const std::string& app, size_t n) {
    std::string routes;
    INFO("last /-/routes: ", routes);
    REQUIRE(wait_until(
        [&] {
          auto r = http_get(admin, "/-/routes", 5);
          if (!r || r->status != 200)
            return false;
          routes = r->body;
          const json body = json::parse(r->body);
          for (const auto& d : body["deployments"]) {
            if (d["application"] == app && d["deployment"] == "InlineProbe")
              return d["replicas"].size() == n;
          }
          return false;
        },
        30s, 100ms));
  }

  // The value of the first line of /-/metrics that starts with `key`; -1
  // when there is none.
  double metric(const std::string& key) {
    auto r = http_get(admin, "/-/metrics", 5);
    REQUIRE(r);
    // At the start of a line (a # HELP line names the series too).
    auto at = r->body.find("\n" + key + " ");
    if (at == std::string::npos)
      return -1;
    return std::stod(r->body.substr(at + 1 + key.size() + 1));
  }
};

}  // namespace

TEST_CASE("inline: an in_process non-blocking deployment answers through the io threads") {
  InlineNode node;
  node.deploy(config(1, 1, "{}"));
  node.wait_replicas("probe", 1);
  node.wait_replicas("normal", 1);
  const double inline_before = node.metric("troupe_proxy_replica_sends_total{transport=\"inline\"}");
  const double caf_before = node.metric("troupe_proxy_replica_sends_total{transport=\"caf\"}");

  auto first = http_get(node.port, "/probe/?a=1", 10);
  REQUIRE(first);
  CAPTURE(first->body);
  CHECK(first->status == 200);
  CHECK(json::parse(first->body).value("replica_id", "").find("probe#InlineProbe#") == 0);
  CHECK(first->head.find("X-Request-Id") != std::string::npos);

  // max_ongoing_requests 1: eight clients over both io threads, each call
  // computing 2 ms; the proxy queues the rest, and the replica never runs
  // two at once.
  constexpr int kClients = 8;
  constexpr int kPerClient = 20;
  auto load = run_clients(node.port, "/probe/?spin_us=2000", kClients, kPerClient);
  CHECK(load.statuses[200] == kClients * kPerClient);
  CHECK(load.most_running == 1);

  // A handler that throws: the same answer as on the normal path.
  auto thrown = http_get(node.port, "/probe/?mode=throw", 10);
  auto normal = http_get(node.port, "/normal/?mode=throw", 10);
  REQUIRE(thrown);
  REQUIRE(normal);
  CAPTURE(thrown->body);
  CAPTURE(normal->body);
  CHECK(thrown->status == 500);
  CHECK(thrown->status == normal->status);
  CHECK(json::parse(thrown->body)["error"] == json::parse(normal->body)["error"]);
  CHECK(json::parse(thrown->body)["error"] == "handler raised: probe failure");

  // A streamed answer goes on from a thread of its own.
  auto streamed = http_get(node.port, "/probe/?mode=stream&n=3", 10);
  REQUIRE(streamed);
  CHECK(streamed->status == 200);
  CHECK(streamed->body == "piece 0\npiece 1\npiece 2\n");

  // The proxy counted them: every request of /probe ran inline (the stream
  // too), and so did /normal's (a blocking handler is called inline while
  // its calls are short; before, it went over CAF).
  const int probe_requests = 1 + kClients * kPerClient + 1 + 1;
  CHECK(node.metric("troupe_proxy_replica_sends_total{transport=\"inline\"}") - inline_before ==
        probe_requests + 1);
  CHECK(node.metric("troupe_proxy_replica_sends_total{transport=\"caf\"}") == caf_before);
  CHECK(node.metric("troupe_proxy_requests_total{application=\"probe\",code=\"200\"}") ==
        1 + kClients * kPerClient + 1);
  CHECK(node.metric("troupe_proxy_requests_total{application=\"probe\",code=\"500\"}") == 1);
  auto reports = node.cluster.stop_all();
  for (const auto& r : reports)
    FAIL_CHECK(r);
}

namespace {

// Replicas of the probe replaced one by one (new args), then deleted, while
// four clients send requests: none fails before the delete, and after it
// only 404 or 503.
void update_and_delete_under_load(const std::string& isolation, bool blocking = false) {
  const std::string extra = blocking ? ", nonblocking: false}" : "}";
  InlineNode node;
  node.deploy(config(2, 4, "{generation: 1" + extra, isolation));
  node.wait_replicas("probe", 2);

  std::atomic<bool> stop{false};
  std::atomic<bool> deleted{false};
  std::mutex mutex;
  std::map<int, int> before_delete;  // status -> count
  std::map<int, int> after_delete;
  std::string unexpected;
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&] {
      while (!stop.load()) {
        bool was_deleted = deleted.load();
        auto r = http_get(node.port, "/probe/?spin_us=200", 30);
        int status = r ? r->status : 0;
        std::lock_guard<std::mutex> lock(mutex);
        ++(was_deleted ? after_delete : before_delete)[status];
        if (status != 200 && !(was_deleted && (status == 404 || status == 503)))
          unexpected = std::to_string(status) + (r ? " " + r->body : std::string(" no answer"));
      }
    });
  }
  auto answered = [&] {
    std::lock_guard<std::mutex> lock(mutex);
    return before_delete[200];
  };
  REQUIRE(wait_until([&] { return answered() >= 100; }, 30s, 10ms));

  // New args: a new version, replaced replica by replica while requests flow.
  node.deploy(config(2, 4, "{generation: 2" + extra, isolation));
  const int after_update = answered();
  REQUIRE(wait_until([&] { return answered() >= after_update + 100; }, 30s, 10ms));

  deleted.store(true);
  auto gone = node.cluster.ctl({"delete", "probe"});
  CAPTURE(gone.err);
  REQUIRE(gone.exit_code == 0);
  // Once the proxy has no route, every answer is 404.
  REQUIRE(wait_until(
      [&] {
        auto r = http_get(node.port, "/probe/", 5);
        return r && r->status == 404;
      },
      30s, 50ms));
  stop.store(true);
  for (auto& t : clients)
    t.join();
  CAPTURE(unexpected);
  CHECK(unexpected.empty());
  CHECK(before_delete[0] == 0);
  CHECK(after_delete[0] == 0);
  CHECK(before_delete[200] >= after_update + 100);
  auto reports = node.cluster.stop_all();
  for (const auto& r : reports)
    FAIL_CHECK(r);
}

}  // namespace

TEST_CASE("inline: a rolling update and a delete while requests flow lose no request") {
  update_and_delete_under_load("in_process");
}

TEST_CASE("in process: a rolling update and a delete while requests flow to a blocking handler lose no request") {
  update_and_delete_under_load("in_process", true);
}

TEST_CASE("inline: a process-isolated non-blocking deployment answers from one loop over its data channel") {
  InlineNode node;
  node.deploy(config(1, 4, "{}", "process"));
  node.wait_replicas("probe", 1);
  const double channel_before =
      node.metric("troupe_proxy_replica_sends_total{transport=\"channel\"}");
  const double inline_before = node.metric("troupe_proxy_replica_sends_total{transport=\"inline\"}");

  auto first = http_get(node.port, "/probe/?a=1", 10);
  REQUIRE(first);
  CAPTURE(first->body);
  CHECK(first->status == 200);
  CHECK(json::parse(first->body).value("replica_id", "").find("probe#InlineProbe#") == 0);
  CHECK(first->head.find("X-Request-Id") != std::string::npos);

  // Eight clients over both io threads, each call computing 2 ms, with room
  // for four at once: the process runs a non-blocking handler on its one
  // request loop, one call after another, and every request is answered.
  constexpr int kClients = 8;
  constexpr int kPerClient = 20;
  auto load = run_clients(node.port, "/probe/?spin_us=2000", kClients, kPerClient);
  CHECK(load.statuses[200] == kClients * kPerClient);
  CHECK(load.most_running == 1);

  // A handler that throws: the same answer as on the normal path.
  auto thrown = http_get(node.port, "/probe/?mode=throw", 10);
  REQUIRE(thrown);
  CAPTURE(thrown->body);
  CHECK(thrown->status == 500);
  CHECK(json::parse(thrown->body)["error"] == "handler raised: probe failure");

  // A streamed answer goes on from a thread of its own.
  auto streamed = http_get(node.port, "/probe/?mode=stream&n=3", 10);
  REQUIRE(streamed);
  CHECK(streamed->status == 200);
  CHECK(streamed->body == "piece 0\npiece 1\npiece 2\n");

  // An answer larger than a frame (256 KiB at most) goes in several.
  auto big = http_get(node.port, "/probe/?mode=big&bytes=700000", 10);
  REQUIRE(big);
  CHECK(big->status == 200);
  REQUIRE(big->body.size() == 700000u);
  CHECK(big->body[0] == '0');
  CHECK(big->body[699000] == '9');
  CHECK(big->body[699001] == 'b');

  // Every request of /probe went over the data channel; none ran inline in
  // the node.
  const int probe_requests = 1 + kClients * kPerClient + 1 + 1 + 1;
  CHECK(node.metric("troupe_proxy_replica_sends_total{transport=\"channel\"}") - channel_before ==
        probe_requests);
  CHECK(node.metric("troupe_proxy_replica_sends_total{transport=\"inline\"}") == inline_before);
  CHECK(node.metric("troupe_proxy_requests_total{application=\"probe\",code=\"200\"}") ==
        1 + kClients * kPerClient + 1 + 1);
  auto reports = node.cluster.stop_all();
  for (const auto& r : reports)
    FAIL_CHECK(r);
}

TEST_CASE("inline: a process-isolated non-blocking deployment loses no request in a rolling update and a delete") {
  update_and_delete_under_load("process");
}

TEST_CASE("inline: requests from another node's proxy run a non-blocking handler where they arrive - one at a time - and answer") {
  Cluster cluster;
  cluster.start({"w1"}, {"--proxy-io-threads", "2", "--resources", "cpu=2"},
                {{"w1", {"--resources", "cpu=2,probe=1"}}}, 30s);
  const uint16_t port = cluster.http_ports.at("head");
  cluster.deploy_yaml("remote.yaml", R"(http_options: {request_timeout_s: 30}
applications:
  - name: probe
    route_prefix: /probe
    import_path: libtroupe_examples.so:InlineProbe
    deployments:
      - name: InlineProbe
        num_replicas: 1
        max_ongoing_requests: 4
        isolation: in_process
        resources: {probe: 0.01}
)");
  REQUIRE(cluster.wait_answers("head", "/probe/"));

  // The head's proxy reaches the replica on w1 over CAF; w1 runs each call
  // on the thread that reads it from the network, one after another, with
  // room for four at once.
  constexpr int kClients = 8;
  constexpr int kPerClient = 10;
  auto load = run_clients(port, "/probe/?spin_us=2000", kClients, kPerClient);
  CHECK(load.statuses[200] == kClients * kPerClient);
  CHECK(load.most_running == 1);
  CHECK(load.replica.find("probe#InlineProbe#") == 0);

  auto thrown = http_get(port, "/probe/?mode=throw", 10);
  REQUIRE(thrown);
  CAPTURE(thrown->body);
  CHECK(thrown->status == 500);
  CHECK(json::parse(thrown->body)["error"] == "handler raised: probe failure");

  // A streamed answer's producer runs on a thread of its own.
  auto streamed = http_get(port, "/probe/?mode=stream&n=50", 10);
  REQUIRE(streamed);
  CHECK(streamed->status == 200);
  std::string expected;
  for (int i = 0; i < 50; ++i)
    expected += "piece " + std::to_string(i) + "\n";
  CHECK(streamed->body == expected);

  auto big = http_get(port, "/probe/?mode=big&bytes=700000", 10);
  REQUIRE(big);
  CHECK(big->status == 200);
  CHECK(big->body.size() == 700000u);
  auto reports = cluster.stop_all();
  for (const auto& r : reports)
    FAIL_CHECK(r);
}

namespace {

// Checks that Sleep's /stats counts one cancelled request within 10 s.
void check_sleep_cancelled(InlineNode& node) {
  std::string last;
  bool seen = wait_until(
      [&] {
        auto r = http_get(node.port, "/sleep/stats", 5);
        if (!r || r->status != 200)
          return false;
        last = r->body;
        return json::parse(r->body).value("cancelled", -1) == 1;
      },
      10s, 20ms);
  INFO("last /sleep/stats: ", last);
  CHECK(seen);
}

}  // namespace

TEST_CASE("in process: a blocking handler that waits does not hold up its io thread - another thread takes the loop over - the replica's next requests go to its request threads - the client's leaving cancels it") {
  // One io thread: without the takeover, every request would wait behind
  // the held one.
  InlineNode node("1");
  node.deploy(R"(http_options: {request_timeout_s: 120}
applications:
  - name: sleep
    route_prefix: /sleep
    import_path: libtroupe_examples.so:Sleep
    deployments:
      - name: Sleep
        num_replicas: 1
        max_ongoing_requests: 4
        isolation: in_process
  - name: probe
    route_prefix: /probe
    import_path: libtroupe_examples.so:InlineProbe
    deployments:
      - name: InlineProbe
        num_replicas: 1
        isolation: in_process
)");
  node.wait_replicas("probe", 1);
  REQUIRE(node.cluster.wait_all_answer("head", {"/sleep/stats", "/probe/"}));
  const std::string takeovers = "troupe_proxy_io_takeovers_total";
  const std::string over_caf = "troupe_proxy_replica_sends_total{transport=\"caf\"}";
  const std::string inline_sends = "troupe_proxy_replica_sends_total{transport=\"inline\"}";
  const double takeovers_before = node.metric(takeovers);
  const double caf_before = node.metric(over_caf);
  const double inline_before = node.metric(inline_sends);
  CHECK(takeovers_before == 0);

  // A Sleep of 20 s, run inline (its short calls so far kept its gate open).
  StreamClient held;
  REQUIRE(held.get(node.port, "/sleep?ms=20000"));
  REQUIRE(wait_until([&] { return node.metric(takeovers) == takeovers_before + 1; }, 10s, 10ms));
  CHECK(node.metric(inline_sends) == inline_before + 1);

  // The io thread's loop goes on on another thread: other requests are
  // answered while the Sleep still waits.
  auto probe = http_get(node.port, "/probe/", 10);
  REQUIRE(probe);
  CHECK(probe->status == 200);
  // Sleep's gate closed at the takeover: its next request goes to its
  // request threads, over CAF.
  auto stats = http_get(node.port, "/sleep/stats", 10);
  REQUIRE(stats);
  CAPTURE(stats->body);
  CHECK(stats->status == 200);
  CHECK(json::parse(stats->body).value("cancelled", -1) == 0);
  CHECK(node.metric(over_caf) == caf_before + 1);
  CHECK(node.metric(inline_sends) == inline_before + 2);  // the held one, the probe

  // The client leaves: the handler, still on the old thread, is cancelled.
  held.close();
  check_sleep_cancelled(node);
  CHECK(node.metric(takeovers) == takeovers_before + 1);
  auto reports = node.cluster.stop_all();
  for (const auto& r : reports)
    FAIL_CHECK(r);
}

TEST_CASE("process: a blocking handler runs on its replica process's request loop - a call that waits has the loop taken over - the next requests go on - the client's leaving cancels it") {
  InlineNode node;
  node.deploy(R"(http_options: {request_timeout_s: 120}
applications:
  - name: sleep
    route_prefix: /sleep
    import_path: libtroupe_examples.so:Sleep
    deployments:
      - name: Sleep
        num_replicas: 1
        max_ongoing_requests: 4
)");
  REQUIRE(node.cluster.wait_all_answer("head", {"/sleep/stats"}));
  // The replica process's count of takeovers of its request loop (-1: not
  // reported yet).
  auto takeovers = [&] {
    auto r = http_get(node.admin, "/-/metrics", 5);
    if (!r)
      return -1.0;
    const std::string series = "\ntroupe_replica_loop_takeovers_total{application=\"sleep\"";
    auto at = r->body.find(series);
    if (at == std::string::npos)
      return -1.0;
    auto end = r->body.find('\n', at + 1);
    auto space = r->body.rfind(' ', end);
    return std::stod(r->body.substr(space + 1, end - space - 1));
  };
  REQUIRE(wait_until([&] { return takeovers() == 0; }, 30s, 50ms));

  // A Sleep of 20 s on the loop (its short calls so far kept it there).
  StreamClient held;
  REQUIRE(held.get(node.port, "/sleep?ms=20000"));
  REQUIRE(wait_until([&] { return takeovers() == 1; }, 30s, 20ms));
  // Another thread runs the loop: the next requests are answered while the
  // Sleep still waits (by the pool while the replica's gate is closed).
  for (int i = 0; i < 3; ++i) {
    auto quick = http_get(node.port, "/sleep?ms=0", 10);
    REQUIRE(quick);
    CAPTURE(quick->body);
    CHECK(quick->status == 200);
  }
  auto stats = http_get(node.port, "/sleep/stats", 10);
  REQUIRE(stats);
  CAPTURE(stats->body);
  CHECK(json::parse(stats->body).value("cancelled", -1) == 0);
  CHECK(json::parse(stats->body).value("completed", -1) >= 3);

  // The client leaves: the handler, still on the old thread, is cancelled.
  held.close();
  check_sleep_cancelled(node);
  auto reports = node.cluster.stop_all();
  for (const auto& r : reports)
    FAIL_CHECK(r);
}
