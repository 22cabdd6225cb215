// The proxy's gRPC port (proxy/grpc_server.hpp: HTTP/2 through nghttp2) on
// arbitrary bytes from a client: each input is sent on a new connection to a
// server started once on 127.0.0.1 (its seeds, tests/fuzz/corpus/grpc, are
// whole conversations: the client preface, SETTINGS, HEADERS and DATA of
// calls, RST_STREAM, made by make_fuzz_seeds with nghttp2's client side).
// The handler answers calls at once, with an error, as a stream, or not at
// all, and checks what the port gave it. Never a crash, and never a
// connection left without an end: once the client stops sending, the
// server must close within 5 s.
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
#include <string>

#include "proxy/grpc_fields.hpp"
#include "proxy/http_server.hpp"

using namespace troupe;
using namespace troupe::proxy;
namespace http = boost::beast::http;

namespace {

class Calls : public Handler {
 public:
  void on_request(ExchangePtr ex) override {
    if (!ex->grpc())
      std::abort();
    auto& req = ex->request();
    // The port hands over one message of at most the body limit.
    if (req.body().size() > 4096 || req.method() != http::verb::post)
      std::abort();
    auto timeout = req["grpc-timeout"];
    if (!timeout.empty()) {
      auto t = grpc::parse_timeout(std::string_view(timeout.data(), timeout.size()));
      if (!t && t.status().message().empty())
        std::abort();
    }
    const std::string target(req.target());
    if (target.find("Stream") != std::string::npos) {
      ex->begin_stream(Response{http::status::ok, 11});
      ex->write_chunk(req.body(), nullptr);
      ex->write_chunk(target, nullptr);
      ex->end_stream(req.body().size() % 2 == 0);
      return;
    }
    if (target.find("Hold") != std::string::npos) {
      ex->on_client_gone([] {});
      return;  // never answered: the connection's end drops it
    }
    Response r{req.body().empty() ? http::status::service_unavailable : http::status::ok, 11};
    r.set("X-Seen", std::to_string(req.body().size()));
    r.body() = req.body();
    ex->respond(std::move(r));
  }
};

Calls* calls = nullptr;
HttpServer* server = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ServerOptions o;
  o.bind = "127.0.0.1";
  o.port = 0;
  o.io_threads = 1;
  o.spin_us = 0;
  o.grpc = true;
  o.grpc_port = 0;
  // Small limits, so that inputs reach them.
  o.body_limit = 4096;
  o.header_limit = 2048;
  calls = new Calls;
  server = new HttpServer(o, *calls);
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
  addr.sin_port = htons(server->grpc_port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int fd = -1;
  // As in http_fuzz: each connection ends with a reset, and a connect that
  // finds no free port or a full backlog is tried again.
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
      break;  // the server closed early (a protocol error)
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  char buf[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) {
      std::fprintf(stderr, "the server did not close within 5 s of the client's end\n");
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
