// The HTTP server's idle timeout between requests of a keep-alive connection,
// changed at run time (the deployed http_options' keep_alive_timeout_s): a
// real server on 127.0.0.1, spoken to with blocking sockets. Every wait is a
// poll() on a condition with a deadline.
#include "proxy/http_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include <boost/beast/http/status.hpp>

using namespace troupe::proxy;
using Clock = std::chrono::steady_clock;

namespace {

// Answers every request 200 at once.
struct Ok : Handler {
  void on_request(ExchangePtr exchange) override {
    Response r{boost::beast::http::status::ok, 11};
    r.body() = "ok";
    exchange->respond(std::move(r));
  }
};

double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Polls `condition` every millisecond until it holds (true) or `deadline_s`
// passed (false).
template <class Condition>
bool wait_for(Condition condition, double deadline_s) {
  auto start = Clock::now();
  while (!condition()) {
    if (since(start) > deadline_s)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// One keep-alive client connection.
class Client {
 public:
  explicit Client(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~Client() {
    if (fd_ >= 0)
      ::close(fd_);
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  bool send(const std::string& data) {
    return connected_ &&
           ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }

  // Sends `req` (a GET unless told) and reads its whole answer ("ok"),
  // within 10 s.
  bool get(const std::string& req = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") {
    if (!send(req))
      return false;
    std::string in;
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while (in.find("\r\n\r\nok") == std::string::npos) {
      if (!readable_before(deadline))
        return false;
      char buf[1024];
      auto n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0)
        return false;
      in.append(buf, static_cast<size_t>(n));
    }
    return in.rfind("HTTP/1.1 200", 0) == 0;
  }

  // Waits up to `deadline_s` for the server to close the connection; the
  // seconds it took, or nullopt when it stayed open.
  std::optional<double> closed_within(double deadline_s) {
    auto start = Clock::now();
    auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(deadline_s));
    while (readable_before(deadline)) {
      char buf[256];
      auto n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0)
        return since(start);  // EOF or reset: closed by the server
    }
    return std::nullopt;
  }

 private:
  bool readable_before(Clock::time_point deadline) {
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0)
        return false;
      pollfd p{fd_, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r > 0)
        return true;
      if (r == 0)
        return false;
    }
  }

  int fd_ = -1;
  bool connected_ = false;
};

}  // namespace

TEST_CASE("http server: a new idle timeout applies from each connection's next idle period") {
  Ok handler;
  ServerOptions options;
  options.port = 0;
  options.idle_timeout_s = 30;  // the node's default until told otherwise
  HttpServer server(options, handler);
  REQUIRE(server.listen().is_ok());
  server.run();
  CHECK(server.idle_timeout_s() == 30);

  // A connection idle under the old timeout keeps it (once its idle period
  // has started: the server starts it after the answer went out) ...
  Client before(server.port());
  REQUIRE(before.get());
  REQUIRE(wait_for([&] { return server.idle_connections() == 1; }, 5));
  server.set_idle_timeout(0.5);
  CHECK(server.idle_timeout_s() == 0.5);

  // ... a new idle period gets the new one: closed after about 0.5 s. The
  // server arms its timer after it answered, so the close comes at least
  // 0.5 s after the request was sent (measured from there: a client slowed
  // down by a busy machine cannot make it look early).
  Client fresh(server.port());
  auto sent = Clock::now();
  REQUIRE(fresh.get());
  auto closed = fresh.closed_within(10);
  REQUIRE(closed.has_value());
  CHECK(since(sent) >= 0.45);
  CHECK(*closed < 5);

  // `before` has been idle longer than 0.5 s now and is still open; its
  // next request starts an idle period with the new timeout.
  CHECK_FALSE(before.closed_within(0.05).has_value());
  sent = Clock::now();
  REQUIRE(before.get());
  closed = before.closed_within(10);
  REQUIRE(closed.has_value());
  CHECK(since(sent) >= 0.45);
  CHECK(*closed < 5);

  // Back to a long timeout: an idle connection stays open well past 0.5 s.
  server.set_idle_timeout(30);
  Client patient(server.port());
  REQUIRE(patient.get());
  CHECK_FALSE(patient.closed_within(1.5).has_value());
  REQUIRE(patient.get());  // and still serves
  server.stop();
}

TEST_CASE("http server: the idle timeout bounds only the wait for a request's first bytes") {
  Ok handler;
  ServerOptions options;
  options.port = 0;
  options.idle_timeout_s = 30;  // the time to send the rest of a request
  HttpServer server(options, handler);
  REQUIRE(server.listen().is_ok());
  server.run();
  server.set_idle_timeout(0.5);
  // A slow client that started its request is not idle: it gets
  // ServerOptions::idle_timeout_s to finish it.
  Client c(server.port());
  REQUIRE(c.send("GET / HT"));
  CHECK_FALSE(c.closed_within(1.5).has_value());
  auto sent = Clock::now();
  REQUIRE(c.get("TP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  // Then idle again: closed about 0.5 s after the answer.
  auto closed = c.closed_within(10);
  REQUIRE(closed.has_value());
  CHECK(since(sent) >= 0.45);
  server.stop();
}
