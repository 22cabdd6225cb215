// Worker to worker over data ports (proxy/peer_client.cpp, proxy/peer_server.cpp): a worker's proxy
// sends requests for another worker's replicas to that worker's data port,
// not over CAF. Real troupe-node processes on loopback; every wait is a
// condition with a deadline; the Cluster stops every process it started,
// also when a check fails.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <cstring>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "runtime/data_channel.hpp"
#include "runtime/resources.hpp"
#include "tests/support/client_cluster.hpp"
#include "tests/support/cluster.hpp"
#include "tests/support/frames.hpp"
#include "tests/support/http_client.hpp"
#include "tests/support/specs.hpp"
#include "tests/support/stream_client.hpp"

using namespace troupe;
using namespace troupe::testing;
using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// An application of `cls` whose replicas run only on nodes with the
// resource `node` (each worker started with one named after itself).
controller::ApplicationSpec pinned_app(const std::string& name, const std::string& prefix,
                                       const std::string& cls, uint32_t replicas,
                                       const std::string& node,
                                       controller::Isolation isolation =
                                           controller::Isolation::process) {
  auto app = example_app(name, prefix, cls, replicas);
  app.deployments[0].config.resources = parse_resources(node + "=0.1").value();
  app.deployments[0].config.isolation = isolation;
  app.deployments[0].config.max_ongoing_requests = 8;
  return app;
}

struct Fixture : ClientCluster {
  // Each worker has a resource named after itself; those in `serving` also
  // `srv`.
  explicit Fixture(const std::vector<std::string>& workers,
                   const std::set<std::string>& serving = {}) {
    std::map<std::string, std::vector<std::string>> args;
    for (const auto& w : workers)
      args[w] = {"--resources", "cpu=2," + w + "=1" + (serving.count(w) ? ",srv=1" : "")};
    start(workers, {}, args);
  }

  uint16_t port(const std::string& node) { return cluster.http_ports.at(node); }
  uint16_t admin(const std::string& node) { return cluster.admin_ports.at(node); }

  bool output_has(const std::string& node, const std::string& text) {
    return cluster.nodes.at(node).output().find(text) != std::string::npos;
  }

  // Replica id -> node of the RUNNING replicas.
  std::map<std::string, std::string> running(const std::string& app, const std::string& dep) {
    std::map<std::string, std::string> out;
    for (const auto& r : deployment(app, dep).value("replicas", json::array())) {
      if (r.at("state") == "RUNNING")
        out[r.at("id")] = r.at("node");
    }
    return out;
  }

  // Requests `node`'s proxy sent over other workers' data ports so far.
  long peer_sends(const std::string& node) {
    auto n = metric_value(admin(node), R"(troupe_proxy_replica_sends_total{transport="peer"})");
    REQUIRE(n);
    return static_cast<long>(*n);
  }

  // GETs `target` (of an application pinned to w2) through w1 until one is
  // answered 200 over w2's data port: w1's peer sends grew with it (the
  // first request to w2 opens the connection and goes over CAF itself).
  void open_w1_to_w2(const std::string& target) {
    REQUIRE(wait_until(
        [&] {
          const long before = peer_sends("w1");
          auto r = http_get(port("w1"), target, 5);
          return r && r->status == 200 && peer_sends("w1") > before;
        },
        20s, 100ms));
  }

  // `node`'s data port, from its log line.
  uint16_t data_port(const std::string& node) {
    static const std::regex line(R"(other workers reach this node on [^ ]+ \(data port (\d+)\))");
    std::smatch m;
    auto out = cluster.nodes.at(node).output();
    REQUIRE(std::regex_search(out, m, line));
    return static_cast<uint16_t>(std::stoi(m[1]));
  }
};

}  // namespace

TEST_CASE("w1 reaches the replicas of w2 over the data port of w2 - answers bodies and streams arrive whole") {
  Fixture f({"w1", "w2"});
  REQUIRE(f.client->deploy(pinned_app("echo", "/echo", "Echo", 2, "w2")).has_value());
  REQUIRE(f.client
              ->deploy(pinned_app("bytes", "/bytes", "Bytes", 1, "w2",
                                  controller::Isolation::in_process))
              .has_value());
  REQUIRE(f.wait_healthy("echo", "Echo", 2));
  REQUIRE(f.wait_healthy("bytes", "Bytes", 1));
  auto replicas = f.running("echo", "Echo");
  for (const auto& [id, node] : replicas)
    REQUIRE(node == "w2");
  REQUIRE(f.wait_routed("w1", "echo", "Echo", 2));
  REQUIRE(f.wait_routed("w1", "bytes", "Bytes", 1));
  f.open_w1_to_w2("/echo/open");
  long before = f.peer_sends("w1");

  std::set<std::string> served_by;
  for (int i = 0; i < 40; ++i) {
    auto r = http_get(f.port("w1"), "/echo/item/" + std::to_string(i) + "?q=" + std::to_string(i),
                      10);
    REQUIRE(r);
    REQUIRE(r->status == 200);
    auto body = json::parse(r->body);
    CHECK(body.at("path") == "/item/" + std::to_string(i));
    CHECK(body.at("query") == "q=" + std::to_string(i));
    CHECK(body.at("node_id") == "w2");
    served_by.insert(body.at("replica_id").get<std::string>());
  }
  for (const auto& id : served_by)
    CHECK(replicas.count(id) == 1);
  // A body of 3 MiB there and back.
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i)
    big[i] = static_cast<char>('a' + i % 26);
  auto posted = http_request(f.port("w1"), "POST", "/echo/big", big, 30);
  REQUIRE(posted);
  REQUIRE(posted->status == 200);
  CHECK(json::parse(posted->body).at("body") == big);
  // A streamed answer of 8 MiB, in chunks of 64 KiB, under the replica's
  // credit window: every byte in order.
  auto streamed = http_get(f.port("w1"), "/bytes/?mb=8&chunk=65520", 60);
  REQUIRE(streamed);
  REQUIRE(streamed->status == 200);
  REQUIRE(streamed->body.size() == size_t{8} << 20);
  bool pattern = true;
  for (size_t i = 0; i < streamed->body.size() && pattern; ++i)
    pattern = streamed->body[i] == static_cast<char>('a' + (i % 65520) % 26);
  CHECK(pattern);
  // All of it went over the data port.
  CHECK(f.peer_sends("w1") - before >= 42);
  CHECK_FALSE(f.output_has("w1", "lost the data port connection"));
}

TEST_CASE("w1 judges what happened at w2 as over CAF - a query of death is answered 502 after two crashed replicas of w2") {
  Fixture f({"w1", "w2"});
  REQUIRE(f.client->deploy(pinned_app("crash", "/crash", "Crash", 2, "w2")).has_value());
  REQUIRE(f.wait_healthy("crash", "Crash", 2));
  REQUIRE(f.wait_routed("w1", "crash", "Crash", 2));
  f.open_w1_to_w2("/crash/");
  auto before = f.running("crash", "Crash");
  long sends = f.peer_sends("w1");
  auto r = http_get(f.port("w1"), "/crash/?mode=segv", 30);
  REQUIRE(r);
  CHECK(r->status == 502);
  auto body = json::parse(r->body, nullptr, false);
  REQUIRE(body.is_object());
  CHECK(body.value("error", "").find("crashed 2 replicas") != std::string::npos);
  CHECK(f.peer_sends("w1") - sends >= 1);
  // Both were replaced; w1 kept its connection to w2 throughout.
  REQUIRE(f.wait_healthy("crash", "Crash", 2));
  for (const auto& [id, node] : f.running("crash", "Crash"))
    CHECK(before.count(id) == 0);
  CHECK_FALSE(f.output_has("w1", "lost the data port connection"));
  auto ok = http_get(f.port("w1"), "/crash/", 10);
  REQUIRE(ok);
  CHECK(ok->status == 200);
}

TEST_CASE("a data port serves nobody without the token of its node") {
  Fixture f({"w1", "w2"});
  uint16_t port = f.data_port("w2");
  // A wrong token, and a request with no hello at all: each connection is
  // closed, and w2 says why.
  CHECK(closed_after_sending(port, stream_frame(channel::Kind::hello, 0, "not-the-token"), 10s));
  HttpRequest req;
  req.method = "GET";
  req.path = "/";
  std::vector<uint64_t> words;
  channel::append_stream_request(words, 1, req, "echo#Echo#1");
  CHECK(closed_after_sending(
      port, std::string(reinterpret_cast<const char*>(words.data()), words.size() * 8), 10s));
  CHECK(wait_until(
      [&] { return f.output_has("w2", "refused a data port connection from 127.0.0.1"); }, 10s));
  // Garbage is closed too.
  CHECK(closed_after_sending(port, std::string(64, '\xff'), 10s));
  // The node serves on.
  REQUIRE(f.client->deploy(pinned_app("echo", "/echo", "Echo", 1, "w2")).has_value());
  REQUIRE(f.wait_healthy("echo", "Echo", 1));
  CHECK(f.cluster.wait_answers("w1", "/echo/after"));
}

TEST_CASE("a worker killed under load through another worker - its requests on the data port are placed again - none fails") {
  Fixture f({"w1", "w2", "w3"}, {"w2", "w3"});
  // Four replicas on w2 and w3 (placement spreads them); the load enters at
  // w1, which has none.
  auto app = example_app("echo", "/echo", "Echo", 4);
  app.deployments[0].config.resources = parse_resources("srv=0.1").value();
  app.deployments[0].config.max_ongoing_requests = 8;
  REQUIRE(f.client->deploy(app).has_value());
  REQUIRE(f.wait_healthy("echo", "Echo", 4));
  std::map<std::string, int> per_node;
  for (const auto& [id, node] : f.running("echo", "Echo"))
    ++per_node[node];
  REQUIRE(per_node["w2"] > 0);
  REQUIRE(per_node["w3"] > 0);
  REQUIRE(f.wait_routed("w1", "echo", "Echo", 4));
  // w1 has its data port connections to w2 and w3: a request answered by a
  // replica of each went over a data port (w1's peer sends grew with it;
  // w1 sends nothing else meanwhile).
  std::set<std::string> over_data_port;
  REQUIRE(wait_until(
      [&] {
        const long before = f.peer_sends("w1");
        auto r = http_get(f.port("w1"), "/echo/open", 5);
        if (r && r->status == 200 && f.peer_sends("w1") > before)
          over_data_port.insert(json::parse(r->body).value("node_id", ""));
        return over_data_port == std::set<std::string>{"w2", "w3"};
      },
      20s, 100ms));

  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::map<int, int> statuses;
  std::atomic<int> count{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&] {
      while (!stop) {
        auto r = http_get(f.port("w1"), "/echo/load", 30);
        std::lock_guard<std::mutex> lock(mutex);
        ++statuses[r ? r->status : 0];
        ++count;
      }
    });
  }
  struct Join {
    std::atomic<bool>& stop;
    std::vector<std::thread>& threads;
    ~Join() {
      stop = true;
      for (auto& t : threads)
        t.join();
    }
  } join{stop, clients};
  REQUIRE(wait_until([&] { return count >= 100; }, 20s));
  int at_kill = count;
  long peer_before = f.peer_sends("w1");
  f.cluster.nodes.at("w2").signal(SIGKILL);
  CHECK(wait_until([&] { return f.output_has("w1", "lost the data port connection to node w2"); },
                   10s));
  // Requests go on, on w3's replicas.
  REQUIRE(wait_until([&] { return count >= at_kill + 200; }, 30s));
  stop = true;
  for (auto& t : clients)
    t.join();
  clients.clear();
  CHECK(f.peer_sends("w1") > peer_before);
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& [status, n] : statuses)
    MESSAGE("status " << status << ": " << n);
  CHECK(statuses.size() == 1);
  CHECK(statuses.count(200) == 1);
}

TEST_CASE("through the data port of w2 - a deadline answers 504 - a full replica makes a request wait - a client that leaves cancels at the replica") {
  Fixture f({"w1", "w2"});
  // In process: its metrics are the node's own, not a report a second
  // late (it runs on its request threads: w2 sends it requests over CAF).
  auto sleep = pinned_app("sleep", "/sleep", "Sleep", 1, "w2", controller::Isolation::in_process);
  sleep.deployments[0].config.max_ongoing_requests = 1;
  REQUIRE(f.client->deploy(sleep).has_value());
  REQUIRE(f.client->deploy(pinned_app("ticker", "/ticker", "Ticker", 1, "w2")).has_value());
  REQUIRE(f.wait_healthy("sleep", "Sleep", 1));
  REQUIRE(f.wait_healthy("ticker", "Ticker", 1));
  REQUIRE(f.wait_routed("w1", "sleep", "Sleep", 1));
  REQUIRE(f.wait_routed("w1", "ticker", "Ticker", 1));
  f.open_w1_to_w2("/sleep/?ms=0");
  long sends = f.peer_sends("w1");
  auto stats = [&](const std::string& prefix) {
    auto r = http_get(f.port("w2"), prefix + "/stats", 5);
    REQUIRE(r);
    REQUIRE(r->status == 200);
    return json::parse(r->body);
  };

  // The client's deadline: 504 at about 0.5 s; the replica learns it and
  // ends the request (cancelled), freeing its only slot.
  auto started = std::chrono::steady_clock::now();
  auto late = http_request(f.port("w1"), "GET", "/sleep/?ms=5000", "", 30,
                           {{"X-Request-Timeout-Seconds", "0.5"}});
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  REQUIRE(late);
  CHECK(late->status == 504);
  CHECK(took < 3.0);
  CHECK(wait_until([&] { return stats("/sleep").value("cancelled", 0) >= 1; }, 10s, 50ms));

  // The replica is full with a request through w2's own proxy; w1 does not
  // know it: its request is refused at the replica, over the data port, and
  // placed again until the slot is free. Both are answered.
  // A second: within the refusals' budget (Attempts::kMaxRefusals, about
  // 1.8 s of backoff), after which a request is answered 503.
  auto held = std::async(std::launch::async,
                         [&] { return http_get(f.port("w2"), "/sleep/?ms=1000", 30); });
  static const std::regex busy(
      R"(troupe_replica_processing_requests\{[^}]*deployment="Sleep"[^}]*\} 1)");
  REQUIRE(wait_until(
      [&] {
        auto r = http_get(f.admin("w2"), "/-/metrics", 5);
        return r && std::regex_search(r->body, busy);
      },
      900ms, 5ms));
  auto waited = http_get(f.port("w1"), "/sleep/?ms=0", 30);
  auto first = held.get();
  REQUIRE(first);
  CHECK(first->status == 200);
  REQUIRE(waited);
  CHECK(waited->status == 200);
  // It was refused at least once and placed again.
  auto m = http_get(f.admin("w1"), "/-/metrics", 5);
  REQUIRE(m);
  static const std::regex retries(R"(troupe_proxy_retries_total\{application="sleep"\} (\d+))");
  std::smatch got;
  REQUIRE(std::regex_search(m->body, got, retries));
  CHECK(std::stol(got[1]) >= 1);

  // A client of w1 that leaves a Ticker stream of w2: the cancellation
  // reaches the producer (the cancel frame, then a CAF message at w2) while
  // it waits for its next event, 10 s after event 0, not when that write
  // would fail.
  StreamClient stream;
  REQUIRE(stream.get(f.port("w1"), "/ticker/?n=1000&ms=10000"));
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  REQUIRE(stream.read_head(deadline));
  StreamClient::Chunk chunk;
  REQUIRE(stream.next_chunk(chunk, deadline) == StreamClient::Next::chunk);
  CHECK(chunk.data == "data: 0\n\n");
  const int64_t t0 = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now().time_since_epoch())
                         .count();
  stream.close();
  json after;
  REQUIRE(wait_until(
      [&] {
        after = stats("/ticker");
        return after.value("streams_cancelled", int64_t{0}) >= 1;
      },
      10s, 20ms));
  CAPTURE(after.dump());
  int64_t noticed = after.value("last_cancel_ns", int64_t{0}) - t0;
  CAPTURE(noticed);
  CHECK(noticed >= 0);  // after the client left
  // Within the wait for event 1 (due 10 s after event 0, which came before
  // t0); 5 s leaves two busy cores room and is still half that wait.
  CHECK(noticed < 5'000'000'000);
  CHECK(after.value("events_sent", int64_t{-1}) == 1);
  CHECK(f.peer_sends("w1") - sends >= 4);
}
