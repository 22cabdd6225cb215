// Streamed answers on a real loopback cluster (replicas in their own
// processes): Ticker's server-sent events reach the client event by event
// through the proxy of the replica's node and through the proxy of another
// node; a slow client reading a 50 MiB Bytes stream keeps the memory of the
// node and of the replica bounded (flow control on every hop); a producer
// that throws mid-stream ends the body without its final chunk. The client
// is a raw-socket HTTP/1.1 client of this file that decodes the chunked
// encoding as it arrives and records when each chunk came. Every wait is a
// condition with a deadline; the fixture stops every process it starts.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
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

using Clock = std::chrono::steady_clock;

// Four applications, since only an ingress is reachable over HTTP: Ticker
// at /stream, Bytes at /bytes, a Ticker in its node's process (isolation:
// in_process) at /inproc, and at /relay a Relay that streams what a
// Ticker of its application streams through a deployment handle (its /stats
// are the Ticker's); one replica each. The request timeout is long
// enough for a 50 MiB stream read at 1 MiB/s.
const char* kStream = R"(http_options: {request_timeout_s: 300}
applications:
  - name: stream
    route_prefix: /stream
    import_path: libtroupe_examples.so:Ticker
    deployments:
      - name: Ticker
        num_replicas: 1
        max_ongoing_requests: 10
  - name: relay
    route_prefix: /relay
    import_path: libtroupe_examples.so:Relay
    deployments:
      - name: Relay
        num_replicas: 1
        max_ongoing_requests: 10
      - name: Ticker
        import_path: libtroupe_examples.so:Ticker
        num_replicas: 1
        max_ongoing_requests: 10
  - name: inproc
    route_prefix: /inproc
    import_path: libtroupe_examples.so:Ticker
    deployments:
      - name: Ticker
        num_replicas: 1
        max_ongoing_requests: 10
        isolation: in_process
  - name: bytes
    route_prefix: /bytes
    import_path: libtroupe_examples.so:Bytes
    deployments:
      - name: Bytes
        num_replicas: 1
        max_ongoing_requests: 10
)";

struct Event {
  std::string text;  // the event's lines, without the blank line that ends it
  Clock::time_point at;
};

// Reads a text/event-stream body to its end: every event with the time the
// chunk completing it arrived, and how the body ended.
std::pair<std::vector<Event>, StreamClient::Next> read_events(StreamClient& c,
                                                              Clock::time_point deadline) {
  std::vector<Event> events;
  std::string pending;
  StreamClient::Chunk chunk;
  for (;;) {
    auto r = c.next_chunk(chunk, deadline);
    if (r != StreamClient::Next::chunk)
      return {events, r};
    pending += chunk.data;
    for (auto end = pending.find("\n\n"); end != std::string::npos; end = pending.find("\n\n")) {
      events.push_back({pending.substr(0, end), chunk.at});
      pending.erase(0, end + 2);
    }
  }
}

int64_t ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count();
}

// VmRSS of `pid` in bytes (/proc/<pid>/status); -1 when unreadable.
int64_t rss_bytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream value(line.substr(6));
      int64_t kb = -1;
      value >> kb;
      return kb < 0 ? -1 : kb * 1024;
    }
  }
  return -1;
}

// The troupe-replica processes whose parent is `parent` (scanning /proc:
// the node starts them from several threads, so no thread's `children` file
// lists them all).
std::vector<pid_t> replica_children(pid_t parent) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d)
    return out;
  while (auto* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (!end || *end != '\0' || pid <= 0)
      continue;
    std::ifstream in("/proc/" + std::string(e->d_name) + "/stat");
    std::string line;
    if (!std::getline(in, line))
      continue;
    auto open = line.find('(');
    auto close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close + 2 > line.size())
      continue;
    std::istringstream rest(line.substr(close + 2));
    char state = '?';
    long ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent && state != 'Z' && line.substr(open + 1, close - open - 1) == "troupe-replica")
      out.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(d);
  return out;
}

struct StreamCluster {
  Cluster cluster;

  explicit StreamCluster(bool with_worker) {
    cluster.start(with_worker ? std::vector<std::string>{"w1"} : std::vector<std::string>{});
    cluster.deploy_yaml("stream.yaml", kStream, 60s);
    // Every proxy routes both applications to their replica.
    for (const auto& node_port : cluster.http_ports) {
      const std::string& node = node_port.first;
      CAPTURE(node);
      REQUIRE(cluster.wait_all_answer(
          node, {"/stream/stats", "/bytes/stats", "/relay/stats", "/inproc/stats"}));
    }
  }

  // The node that runs the replica of (app, deployment), as the proxy whose
  // admin listener is on `port` routes it ("" until it routes to exactly one).
  std::string replica_node(uint16_t port, const std::string& app, const std::string& deployment) {
    auto r = http_get(port, "/-/routes", 5);
    if (!r || r->status != 200)
      return "";
    json view = json::parse(r->body, nullptr, false);
    if (!view.is_object())
      return "";
    for (const auto& d : view.value("deployments", json::array())) {
      if (d.value("application", "") == app && d.value("deployment", "") == deployment &&
          d.value("replicas", json::array()).size() == 1)
        return d["replicas"][0].value("node", "");
    }
    return "";
  }

  json stats(uint16_t port, const std::string& prefix) {
    auto r = http_get(port, prefix + "/stats", 10);
    if (!r || r->status != 200)
      return json();
    return json::parse(r->body, nullptr, false);
  }
};

// GET /stream?n=5&ms=300 through `port`: five events in order, one by one,
// the first within 400 ms and the last at least 1.2 s after the request,
// then the final zero chunk.
void check_ticker_stream(uint16_t port, const std::string& prefix = "/stream") {
  StreamClient c;
  REQUIRE(c.get(port, prefix + "?n=5&ms=300"));
  const auto deadline = Clock::now() + 20s;
  REQUIRE(c.read_head(deadline));
  CAPTURE(c.head);
  CHECK(c.status == 200);
  CHECK(c.header("Transfer-Encoding").find("chunked") != std::string::npos);
  CHECK(c.header("Content-Type").rfind("text/event-stream", 0) == 0);
  CHECK(c.header("Content-Length").empty());
  auto [events, end] = read_events(c, deadline);
  CHECK_MESSAGE(end == StreamClient::Next::end, "the body ended with: " << describe(end));
  REQUIRE(events.size() == 5);
  for (std::size_t i = 0; i < events.size(); ++i) {
    CAPTURE(i);
    CHECK(events[i].text == "data: " + std::to_string(i));
    if (i > 0) {
      // Event by event: about 300 ms apart, not all at the end.
      CHECK(ms_between(events[i - 1].at, events[i].at) >= 150);
    }
  }
  CHECK(ms_between(c.sent_at, events.front().at) < 400);
  CHECK(ms_between(c.sent_at, events.back().at) >= 1200);
}

}  // namespace

TEST_CASE("stream: a Ticker stream arrives event by event through the proxy of its node and of another node") {
  StreamCluster s(true);
  const uint16_t head_proxy = s.cluster.http_ports.at("head");
  const uint16_t head_admin = s.cluster.admin_ports.at("head");
  std::string host;
  REQUIRE(wait_until([&] { return !(host = s.replica_node(head_admin, "stream", "Ticker")).empty(); },
                     20s, 100ms));
  REQUIRE(s.cluster.http_ports.count(host) == 1);
  const std::string other = host == "head" ? "w1" : "head";
  // The other node's proxy knows the replica's place too.
  REQUIRE(wait_until(
      [&] { return s.replica_node(s.cluster.admin_ports.at(other), "stream", "Ticker") == host; },
      20s, 100ms));

  {
    INFO("through the proxy of the replica's node ", host);
    check_ticker_stream(s.cluster.http_ports.at(host));
  }
  {
    INFO("through the proxy of the other node ", other);
    check_ticker_stream(s.cluster.http_ports.at(other));
  }
  json stats = s.stats(head_proxy, "/stream");
  CAPTURE(stats.dump());
  CHECK(stats.value("streams_completed", int64_t{-1}) == 2);
  CHECK(stats.value("events_sent", int64_t{-1}) == 10);
  CHECK(stats.value("streams_cancelled", int64_t{-1}) == 0);

  // A replica in its node's own process streams the same way (over CAF from
  // both proxies), and a client that leaves cancels it.
  for (const auto& [node, port] : s.cluster.http_ports) {
    INFO("in_process: through the proxy of ", node);
    check_ticker_stream(port, "/inproc");
  }
  StreamClient c;
  REQUIRE(c.get(head_proxy, "/inproc?n=1000&ms=300"));
  const auto deadline = Clock::now() + 20s;
  REQUIRE(c.read_head(deadline));
  StreamClient::Chunk first;
  REQUIRE(c.next_chunk(first, deadline) == StreamClient::Next::chunk);
  c.close();
  json inproc;
  CHECK(wait_until(
      [&] {
        inproc = s.stats(head_proxy, "/inproc");
        return inproc.is_object() && inproc.value("streams_cancelled", int64_t{0}) == 1;
      },
      10s, 50ms));
  CAPTURE(inproc.dump());
  CHECK(inproc.value("streams_completed", int64_t{-1}) == 2);
}

TEST_CASE("stream: a slow client reading a 50 MB stream keeps the node's memory bounded") {
  StreamCluster s(false);  // one node: the Bytes replica runs behind the head's proxy
  const uint16_t proxy = s.cluster.http_ports.at("head");
  REQUIRE(s.replica_node(s.cluster.admin_ports.at("head"), "bytes", "Bytes") == "head");
  const pid_t node_pid = s.cluster.nodes.at("head").pid();
  // Every replica but /inproc's runs in a troupe-replica process of its own
  // (stream's Ticker, relay's Relay and Ticker, Bytes); Bytes' is the one
  // whose RSS we can tell apart only by elimination, so watch every replica
  // of the node (the others idle).
  std::vector<pid_t> replicas;
  REQUIRE(wait_until([&] { return (replicas = replica_children(node_pid)).size() == 4; }, 10s,
                     100ms));

  const int64_t node_before = rss_bytes(node_pid);
  REQUIRE(node_before > 0);
  std::vector<int64_t> replicas_before;
  for (pid_t pid : replicas)
    replicas_before.push_back(rss_bytes(pid));
  int64_t node_max = node_before;
  std::vector<int64_t> replicas_max = replicas_before;
  auto next_sample = Clock::now();
  auto sample = [&] {
    if (Clock::now() < next_sample)
      return;
    next_sample += 500ms;
    node_max = std::max(node_max, rss_bytes(node_pid));
    for (std::size_t i = 0; i < replicas.size(); ++i)
      replicas_max[i] = std::max(replicas_max[i], rss_bytes(replicas[i]));
  };

  constexpr int64_t kMiB = 1024 * 1024;
  StreamClient c;
  c.limit_rate(1.0 * kMiB, 16 * 1024);  // 1 MiB/s in 16 KiB reads
  REQUIRE(c.get(proxy, "/bytes?mb=50&chunk=65536"));
  const auto deadline = Clock::now() + 120s;
  REQUIRE(c.read_head(deadline));
  CAPTURE(c.head);
  CHECK(c.status == 200);
  CHECK(c.header("Transfer-Encoding").find("chunked") != std::string::npos);
  CHECK(c.header("Content-Type").rfind("application/octet-stream", 0) == 0);
  int64_t received = 0;
  bool pattern_ok = true;
  StreamClient::Chunk chunk;
  StreamClient::Next end;
  while ((end = c.next_chunk(chunk, deadline)) == StreamClient::Next::chunk) {
    // Every 64 KiB chunk Bytes writes is 'a' + i % 26 from its start: byte
    // `at` of the stream is 'a' + (at % 65536) % 26, however the hops
    // re-chunk it.
    for (std::size_t i = 0; i < chunk.data.size() && pattern_ok; i += 997) {
      const int64_t at = received + static_cast<int64_t>(i);
      pattern_ok = chunk.data[i] == static_cast<char>('a' + (at % 65536) % 26);
    }
    received += static_cast<int64_t>(chunk.data.size());
    sample();
  }
  sample();
  CHECK_MESSAGE(end == StreamClient::Next::end, "the body ended with: " << describe(end));
  CHECK(received == 50 * kMiB);
  CHECK(pattern_ok);
  const double took = std::chrono::duration<double>(Clock::now() - c.sent_at).count();
  CHECK(took >= 45);  // the client's rate limit held

  MESSAGE("node RSS before " << node_before / kMiB << " MiB, max " << node_max / kMiB << " MiB");
  CHECK(node_max - node_before < 16 * kMiB);
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    CAPTURE(replicas[i]);
    MESSAGE("replica " << replicas[i] << " RSS before " << replicas_before[i] / kMiB
                       << " MiB, max " << replicas_max[i] / kMiB << " MiB");
    CHECK(replicas_before[i] > 0);
    CHECK(replicas_max[i] - replicas_before[i] < 16 * kMiB);
  }
  json stats = s.stats(proxy, "/bytes");
  CAPTURE(stats.dump());
  CHECK(stats.value("streams_completed", int64_t{-1}) == 1);
  CHECK(stats.value("bytes_sent", int64_t{-1}) == 50 * kMiB);
}

TEST_CASE("stream: an error mid-stream is not a clean end") {
  StreamCluster s(false);
  const uint16_t proxy = s.cluster.http_ports.at("head");
  StreamClient c;
  // Ticker throws after 2 events.
  REQUIRE(c.get(proxy, "/stream?n=5&ms=100&fail_after=2"));
  const auto deadline = Clock::now() + 20s;
  REQUIRE(c.read_head(deadline));
  CAPTURE(c.head);
  CHECK(c.status == 200);  // the head went out before the producer failed
  auto [events, end] = read_events(c, deadline);
  REQUIRE(events.size() == 2);
  CHECK(events[0].text == "data: 0");
  CHECK(events[1].text == "data: 1");
  // The connection ends without the final zero chunk (or is reset): never
  // a clean end, and not left hanging either.
  CAPTURE(describe(end));
  CHECK(end != StreamClient::Next::end);
  CHECK(end != StreamClient::Next::timeout);
  CHECK(end != StreamClient::Next::chunk);

  json stats = s.stats(proxy, "/stream");
  CAPTURE(stats.dump());
  CHECK(stats.value("streams_failed", int64_t{-1}) == 1);
  CHECK(stats.value("streams_completed", int64_t{-1}) == 0);
  // The proxy still serves streams afterwards.
  check_ticker_stream(proxy);
}

TEST_CASE("stream: a stream relayed through a deployment handle arrives event by event - its end and its cancellation cross the handle") {
  StreamCluster s(true);
  // Relay and its Ticker are placed by the controller: the handle call may
  // cross nodes, and each proxy is tried.
  for (const auto& [node, port] : s.cluster.http_ports) {
    INFO("through the proxy of ", node);
    check_ticker_stream(port, "/relay");
  }
  const uint16_t proxy = s.cluster.http_ports.at("head");
  {
    INFO("the callee fails after two events: the relayed stream ends early too");
    StreamClient c;
    REQUIRE(c.get(proxy, "/relay?n=5&ms=100&fail_after=2"));
    const auto deadline = Clock::now() + 20s;
    REQUIRE(c.read_head(deadline));
    CHECK(c.status == 200);
    auto [events, end] = read_events(c, deadline);
    REQUIRE(events.size() == 2);
    CHECK(events[1].text == "data: 1");
    CAPTURE(describe(end));
    CHECK(end != StreamClient::Next::end);
    CHECK(end != StreamClient::Next::timeout);
  }
  {
    INFO("the client leaves: the callee's producer is cancelled");
    json before = s.stats(proxy, "/relay");
    REQUIRE(before.is_object());
    StreamClient c;
    REQUIRE(c.get(proxy, "/relay?n=1000&ms=300"));
    const auto deadline = Clock::now() + 20s;
    REQUIRE(c.read_head(deadline));
    StreamClient::Chunk first;
    REQUIRE(c.next_chunk(first, deadline) == StreamClient::Next::chunk);
    CHECK(first.data == "data: 0\n\n");
    c.close();
    json after;
    CHECK(wait_until(
        [&] {
          after = s.stats(proxy, "/relay");
          return after.is_object() && after.value("streams_cancelled", int64_t{0}) >
                                          before.value("streams_cancelled", int64_t{0});
        },
        10s, 50ms));
    CAPTURE(after.dump());
    CHECK(after.value("streams_completed", int64_t{-1}) ==
          before.value("streams_completed", int64_t{-2}));
  }
  json stats = s.stats(proxy, "/relay");
  CAPTURE(stats.dump());
  CHECK(stats.value("streams_completed", int64_t{-1}) == 2);  // one per proxy
  CHECK(stats.value("streams_failed", int64_t{-1}) == 1);
}
