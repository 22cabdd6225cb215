#include "proxy/http_server.hpp"

#include <chrono>
#include <optional>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

namespace troupe::proxy {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

std::chrono::steady_clock::duration duration_of(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

// What an idle connection's first read takes at most; the parser reads the
// rest of the request.
constexpr size_t kFirstRead = 4096;

class Session : public Exchange, public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServer& server, size_t thread)
      : stream_(std::move(socket)), server_(server), thread_(thread) {}

  void start() { read(); }

  Request& request() override { return parser_->get(); }
  size_t thread() const override { return thread_; }
  asio::io_context& io() override { return server_.io(thread_); }

  void respond(Response&& response) override {
    response_ = std::move(response);
    bool keep_alive = !close_after_ && parser_ && parser_->get().keep_alive();
    response_.keep_alive(keep_alive);
    response_.prepare_payload();
    // A HEAD answer carries the length of the body it does not send.
    if (parser_ && parser_->get().method() == http::verb::head)
      response_.body().clear();
    stream_.expires_after(duration_of(server_.options().idle_timeout_s));
    http::async_write(
        stream_, response_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
  }

 private:
  // An idle period (before the first request, or after an answer): wait for
  // the next request's first bytes for the server's idle timeout as it is
  // now, then read the whole request within the fixed
  // ServerOptions::idle_timeout_s. Bytes a client already sent (pipelined)
  // end the idle period at once.
  void read() {
    parser_.emplace();
    parser_->body_limit(server_.options().body_limit);
    parser_->header_limit(server_.options().header_limit);
    if (buffer_.size() > 0) {
      read_request();
      return;
    }
    stream_.expires_after(duration_of(server_.idle_timeout_s()));
    server_.idle_started();
    stream_.async_read_some(buffer_.prepare(kFirstRead),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->on_first_bytes(ec, n);
                            });
  }

  void on_first_bytes(beast::error_code ec, size_t n) {
    server_.idle_ended();
    if (ec) {
      close();  // idle too long, or the client closed or reset: nobody to answer
      return;
    }
    buffer_.commit(n);
    read_request();
  }

  void read_request() {
    stream_.expires_after(duration_of(server_.options().idle_timeout_s));
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset ||
        ec == asio::error::eof) {
      close();
      return;
    }
    if (ec == http::error::header_limit) {
      reject(http::status::request_header_fields_too_large, "request header fields too large");
      return;
    }
    if (ec == http::error::body_limit) {
      reject(http::status::payload_too_large,
             "request body larger than " + std::to_string(server_.options().body_limit) + " bytes");
      return;
    }
    if (ec) {
      if (ec.category() == http::make_error_code(http::error::bad_target).category()) {
        reject(http::status::bad_request, "malformed request: " + ec.message());
      } else {
        close();  // a socket error: nobody to answer
      }
      return;
    }
    // Handling may take long (a slow replica); the request timeout, not the
    // idle timeout, bounds it.
    stream_.expires_never();
    server_.handler().on_request(shared_from_this());
  }

  void reject(http::status status, const std::string& message) {
    server_.handler().on_rejected(static_cast<int>(status));
    close_after_ = true;
    Response r{status, 11};
    r.set(http::field::content_type, "application/json");
    r.body() = "{\"error\":\"" + message + "\"}";
    respond(std::move(r));
  }

  void on_write(beast::error_code ec) {
    if (ec || !response_.keep_alive()) {
      close();
      return;
    }
    response_ = {};
    read();
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.close();
  }

  beast::tcp_stream stream_;
  HttpServer& server_;
  size_t thread_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Response response_;
  bool close_after_ = false;
};

}  // namespace

HttpServer::HttpServer(ServerOptions options, Handler& handler)
    : options_(std::move(options)), handler_(handler), idle_timeout_s_(options_.idle_timeout_s) {
  size_t n = std::max<size_t>(1, options_.io_threads);
  for (size_t i = 0; i < n; ++i) {
    ios_.push_back(std::make_unique<asio::io_context>(1));
    guards_.push_back(std::make_shared<asio::executor_work_guard<asio::io_context::executor_type>>(
        ios_.back()->get_executor()));
  }
}

HttpServer::~HttpServer() {
  stop();
  guards_.clear();
  // Connections (and their sockets) go before the io_contexts they use: an
  // io_context destroys its pending handlers, and with them the sessions.
  acceptor_.reset();
  for (auto it = ios_.rbegin(); it != ios_.rend(); ++it)
    it->reset();
}

Status HttpServer::listen() {
  auto fail = [&](const std::string& what, const boost::system::error_code& ec) {
    return Status(errc::unavailable, "cannot listen on " + options_.bind + ":" +
                                         std::to_string(options_.port) + ": " + what + ": " +
                                         ec.message());
  };
  boost::system::error_code ec;
  auto address = asio::ip::make_address(options_.bind, ec);
  if (ec)
    return fail("bad address", ec);
  auto acceptor = std::make_unique<tcp::acceptor>(*ios_[0]);
  tcp::endpoint endpoint{address, options_.port};
  acceptor->open(endpoint.protocol(), ec);
  if (ec)
    return fail("open", ec);
  acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  acceptor->bind(endpoint, ec);
  if (ec)
    return fail("bind", ec);
  acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return fail("listen", ec);
  port_ = acceptor->local_endpoint().port();
  acceptor_ = std::move(acceptor);
  return Status::ok();
}

void HttpServer::accept() {
  size_t target = next_;
  next_ = (next_ + 1) % ios_.size();
  acceptor_->async_accept(*ios_[target], [this, target](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_ || !acceptor_->is_open())
      return;
    if (!ec) {
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      auto session = std::make_shared<Session>(std::move(socket), *this, target);
      // Start on the connection's own thread.
      asio::post(*ios_[target], [session] { session->start(); });
    }
    accept();
  });
}

void HttpServer::run() {
  if (running_ || !acceptor_)
    return;
  running_ = true;
  accept();
  for (auto& io : ios_) {
    threads_.emplace_back([ctx = io.get(), spin = std::chrono::microseconds(options_.spin_us)] {
      if (spin.count() == 0) {
        ctx->run();
        return;
      }
      while (!ctx->stopped()) {
        if (ctx->poll() > 0)
          continue;
        bool more = false;
        auto until = std::chrono::steady_clock::now() + spin;
        while (!more && std::chrono::steady_clock::now() < until)
          more = ctx->poll() > 0;
        if (!more)
          ctx->run_one();
      }
    });
  }
}

void HttpServer::stop() {
  if (!running_)
    return;
  running_ = false;
  guards_.clear();
  for (auto& io : ios_)
    io->stop();
  for (auto& t : threads_)
    t.join();
  threads_.clear();
  beast::error_code ignored;
  if (acceptor_)
    acceptor_->close(ignored);
}

}  // namespace troupe::proxy
