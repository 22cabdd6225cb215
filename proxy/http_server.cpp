#include "proxy/http_server.hpp"

#include "proxy/grpc_server.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <deque>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>

#include <openssl/ssl.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_suffix.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/read_size.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/serializer.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>

#include "proxy/tls_context.hpp"

namespace troupe::proxy {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// The default streaming implementation, for exchanges that are not
// connections: collect, then answer in one piece.

void Exchange::begin_stream(Response&& head) {
  collected_ = std::make_unique<Response>(std::move(head));
  collected_->body().clear();
}

void Exchange::write_chunk(std::string data, std::function<void(bool ok)> written) {
  if (!collected_)
    collected_ = std::make_unique<Response>(http::status::ok, 11);
  collected_->body() += data;
  if (written)
    written(true);
}

void Exchange::end_stream(bool complete) {
  Response r = collected_ ? std::move(*collected_) : Response{http::status::ok, 11};
  collected_.reset();
  if (complete) {
    r.erase(http::field::transfer_encoding);
    r.prepare_payload();
    respond(std::move(r));
    return;
  }
  Response error{http::status::bad_gateway, r.version()};
  if (auto id = r.find("X-Request-Id"); id != r.end())
    error.set("X-Request-Id", id->value());
  error.set(http::field::content_type, "application/json");
  error.body() = "{\"error\":\"the stream ended early\"}";
  error.prepare_payload();
  respond(std::move(error));
}

void Exchange::on_client_gone(std::function<void()> /*f*/) {}

bool Exchange::client_gone() const { return false; }

const std::string& Exchange::client_identity() const {
  static const std::string kNone;
  return kNone;
}

namespace {

std::chrono::steady_clock::duration duration_of(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

// What an idle connection's first read takes at most; the parser reads the
// rest of the request.
constexpr size_t kFirstRead = 4096;

// The classification of a refused TLS handshake, for the metrics.
const char* tls_refusal(const beast::error_code& ec) {
  if (ec == beast::error::timeout)
    return "timeout";
  if (ec.category() != asio::error::get_ssl_category())
    return "connection_lost";
  switch (ERR_GET_REASON(static_cast<unsigned long>(ec.value()))) {
    case SSL_R_HTTP_REQUEST:
    case SSL_R_HTTPS_PROXY_REQUEST:
      return "plain_http";
    case SSL_R_UNSUPPORTED_PROTOCOL:
    case SSL_R_WRONG_VERSION_NUMBER:
    case SSL_R_VERSION_TOO_LOW:
    case SSL_R_NO_PROTOCOLS_AVAILABLE:
    case SSL_R_UNKNOWN_PROTOCOL:
      return "protocol_version";
    case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
      return "no_client_certificate";
    case SSL_R_CERTIFICATE_VERIFY_FAILED:
      return "client_certificate_refused";
    default:
      return "other";
  }
}

// One connection: plain (beast::tcp_stream) or HTTPS
// (beast::ssl_stream<beast::tcp_stream>, after its handshake).
template <class Socket>
class Session : public Exchange, public std::enable_shared_from_this<Session<Socket>> {
  static constexpr bool kTls = !std::is_same_v<Socket, beast::tcp_stream>;
  using std::enable_shared_from_this<Session<Socket>>::shared_from_this;
  using std::enable_shared_from_this<Session<Socket>>::weak_from_this;

 public:
  Session(tcp::socket socket, HttpServer& server, size_t thread)
      : stream_(std::move(socket)), server_(server), thread_(thread) {
    // Plain HTTP reads and writes the socket itself (read_plain(),
    // write_plain()): a write that the socket does not take at once returns
    // would_block instead of waiting.
    beast::error_code ignored;
    lowest().socket().non_blocking(true, ignored);
    deadline_timer_.emplace(lowest().socket().get_executor());
  }
  Session(tcp::socket socket, std::shared_ptr<asio::ssl::context> ctx, HttpServer& server,
          size_t thread)
      : ctx_(std::move(ctx)),
        stream_(std::move(socket), *ctx_),
        server_(server),
        thread_(thread) {}

  void start() {
    if constexpr (kTls) {
      // The handshake within the time allowed to send a request.
      lowest().expires_after(duration_of(server_.options().idle_timeout_s));
      stream_.async_handshake(asio::ssl::stream_base::server,
                              [self = shared_from_this()](beast::error_code ec) {
                                self->on_handshake(ec);
                              });
    } else {
      read();
    }
  }

  bool secure() const override { return kTls; }
  const std::string& client_identity() const override { return client_identity_; }

  Request& request() override { return parser_->get(); }
  size_t thread() const override { return thread_; }
  asio::io_context& io() override { return server_.io(thread_); }

  void respond(Response&& response) override {
    end_answer();
    if (watching_) {
      // Nothing else is pending on the socket between a request and its
      // answer: this cancels only the disconnect watch.
      beast::error_code ignored;
      socket().cancel(ignored);
      watching_ = false;
    }
    response_ = std::move(response);
    bool keep_alive =
        !close_after_ && !server_.closing() && parser_ && parser_->get().keep_alive();
    response_.keep_alive(keep_alive);
    response_.prepare_payload();
    // A HEAD answer carries the length of the body it does not send.
    if (parser_ && parser_->get().method() == http::verb::head)
      response_.body().clear();
    if constexpr (kTls) {
      lowest().expires_after(duration_of(server_.options().idle_timeout_s));
      http::async_write(
          stream_, response_,
          [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
    } else {
      write_plain();
    }
  }

  void begin_stream(Response&& head) override {
    auto s = std::make_unique<Stream>();
    s->head = http::response<http::empty_body>(std::move(head.base()));
    s->keep_alive = !close_after_ && !server_.closing() && parser_ && parser_->get().keep_alive();
    s->head_only = parser_ && parser_->get().method() == http::verb::head;
    // An HTTP/1.0 client cannot read chunked encoding (RFC 9112, 7.1): its
    // stream is delimited by the close of the connection instead, as nginx
    // answers such a client when the length is not known.
    s->close_delimited = parser_ && parser_->get().version() < 11;
    s->head.erase(http::field::content_length);
    if (s->close_delimited) {
      s->keep_alive = false;
      s->head.erase(http::field::transfer_encoding);
    } else {
      s->head.chunked(true);
    }
    s->head.keep_alive(s->keep_alive);
    stream_state_ = std::move(s);
    stream_state_->serializer.emplace(stream_state_->head);
    pump();
  }

  void write_chunk(std::string data, std::function<void(bool ok)> written) override {
    auto* s = stream_state_.get();
    if (!s || s->dead) {
      if (written)
        written(false);
      return;
    }
    if (data.empty() || s->head_only) {
      if (written)
        written(true);
      return;
    }
    s->queue.emplace_back(std::move(data), std::move(written));
    pump();
  }

  void end_stream(bool complete) override {
    end_answer();
    if (!stream_state_)
      begin_stream(Response{http::status::ok, 11});
    auto& s = *stream_state_;
    s.ended = true;
    s.complete = complete;
    if (!complete && gone_ && !s.dead) {
      // Nobody to flush the queued chunks to.
      stream_failed();
      return;
    }
    pump();
  }

  void on_client_gone(std::function<void()> f) override {
    if (!answering_)
      return;
    gone_callback_ = std::move(f);
    if (gone_)
      asio::post(io(), [self = shared_from_this(), generation = generation_] {
        if (generation == self->generation_)
          self->fire_gone();
      });
  }

  bool client_gone() const override { return gone_; }

 private:
  // A streamed answer being written: its head, then its chunks one write at
  // a time, then the last chunk (or a close).
  struct Stream {
    http::response<http::empty_body> head;
    std::optional<http::response_serializer<http::empty_body>> serializer;
    std::deque<std::pair<std::string, std::function<void(bool)>>> queue;
    std::array<char, 24> size_line{};
    bool keep_alive = false;
    bool head_only = false;
    bool close_delimited = false;  // HTTP/1.0: the data as it is, then a close
    bool head_written = false;
    bool writing = false;
    bool ended = false;
    bool complete = false;
    bool dead = false;  // the connection failed: everything else gets false
  };

  // Starts the next write of the stream, if none is under way.
  void pump() {
    auto& s = *stream_state_;
    if (s.writing || s.dead)
      return;
    lowest().expires_after(duration_of(server_.options().idle_timeout_s));
    if (!s.head_written) {
      s.writing = true;
      http::async_write_header(stream_, *s.serializer,
                               [self = shared_from_this()](beast::error_code ec, size_t) {
                                 self->on_stream_written(ec, false);
                               });
      return;
    }
    if (!s.queue.empty()) {
      const std::string& data = s.queue.front().first;
      // A chunk's size line and CRLF around the data; close-delimited, the
      // data alone.
      int n = s.close_delimited ? 0
                                : std::snprintf(s.size_line.data(), s.size_line.size(), "%zx\r\n",
                                                data.size());
      std::array<asio::const_buffer, 3> buffers{
          asio::buffer(s.size_line.data(), static_cast<size_t>(n)), asio::buffer(data),
          asio::buffer("\r\n", s.close_delimited ? 0 : 2)};
      s.writing = true;
      asio::async_write(stream_, buffers,
                        [self = shared_from_this()](beast::error_code ec, size_t) {
                          self->on_stream_written(ec, true);
                        });
      return;
    }
    if (!s.ended) {
      lowest().expires_never();  // the producer may take its time
      return;
    }
    if (!s.complete) {
      stream_state_.reset();
      close();  // no last chunk: the client sees an incomplete body
      return;
    }
    if (s.head_only || s.close_delimited) {
      stream_finished();  // without keep-alive: the close ends the body
      return;
    }
    s.writing = true;
    asio::async_write(stream_, asio::buffer("0\r\n\r\n", 5),
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        self->stream_state_->writing = false;
                        if (ec)
                          self->stream_failed();
                        else
                          self->stream_finished();
                      });
  }

  void on_stream_written(beast::error_code ec, bool chunk) {
    auto& s = *stream_state_;
    s.writing = false;
    std::function<void(bool)> written;
    if (chunk) {
      written = std::move(s.queue.front().second);
      s.queue.pop_front();
    } else {
      s.head_written = true;
    }
    if (ec) {
      stream_failed();
      if (written)
        written(false);
      return;
    }
    if (written)
      written(true);  // may write more or end the stream
    if (stream_state_)
      pump();
  }

  // The last chunk is out: the connection goes on as after respond().
  void stream_finished() {
    bool keep_alive = stream_state_->keep_alive;
    stream_state_.reset();
    if (watching_) {
      beast::error_code ignored;
      socket().cancel(ignored);  // nothing else is pending now
      watching_ = false;
    }
    if (!keep_alive) {
      close();
      return;
    }
    read();
  }

  // A write failed (the client went away, or took no data for the idle
  // timeout): close, tell the queued chunks' owners, and the gone callback.
  void stream_failed() {
    auto& s = *stream_state_;
    s.dead = true;
    auto queue = std::move(s.queue);
    s.queue.clear();
    close();
    client_went();
    for (auto& [data, written] : queue)
      if (written)
        written(false);
  }

  // The request is handled: watch the socket for the client going away.
  // (Bytes of a next request already read, or arriving, make that
  // impossible to tell: no watch then.)
  void watch() {
    if (gone_ || buffer_.size() > 0)
      return;
    watching_ = true;
    socket().async_wait(tcp::socket::wait_read,
                        [weak = weak_from_this(), generation = generation_](beast::error_code ec) {
                          if (auto self = weak.lock())
                            self->on_readable(ec, generation);
                        });
  }

  void on_readable(beast::error_code ec, uint64_t generation) {
    if (generation != generation_)
      return;  // an earlier answer's watch
    watching_ = false;
    if (!answering_ || ec == asio::error::operation_aborted)
      return;
    if (ec) {
      client_went();
      return;
    }
    char b;
    auto n = ::recv(socket().native_handle(), &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) {
      client_went();  // EOF: closed or half-closed
    } else if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
        watch();
      else
        client_went();  // reset
    } else {
      // Bytes wait: a pipelined request, or over TLS also the client's
      // close_notify. The peer's FIN still tells, unread bytes or not.
      watch_hangup();
    }
  }

  // Checks every kHangupCheck for the peer's FIN while bytes it sent wait
  // unread (they keep the socket readable, so no async_wait can tell).
  static constexpr auto kHangupCheck = std::chrono::milliseconds(100);
  void watch_hangup() {
    pollfd p{socket().native_handle(), POLLRDHUP, 0};
    if (::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
      client_went();
      return;
    }
    if (!hangup_timer_)
      hangup_timer_.emplace(io());
    hangup_timer_->expires_after(kHangupCheck);
    hangup_timer_->async_wait(
        [weak = weak_from_this(), generation = generation_](beast::error_code ec) {
          auto self = weak.lock();
          if (!ec && self && self->answering_ && self->generation_ == generation)
            self->watch_hangup();
        });
  }

  void on_handshake(beast::error_code ec) {
    if (!ec) {
      if constexpr (kTls) {
        if (server_.options().describe_client)
          client_identity_ = server_.options().describe_client(stream_.native_handle());
      }
      read();
      return;
    }
    const char* why = tls_refusal(ec);
    server_.handler().on_tls_refused(why);
    if (std::string_view(why) == "plain_http") {
      // As nginx does: say so in plain HTTP, then close.
      static const std::string kBody = "this port speaks HTTPS: send the request over TLS\n";
      static const std::string kAnswer =
          "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n"
          "Content-Length: " +
          std::to_string(kBody.size()) + "\r\n\r\n" + kBody;
      asio::async_write(socket(), asio::buffer(kAnswer),
                        [self = shared_from_this()](beast::error_code, size_t) { self->close(); });
      return;
    }
    close();
  }

  void client_went() {
    if (gone_)
      return;
    gone_ = true;
    fire_gone();
  }

  void fire_gone() {
    if (!answering_ || !gone_callback_)
      return;
    auto f = std::move(gone_callback_);
    gone_callback_ = nullptr;
    f();
  }

  // respond() or end_stream(): no gone callback from now on.
  void end_answer() {
    answering_ = false;
    ++generation_;
    gone_callback_ = nullptr;
  }

  // An idle period (before the first request, or after an answer): wait for
  // the next request's first bytes for the server's idle timeout as it is
  // now, then read the whole request within the fixed
  // ServerOptions::idle_timeout_s. Bytes a client already sent (pipelined)
  // end the idle period at once.
  void read() {
    if constexpr (!kTls) {
      read_plain();
      return;
    }
    new_parser();
    if (buffer_.size() > 0) {
      read_request();
      return;
    }
    lowest().expires_after(duration_of(server_.idle_timeout_s()));
    server_.idle_started();
    stream_.async_read_some(buffer_.prepare(kFirstRead),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->on_first_bytes(ec, n);
                            });
  }

  void new_parser() {
    parser_.emplace();
    parser_->body_limit(server_.options().body_limit);
    parser_->header_limit(server_.options().header_limit);
    parser_->eager(true);  // as http::async_read: the whole message
  }

  // Plain HTTP: the request read with the socket's own asynchronous reads
  // and parsed with Beast's parser as the bytes come (what http::async_read
  // does, without its layers of composed operations and the stream's timer
  // per operation; one deadline per phase instead, set_deadline()).
  // Bytes of a next request already read (pipelined) are parsed at once.
  void read_plain() {
    if (buffer_.size() > 0) {
      new_parser();
      set_deadline(server_.options().idle_timeout_s);
      parse_plain();
      return;
    }
    // Idle: the parser is made when the first bytes arrive (the last
    // request may still be in use by whoever answered it).
    idle_ = true;
    set_deadline(server_.idle_timeout_s());
    server_.idle_started();
    socket().async_read_some(buffer_.prepare(kFirstRead),
                             [self = shared_from_this()](beast::error_code ec, size_t n) {
                               self->on_plain_bytes(ec, n);
                             });
  }

  void on_plain_bytes(beast::error_code ec, size_t n) {
    if (idle_) {
      idle_ = false;
      server_.idle_ended();
      if (ec) {
        close();  // idle too long, or the client closed or reset: nobody to answer
        return;
      }
      new_parser();
      set_deadline(server_.options().idle_timeout_s);
    }
    if (ec == asio::error::eof) {
      // As http::async_read: a message cut short is malformed, a close
      // between messages the end of the connection.
      beast::error_code parsed;
      parser_->put_eof(parsed);
      on_read(parsed ? parsed : beast::error_code(http::error::end_of_stream));
      return;
    }
    if (ec) {
      on_read(ec);
      return;
    }
    buffer_.commit(n);
    parse_plain();
  }

  void parse_plain() {
    if (buffer_.size() > 0) {
      beast::error_code ec;
      buffer_.consume(parser_->put(buffer_.data(), ec));
      if (ec && ec != http::error::need_more) {
        on_read(ec);
        return;
      }
      if (parser_->is_done()) {
        on_read({});
        return;
      }
    }
    size_t size = beast::read_size(buffer_, 65536);
    if (size == 0) {
      on_read(http::error::buffer_overflow);
      return;
    }
    socket().async_read_some(buffer_.prepare(size),
                             [self = shared_from_this()](beast::error_code ec, size_t n) {
                               self->on_plain_bytes(ec, n);
                             });
  }

  // Plain HTTP: the head serialized here (the status line and the fields in
  // their order, as Beast's serializer writes them) and the whole answer
  // given to the kernel at once, in the usual case with one system call and
  // nothing queued. Beast's serializer and composed write took about a
  // seventh of the io thread per request (docs/benchmarks.md). What the
  // socket does not take at once is written asynchronously, under the
  // deadline.
  void write_plain() {
    auto& h = head_;
    h.clear();
    const unsigned version = response_.version();
    h.append("HTTP/");
    h.push_back(static_cast<char>('0' + version / 10 % 10));
    h.push_back('.');
    h.push_back(static_cast<char>('0' + version % 10));
    h.push_back(' ');
    char code[8];
    h.append(code, std::to_chars(code, code + sizeof code, response_.result_int()).ptr);
    h.push_back(' ');
    auto reason = response_.reason();
    h.append(reason.data(), reason.size());
    h.append("\r\n");
    for (const auto& field : response_.base()) {
      auto name = field.name_string();
      auto value = field.value();
      h.append(name.data(), name.size()).append(": ").append(value.data(), value.size());
      h.append("\r\n");
    }
    h.append("\r\n");
    const std::string& body = response_.body();
    std::array<asio::const_buffer, 2> out{asio::buffer(h), asio::buffer(body)};
    beast::error_code ec;
    size_t n = socket().write_some(out, ec);
    if (!ec && n == h.size() + body.size()) {
      on_write({}, true);
      return;
    }
    if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
      close();
      return;
    }
    if (ec)
      n = 0;
    set_deadline(server_.options().idle_timeout_s);
    beast::buffers_suffix<std::array<asio::const_buffer, 2>> rest(out);
    rest.consume(n);
    asio::async_write(socket(), rest, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->clear_deadline();
      self->on_write(ec);
    });
  }

  // Plain HTTP's deadline (the time to send a request, the idle timeout, the
  // time to take an answer that did not fit the socket at once): one
  // absolute time, checked by one timer that is re-armed only when it fires
  // early or must fire sooner. Setting a deadline per request costs a clock
  // read, not a timer operation. Past it, the connection is closed: what is
  // pending on the socket ends with an error.
  void set_deadline(double seconds) {
    deadline_ = std::chrono::steady_clock::now() + duration_of(seconds);
    if (!timer_at_ || *timer_at_ > deadline_)
      arm_deadline();
  }
  void clear_deadline() { deadline_ = std::chrono::steady_clock::time_point::max(); }

  void arm_deadline() {
    timer_at_ = deadline_;
    deadline_timer_->expires_at(deadline_);
    deadline_timer_->async_wait([weak = weak_from_this(), at = deadline_](beast::error_code ec) {
      auto self = weak.lock();
      if (!self || ec || self->timer_at_ != at)
        return;  // cancelled, or re-armed for a sooner deadline
      self->timer_at_.reset();
      if (self->deadline_ == std::chrono::steady_clock::time_point::max())
        return;
      if (std::chrono::steady_clock::now() < self->deadline_) {
        self->arm_deadline();
        return;
      }
      self->close();
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
    lowest().expires_after(duration_of(server_.options().idle_timeout_s));
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
    if constexpr (kTls)
      lowest().expires_never();
    else
      clear_deadline();
    answering_ = true;
    ++generation_;
    server_.handler().on_request(shared_from_this());
    // Not answered at once: watch for the client going away meanwhile. From
    // a moment later: most answers come sooner, and each watch costs a
    // system call (the socket's registration is changed). A client that
    // left meanwhile is seen as soon as the watch begins.
    if (answering_) {
      server_.defer(thread_, [weak = weak_from_this(), generation = generation_] {
        auto self = weak.lock();
        if (self && self->answering_ && self->generation_ == generation && !self->watching_)
          self->watch();
      });
    }
  }

  void reject(http::status status, const std::string& message) {
    server_.handler().on_rejected(static_cast<int>(status));
    close_after_ = true;
    Response r{status, 11};
    r.set(http::field::content_type, "application/json");
    r.body() = "{\"error\":\"" + message + "\"}";
    respond(std::move(r));
  }

  // The answer is out. `inline_write`: written by respond() itself, whose
  // caller may still use the request: a pipelined next one is parsed from a
  // fresh handler.
  void on_write(beast::error_code ec, bool inline_write = false) {
    if (ec || !response_.keep_alive()) {
      close();
      return;
    }
    response_ = {};
    if (inline_write && buffer_.size() > 0) {
      asio::post(io(), [self = shared_from_this()] { self->read(); });
      return;
    }
    read();
  }

  void close() {
    beast::error_code ignored;
    socket().shutdown(tcp::socket::shutdown_send, ignored);
    lowest().close();
    if (hangup_timer_)
      hangup_timer_->cancel();
    if (deadline_timer_) {
      clear_deadline();
      deadline_timer_->cancel();
    }
  }

  beast::tcp_stream& lowest() { return beast::get_lowest_layer(stream_); }
  tcp::socket& socket() { return lowest().socket(); }

  std::shared_ptr<asio::ssl::context> ctx_;  // TLS: outlives stream_
  Socket stream_;
  std::optional<asio::steady_timer> hangup_timer_;
  // Plain HTTP (read_plain(), write_plain(), set_deadline()).
  std::optional<asio::steady_timer> deadline_timer_;
  std::chrono::steady_clock::time_point deadline_ = std::chrono::steady_clock::time_point::max();
  // When the timer's pending wait ends; none when nothing waits.
  std::optional<std::chrono::steady_clock::time_point> timer_at_;
  bool idle_ = false;  // waiting for a request's first bytes
  std::string head_;
  std::string client_identity_;
  HttpServer& server_;
  size_t thread_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Response response_;
  bool close_after_ = false;
  std::unique_ptr<Stream> stream_state_;
  // Between the hand-over of a request and respond() / end_stream().
  bool answering_ = false;
  bool watching_ = false;  // a disconnect watch is pending
  bool gone_ = false;      // the client is known gone
  // Counts requests and answers: a watch (or posted gone call) of an earlier
  // one does nothing.
  uint64_t generation_ = 0;
  std::function<void()> gone_callback_;
};

}  // namespace

HttpServer::HttpServer(ServerOptions options, Handler& handler)
    : options_(std::move(options)), handler_(handler), idle_timeout_s_(options_.idle_timeout_s) {
  size_t n = std::max<size_t>(1, options_.io_threads);
  for (size_t i = 0; i < n; ++i) {
    ios_.push_back(std::make_unique<asio::io_context>(1));
    deferred_.push_back(std::make_unique<Deferred>(*ios_.back()));
    guards_.push_back(std::make_shared<asio::executor_work_guard<asio::io_context::executor_type>>(
        ios_.back()->get_executor()));
  }
}

struct HttpServer::Deferred {
  explicit Deferred(asio::io_context& io) : timer(io) {}
  asio::steady_timer timer;
  std::vector<std::function<void()>> due;
  bool armed = false;
};

void HttpServer::defer(size_t thread, std::function<void()> f) {
  auto& d = *deferred_[thread];
  d.due.push_back(std::move(f));
  if (d.armed)
    return;
  d.armed = true;
  d.timer.expires_after(kDeferral);
  d.timer.async_wait([&d](const boost::system::error_code& ec) {
    d.armed = false;
    if (ec)
      return;
    auto due = std::move(d.due);
    d.due.clear();
    for (auto& f : due)
      f();
  });
}

HttpServer::~HttpServer() {
  stop();
  guards_.clear();
  deferred_.clear();
  // Connections (and their sockets) go before the io_contexts they use: an
  // io_context destroys its pending handlers, and with them the sessions.
  acceptor_.reset();
  tls_acceptor_.reset();
  grpc_acceptor_.reset();
  for (auto it = ios_.rbegin(); it != ios_.rend(); ++it)
    it->reset();
}

Status HttpServer::open(uint16_t port, std::unique_ptr<tcp::acceptor>& out, uint16_t& bound) {
  auto fail = [&](const std::string& what, const boost::system::error_code& ec) {
    return Status(errc::unavailable, "cannot listen on " + options_.bind + ":" +
                                         std::to_string(port) + ": " + what + ": " +
                                         ec.message());
  };
  boost::system::error_code ec;
  auto address = asio::ip::make_address(options_.bind, ec);
  if (ec)
    return fail("bad address", ec);
  auto acceptor = std::make_unique<tcp::acceptor>(*ios_[0]);
  tcp::endpoint endpoint{address, port};
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
  bound = acceptor->local_endpoint().port();
  out = std::move(acceptor);
  return Status::ok();
}

Status HttpServer::listen() {
  if (auto st = open(options_.port, acceptor_, port_); !st)
    return st;
  if (options_.tls && !options_.tls_only) {
    if (auto st = open(options_.https_port, tls_acceptor_, https_port_); !st) {
      acceptor_.reset();
      return Status(st.code(), "HTTPS: " + st.message());
    }
  }
  if (options_.grpc) {
    if (auto st = open(options_.grpc_port, grpc_acceptor_, grpc_port_); !st) {
      acceptor_.reset();
      tls_acceptor_.reset();
      return Status(st.code(), "gRPC: " + st.message());
    }
  }
  return Status::ok();
}

std::unique_ptr<tcp::acceptor>& HttpServer::acceptor_of(Listener kind) {
  switch (kind) {
    case Listener::tls:
      return tls_acceptor_;
    case Listener::grpc:
      return grpc_acceptor_;
    default:
      return acceptor_;
  }
}

void HttpServer::accept(Listener kind) {
  size_t target = next_;
  next_ = (next_ + 1) % ios_.size();
  acceptor_of(kind)->async_accept(*ios_[target], [this, target, kind](beast::error_code ec,
                                                                      tcp::socket socket) {
    auto& acceptor = acceptor_of(kind);
    if (ec == asio::error::operation_aborted || !acceptor || !acceptor->is_open())
      return;
    if (!ec) {
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      // Start on the connection's own thread.
      if (kind == Listener::grpc) {
        auto s = std::make_shared<tcp::socket>(std::move(socket));
        // With the HTTPS port's TLS, the gRPC port speaks TLS too.
        auto ctx = options_.tls ? options_.tls->context() : nullptr;
        asio::post(*ios_[target], [this, s, target, ctx] {
          if (ctx)
            serve_grpc_tls(std::move(*s), ctx, *this, target);
          else
            serve_grpc(std::move(*s), *this, target);
        });
      } else if (kind == Listener::tls || (options_.tls && options_.tls_only)) {
        auto session = std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(
            std::move(socket), options_.tls->context(), *this, target);
        asio::post(*ios_[target], [session] { session->start(); });
      } else {
        auto session = std::make_shared<Session<beast::tcp_stream>>(std::move(socket), *this,
                                                                    target);
        asio::post(*ios_[target], [session] { session->start(); });
      }
    }
    accept(kind);
  });
}

void HttpServer::run() {
  if (running_ || !acceptor_)
    return;
  running_ = true;
  accept(Listener::plain);
  if (tls_acceptor_)
    accept(Listener::tls);
  if (grpc_acceptor_)
    accept(Listener::grpc);
  loops_ = std::make_unique<LoopTakeover>(ios_.size(), [this](size_t i, bool taking_over) {
    asio::io_context* ctx = ios_[i].get();
    if (taking_over && on_takeover_)
      on_takeover_(i);
    // After each pass over the ready handlers, outside them: on_pass_ (false:
    // this thread was taken over, and leaves the loop).
    auto pass = [&] { return !on_pass_ || on_pass_(i); };
    // A thread that takes a loop over runs a pass first: what the old thread
    // left queued for after its pass (the calls behind the one that blocked)
    // must not wait for the loop's next event, which may be the blocked
    // call's own answer.
    if (taking_over && !pass())
      return;
    const auto spin = std::chrono::microseconds(options_.spin_us);
    if (spin.count() == 0) {
      if (!on_pass_) {
        ctx->run();
        return;
      }
      while (!ctx->stopped()) {
        ctx->run_one();
        if (!pass())
          return;
      }
      return;
    }
    while (!ctx->stopped()) {
      const size_t ran = ctx->poll();
      if (!pass())
        return;
      if (ran > 0)
        continue;
      bool more = false;
      auto until = std::chrono::steady_clock::now() + spin;
      while (!more && std::chrono::steady_clock::now() < until)
        more = ctx->poll() > 0;
      if (!more)
        ctx->run_one();
    }
  });
  loops_->start();
}

void HttpServer::stop_accepting() {
  if (closing_.exchange(true) || !acceptor_)
    return;
  // The acceptor lives on the first loop.
  asio::post(*ios_[0], [this] {
    beast::error_code ignored;
    if (acceptor_)
      acceptor_->close(ignored);
    if (tls_acceptor_)
      tls_acceptor_->close(ignored);
    if (grpc_acceptor_)
      grpc_acceptor_->close(ignored);
  });
}

void HttpServer::stop() {
  if (!running_)
    return;
  running_ = false;
  guards_.clear();
  for (auto& io : ios_)
    io->stop();
  // Every loop's thread, and the threads of loops taken over that are still
  // in a blocking handler (runtime/loop_takeover.hpp).
  loops_->join();
  beast::error_code ignored;
  if (acceptor_)
    acceptor_->close(ignored);
  if (tls_acceptor_)
    tls_acceptor_->close(ignored);
  if (grpc_acceptor_)
    grpc_acceptor_->close(ignored);
}

}  // namespace troupe::proxy
