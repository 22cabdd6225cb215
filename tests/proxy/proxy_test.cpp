// The HTTP proxy of every node on a real loopback cluster, spoken to over
// HTTP/1.1 with a small blocking client. Every wait is a condition with a
// deadline.
#include <arpa/inet.h>
#include <signal.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <map>
#include <memory>
#include <optional>
#include <random>
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

struct Reply {
  int status = 0;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

// One keep-alive connection; every read is bounded by `timeout_s`.
class Conn {
 public:
  explicit Conn(uint16_t port, double timeout_s = 15) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{static_cast<time_t>(timeout_s),
               static_cast<suseconds_t>((timeout_s - static_cast<time_t>(timeout_s)) * 1e6)};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~Conn() {
    if (fd_ >= 0)
      ::close(fd_);
  }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  bool connected() const { return connected_; }
  int fd() const { return fd_; }

  bool send_raw(const std::string& data) {
    size_t off = 0;
    while (off < data.size()) {
      auto n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0)
        return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }

  std::optional<Reply> request(const std::string& method, const std::string& target,
                               const std::vector<std::pair<std::string, std::string>>& headers = {},
                               const std::string& body = "") {
    std::string req = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    for (const auto& [k, v] : headers)
      req += k + ": " + v + "\r\n";
    if (!body.empty() || method == "POST")
      req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    req += "\r\n" + body;
    if (!send_raw(req))
      return std::nullopt;
    return read_reply();
  }

  std::optional<Reply> get(const std::string& target,
                           const std::vector<std::pair<std::string, std::string>>& headers = {}) {
    return request("GET", target, headers);
  }

  std::optional<Reply> read_reply() {
    size_t end;
    while ((end = buffer_.find("\r\n\r\n")) == std::string::npos) {
      if (!fill())
        return std::nullopt;
    }
    Reply r;
    std::string head = buffer_.substr(0, end);
    buffer_.erase(0, end + 4);
    auto line_end = head.find("\r\n");
    std::string status_line = head.substr(0, line_end);
    if (status_line.size() < 12)
      return std::nullopt;
    r.status = std::stoi(status_line.substr(9, 3));
    size_t pos = line_end == std::string::npos ? head.size() : line_end + 2;
    while (pos < head.size()) {
      auto next = head.find("\r\n", pos);
      if (next == std::string::npos)
        next = head.size();
      auto line = head.substr(pos, next - pos);
      auto colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(0, colon);
        std::transform(name.begin(), name.end(), name.begin(),
                       [](unsigned char c) { return std::tolower(c); });
        auto value = line.substr(colon + 1);
        value.erase(0, value.find_first_not_of(' '));
        r.headers[name] = value;
      }
      pos = next + 2;
    }
    size_t length =
        std::stoul(r.header("content-length").empty() ? "0" : r.header("content-length"));
    while (buffer_.size() < length) {
      if (!fill())
        return std::nullopt;
    }
    r.body = buffer_.substr(0, length);
    buffer_.erase(0, length);
    return r;
  }

  // True when the peer closed the connection (read returns 0).
  bool closed_by_peer() {
    char c;
    return ::recv(fd_, &c, 1, 0) == 0;
  }

 private:
  bool fill() {
    char buf[16384];
    auto n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0)
      return false;
    buffer_.append(buf, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  bool connected_ = false;
  std::string buffer_;
};

controller::ApplicationSpec app_spec(const std::string& name, const std::string& prefix,
                                     const std::string& cls, uint32_t replicas,
                                     uint32_t max_ongoing = 5, int32_t max_queued = -1) {
  auto app = example_app(name, prefix, cls, replicas);
  app.deployments[0].config.max_ongoing_requests = max_ongoing;
  app.deployments[0].config.max_queued_requests = max_queued;
  return app;
}

// A thread joined when it goes out of scope, also when a REQUIRE fails.
struct Joiner {
  std::thread thread;
  template <class F>
  explicit Joiner(F f) : thread(std::move(f)) {}
  ~Joiner() { join(); }
  void join() {
    if (thread.joinable())
      thread.join();
  }
};

uint16_t http_port_of(const ChildProcess& p) {
  const auto& argv = p.argv();
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == "--http-port")
      return static_cast<uint16_t>(std::stoi(argv[i + 1]));
  }
  return 0;
}

struct Fixture : ClientCluster {
  explicit Fixture(std::vector<std::string> worker_ids = {},
                   std::vector<std::string> head_args = {},
                   std::map<std::string, std::vector<std::string>> worker_args = {}) {
    start(worker_ids, head_args, worker_args);
  }

  uint16_t port(const std::string& node = "head") { return http_port_of(cluster.nodes.at(node)); }
  // The node's admin listener: /-/routes, /-/metrics.
  uint16_t admin(const std::string& node = "head") { return cluster.admin_ports.at(node); }

  std::vector<std::string> running(const std::string& app, const std::string& dep) {
    std::vector<std::string> out;
    auto d = deployment(app, dep);
    for (const auto& r : d.value("replicas", json::array())) {
      if (r.at("state") == "RUNNING")
        out.push_back(r.at("id"));
    }
    return out;
  }

  bool wait_healthy(const std::string& app, const std::string& dep, size_t n) {
    json last;
    bool ok = wait_until(
        [&] {
          last = deployment(app, dep);
          return last.value("status", "") == "HEALTHY" && running(app, dep).size() == n;
        },
        30s, 100ms);
    if (!ok) {
      MESSAGE("last status of " << app << "/" << dep << ": " << last.dump(2));
      cluster.dump_output();
    }
    return ok;
  }

  // Waits until the proxy of `node` routes `path` to `n` replicas.
  bool wait_routed(const std::string& node, const std::string& app, const std::string& dep,
                   size_t n) {
    json last;
    bool ok = wait_until(
        [&] {
          Conn c(admin(node), 2);
          auto r = c.get("/-/routes");
          if (!r || r->status != 200)
            return false;
          last = json::parse(r->body);
          for (const auto& d : last.at("deployments")) {
            if (d.at("application") == app && d.at("deployment") == dep)
              return d.at("replicas").size() == n;
          }
          return false;
        },
        30s, 100ms);
    if (!ok)
      MESSAGE("last routes of " << node << ": " << last.dump(2));
    return ok;
  }

  // /-/routes of `node`; {} when it did not answer.
  json routes(const std::string& node) {
    Conn c(admin(node), 2);
    auto r = c.get("/-/routes");
    if (!r || r->status != 200)
      return json{{"deployments", json::array()}};
    return json::parse(r->body);
  }

  json queue_view(const std::string& app) {
    Conn c(admin(), 2);
    auto r = c.get("/-/routes");
    REQUIRE(r);
    auto view = json::parse(r->body);
    for (const auto& d : view.at("deployments")) {
      if (d.at("application") == app)
        return d;
    }
    return json::object();
  }
};

}  // namespace

TEST_CASE("proxy: requests reach the ingress by longest prefix on every node over keep-alive") {
  Fixture f({"w1"});
  {
    Conn c(f.port("w1"));
    auto r = c.get("/-/healthz");
    REQUIRE(r);
    CHECK(r->status == 200);  // a (still empty) route table is held
  }
  REQUIRE(f.client->deploy(app_spec("echo", "/echo", "Echo", 4)).has_value());
  REQUIRE(f.client->deploy(app_spec("hello", "/echo/hello", "Hello", 1)).has_value());
  REQUIRE(f.wait_healthy("echo", "Echo", 4));
  REQUIRE(f.wait_healthy("hello", "Hello", 1));
  for (const std::string node : {"head", "w1"}) {
    REQUIRE(f.wait_routed(node, "echo", "Echo", 4));
    REQUIRE(f.wait_routed(node, "hello", "Hello", 1));
    Conn c(f.port(node));
    // Several requests on one connection.
    std::set<std::string> replicas;
    for (int i = 0; i < 20; ++i) {
      auto r = c.request("POST", "/echo/a/b?x=1&y=2", {{"X-Custom", "v"}}, "payload");
      REQUIRE(r);
      CHECK(r->status == 200);
      auto body = json::parse(r->body);
      CHECK(body.at("path") == "/a/b");
      CHECK(body.at("query") == "x=1&y=2");
      CHECK(body.at("method") == "POST");
      CHECK(body.at("body") == "payload");
      CHECK(body.at("headers").at("X-Custom") == "v");
      CHECK(r->header("x-request-id").size() >= 8);
      CHECK(r->header("content-type") == "application/json");
      replicas.insert(body.at("replica_id").get<std::string>());
      // One at a time, every replica is equally loaded: the local ones win.
      CHECK(body.at("node_id") == node);
    }
    CHECK(replicas.size() == 2);  // both local replicas (of 2 + 2) take work
    auto r = c.get("/echo");
    REQUIRE(r);
    CHECK(json::parse(r->body).at("path") == "/");
    // The longer prefix wins.
    r = c.get("/echo/hello/there");
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK(json::parse(r->body).at("greeting") == "hello");
    // Whole segments only: /echoes is not /echo.
    r = c.get("/echoes");
    REQUIRE(r);
    CHECK(r->status == 404);
    // HEAD: the length of the body, no body, and the connection stays usable.
    {
      REQUIRE(c.send_raw("HEAD /echo/h HTTP/1.1\r\nHost: x\r\n\r\n"));
      std::string head;
      char ch;
      while (head.find("\r\n\r\n") == std::string::npos && ::recv(c.fd(), &ch, 1, 0) == 1)
        head.push_back(ch);
      CHECK(head.find("HTTP/1.1 200") == 0);
      CHECK(head.find("Content-Length: 0") == std::string::npos);
    }
    // The client's request id goes to the replica and comes back.
    r = c.get("/echo/id", {{"X-Request-Id", "my-id-42"}});
    REQUIRE(r);
    CHECK(r->header("x-request-id") == "my-id-42");
    CHECK(json::parse(r->body).at("headers").at("X-Request-Id") == "my-id-42");
  }
  // /-/routes and /-/metrics, on the admin listener; the ingress answers
  // 404 for them and for the dashboard.
  {
    Conn ingress(f.port());
    for (const char* path : {"/-/routes", "/-/metrics", "/-/dashboard", "/-/dashboard/state"}) {
      CAPTURE(path);
      auto r = ingress.get(path);
      REQUIRE(r);
      CHECK(r->status == 404);
      CHECK(r->body.find("admin port") != std::string::npos);
    }
  }
  Conn c(f.admin());
  auto routes = c.get("/-/routes");
  REQUIRE(routes);
  auto table = json::parse(routes->body);
  REQUIRE(table.at("routes").size() == 2);
  CHECK(table.at("routes")[0].at("prefix") == "/echo");
  CHECK(table.at("routes")[0].at("deployment") == "Echo");
  CHECK(table.at("routes")[1].at("prefix") == "/echo/hello");
  auto metrics = c.get("/-/metrics");
  REQUIRE(metrics);
  CHECK(metrics->status == 200);
  CHECK(metrics->body.find("troupe_proxy_requests_total{application=\"echo\",code=\"200\"}") !=
        std::string::npos);
  CHECK(metrics->body.find("troupe_proxy_request_duration_seconds_bucket{application=\"echo\"") !=
        std::string::npos);
  CHECK(metrics->body.find("troupe_proxy_requests_in_flight") != std::string::npos);
  CHECK(
      metrics->body.find("troupe_proxy_queue_length{application=\"echo\",deployment=\"Echo\"} 0") !=
      std::string::npos);
  CHECK(metrics->body.find("troupe_proxy_retries_total") != std::string::npos);
}

namespace {

// GET `path` on a fresh connection to `port`: (status, body); (0, "") when
// nothing answered.
std::pair<int, std::string> probe(uint16_t port, const std::string& path) {
  Conn c(port, 2);
  auto r = c.get(path);
  return r ? std::make_pair(r->status, r->body) : std::make_pair(0, std::string());
}

}  // namespace

TEST_CASE("proxy: /-/readyz is 503 on a drained node - /-/livez stays 200 - /-/healthz is /-/readyz") {
  Fixture f({"w1"});
  for (const std::string node : {"head", "w1"}) {
    CAPTURE(node);
    CHECK(probe(f.port(node), "/-/readyz") == std::make_pair(200, std::string("success")));
    CHECK(probe(f.port(node), "/-/healthz") == std::make_pair(200, std::string("success")));
    CHECK(probe(f.port(node), "/-/livez") == std::make_pair(200, std::string("alive")));
  }
  REQUIRE(f.client->drain("w1").is_ok());
  const auto drained = std::make_pair(503, std::string("node w1 is drained"));
  CHECK(wait_until([&] { return probe(f.port("w1"), "/-/readyz") == drained; }, 10s, 50ms));
  CHECK(probe(f.port("w1"), "/-/healthz") == drained);
  CHECK(probe(f.port("w1"), "/-/livez") == std::make_pair(200, std::string("alive")));
  CHECK(probe(f.port("head"), "/-/readyz") == std::make_pair(200, std::string("success")));
}

TEST_CASE("proxy: on SIGTERM a node turns not ready and still answers the request it has in flight") {
  Fixture f({"w1"});
  auto app = app_spec("sleep", "/sleep", "Sleep", 2);
  app.deployments[0].config.graceful_shutdown_timeout_s = 10;
  REQUIRE(f.client->deploy(app).has_value());
  REQUIRE(f.wait_healthy("sleep", "Sleep", 2));
  auto on_w1 = [&] {
    for (const auto& r : f.deployment("sleep", "Sleep").value("replicas", json::array())) {
      if (r.at("node") == "w1")
        return true;
    }
    return false;
  };
  REQUIRE(on_w1());  // one replica per node
  REQUIRE(f.wait_routed("w1", "sleep", "Sleep", 2));
  // A request through w1 that w1's own replica holds for 2 s.
  std::optional<Reply> slow;
  Joiner waiting([&] {
    Conn c(f.port("w1"), 20);
    slow = c.get("/sleep?ms=2000");
  });
  json last;
  bool held = wait_until(
      [&] {
        last = f.routes("w1");
        for (const auto& d : last.at("deployments")) {
          for (const auto& r : d.at("replicas")) {
            if (r.at("local") == true && r.at("in_flight").get<int>() > 0)
              return true;
          }
        }
        return false;
      },
      10s, 10ms);
  if (!held)
    MESSAGE("routes of w1: " << last.dump());
  REQUIRE(held);
  f.cluster.nodes.at("w1").signal(SIGTERM);
  const auto stopping = std::make_pair(503, std::string("node w1 is shutting down"));
  CHECK(wait_until([&] { return probe(f.port("w1"), "/-/readyz") == stopping; }, 5s, 10ms));
  waiting.join();
  if (!slow || slow->status != 200)
    f.cluster.dump_output();
  REQUIRE(slow);
  CHECK(slow->status == 200);
  auto code = f.cluster.nodes.at("w1").wait_exit(20s);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
}

TEST_CASE("proxy: a stopping node serves through its drain delay and a second SIGTERM stops it at once") {
  Fixture f({"w1"}, {}, {{"w1", {"--drain-delay", "60"}}});
  REQUIRE(f.client->deploy(app_spec("echo", "/echo", "Echo", 2)).has_value());
  REQUIRE(f.wait_healthy("echo", "Echo", 2));
  REQUIRE(f.wait_routed("w1", "echo", "Echo", 2));
  Conn kept(f.port("w1"));
  auto first = kept.get("/echo/before");
  REQUIRE(first);
  CHECK(first->status == 200);
  CHECK(first->header("connection") != "close");

  auto& w1 = f.cluster.nodes.at("w1");
  w1.signal(SIGTERM);
  const auto stopping = std::make_pair(503, std::string("node w1 is shutting down"));
  REQUIRE(wait_until([&] { return probe(f.port("w1"), "/-/readyz") == stopping; }, 10s, 10ms));
  // Not ready, and serving: on the connection it kept and on new ones,
  // while the controller moves its replica to the head.
  auto during = kept.get("/echo/during");
  REQUIRE(during);
  CHECK(during->status == 200);
  Conn fresh(f.port("w1"));
  auto again = fresh.get("/echo/fresh");
  REQUIRE(again);
  CHECK(again->status == 200);
  CHECK(wait_until(
      [&] {
        auto d = f.deployment("echo", "Echo");
        int on_head = 0;
        for (const auto& r : d.value("replicas", json::array()))
          on_head += r.at("node") == "head" && r.at("state") == "RUNNING";
        return on_head == 2;
      },
      20s, 50ms));
  CHECK(w1.running());  // the drain delay (60 s) is not over

  // A second SIGTERM forces the stop at once (exit 1): long before the
  // drain delay would end.
  w1.signal(SIGTERM);
  auto code = w1.wait_exit(20s);
  REQUIRE(code.has_value());
  CHECK(*code == 1);
  CHECK(w1.output().find("received a second SIGTERM; stopping now") != std::string::npos);
}

TEST_CASE("proxy: 404 400 413 and 431 answers and the proxy keeps serving") {
  Fixture f({}, {"--proxy-body-limit", "1024", "--proxy-idle-timeout", "1"});
  REQUIRE(f.client->deploy(app_spec("echo", "/echo", "Echo", 1)).has_value());
  REQUIRE(f.wait_healthy("echo", "Echo", 1));
  REQUIRE(f.wait_routed("head", "echo", "Echo", 1));
  auto healthy = [&] {
    Conn c(f.port());
    auto r = c.get("/echo/ok");
    return r && r->status == 200;
  };
  {
    Conn c(f.port());
    auto r = c.get("/nowhere/x");
    REQUIRE(r);
    CHECK(r->status == 404);
    CHECK(r->header("content-type") == "application/json");
    auto body = json::parse(r->body);
    CHECK(body.at("error").get<std::string>().find("/nowhere/x") != std::string::npos);
    // A 404 keeps the connection.
    r = c.get("/echo/after-404");
    REQUIRE(r);
    CHECK(r->status == 200);
  }
  {
    Conn c(f.port());
    REQUIRE(c.send_raw("THIS IS NOT HTTP\r\n\r\n"));
    auto r = c.read_reply();
    REQUIRE(r);
    CHECK(r->status == 400);
    CHECK(c.closed_by_peer());
  }
  {
    Conn c(f.port());
    REQUIRE(c.send_raw("GET /echo HTTP/1.1\r\nContent-Length: abc\r\n\r\n"));
    auto r = c.read_reply();
    REQUIRE(r);
    CHECK(r->status == 400);
  }
  {
    Conn c(f.port());
    auto r = c.request("POST", "/echo/big", {}, std::string(1025, 'x'));
    REQUIRE(r);
    CHECK(r->status == 413);
    CHECK(c.closed_by_peer());
    Conn c2(f.port());
    r = c2.request("POST", "/echo/fits", {}, std::string(1024, 'x'));
    REQUIRE(r);
    CHECK(r->status == 200);
  }
  {
    // Announced but not sent: refused from the header alone.
    Conn c(f.port());
    REQUIRE(c.send_raw("POST /echo HTTP/1.1\r\nContent-Length: 100000000\r\n\r\n"));
    auto r = c.read_reply();
    REQUIRE(r);
    CHECK(r->status == 413);
  }
  {
    Conn c(f.port());
    auto r = c.get("/echo/h", {{"X-Huge", std::string(20000, 'h')}});
    REQUIRE(r);
    CHECK(r->status == 431);
  }
  {
    // A slow client (half a request line, then nothing) is disconnected
    // after the idle timeout (1 s here) ...
    Conn c(f.port(), 10);
    REQUIRE(c.send_raw("GET /echo HT"));
    CHECK(c.closed_by_peer());
    // ... and so is an idle keep-alive connection.
    Conn idle(f.port(), 10);
    REQUIRE(idle.get("/echo/x"));
    CHECK(idle.closed_by_peer());
  }
  CHECK(healthy());
  Conn c(f.admin());
  auto metrics = c.get("/-/metrics");
  REQUIRE(metrics);
  for (const char* code : {"400", "404", "413", "431"}) {
    CHECK(metrics->body.find("code=\"" + std::string(code) + "\"") != std::string::npos);
  }
}

TEST_CASE("proxy: 503 with Retry-After when the deployment's queue is full") {
  Fixture f;
  // One replica, one request at a time, one waiting.
  REQUIRE(f.client->deploy(app_spec("sleep", "/sleep", "Sleep", 1, 1, 1)).has_value());
  REQUIRE(f.wait_healthy("sleep", "Sleep", 1));
  REQUIRE(f.wait_routed("head", "sleep", "Sleep", 1));
  std::optional<Reply> first, second;
  Conn c1(f.port(), 30), c2(f.port(), 30);
  Joiner t1([&] { first = c1.get("/sleep?ms=4000"); });
  json last;
  bool busy = wait_until(
      [&] {
        last = f.queue_view("sleep");
        return !last.empty() && last.at("replicas").size() == 1 &&
               last.at("replicas")[0].at("in_flight") == 1;
      },
      10s);
  if (!busy)
    MESSAGE("last view: " << last.dump() << " first: " << (first ? first->body : "-"));
  REQUIRE(busy);
  Joiner t2([&] { second = c2.get("/sleep?ms=10"); });
  REQUIRE(wait_until([&] { return f.queue_view("sleep").at("queued") == 1; }, 10s));
  {
    Conn c3(f.port());
    auto third = c3.get("/sleep?ms=10");
    REQUIRE(third);
    CHECK(third->status == 503);
    CHECK(third->header("retry-after") == "1");
    CHECK(json::parse(third->body).at("error").get<std::string>().find("queued") !=
          std::string::npos);
  }
  t1.join();
  t2.join();
  REQUIRE(first);
  REQUIRE(second);
  CHECK(first->status == 200);
  CHECK(second->status == 200);  // the queued one was served after the first
}

TEST_CASE("proxy: 504 when a request outlives the request timeout") {
  Fixture f({}, {"--request-timeout", "0.5"});
  REQUIRE(f.client->deploy(app_spec("sleep", "/sleep", "Sleep", 1, 2)).has_value());
  REQUIRE(f.wait_healthy("sleep", "Sleep", 1));
  REQUIRE(f.wait_routed("head", "sleep", "Sleep", 1));
  Conn c(f.port(), 30);
  auto r = c.get("/sleep?ms=3000");
  REQUIRE(r);
  CHECK(r->status == 504);
  CHECK(json::parse(r->body).at("error") == "request timed out");
  // Quick requests still pass, on the same connection. The timed-out request
  // still occupies its replica slot for a while; max_ongoing is 2.
  r = c.get("/sleep?ms=1");
  REQUIRE(r);
  CHECK(r->status == 200);
  // A request waiting in the queue times out as well.
  Conn c2(f.port(), 30), c3(f.port(), 30);
  std::optional<Reply> a, b;
  Joiner ta([&] { a = c2.get("/sleep?ms=3000"); });
  Joiner tb([&] { b = c3.get("/sleep?ms=3000"); });
  ta.join();
  tb.join();
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->status == 504);
  CHECK(b->status == 504);
}

TEST_CASE("proxy: killing a replica every second under a steady request loop fails no request") {
  Fixture f({"w1"});
  REQUIRE(f.client->deploy(app_spec("echo", "/echo", "Echo", 4)).has_value());
  REQUIRE(f.wait_healthy("echo", "Echo", 4));
  REQUIRE(f.wait_routed("head", "echo", "Echo", 4));
  REQUIRE(f.wait_routed("w1", "echo", "Echo", 4));
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0};
  std::atomic<int> failed{0};
  std::vector<std::string> failures;
  std::mutex failures_mutex;
  std::vector<std::thread> loops;
  for (const std::string node : {"head", "w1", "head", "w1"}) {
    uint16_t port = f.port(node);
    loops.emplace_back([&, port] {
      auto conn = std::make_unique<Conn>(port, 60);
      int i = 0;
      while (!stop) {
        auto r = conn->get("/echo/n" + std::to_string(i++));
        if (r && r->status == 200) {
          ++ok;
          continue;
        }
        ++failed;
        std::lock_guard<std::mutex> lock(failures_mutex);
        failures.push_back(r ? std::to_string(r->status) + " " + r->body : "no answer");
        conn = std::make_unique<Conn>(port, 60);
      }
    });
  }
  std::mt19937 rng(7);
  int kills = 0;
  auto start = std::chrono::steady_clock::now();
  for (int second = 0; second < 10; ++second) {
    // Wait until the next whole second of the run (a deadline, not a pause
    // standing in for a condition).
    wait_until([&] { return std::chrono::steady_clock::now() - start >= second * 1s; }, 2s, 10ms);
    auto ids = f.running("echo", "Echo");
    if (ids.empty())
      continue;
    auto victim = ids[rng() % ids.size()];
    if (f.client->kill_replica(victim).is_ok())
      ++kills;
  }
  stop = true;
  for (auto& t : loops)
    t.join();
  MESSAGE(ok.load() << " requests answered, " << kills << " replicas killed");
  for (const auto& msg : failures)
    MESSAGE("failure: " << msg);
  CHECK(kills >= 8);
  CHECK(failed == 0);
  CHECK(ok > 100);
  Conn c(f.admin());
  auto metrics = c.get("/-/metrics");
  REQUIRE(metrics);
  MESSAGE(metrics->body.substr(0, 2000));
}

TEST_CASE("proxy: with the controller killed requests are served from the last snapshot") {
  Fixture f({"w1"});
  REQUIRE(f.client->deploy(app_spec("echo", "/echo", "Echo", 2)).has_value());
  REQUIRE(f.wait_healthy("echo", "Echo", 2));
  REQUIRE(f.wait_routed("head", "echo", "Echo", 2));
  REQUIRE(f.wait_routed("w1", "echo", "Echo", 2));
  {
    caf::scoped_actor self{*f.sys};
    self->send_exit(f.client->controller(), caf::exit_reason::kill);
  }
  // The controller is gone: its client gets no answer any more.
  REQUIRE(wait_until([&] { return !f.client->status_json().has_value(); }, 10s, 100ms));
  for (const std::string node : {"head", "w1"}) {
    Conn c(f.port(node));
    for (int i = 0; i < 50; ++i) {
      auto r = c.get("/echo/still-here");
      REQUIRE(r);
      CHECK(r->status == 200);
    }
    auto health = c.get("/-/healthz");
    REQUIRE(health);
    CHECK(health->status == 200);
    auto routes = Conn(f.admin(node)).get("/-/routes");
    REQUIRE(routes);
    CHECK(json::parse(routes->body).at("routes").size() == 1);
  }
}

TEST_CASE("proxy: requests refused by a replica busy with another proxy are placed again") {
  Fixture f({"w1"});
  // One replica taking one request at a time, used by both nodes' proxies:
  // each proxy believes it has room, the replica refuses the second one.
  REQUIRE(f.client->deploy(app_spec("sleep", "/sleep", "Sleep", 1, 1)).has_value());
  REQUIRE(f.wait_healthy("sleep", "Sleep", 1));
  REQUIRE(f.wait_routed("head", "sleep", "Sleep", 1));
  REQUIRE(f.wait_routed("w1", "sleep", "Sleep", 1));
  std::vector<std::optional<Reply>> replies(4);
  {
    std::vector<std::unique_ptr<Joiner>> clients;
    for (size_t i = 0; i < replies.size(); ++i) {
      uint16_t port = f.port(i % 2 == 0 ? "head" : "w1");
      clients.push_back(std::make_unique<Joiner>([&, i, port] {
        Conn c(port, 30);
        replies[i] = c.get("/sleep?ms=150");
      }));
    }
  }
  for (const auto& r : replies) {
    REQUIRE(r);
    CHECK(r->status == 200);
  }
  // How many refusals there were depends on timing; what matters is above.
  for (const std::string node : {"head", "w1"}) {
    Conn c(f.admin(node));
    auto metrics = c.get("/-/metrics");
    REQUIRE(metrics);
    auto pos = metrics->body.find("troupe_proxy_retries_total{application=\"sleep\"}");
    MESSAGE(node << ": "
                 << (pos == std::string::npos ? "no retries" : metrics->body.substr(pos, 60)));
  }
}

TEST_CASE("proxy: a killed proxy actor is restarted and follows later snapshots") {
  Fixture f({"w1"});
  REQUIRE(f.client->deploy(app_spec("echo", "/echo", "Echo", 2)).has_value());
  REQUIRE(f.wait_healthy("echo", "Echo", 2));
  REQUIRE(f.wait_routed("w1", "echo", "Echo", 2));
  REQUIRE(f.client->kill("proxy", "w1").is_ok());
  REQUIRE(wait_until(
      [&] {
        return f.cluster.nodes.at("w1").output().find("proxy actor died") != std::string::npos;
      },
      10s));
  // The HTTP side never stopped.
  {
    Conn c(f.port("w1"));
    auto r = c.get("/echo/x");
    REQUIRE(r);
    CHECK(r->status == 200);
  }
  // The new actor subscribed itself: a new application reaches this proxy.
  REQUIRE(f.client->deploy(app_spec("hello", "/hello", "Hello", 1)).has_value());
  REQUIRE(f.wait_healthy("hello", "Hello", 1));
  REQUIRE(f.wait_routed("w1", "hello", "Hello", 1));
  Conn c(f.port("w1"));
  auto r = c.get("/hello");
  REQUIRE(r);
  CHECK(r->status == 200);
  // And it can be killed again (the controller knows the new one).
  CHECK(f.client->kill("proxy", "w1").is_ok());
}

TEST_CASE("proxy: a node whose HTTP port is taken exits with code 2 naming the port") {
  Fixture f;
  auto taken = std::to_string(f.port());
  TempDir dir;
  auto r = run({bin("troupe-node"), "--join", f.cluster.address, "--node-id", "w9", "--state-dir",
                dir / "w9", "--http-port", taken, "--admin-port", "0"},
               20s);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("cannot listen on 127.0.0.1:" + taken) != std::string::npos);
}
