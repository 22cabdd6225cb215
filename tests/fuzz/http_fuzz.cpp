// The proxy's HTTP server (proxy/http_server.hpp, Boost.Beast) on arbitrary
// bytes from a client: each input is sent on a new connection to a server
// started once on 127.0.0.1, which parses what it can (pipelined requests,
// chunked bodies, HEAD, oversized headers and bodies), answers or rejects
// it, and closes when the client stops sending. Its handler checks the
// headers the proxy reads itself (proxy/http_fields.hpp) and answers some
// requests as streams. Never a crash, and never a connection left without
// an end: the client's read of everything the server sends must end (the
// server closes) within 5 s.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "proxy/http_fields.hpp"
#include "proxy/http_server.hpp"
#include "tests/fuzz/one_connection.hpp"

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
  troupe::fuzz::send_on_one_connection(server->port(), data, size);
  return 0;
}
