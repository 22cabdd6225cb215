// The proxy's gRPC port (proxy/grpc_server.hpp: HTTP/2 through nghttp2) on
// arbitrary bytes from a client: each input is sent on a new connection to a
// server started once on 127.0.0.1 (its seeds, tests/fuzz/corpus/grpc, are
// whole conversations: the client preface, SETTINGS, HEADERS and DATA of
// calls, RST_STREAM, made by make_fuzz_seeds with nghttp2's client side).
// The handler answers calls at once, with an error, as a stream, or not at
// all, and checks what the port gave it. Never a crash, and never a
// connection left without an end: once the client stops sending, the
// server must close within 5 s.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "proxy/grpc_fields.hpp"
#include "proxy/http_server.hpp"
#include "tests/fuzz/one_connection.hpp"

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
  troupe::fuzz::send_on_one_connection(server->grpc_port(), data, size);
  return 0;
}
