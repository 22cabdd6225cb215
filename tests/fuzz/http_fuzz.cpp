// The proxy's HTTP server (proxy/http_server.hpp, Boost.Beast) on arbitrary
// bytes from a client: each input is sent on a new connection to a server
// started once on 127.0.0.1, which parses what it can (pipelined requests,
// chunked bodies, HEAD, oversized headers and bodies), answers or rejects
// it, and closes when the client stops sending. Its handler checks the
// headers the proxy reads itself (proxy/http_fields.hpp) and answers some
// requests as streams. Never a crash, and never a connection left without
// an end: the client's read of everything the server sends must end (the
// server closes) within 5 s.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "proxy/http_fields.hpp"
#include "proxy/http_server.hpp"

using namespace troupe;
using namespace troupe::proxy;
namespace http = boost::beast::http;

namespace {

class Answers : public Handler {
 public:
  void on_request(ExchangePtr ex) override {
    auto& req = ex->request();
    std::string body = std::string(req.method_string()) + " " + std::string(req.target());
    auto id = req["X-Request-Id"];  // absent: empty
    if (!id.empty() && valid_request_id(id))
      body += " id";
    auto timeout = req[kRequestTimeoutHeader];
    if (!timeout.empty()) {
      auto t = parse_request_timeout(timeout);
      if (!t && t.status().message().empty())
        std::abort();
      if (t && !(*t > 0 && *t <= 86400))
        std::abort();
    }
    if (req.target().find("stream") != boost::beast::string_view::npos) {
      Response head{http::status::ok, 11};
      head.set(http::field::content_type, "text/plain");
      ex->begin_stream(std::move(head));
      ex->write_chunk(body, nullptr);
      ex->write_chunk(std::to_string(req.body().size()), nullptr);
      ex->end_stream(req.body().size() % 2 == 0);
      return;
    }
    Response r{http::status::ok, 11};
    r.set(http::field::content_type, "text/plain");
    r.body() = body + " " + std::to_string(req.body().size());
    ex->respond(std::move(r));
  }
};

Answers* answers = nullptr;
HttpServer* server = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ServerOptions o;
  o.bind = "127.0.0.1";
  o.port = 0;
  o.io_threads = 1;
  o.spin_us = 0;
  // Small limits, so that inputs reach them.
  o.body_limit = 4096;
  o.header_limit = 2048;
  o.idle_timeout_s = 5;
  answers = new Answers;
  server = new HttpServer(o, *answers);
  if (auto st = server->listen(); !st.is_ok()) {
    std::fprintf(stderr, "listen: %s\n", st.message().c_str());
    std::abort();
  }
  server->run();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server->port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int fd = -1;
  // Thousands of connections a second: the client ends each with a reset
  // (SO_LINGER 0, below) so that no port waits in TIME_WAIT; a connect that
  // still finds no free port or a full backlog is tried again.
  for (int attempt = 0;; ++attempt) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
      std::abort();
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0)
      break;
    const int err = errno;
    ::close(fd);
    if (attempt == 100) {
      std::fprintf(stderr, "connect to the server: %s\n", std::strerror(err));
      std::abort();
    }
    ::usleep(10000);
  }
  const linger reset{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  size_t sent = 0;
  while (sent < size) {
    ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0)
      break;  // the server closed early (a rejected request)
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  // Everything the server answers, until it closes.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  char buf[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) {
      std::fprintf(stderr, "the server neither answered nor closed within 5 s\n");
      std::abort();
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0)
      continue;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0)
      break;
  }
  ::close(fd);
  return 0;
}
