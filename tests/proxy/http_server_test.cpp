// The HTTP server's idle timeout between requests of a keep-alive connection,
// changed at run time (the deployed http_options' keep_alive_timeout_s),
// streamed (chunked) answers and the detection of clients that go away: a
// real server on 127.0.0.1, spoken to with blocking sockets. Every wait is a
// poll() on a condition with a deadline.
#include "proxy/http_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/post.hpp>
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
  // rcvbuf > 0: a small receive buffer (before connecting), for a client
  // that stops reading to fill up quickly.
  explicit Client(uint16_t port, int rcvbuf = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (rcvbuf > 0)
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
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

  // Reads into `in` until `done(in)` holds (true), or EOF, an error or
  // `deadline_s` (false; *eof tells whether it was EOF or reset).
  template <class Done>
  bool read_until_done(std::string& in, Done done, double deadline_s, bool* eof = nullptr) {
    auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(deadline_s));
    if (eof)
      *eof = false;
    while (!done(in)) {
      if (!readable_before(deadline))
        return false;
      char buf[65536];
      auto n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) {
        if (eof)
          *eof = true;
        return false;
      }
      in.append(buf, static_cast<size_t>(n));
    }
    return true;
  }
  bool read_until(std::string& in, const std::string& marker, double deadline_s) {
    return read_until_done(
        in, [&](const std::string& s) { return s.find(marker) != std::string::npos; }, deadline_s);
  }

  void close() {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = -1;
  }

  bool connected() const { return connected_; }
  int fd() const { return fd_; }

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

// "/ok" is answered 200 "ok" at once; any other request is held for the
// test, which answers or streams it by posting to its io thread. Every
// exchange gets a gone callback that counts.
struct Holding : Handler {
  void on_request(ExchangePtr exchange) override {
    exchange->on_client_gone([this] { ++gone; });
    if (exchange->request().target() == "/ok") {
      Response r{boost::beast::http::status::ok, 11};
      r.body() = "ok";
      exchange->respond(std::move(r));
      return;
    }
    std::lock_guard<std::mutex> lock(mutex);
    held.push_back(std::move(exchange));
  }

  // The held exchange number `i`, once the request arrived (within 5 s).
  ExchangePtr at(size_t i) {
    ExchangePtr e;
    wait_for(
        [&] {
          std::lock_guard<std::mutex> lock(mutex);
          if (held.size() > i)
            e = held[i];
          return e != nullptr;
        },
        5);
    return e;
  }

  // Runs `f` on the exchange's io thread and waits (5 s) until it ran.
  static void on_io(const ExchangePtr& e, std::function<void()> f) {
    auto done = std::make_shared<std::atomic<bool>>(false);
    boost::asio::post(e->io(), [f = std::move(f), done] {
      f();
      *done = true;
    });
    wait_for([&] { return done->load(); }, 5);
  }

  std::atomic<int> gone{0};
  std::mutex mutex;
  std::vector<ExchangePtr> held;
};

Response stream_head() {
  Response head{boost::beast::http::status::ok, 11};
  head.set("X-Request-Id", "r-1");
  head.set(boost::beast::http::field::content_type, "text/plain");
  head.set(boost::beast::http::field::content_length, "999");  // dropped
  return head;
}

// A running server for a Holding handler; the held exchanges (connections)
// go before the server's io contexts.
struct Server {
  explicit Server(Holding& handler, double idle_timeout_s = 30)
      : holding(handler), server(options(idle_timeout_s), handler) {
    REQUIRE(server.listen().is_ok());
    server.run();
  }
  ~Server() {
    server.stop();
    std::lock_guard<std::mutex> lock(holding.mutex);
    holding.held.clear();
  }
  static ServerOptions options(double idle_timeout_s) {
    ServerOptions o;
    o.port = 0;
    o.idle_timeout_s = idle_timeout_s;
    return o;
  }
  Holding& holding;
  HttpServer server;
};

const std::string kGetStream = "GET /stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";

// A written callback that counts into `written`: 1 per chunk written, 100
// per chunk that failed.
std::function<void(bool)> counting(std::atomic<int>& written) {
  return [&written](bool ok) { written += ok ? 1 : 100; };
}

// Sends `request` on `c`, then has its exchange begin a stream and write
// "hello" (reported to `written`); the exchange.
ExchangePtr stream_hello(Holding& handler, Client& c, const std::string& request,
                         const std::function<void(bool)>& written) {
  REQUIRE(c.send(request));
  auto e = handler.at(0);
  REQUIRE(e);
  Holding::on_io(e, [&] {
    e->begin_stream(stream_head());
    e->write_chunk("hello", written);
  });
  return e;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Collects what an Exchange that is no connection answers.
class Collecting : public Exchange {
 public:
  Request& request() override { return request_; }
  void respond(Response&& response) override { answers.push_back(std::move(response)); }
  size_t thread() const override { return 0; }
  asio::io_context& io() override { return io_; }
  std::vector<Response> answers;

 private:
  asio::io_context io_;
  Request request_;
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

TEST_CASE("http server: after stop_accepting answers close their connections and none is accepted") {
  Ok handler;
  ServerOptions options;
  options.port = 0;
  HttpServer server(options, handler);
  REQUIRE(server.listen().is_ok());
  server.run();
  Client kept(server.port());
  REQUIRE(kept.get());
  CHECK_FALSE(kept.closed_within(0.05).has_value());  // kept alive

  server.stop_accepting();
  CHECK(server.closing());
  // The listening socket closes: a new connection is refused.
  CHECK(wait_for([&] { return !Client(server.port()).connected(); }, 5));
  // The kept-alive connection is still served, told to close, and closed.
  REQUIRE(kept.send("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  std::string in;
  REQUIRE(kept.read_until(in, "\r\n\r\nok", 10));
  CHECK(in.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(in.find("Connection: close\r\n") != std::string::npos);
  CHECK(kept.closed_within(10).has_value());
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

TEST_CASE("http server: a streamed answer arrives chunk by chunk and the connection goes on") {
  Holding handler;
  Server s(handler);
  Client c(s.server.port());
  std::atomic<int> written{0};
  auto count = counting(written);
  auto e = stream_hello(handler, c, kGetStream, count);
  // The head and the first chunk arrive before the second is written.
  std::string in;
  REQUIRE(c.read_until(in, "\r\n\r\n5\r\nhello\r\n", 5));
  auto head = in.substr(0, in.find("\r\n\r\n"));
  CHECK(head.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(head.find("Transfer-Encoding: chunked") != std::string::npos);
  CHECK(head.find("X-Request-Id: r-1") != std::string::npos);
  CHECK(head.find("Content-Length") == std::string::npos);
  CHECK(head.find("Connection: close") == std::string::npos);
  CHECK(wait_for([&] { return written == 1; }, 5));
  Holding::on_io(e, [&] {
    e->write_chunk("", count);  // nothing sent
    e->write_chunk(std::string(20, 'x'), count);
  });
  REQUIRE(c.read_until(in, "14\r\n" + std::string(20, 'x') + "\r\n", 5));
  CHECK(in.find("0\r\n\r\n") == std::string::npos);
  Holding::on_io(e, [&] { e->end_stream(true); });
  REQUIRE(c.read_until_done(in, [](const std::string& s) { return ends_with(s, "\r\n0\r\n\r\n"); }, 5));
  CHECK(written == 3);
  // The same connection serves the next request; the stream's gone callback
  // never fires.
  REQUIRE(c.get("GET /ok HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  CHECK_FALSE(e->client_gone());
  CHECK(handler.gone == 0);
}

TEST_CASE("http server: an HTTP/1.0 client gets its stream as it is - ended by the close") {
  Holding handler;
  Server s(handler);
  Client c(s.server.port());
  std::atomic<int> written{0};
  auto count = counting(written);
  auto e = stream_hello(handler, c, "GET /stream HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n", count);
  // No chunk sizes: the data as the producer wrote it, as it is written.
  std::string in;
  REQUIRE(c.read_until(in, "\r\n\r\nhello", 5));
  auto head = in.substr(0, in.find("\r\n\r\n"));
  CHECK(head.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(head.find("Transfer-Encoding") == std::string::npos);
  CHECK(head.find("Content-Length") == std::string::npos);
  CHECK(head.find("Connection: close") != std::string::npos);  // its keep-alive is not kept
  CHECK(head.find("X-Request-Id: r-1") != std::string::npos);
  CHECK(wait_for([&] { return written == 1; }, 5));
  Holding::on_io(e, [&] {
    e->write_chunk(std::string(20, 'x'), count);
    e->end_stream(true);
  });
  bool eof = false;
  CHECK_FALSE(c.read_until_done(in, [](const std::string&) { return false; }, 5, &eof));
  CHECK(eof);  // the close ends the body
  CHECK(in.substr(in.find("\r\n\r\n") + 4) == "hello" + std::string(20, 'x'));
  CHECK(written == 2);
  CHECK(handler.gone == 0);
}

TEST_CASE("http server: end_stream(false) closes the connection without the last chunk") {
  Holding handler;
  Server s(handler);
  Client c(s.server.port());
  REQUIRE(c.send(kGetStream));
  auto e = handler.at(0);
  REQUIRE(e);
  std::atomic<int> written{0};
  Holding::on_io(e, [&] {
    e->begin_stream(stream_head());
    e->write_chunk("partial", [&](bool ok) { written += ok; });
    e->end_stream(false);  // the queued chunk goes out first
  });
  std::string in;
  bool eof = false;
  CHECK_FALSE(c.read_until_done(in, [](const std::string&) { return false; }, 5, &eof));
  CHECK(eof);
  CHECK(in.find("7\r\npartial\r\n") != std::string::npos);
  CHECK(in.find("0\r\n\r\n") == std::string::npos);
  CHECK(written == 1);
}

TEST_CASE("http server: a client that goes away while its request is handled is noticed") {
  Holding handler;
  Server s(handler);
  // Answered normally, then closed: no gone callback.
  {
    Client c(s.server.port());
    REQUIRE(c.get("GET /ok HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
    REQUIRE(c.send(kGetStream));
    auto e = handler.at(0);
    REQUIRE(e);
    Holding::on_io(e, [&] {
      Response r{boost::beast::http::status::ok, 11};
      r.body() = "ok";
      e->respond(std::move(r));
    });
    std::string in;
    REQUIRE(c.read_until(in, "\r\n\r\nok", 5));
  }
  // Held (never answered), then closed: the gone callback fires.
  Client c(s.server.port());
  REQUIRE(c.send(kGetStream));
  auto e = handler.at(1);
  REQUIRE(e);
  CHECK_FALSE(e->client_gone());
  c.close();
  REQUIRE(wait_for([&] { return handler.gone == 1; }, 5));
  std::atomic<bool> gone{false};
  Holding::on_io(e, [&] { gone = e->client_gone(); });
  CHECK(gone);
  // Set after the client went: called soon after.
  std::atomic<int> late{0};
  Holding::on_io(e, [&] { e->on_client_gone([&] { ++late; }); });
  CHECK(wait_for([&] { return late == 1; }, 5));
  // An answer to nobody is dropped; still only the one gone callback.
  Holding::on_io(e, [&] { e->respond(Response{boost::beast::http::status::ok, 11}); });
  CHECK_FALSE(wait_for([&] { return handler.gone != 1; }, 0.2));
  CHECK(late == 1);
}

TEST_CASE("http server: a client that goes away mid-stream stops the producer") {
  Holding handler;
  Server s(handler);
  Client c(s.server.port());
  REQUIRE(c.send(kGetStream));
  auto e = handler.at(0);
  REQUIRE(e);
  std::atomic<int> ok{0}, failed{0};
  auto count = [&](bool good) { (good ? ok : failed) += 1; };
  Holding::on_io(e, [&] {
    e->begin_stream(stream_head());
    e->write_chunk("first", count);
  });
  std::string in;
  REQUIRE(c.read_until(in, "5\r\nfirst\r\n", 5));
  c.close();
  REQUIRE(wait_for([&] { return handler.gone == 1; }, 5));
  // A producer that goes on writing is told: written(false) within a few
  // writes (the first may still land in the kernel before the reset).
  CHECK(wait_for(
      [&] {
        Holding::on_io(e, [&] { e->write_chunk("more", count); });
        return failed > 0;
      },
      5));
  Holding::on_io(e, [&] { e->end_stream(false); });
  CHECK(ok >= 1);
  CHECK(handler.gone == 1);
}

TEST_CASE("http server: written callbacks stop while the client reads nothing") {
  Holding handler;
  Server s(handler);
  Client c(s.server.port(), 64 << 10);
  REQUIRE(c.send(kGetStream));
  auto e = handler.at(0);
  REQUIRE(e);
  constexpr int kChunks = 64;
  constexpr size_t kSize = 256 << 10;
  std::atomic<int> ok{0}, failed{0};
  Holding::on_io(e, [&] {
    e->begin_stream(stream_head());
    for (int i = 0; i < kChunks; ++i)
      e->write_chunk(std::string(kSize, 'a'), [&](bool good) { (good ? ok : failed) += 1; });
    e->end_stream(true);
  });
  // The socket buffers fill up: the callbacks stop short of all chunks.
  CHECK_FALSE(wait_for([&] { return ok == kChunks; }, 1));
  CHECK(ok < kChunks);
  CHECK(failed == 0);
  std::string in;
  in.reserve(kChunks * (kSize + 16) + 1024);
  REQUIRE(c.read_until_done(in, [](const std::string& s) { return ends_with(s, "\r\n0\r\n\r\n"); }, 20));
  CHECK(wait_for([&] { return ok == kChunks; }, 5));
  CHECK(failed == 0);
  auto body = in.size() - (in.find("\r\n\r\n") + 4);
  CHECK(body == kChunks * (kSize + std::string("40000\r\n\r\n").size()) + 5);
  CHECK(handler.gone == 0);
}

TEST_CASE("http server: a streamed answer to HEAD sends only the head") {
  Holding handler;
  Server s(handler);
  Client c(s.server.port());
  REQUIRE(c.send("HEAD /stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  auto e = handler.at(0);
  REQUIRE(e);
  std::atomic<int> ok{0};
  Holding::on_io(e, [&] {
    e->begin_stream(stream_head());
    e->write_chunk("body", [&](bool good) { ok += good; });
    e->end_stream(true);
  });
  std::string in;
  REQUIRE(c.read_until(in, "\r\n\r\n", 5));
  CHECK(in.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(in.find("X-Request-Id: r-1") != std::string::npos);
  CHECK(ends_with(in, "\r\n\r\n"));  // nothing after the head
  CHECK(ok == 1);
  // The next answer on the connection starts right after the head.
  REQUIRE(c.get("GET /ok HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
}

TEST_CASE("http server: exchanges that are no connection collect a stream into one answer") {
  Collecting e;
  int ok = 0;
  e.begin_stream(stream_head());
  e.write_chunk("ab", [&](bool good) { ok += good; });
  e.write_chunk("cd", [&](bool good) { ok += good; });
  CHECK(ok == 2);
  CHECK(e.answers.empty());
  e.end_stream(true);
  REQUIRE(e.answers.size() == 1);
  CHECK(e.answers[0].result_int() == 200);
  CHECK(e.answers[0].body() == "abcd");
  CHECK(e.answers[0][boost::beast::http::field::content_length] == "4");
  CHECK(e.answers[0]["X-Request-Id"] == "r-1");
  CHECK_FALSE(e.client_gone());

  Collecting broken;
  broken.begin_stream(stream_head());
  broken.write_chunk("ab", nullptr);
  broken.end_stream(false);
  REQUIRE(broken.answers.size() == 1);
  CHECK(broken.answers[0].result_int() == 502);
  CHECK(broken.answers[0].body() == "{\"error\":\"the stream ended early\"}");
  CHECK(broken.answers[0]["X-Request-Id"] == "r-1");
}

TEST_CASE("http server: a stream write the client takes nothing of ends after the idle timeout") {
  Holding handler;
  Server s(handler, 0.5);
  Client c(s.server.port(), 64 << 10);
  REQUIRE(c.send(kGetStream));
  auto e = handler.at(0);
  REQUIRE(e);
  std::atomic<int> ok{0}, failed{0};
  auto sent = Clock::now();
  Holding::on_io(e, [&] {
    e->begin_stream(stream_head());
    for (int i = 0; i < 64; ++i)
      e->write_chunk(std::string(256 << 10, 'a'), [&](bool good) { (good ? ok : failed) += 1; });
  });
  // Every chunk is accounted for: the written ones, and false for the rest
  // once the stuck write timed out; the producer hears of it as gone too.
  REQUIRE(wait_for([&] { return ok + failed == 64; }, 10));
  CHECK(failed > 0);
  CHECK(since(sent) >= 0.45);
  CHECK(wait_for([&] { return handler.gone == 1; }, 5));
  std::atomic<bool> gone{false};
  Holding::on_io(e, [&] {
    gone = e->client_gone();
    e->write_chunk("late", [&](bool good) { (good ? ok : failed) += 1; });  // false at once
    e->end_stream(true);
  });
  CHECK(gone);
  CHECK(ok + failed == 65);
}

namespace {

// Keeps requests for the loop's pass (HttpServer::on_pass), as the proxy
// keeps in-process blocking calls: once `batch` requests are queued, the pass
// runs them in order, "/block" inside run_blocking (on a latch the test
// opens), the others answered at once (and from then on every pass runs
// what is queued). The queue is the loop's state: only
// the thread running the loop touches it.
struct Queued : Handler {
  void on_request(ExchangePtr exchange) override {
    queue.push_back(std::move(exchange));
    ++queued;
  }
  bool pass(HttpServer& server, size_t i) {
    if (!started && queue.size() < batch)
      return true;
    started = true;
    while (!queue.empty()) {
      ExchangePtr e = std::move(queue.front());
      queue.erase(queue.begin());
      if (e->request().target() == "/block") {
        bool kept = server.loops()->run_blocking(i, [&] {
          blocked = true;
          std::unique_lock<std::mutex> lock(mutex);
          opened.wait(lock, [&] { return open; });
        });
        if (!kept) {
          // Taken over: the answer goes to the loop as a post, and this
          // thread leaves.
          boost::asio::post(e->io(), [e] { e->respond(ok()); });
          return false;
        }
      }
      e->respond(ok());
    }
    return true;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      open = true;
    }
    opened.notify_all();
  }
  static Response ok() {
    Response r{boost::beast::http::status::ok, 11};
    r.body() = "ok";
    return r;
  }
  size_t batch = 2;
  bool started = false;
  std::vector<ExchangePtr> queue;
  std::atomic<int> queued{0};
  std::atomic<bool> blocked{false};
  std::mutex mutex;
  std::condition_variable opened;
  bool open = false;
};

}  // namespace

TEST_CASE("http server: the thread that takes a loop over runs the requests queued behind the one that blocked - without waiting for another event") {
  Queued handler;
  ServerOptions o;
  o.port = 0;
  // Both ways a loop waits for work: blocking in epoll at once, and polling
  // for spin_us first.
  SUBCASE("no spin") { o.spin_us = 0; }
  SUBCASE("spin") { o.spin_us = 50; }
  HttpServer server(o, handler);
  server.on_pass([&](size_t i) { return handler.pass(server, i); });
  REQUIRE(server.listen().is_ok());
  server.run();
  Client blocking(server.port());
  Client behind(server.port());
  REQUIRE(blocking.send("GET /block HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  REQUIRE(wait_for([&] { return handler.queued.load() == 1; }, 10));
  // The second request is queued behind the first in the same pass; the
  // first blocks, its loop is taken over, and the second is answered while
  // the first still waits: no client sends anything else meanwhile.
  CHECK(behind.get("GET /quick HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  CHECK(handler.blocked);
  CHECK(server.loops()->takeovers() == 1);
  handler.release();
  std::string in;
  CHECK(blocking.read_until(in, "\r\n\r\nok", 10));
  server.stop();
}

namespace {

// Answers at once: "/big" with kBig bytes of 'b', "/gone" by nothing (held
// until the test ends), anything else with "<target> <body size>".
constexpr size_t kBig = 8u << 20;
struct Answering : Handler {
  void on_request(ExchangePtr exchange) override {
    ++requests;
    const auto& req = exchange->request();
    Response r{boost::beast::http::status::ok, 11};
    r.set("X-First", "1");
    r.set("X-Second", "2");
    if (req.target() == "/big") {
      r.body().assign(kBig, 'b');
    } else if (req.target() == "/missing") {
      r.result(boost::beast::http::status::not_found);
      r.body() = "none";
    } else {
      r.body() = std::string(req.target()) + " " + std::to_string(req.body().size());
    }
    exchange->respond(std::move(r));
  }
  std::atomic<int> requests{0};
};

struct Running {
  explicit Running(Handler& handler, double idle_timeout_s = 30)
      : server(options(idle_timeout_s), handler) {
    REQUIRE(server.listen().is_ok());
    server.run();
  }
  ~Running() { server.stop(); }
  static ServerOptions options(double idle_timeout_s) {
    ServerOptions o;
    o.port = 0;
    o.idle_timeout_s = idle_timeout_s;
    return o;
  }
  HttpServer server;
};

// The whole answers in `in` so far (each: head, then Content-Length bytes).
std::vector<std::string> complete_bodies(const std::string& in) {
  std::vector<std::string> bodies;
  size_t at = 0;
  for (;;) {
    auto end = in.find("\r\n\r\n", at);
    if (end == std::string::npos)
      break;
    auto cl = in.find("Content-Length: ", at);
    if (cl == std::string::npos || cl > end)
      break;
    size_t length = std::stoul(in.substr(cl + 16, in.find("\r\n", cl) - cl - 16));
    if (in.size() < end + 4 + length)
      break;
    bodies.push_back(in.substr(end + 4, length));
    at = end + 4 + length;
  }
  return bodies;
}

// The state of the server's side of a connection in /proc/net/tcp (hex, as
// the kernel writes it: "01" established, "04" FIN_WAIT1, ...), found by its
// two ports on 127.0.0.1; "" when there is none.
std::string server_side_state(uint16_t server_port, uint16_t client_port) {
  FILE* f = std::fopen("/proc/net/tcp", "r");
  if (!f)
    return "";
  char line[512];
  std::string state;
  char local[64], remote[64];
  auto port_of = [](const char* endpoint) {
    const char* colon = std::strchr(endpoint, ':');
    return colon ? static_cast<uint16_t>(std::strtoul(colon + 1, nullptr, 16)) : 0;
  };
  while (std::fgets(line, sizeof line, f)) {
    char st[8];
    if (std::sscanf(line, " %*d: %63s %63s %7s", local, remote, st) != 3)
      continue;
    if (port_of(local) == server_port && port_of(remote) == client_port) {
      state = st;
      break;
    }
  }
  std::fclose(f);
  return state;
}

// Reads one whole answer on `c` (within `deadline_s`): its body, or "<none>".
std::string one_body(Client& c, double deadline_s = 10) {
  std::string in;
  if (!c.read_until_done(
          in, [](const std::string& s) { return complete_bodies(s).size() == 1; }, deadline_s))
    return "<none>";
  return complete_bodies(in)[0];
}

// GETs `target` on `c`: the body of its answer, or "<none>".
std::string get_body(Client& c, const std::string& target) {
  if (!c.send("GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
    return "<none>";
  return one_body(c);
}

uint16_t local_port(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

}  // namespace

TEST_CASE("http server: an answer's head is its status line and its fields in their order") {
  Answering handler;
  Running s(handler);
  Client c(s.server.port());
  REQUIRE(c.send("GET /missing HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  std::string in;
  REQUIRE(c.read_until_done(
      in, [](const std::string& s) { return complete_bodies(s).size() == 1; }, 10));
  CHECK(in ==
        "HTTP/1.1 404 Not Found\r\nX-First: 1\r\nX-Second: 2\r\nContent-Length: 4\r\n\r\nnone");
  // HEAD: the length of the body it does not send; the connection goes on.
  REQUIRE(c.send("HEAD /x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  in.clear();
  REQUIRE(c.read_until(in, "\r\n\r\n", 10));
  CHECK(in == "HTTP/1.1 200 OK\r\nX-First: 1\r\nX-Second: 2\r\nContent-Length: 4\r\n\r\n");
  // An HTTP/1.0 client without keep-alive: told, answered, closed.
  REQUIRE(c.send("GET /old HTTP/1.0\r\n\r\n"));
  in.clear();
  bool eof = false;
  CHECK_FALSE(c.read_until_done(
      in, [](const std::string&) { return false; }, 10, &eof));
  CHECK(eof);
  CHECK(in ==
        "HTTP/1.1 200 OK\r\nX-First: 1\r\nX-Second: 2\r\nConnection: close\r\n"
        "Content-Length: 6\r\n\r\n/old 0");
}

TEST_CASE("http server: thousands of pipelined requests in one write are answered in order") {
  Answering handler;
  Running s(handler);
  Client c(s.server.port());
  constexpr int kCount = 5000;
  std::string all;
  for (int i = 0; i < kCount; ++i)
    all += "GET /" + std::to_string(i) + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  // From a thread of its own: the answers must be read while it sends.
  std::thread sender([&] { c.send(all); });
  std::string in;
  bool complete = c.read_until_done(
      in, [&](const std::string& s) { return complete_bodies(s).size() == kCount; }, 30);
  sender.join();
  REQUIRE(complete);
  auto bodies = complete_bodies(in);
  for (int i = 0; i < kCount; ++i) {
    if (bodies[i] != "/" + std::to_string(i) + " 0") {
      FAIL_CHECK("answer " << i << " is " << bodies[i]);
      break;
    }
  }
  CHECK(handler.requests == kCount);
  CHECK(get_body(c, "/last") == "/last 0");  // the connection goes on
}

TEST_CASE("http server: a request whose body arrives in parts is read whole") {
  Answering handler;
  Running s(handler);
  Client c(s.server.port());
  REQUIRE(c.send("POST /in-parts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\nabcd"));
  // Six bytes are missing: no answer yet.
  CHECK_FALSE(c.closed_within(0.3).has_value());
  CHECK(handler.requests == 0);
  REQUIRE(c.send("efghij"));
  CHECK(one_body(c) == "/in-parts 10");
  // A client that closes halfway through a body is dropped; the server goes on.
  {
    Client cut(s.server.port());
    REQUIRE(cut.send("POST /cut HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\nabc"));
  }
  Client after(s.server.port());
  CHECK(get_body(after, "/after") == "/after 0");
  CHECK(handler.requests == 2);
}

TEST_CASE(
    "http server: an answer larger than the socket takes at once arrives whole and the connection "
    "goes on") {
  Answering handler;
  Running s(handler);
  Client c(s.server.port(), 64 << 10);
  REQUIRE(c.send("GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  CHECK(one_body(c, 30) == std::string(kBig, 'b'));
  CHECK(get_body(c, "/next") == "/next 0");
}

TEST_CASE("http server: an answer the client takes nothing of is dropped after the idle timeout") {
  Answering handler;
  Running s(handler, 0.5);
  Client c(s.server.port(), 64 << 10);
  const uint16_t client_port = local_port(c.fd());
  REQUIRE(c.send("GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  auto sent = Clock::now();
  REQUIRE(wait_for([&] { return handler.requests == 1; }, 10));
  CHECK(server_side_state(s.server.port(), client_port) == "01");  // established, writing
  // The server closes its side once the answer's write is past its
  // deadline: the kernel's state leaves ESTABLISHED.
  REQUIRE(wait_for([&] { return server_side_state(s.server.port(), client_port) != "01"; }, 10));
  CHECK(since(sent) >= 0.45);
  // What the client reads is a part of the answer, then the end.
  std::string in;
  bool eof = false;
  CHECK_FALSE(c.read_until_done(
      in, [](const std::string&) { return false; }, 10, &eof));
  CHECK(eof);
  CHECK(in.size() < kBig);
}
