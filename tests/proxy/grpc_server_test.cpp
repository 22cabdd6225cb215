// The gRPC port of the proxy's server (proxy/grpc_server.hpp): a real server
// on 127.0.0.1 with a handler of the test's own, spoken to by an HTTP/2
// client made here with nghttp2's client side over a blocking socket. Every
// wait is a poll() on a condition with a deadline.
#include "proxy/grpc_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <doctest/doctest.h>
#include <nghttp2/nghttp2.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <boost/asio/post.hpp>

#include "proxy/grpc_fields.hpp"
#include "proxy/http_server.hpp"

using namespace troupe::proxy;
using Clock = std::chrono::steady_clock;
namespace http = boost::beast::http;

namespace {

// Answers by the method's name:
//   /t.S/Unary   200 with "re:" and the message
//   /t.S/Meta    200 with the value of metadata "x-who"; answer header x-said
//   /t.S/Refuse  503 {"error": "no replica is free"}
//   /t.S/Own     404 with its own grpc-status 12 and grpc-message
//   /t.S/Stream  a stream of 16 KiB messages, the next one written only when
//                the last is in the socket, until `stream_limit` of them
//   /t.S/Hold    nothing: kept until the client goes
struct Service : Handler {
  std::mutex mutex;
  std::vector<std::string> targets;
  std::atomic<int> streamed{0};
  std::atomic<int> gone{0};
  int stream_limit = 1000;
  std::vector<ExchangePtr> held;

  void on_request(ExchangePtr ex) override {
    auto& req = ex->request();
    std::string target(req.target());
    {
      std::lock_guard<std::mutex> lock(mutex);
      targets.push_back(target);
    }
    CHECK(ex->grpc());
    if (target == "/t.S/Unary") {
      Response r{http::status::ok, 11};
      r.body() = "re:" + req.body();
      ex->respond(std::move(r));
    } else if (target == "/t.S/Meta") {
      Response r{http::status::ok, 11};
      r.set("X-Said", "hi");
      r.body() = std::string(req["x-who"]);
      ex->respond(std::move(r));
    } else if (target == "/t.S/Refuse") {
      Response r{http::status::service_unavailable, 11};
      r.body() = R"({"error":"no replica is free"})";
      ex->respond(std::move(r));
    } else if (target == "/t.S/Own") {
      Response r{http::status::not_found, 11};
      r.set("grpc-status", "12");
      r.set("grpc-message", "no such method");
      ex->respond(std::move(r));
    } else if (target == "/t.S/Stream") {
      ex->on_client_gone([this] { ++gone; });
      ex->begin_stream(Response{http::status::ok, 11});
      write_next(ex);
    } else {
      ex->on_client_gone([this] { ++gone; });
      std::lock_guard<std::mutex> lock(mutex);
      held.push_back(ex);
    }
  }

  void write_next(const ExchangePtr& ex) {
    if (streamed.load() >= stream_limit) {
      ex->end_stream(true);
      return;
    }
    ex->write_chunk(std::string(16384, char('a' + streamed.load() % 26)), [this, ex](bool ok) {
      if (!ok)
        return;
      ++streamed;
      write_next(ex);
    });
  }
};

struct Server {
  Service service;
  std::unique_ptr<HttpServer> server;
  explicit Server(uint64_t body_limit = 1u << 20, double idle_timeout_s = 60) {
    ServerOptions o;
    o.idle_timeout_s = idle_timeout_s;
    o.port = 0;
    o.grpc = true;
    o.grpc_port = 0;
    o.body_limit = body_limit;
    server = std::make_unique<HttpServer>(o, service);
    REQUIRE(server->listen().is_ok());
    server->run();
  }
  ~Server() { server->stop(); }
  uint16_t port() const { return server->grpc_port(); }
};

// One HTTP/2 connection of a client (nghttp2's client side, blocking socket).
struct Client {
  struct Stream {
    std::map<std::string, std::string> headers, trailers;
    std::string data;
    bool closed = false;
    uint32_t error = 0;
    bool trailers_seen = false;
  };
  int fd = -1;
  nghttp2_session* session = nullptr;
  std::map<int32_t, Stream> streams;
  bool eof = false;
  int goaways = 0;
  int32_t goaway_last_stream = -1;

  // `read_window`: false, the client never grants the server more window
  // than its first 64 KiB (a client that does not read).
  explicit Client(uint16_t port, bool read_window = true) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    nghttp2_session_callbacks* cbs = nullptr;
    nghttp2_session_callbacks_new(&cbs);
    nghttp2_session_callbacks_set_on_header_callback(
        cbs, [](nghttp2_session*, const nghttp2_frame* f, const uint8_t* n, size_t nl,
                const uint8_t* v, size_t vl, uint8_t, void* u) {
          auto& s = static_cast<Client*>(u)->streams[f->hd.stream_id];
          std::string name(reinterpret_cast<const char*>(n), nl);
          std::string value(reinterpret_cast<const char*>(v), vl);
          if (f->headers.cat == NGHTTP2_HCAT_HEADERS) {
            s.trailers[name] = value;
            s.trailers_seen = true;
          } else {
            s.headers[name] = value;
          }
          return 0;
        });
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(
        cbs, [](nghttp2_session*, uint8_t, int32_t id, const uint8_t* d, size_t n, void* u) {
          static_cast<Client*>(u)->streams[id].data.append(reinterpret_cast<const char*>(d), n);
          return 0;
        });
    nghttp2_session_callbacks_set_on_stream_close_callback(
        cbs, [](nghttp2_session*, int32_t id, uint32_t error, void* u) {
          auto& s = static_cast<Client*>(u)->streams[id];
          s.closed = true;
          s.error = error;
          return 0;
        });
    nghttp2_session_callbacks_set_on_frame_recv_callback(
        cbs, [](nghttp2_session*, const nghttp2_frame* f, void* u) {
          if (f->hd.type == NGHTTP2_GOAWAY) {
            auto* c = static_cast<Client*>(u);
            ++c->goaways;
            c->goaway_last_stream = f->goaway.last_stream_id;
          }
          return 0;
        });
    nghttp2_option* opt = nullptr;
    nghttp2_option_new(&opt);
    if (!read_window)
      nghttp2_option_set_no_auto_window_update(opt, 1);
    nghttp2_session_client_new2(&session, cbs, this, opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cbs);
    nghttp2_submit_settings(session, NGHTTP2_FLAG_NONE, nullptr, 0);
  }
  ~Client() {
    nghttp2_session_del(session);
    if (fd >= 0)
      ::close(fd);
  }

  // A call of `path` whose body is `body` as it is (frame it for a message).
  int32_t call(const std::string& path, const std::string& body,
               std::vector<std::pair<std::string, std::string>> extra = {},
               const std::string& method = "POST",
               const std::string& content_type = "application/grpc") {
    std::vector<std::pair<std::string, std::string>> fields = {
        {":method", method}, {":scheme", "http"}, {":authority", "127.0.0.1"},
        {":path", path},     {"te", "trailers"},  {"content-type", content_type}};
    fields.insert(fields.end(), extra.begin(), extra.end());
    std::vector<nghttp2_nv> nva;
    for (auto& [n, v] : fields)
      nva.push_back({reinterpret_cast<uint8_t*>(n.data()), reinterpret_cast<uint8_t*>(v.data()),
                     n.size(), v.size(), NGHTTP2_NV_FLAG_NONE});
    auto pending = std::make_shared<std::string>(body);
    nghttp2_data_provider provider;
    provider.source.ptr = pending.get();
    provider.read_callback = [](nghttp2_session*, int32_t, uint8_t* buf, size_t length,
                                uint32_t* flags, nghttp2_data_source* src, void*) -> ssize_t {
      auto& p = *static_cast<std::string*>(src->ptr);
      size_t n = std::min(length, p.size());
      std::copy_n(p.data(), n, buf);
      p.erase(0, n);
      if (p.empty())
        *flags |= NGHTTP2_DATA_FLAG_EOF;
      return ssize_t(n);
    };
    bodies.push_back(pending);
    return nghttp2_submit_request(session, nullptr, nva.data(), nva.size(), &provider, nullptr);
  }
  std::vector<std::shared_ptr<std::string>> bodies;

  // Sends what is due and reads what comes until `done` holds or `ms` pass.
  bool pump(const std::function<bool()>& done, int ms = 10000) {
    const auto until = Clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
      const uint8_t* data = nullptr;
      ssize_t n;
      while ((n = nghttp2_session_mem_send(session, &data)) > 0) {
        if (::send(fd, data, size_t(n), MSG_NOSIGNAL) != n)
          return done();
      }
      if (done())
        return true;
      if (eof || Clock::now() >= until)
        return done();
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 20) > 0) {
        char buf[65536];
        ssize_t got = ::recv(fd, buf, sizeof(buf), 0);
        if (got <= 0) {
          eof = true;
          continue;
        }
        nghttp2_session_mem_recv(session, reinterpret_cast<uint8_t*>(buf), size_t(got));
      }
    }
  }
  bool closed(int32_t id, int ms = 10000) {
    return pump([&] { return streams[id].closed; }, ms);
  }
};

std::string framed(const std::string& message) {
  std::string out;
  grpc::frame(message, out);
  return out;
}

bool eventually(const std::function<bool()>& done, int ms = 10000) {
  const auto until = Clock::now() + std::chrono::milliseconds(ms);
  while (!done()) {
    if (Clock::now() >= until)
      return false;
    ::poll(nullptr, 0, 5);
  }
  return true;
}

}  // namespace

TEST_CASE(
    "grpc server: a unary call's answer is one message and grpc-status 0 - errors are trailers "
    "only - calls share a connection") {
  Server s;
  Client c(s.port());
  int32_t unary = c.call("/t.S/Unary", framed("ping"));
  int32_t meta = c.call("/t.S/Meta", framed(""), {{"x-who", "alice"}});
  int32_t refused = c.call("/t.S/Refuse", framed(""));
  int32_t own = c.call("/t.S/Own", framed(""));
  REQUIRE(c.pump([&] {
    return c.streams[unary].closed && c.streams[meta].closed && c.streams[refused].closed &&
           c.streams[own].closed;
  }));
  auto& u = c.streams[unary];
  CHECK(u.headers[":status"] == "200");
  CHECK(u.headers["content-type"] == "application/grpc");
  CHECK(u.data == framed("re:ping"));
  CHECK(u.trailers["grpc-status"] == "0");
  CHECK(u.error == 0);

  auto& m = c.streams[meta];
  CHECK(m.data == framed("alice"));
  CHECK(m.headers["x-said"] == "hi");

  // Trailers only: one HEADERS frame with the status, no data.
  auto& r = c.streams[refused];
  CHECK(r.headers[":status"] == "200");
  CHECK(r.headers["grpc-status"] == "14");
  CHECK(r.headers["grpc-message"] == "no replica is free");
  CHECK(r.data.empty());
  CHECK_FALSE(r.trailers_seen);
  auto& o = c.streams[own];
  CHECK(o.headers["grpc-status"] == "12");
  CHECK(o.headers["grpc-message"] == "no such method");
}

TEST_CASE(
    "grpc server: a stream's messages wait for a client that does not read - and go on when it "
    "reads") {
  Server s;
  s.service.stream_limit = 40;
  Client c(s.port(), false);
  int32_t id = c.call("/t.S/Stream", framed(""));
  // The client's window (64 KiB) takes four 16 KiB messages and their
  // prefixes at most; the server then holds the rest back and the handler
  // is told of nothing more written.
  REQUIRE(c.pump([&] { return c.streams[id].data.size() >= 60000; }));
  c.pump([] { return false; }, 300);
  CHECK(s.service.streamed.load() <= 5);
  CHECK(c.streams[id].data.size() <= 65535);
  CHECK_FALSE(c.streams[id].closed);
  // Reading: every byte taken is granted again, and the stream ends.
  size_t granted = 0;
  REQUIRE(c.pump([&] {
    auto& st = c.streams[id];
    if (st.data.size() > granted) {
      nghttp2_session_consume(c.session, id, st.data.size() - granted);
      granted = st.data.size();
    }
    return st.closed;
  }));
  CHECK(s.service.streamed.load() == 40);
  CHECK(c.streams[id].data.size() == 40 * (16384 + 5));
  CHECK(c.streams[id].trailers["grpc-status"] == "0");
  CHECK(s.service.gone.load() == 0);
}

TEST_CASE(
    "grpc server: a client's RST_STREAM and a closed connection are told to the handler as gone") {
  Server s;
  {
    Client c(s.port());
    int32_t id = c.call("/t.S/Hold", framed(""));
    REQUIRE(c.pump([&] { return eventually([&] { return s.service.held.size() == 1; }, 0); }));
    nghttp2_submit_rst_stream(c.session, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
    c.pump([] { return false; }, 50);
    REQUIRE(eventually([&] { return s.service.gone.load() == 1; }));
    CHECK(s.service.held[0]->client_gone());
    c.call("/t.S/Hold", framed(""));
    REQUIRE(c.pump([&] { return eventually([&] { return s.service.held.size() == 2; }, 0); }));
  }
  // The connection closed with a call held.
  REQUIRE(eventually([&] { return s.service.gone.load() == 2; }));
  // An answer to a call whose client is gone goes nowhere, and harms nothing.
  boost::asio::post(s.service.held[1]->io(), [ex = s.service.held[1]] {
    ex->respond(Response{http::status::ok, 11});
  });
  Client again(s.port());
  int32_t id = again.call("/t.S/Unary", framed("x"));
  REQUIRE(again.closed(id));
  CHECK(again.streams[id].data == framed("re:x"));
}

TEST_CASE(
    "grpc server: calls that are not one gRPC message are refused before the handler - garbage "
    "ends the connection") {
  Server s(1000);
  Client c(s.port());
  int32_t get = c.call("/t.S/Unary", "", {}, "GET");
  int32_t form = c.call("/t.S/Unary", "a=b", {}, "POST", "application/x-www-form-urlencoded");
  int32_t two = c.call("/t.S/Unary", framed("a") + framed("b"));
  int32_t zipped = c.call("/t.S/Unary", std::string("\1\0\0\0\1x", 6));
  int32_t cut = c.call("/t.S/Unary", std::string("\0\0\0\0\9abc", 8));
  int32_t big = c.call("/t.S/Unary", framed(std::string(5000, 'x')));
  std::vector<std::pair<std::string, std::string>> bulky;
  for (int i = 0; i < 40; ++i)
    bulky.emplace_back("x-pad-" + std::to_string(i), std::string(1000, 'p'));
  int32_t bloated = c.call("/t.S/Unary", framed("x"), bulky);
  int32_t fine = c.call("/t.S/Unary", framed("ok"));
  REQUIRE(c.pump([&] {
    for (int32_t id : {get, form, two, zipped, cut, big, bloated, fine}) {
      if (!c.streams[id].closed)
        return false;
    }
    return true;
  }));
  CHECK(c.streams[get].headers[":status"] == "405");
  CHECK(c.streams[form].headers[":status"] == "415");
  CHECK(c.streams[two].headers["grpc-status"] == "3");
  CHECK(c.streams[two].headers["grpc-message"].find("more than one message") != std::string::npos);
  CHECK(c.streams[zipped].headers["grpc-status"] == "3");
  CHECK(c.streams[cut].headers["grpc-status"] == "3");
  CHECK(c.streams[big].headers["grpc-status"] == "8");
  CHECK(c.streams[big].headers["grpc-message"].find("1000 bytes") != std::string::npos);
  // Metadata over the header limit (16 KiB by default): the call is reset.
  CHECK(c.streams[bloated].error != 0);
  CHECK(c.streams[bloated].headers.empty());
  CHECK(c.streams[fine].data == framed("re:ok"));
  {
    std::lock_guard<std::mutex> lock(s.service.mutex);
    CHECK(s.service.targets == std::vector<std::string>{"/t.S/Unary"});
  }

  // Not HTTP/2: the server sends its GOAWAY and closes.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(s.port());
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  const std::string garbage = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  REQUIRE(::send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL) == ssize_t(garbage.size()));
  bool closed = eventually([&] {
    char buf[4096];
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0)
      return false;
    return ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT) == 0;
  });
  ::close(fd);
  CHECK(closed);
}

TEST_CASE(
    "grpc server: a connection idle for the idle timeout is ended with a GOAWAY - one with a call "
    "open is kept") {
  Server s(1u << 20, 0.3);
  Client idle(s.port());
  Client busy(s.port());
  int32_t held = busy.call("/t.S/Hold", framed(""));
  REQUIRE(busy.pump([&] { return eventually([&] { return s.service.held.size() == 1; }, 0); }));
  REQUIRE(idle.pump([&] { return idle.eof; }, 10000));
  CHECK(idle.goaways == 1);
  // Well past the idle timeout, the connection with the call open is there.
  busy.pump([] { return false; }, 1200);
  CHECK_FALSE(busy.eof);
  CHECK(busy.goaways == 0);
  CHECK_FALSE(busy.streams[held].closed);
  CHECK(s.service.gone.load() == 0);
}

TEST_CASE(
    "grpc server: when the server stops accepting its clients get a GOAWAY - the calls they have "
    "open still end well") {
  Server s;
  Client c(s.port());
  int32_t held = c.call("/t.S/Hold", framed(""));
  REQUIRE(c.pump([&] { return eventually([&] { return s.service.held.size() == 1; }, 0); }));
  s.server->stop_accepting();
  REQUIRE(c.pump([&] { return c.goaways == 1; }));
  CHECK(c.goaway_last_stream == held);
  CHECK_FALSE(c.eof);
  ExchangePtr ex;
  {
    std::lock_guard<std::mutex> lock(s.service.mutex);
    ex = s.service.held[0];
  }
  boost::asio::post(ex->io(), [ex] {
    Response r{http::status::ok, 11};
    r.body() = "late";
    ex->respond(std::move(r));
  });
  REQUIRE(c.closed(held));
  CHECK(c.streams[held].data == framed("late"));
  CHECK(c.streams[held].trailers["grpc-status"] == "0");
  // Then the server closes the connection: nothing is open on it.
  CHECK(c.pump([&] { return c.eof; }));
}
