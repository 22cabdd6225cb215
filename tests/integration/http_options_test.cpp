// Ray Serve's http_options on a real node (issue 15, item 5): the request
// timeout and the keep-alive timeout of a deployed config reach the proxy,
// both survive a controller restart (they are part of the checkpointed
// target state), and host/port, which a deploy does not apply, are named in
// a warning.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <optional>
#include <string>

#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"

using namespace troupe::testing;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// Sleep answers after ?ms=N. A port that is given is ignored, with a warning.
const char* kSleep = R"(http_options: {request_timeout_s: 1, keep_alive_timeout_s: 1, port: 9000}
applications:
  - name: sleep
    route_prefix: /sleep
    import_path: libtroupe_examples.so:Sleep
    deployments:
      - name: Sleep
        num_replicas: 1
        max_ongoing_requests: 8
)";

double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The timeouts in force at the proxy whose admin listener is on `port`
// ({request_timeout_s, keep_alive_timeout_s, epoch}, from /-/routes); {}
// when it did not answer.
json proxy_settings(uint16_t port) {
  auto r = http_get(port, "/-/routes", 5);
  if (!r || r->status != 200)
    return json::object();
  auto body = json::parse(r->body, nullptr, false);
  if (!body.is_object())
    return json::object();
  return {{"request_timeout_s", body.value("request_timeout_s", -1.0)},
          {"keep_alive_timeout_s", body.value("keep_alive_timeout_s", -1.0)},
          {"epoch", body.value("epoch", uint64_t{0})}};
}

// A request that sleeps 5 s: the seconds until the proxy answered 504, or
// nullopt when the answer was something else (or none within 15 s).
std::optional<double> timed_out_after(uint16_t port) {
  auto start = Clock::now();
  auto r = http_get(port, "/sleep/?ms=5000", 15);
  double took = since(start);
  if (!r || r->status != 504) {
    MESSAGE("answer " << (r ? std::to_string(r->status) : std::string("none")) << " after " << took
                      << " s");
    return std::nullopt;
  }
  return took;
}

// One keep-alive request on a fresh connection, then the seconds until the
// proxy closed the idle connection (nullopt: it stayed open for 20 s, or the
// request failed).
std::optional<double> idle_closed_after(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return std::nullopt;
  const std::string req = "GET /sleep/?ms=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size()))
    return std::nullopt;
  // Reads until the answer is in (its body is JSON: ends with '}'), then
  // until the proxy closes; poll() bounds every wait.
  std::string in;
  std::optional<Clock::time_point> answered;
  auto deadline = Clock::now() + std::chrono::seconds(20);
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0)
      return std::nullopt;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0)
      continue;
    char buf[4096];
    auto n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      if (!answered)
        return std::nullopt;
      return since(*answered);
    }
    in.append(buf, static_cast<size_t>(n));
    if (!answered && in.rfind("HTTP/1.1 200", 0) == 0 && in.find("\r\n\r\n") != std::string::npos &&
        in.back() == '}')
      answered = Clock::now();
  }
}

}  // namespace

TEST_CASE(
    "http_options: 504 after request_timeout_s and keep-alive closed after keep_alive_timeout_s - "
    "before and after a controller restart - port warns") {
  Cluster cluster;
  cluster.start();
  const uint16_t port = cluster.http_ports.at("head");
  const uint16_t admin = cluster.admin_ports.at("head");
  // Before any http_options: the node's own (no request timeout, 60 s idle).
  REQUIRE(wait_until([&] { return proxy_settings(admin).contains("epoch"); }, 20s, 100ms));
  CHECK(proxy_settings(admin)["keep_alive_timeout_s"] == 60.0);
  CHECK(proxy_settings(admin)["request_timeout_s"] == 0.0);

  auto deployed = cluster.ctl({"deploy", cluster.write("sleep.yaml", kSleep), "--wait"});
  REQUIRE_MESSAGE(deployed.exit_code == 0, deployed.out << deployed.err);
  // One line on stderr naming the ignored field and where the address is set.
  CHECK(deployed.err ==
        "troupectl: warning: http_options: port is ignored: each node's proxy listens where "
        "troupe-node --bind and --http-port say\n");

  const json wanted = {{"request_timeout_s", 1.0}, {"keep_alive_timeout_s", 1.0}};
  auto in_force = [&] {
    auto s = proxy_settings(admin);
    return s.value("request_timeout_s", -1.0) == 1.0 &&
           s.value("keep_alive_timeout_s", -1.0) == 1.0;
  };
  REQUIRE(wait_until(in_force, 10s, 100ms));
  auto check_timeouts = [&] {
    auto took = timed_out_after(port);
    REQUIRE(took.has_value());
    CHECK(*took >= 0.9);
    CHECK(*took < 4);  // the handler sleeps 5 s
    auto idle = idle_closed_after(port);
    REQUIRE(idle.has_value());
    CHECK(*idle >= 0.8);
    CHECK(*idle < 10);  // not the node's 60 s
  };
  check_timeouts();
  // Declared state: shown by status and config (without the port).
  auto status = cluster.status();
  REQUIRE(status.is_object());
  CHECK(status["http_options"] == wanted);
  auto config = cluster.ctl({"config"});
  REQUIRE(config.exit_code == 0);
  CHECK(config.out.rfind("http_options: {request_timeout_s: 1, keep_alive_timeout_s: 1}\n", 0) ==
        0);

  // A controller restart: the new incarnation reads the settings from its
  // checkpoint and pushes them to the proxy with its first snapshot (a new
  // epoch replaces everything the proxy held).
  const uint64_t epoch = proxy_settings(admin).value("epoch", uint64_t{0});
  auto killed = cluster.ctl({"kill", "controller"});
  REQUIRE(killed.exit_code == 0);
  REQUIRE(wait_until(
      [&] {
        auto s = proxy_settings(admin);
        return s.value("epoch", epoch) != epoch;
      },
      30s, 100ms));
  CHECK(in_force());
  check_timeouts();
  auto after = cluster.status();
  REQUIRE(after.is_object());
  CHECK(after["http_options"] == wanted);
}
