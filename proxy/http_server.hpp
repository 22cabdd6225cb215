// The proxy's HTTP/1.1 server (Boost.Beast): keep-alive, limits on header and
// body size, and timeouts for slow or idle clients. It parses requests and
// writes responses; what to answer is the Handler's business.
//
// Threads: `io_threads` event loops, each with its own io_context; a
// connection lives on one of them for its whole life, and its Exchange must be
// answered on that loop (post to exchange.io() from elsewhere). A loop's
// thread may be replaced when it stays in blocking code (loops(),
// runtime/loop_takeover.hpp); one thread runs a loop at a time.
//
// Answers of its own, with "Connection: close": 400 for a malformed request,
// 431 when the header block is over header_limit, 413 when the body is over
// body_limit. A client that sends nothing for the idle timeout between
// requests (keep-alive; set_idle_timeout() changes it at run time), or takes
// longer than ServerOptions::idle_timeout_s to send the rest of a request once
// its first bytes arrived, is disconnected.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "runtime/loop_takeover.hpp"
#include "runtime/status.hpp"

struct ssl_st;

namespace troupe::proxy {

class ServerTls;
namespace asio = boost::asio;
using Request = boost::beast::http::request<boost::beast::http::string_body>;
using Response = boost::beast::http::response<boost::beast::http::string_body>;

struct ServerOptions {
  std::string bind = "127.0.0.1";
  uint16_t port = 8000;  // 0: any free port (tests)
  size_t io_threads = 1;
  uint64_t body_limit = 16u << 20;
  uint32_t header_limit = 16u << 10;
  // The idle timeout between two requests of a keep-alive connection until
  // set_idle_timeout() says otherwise, and for good the time allowed to send
  // one request once it started and to take one answer.
  double idle_timeout_s = 60;
  // After each burst of work an io thread keeps polling for up to spin_us
  // before it blocks in epoll: a replica's answer usually arrives within tens
  // of microseconds, and catching it without a wake-up saves two context
  // switches per request (measured +10-20 % requests/s through the proxy on
  // 2 cores). Costs at most spin_us of CPU per wake-up when idle. 0: block at
  // once.
  uint32_t spin_us = 50;
  // HTTPS on a second port, served by the same io threads and the same
  // Handler (proxy/tls_context.hpp); null: none. https_port 0: any free
  // port. A client that sends plain HTTP there is answered 400 in plain
  // text; a refused handshake is reported to Handler::on_tls_refused().
  std::shared_ptr<ServerTls> tls;
  uint16_t https_port = 0;
  // With tls: the main port speaks TLS and there is no second one (the
  // admin listener off loopback).
  bool tls_only = false;
  // gRPC (HTTP/2 with prior knowledge, proxy/grpc_server.hpp) on a port of
  // its own, served by the same io threads and the same Handler; grpc_port
  // 0: any free port.
  bool grpc = false;
  uint16_t grpc_port = 0;
  // With tls: what a connection's client certificate says, computed once
  // after its handshake (e.g. its troupe role) and given by
  // Exchange::client_identity(); null: nothing.
  std::function<std::string(ssl_st*)> describe_client;
};

// One request of a connection. The connection reads its next request only
// after respond() (or end_stream(true)), so there is at most one Exchange per
// connection at a time.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual Request& request() = 0;
  // Sends the answer (Content-Length and keep-alive are set here). Call once,
  // on io(); a connection that closed meanwhile drops the answer.
  virtual void respond(Response&& response) = 0;
  virtual size_t thread() const = 0;
  virtual asio::io_context& io() = 0;
  // The request came over TLS (the HTTPS port). Default: false.
  virtual bool secure() const { return false; }
  // The request is a gRPC call (the gRPC port, proxy/grpc_server.hpp): its
  // target is the method's full name, its body the request message, and it
  // is routed by its `application` metadata. Default: false.
  virtual bool grpc() const { return false; }
  // ServerOptions::describe_client's verdict on this connection's client
  // certificate ("" without TLS or without it).
  virtual const std::string& client_identity() const;
  // Turns a routed call's answer into what this exchange's client gets,
  // before the proxy counts and logs it (proxy/call.cpp finish()): an
  // exchange that wraps another for a protocol (proxy/oip_path.cpp) shapes
  // its answers here, so that the metrics and the access log say what the
  // client saw. Default: nothing.
  virtual void shape_answer(Response& response) { (void)response; }

  // Streaming answers (chunked transfer encoding), instead of respond(). All
  // on io(): begin_stream once, then any number of write_chunk, then
  // end_stream once.
  //
  // begin_stream() sends the status line and the headers of `head` as given
  // (its body is ignored); the server sets Transfer-Encoding: chunked and
  // keep-alive and drops any Content-Length. write_chunk() sends `data` as one
  // HTTP chunk (empty data: nothing sent) and calls `written(true)` on io()
  // once the chunk is in the socket, or `written(false)` when the connection
  // is gone (at once, inline, when it is known gone already). The server
  // queues whatever it is given: the caller bounds what is outstanding, e.g.
  // grants its producer more on each `written`. end_stream(true) sends the
  // final zero-length chunk (after the queued ones) and the connection then
  // reads its next request; end_stream(false) closes the connection after
  // the queued chunks without it, so the client sees an incomplete body. For
  // a HEAD request only the head is sent (chunks: `written(true)` at once).
  //
  // Default (exchanges that are not connections): collects the head and the
  // chunks, calls `written(true)` at once, and at end_stream(true) respond()s
  // with the body concatenated (Content-Length); end_stream(false) respond()s
  // a 502 JSON {"error":"the stream ended early"}.
  virtual void begin_stream(Response&& head);
  virtual void write_chunk(std::string data, std::function<void(bool ok)> written);
  virtual void end_stream(bool complete);

  // `f` is called once, on io(), when the client goes away (the connection
  // closed, half-closed or reset) while its request is being handled or its
  // stream written, so the caller can cancel the work. Set it any time before
  // the answer ends (a second call replaces it); if the client is known gone
  // already, it is called soon after (posted, never inline). Never called
  // after respond() / end_stream(). Default: never called.
  virtual void on_client_gone(std::function<void()> f);
  // True once the client is known gone. Default: false.
  virtual bool client_gone() const;

 private:
  // The default streaming implementation's head and body so far.
  std::unique_ptr<Response> collected_;
};
using ExchangePtr = std::shared_ptr<Exchange>;

class Handler {
 public:
  virtual ~Handler() = default;
  // Runs on the exchange's io thread; must not block.
  virtual void on_request(ExchangePtr exchange) = 0;
  // Answers the server sends on its own (400/413/431), for metrics.
  virtual void on_rejected(int /*status*/) {}
  // A TLS handshake on the HTTPS port failed: plain_http, protocol_version,
  // no_client_certificate, client_certificate_refused, timeout,
  // connection_lost or other. On an io thread.
  virtual void on_tls_refused(const char* /*reason*/) {}
};

class HttpServer {
 public:
  HttpServer(ServerOptions options, Handler& handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens; the error names the address and the reason.
  Status listen();
  // Starts the event loops (after listen()).
  void run();
  // Stops accepting, stops the event loops and joins their threads. Open
  // connections are dropped when the server is destroyed.
  void stop();
  // Closes the listening socket (from any thread; the loops keep running)
  // and makes every answer from now on close its connection after it
  // ("Connection: close"), also on connections that were kept alive.
  void stop_accepting();
  bool closing() const { return closing_.load(std::memory_order_relaxed); }

  uint16_t port() const { return port_; }
  // The HTTPS port (0: none).
  uint16_t https_port() const { return https_port_; }
  // The gRPC port (0: none).
  uint16_t grpc_port() const { return grpc_port_; }
  size_t threads() const { return ios_.size(); }
  asio::io_context& io(size_t i) { return *ios_[i]; }
  const ServerOptions& options() const { return options_; }
  Handler& handler() { return handler_; }

  // The idle timeout between requests of keep-alive connections, from any
  // thread. Each connection reads it when an idle period starts (a new
  // connection, or an answer written): a connection that is idle already
  // keeps the timeout it started with. Seconds > 0.
  void set_idle_timeout(double seconds) {
    idle_timeout_s_.store(seconds, std::memory_order_relaxed);
  }
  double idle_timeout_s() const { return idle_timeout_s_.load(std::memory_order_relaxed); }
  // Connections in an idle period now (waiting for a request's first bytes,
  // with the idle timeout they read when it started).
  size_t idle_connections() const { return idle_connections_.load(std::memory_order_relaxed); }
  void idle_started() { idle_connections_.fetch_add(1, std::memory_order_relaxed); }
  void idle_ended() { idle_connections_.fetch_sub(1, std::memory_order_relaxed); }
  // Runs `f` on io thread `thread`, from that thread, about kDeferral later,
  // together with everything deferred there meanwhile (one timer per thread).
  void defer(size_t thread, std::function<void()> f);
  static constexpr auto kDeferral = std::chrono::milliseconds(2);
  // The threads of the event loops, which may run blocking code
  // (LoopTakeover::run_blocking); null before run().
  LoopTakeover* loops() { return loops_.get(); }
  // Called on the thread that takes loop `i` over, before it runs the loop
  // (set before run()).
  void on_takeover(std::function<void(size_t)> f) { on_takeover_ = std::move(f); }
  // Called on loop `i`'s thread after each pass over its ready handlers,
  // outside them, where code may block (LoopTakeover::run_blocking); it
  // returns false when the thread was taken over meanwhile, and the thread
  // leaves the loop then (set before run()).
  void on_pass(std::function<bool(size_t)> f) { on_pass_ = std::move(f); }

 private:
  Status open(uint16_t port, std::unique_ptr<asio::ip::tcp::acceptor>& out, uint16_t& bound);
  enum class Listener { plain, tls, grpc };
  void accept(Listener kind);
  std::unique_ptr<asio::ip::tcp::acceptor>& acceptor_of(Listener kind);
  struct Deferred;

  ServerOptions options_;
  Handler& handler_;
  std::atomic<double> idle_timeout_s_;
  std::atomic<size_t> idle_connections_{0};
  std::atomic<bool> closing_{false};
  std::vector<std::unique_ptr<asio::io_context>> ios_;
  std::vector<std::unique_ptr<Deferred>> deferred_;  // per io thread
  std::vector<std::shared_ptr<void>> guards_;
  std::unique_ptr<asio::ip::tcp::acceptor> acceptor_;
  std::unique_ptr<asio::ip::tcp::acceptor> tls_acceptor_;
  std::unique_ptr<asio::ip::tcp::acceptor> grpc_acceptor_;
  std::unique_ptr<LoopTakeover> loops_;
  std::function<void(size_t)> on_takeover_;
  std::function<bool(size_t)> on_pass_;
  size_t next_ = 0;
  uint16_t port_ = 0;
  uint16_t https_port_ = 0;
  uint16_t grpc_port_ = 0;
  bool running_ = false;
};

}  // namespace troupe::proxy
