#include "proxy/grpc_server.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <nghttp2/nghttp2.h>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include "proxy/grpc_fields.hpp"
#include "proxy/http_server.hpp"
#include "proxy/tls_context.hpp"

namespace troupe::proxy {

namespace {

namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

// Streams a client may open at once on one connection.
constexpr uint32_t kMaxStreams = 1000;
// The receive window of each stream and of the connection: a message of a
// few hundred kilobytes arrives without waiting for window updates.
constexpr int32_t kWindow = 1 << 20;
// What one write to the socket takes from nghttp2 at most.
constexpr size_t kWriteBatch = 256u << 10;

class Connection;

// One call: its request as it arrives, then its answer as nghttp2 takes it.
struct H2Stream {
  int32_t id = 0;
  std::string method, path, content_type;
  Request request{http::verb::post, "", 11};  // its metadata as they arrive
  std::string body;
  size_t header_bytes = 0;  // the metadata's size so far, as HTTP/2 counts it
  bool too_large = false;
  bool dispatched = false;
  bool answered = false;  // headers submitted
  bool ended = false;     // nothing more will be queued
  std::string out;        // framed messages not yet taken by nghttp2
  size_t taken = 0;       // bytes of messages taken so far, over the stream
  size_t queued = 0;      // bytes of messages queued so far
  // write_chunk's callbacks, by the byte count that completes their chunk.
  std::deque<std::pair<size_t, std::function<void(bool)>>> written;
  std::vector<std::pair<std::string, std::string>> trailers;
  std::shared_ptr<class GrpcExchange> exchange;
};

class GrpcExchange : public Exchange {
 public:
  GrpcExchange(std::shared_ptr<Connection> conn, int32_t id, Request request)
      : conn_(std::move(conn)), id_(id), request_(std::move(request)) {}
  Request& request() override { return request_; }
  void respond(Response&& response) override;
  size_t thread() const override;
  asio::io_context& io() override;
  bool grpc() const override { return true; }
  void begin_stream(Response&& head) override;
  void write_chunk(std::string data, std::function<void(bool ok)> written) override;
  void end_stream(bool complete) override;
  void on_client_gone(std::function<void()> f) override;
  bool client_gone() const override { return gone_; }

  // The stream closed before its answer ended (RST_STREAM or the connection).
  void gone();
  void finished() { done_ = true; }

 private:
  std::shared_ptr<Connection> conn_;
  int32_t id_;
  Request request_;
  bool gone_ = false;
  bool done_ = false;
  grpc::Code stream_code_ = grpc::Code::ok;
  std::function<void()> on_gone_;
};

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& ch : out)
    ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// Response headers that are not metadata: HTTP/1.1's own, and what the
// ingress sets itself.
bool hop_header(const std::string& name) {
  static const char* const names[] = {
      "connection",     "keep-alive",   "transfer-encoding", "upgrade",      "te",
      "content-length", "content-type", "grpc-status",       "grpc-message", "proxy-connection"};
  for (const char* n : names) {
    if (name == n)
      return true;
  }
  return name.empty() || name[0] == ':';
}

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, HttpServer& server, size_t thread)
      : socket_(std::move(socket)),
        server_(server),
        thread_(thread),
        idle_timer_(server.io(thread)) {}
  // Over TLS: `socket` is handed to the TLS stream.
  Connection(tcp::socket socket, std::shared_ptr<asio::ssl::context> ctx, HttpServer& server,
             size_t thread)
      : socket_(socket.get_executor()),
        ctx_(std::move(ctx)),
        tls_(std::make_unique<asio::ssl::stream<tcp::socket>>(std::move(socket), *ctx_)),
        server_(server),
        thread_(thread),
        idle_timer_(server.io(thread)) {}
  ~Connection() {
    if (session_)
      nghttp2_session_del(session_);
  }

  // TLS first when over TLS: the handshake, which must choose "h2" by ALPN,
  // within the server's idle timeout.
  void start() {
    if (!tls_) {
      begin();
      return;
    }
    mark_grpc(tls_->native_handle());
    idle_timer_.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(server_.options().idle_timeout_s)));
    idle_timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      if (auto self = weak.lock(); self && !ec && !self->session_)
        self->lowest().close();
    });
    tls_->async_handshake(asio::ssl::stream_base::server,
                          [self = shared_from_this()](const boost::system::error_code& ec) {
                            self->idle_timer_.cancel();
                            if (ec) {
                              self->server_.handler().on_tls_refused("grpc_handshake");
                              self->closed_ = true;
                              self->lowest().close();
                              return;
                            }
                            self->begin();
                          });
  }

  // The HTTP/2 session, once the connection is ready.
  void begin() {
    nghttp2_session_callbacks* cbs = nullptr;
    nghttp2_session_callbacks_new(&cbs);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, &Connection::on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cbs, &Connection::on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, &Connection::on_data);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, &Connection::on_frame);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, &Connection::on_close);
    nghttp2_option* opt = nullptr;
    nghttp2_option_new(&opt);
    nghttp2_option_set_max_send_header_block_length(opt, 64u << 10);
    // No tree of closed streams kept for RFC 7540 priorities (SETTINGS below
    // turns those off): gRPC clients do not use them, and they cost every
    // call.
    nghttp2_option_set_no_closed_streams(opt, 1);
    const int rv = nghttp2_session_server_new2(&session_, cbs, this, opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cbs);
    if (rv != 0) {
      session_ = nullptr;
      return;
    }
    const nghttp2_settings_entry settings[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, kMaxStreams},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, uint32_t(kWindow)},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, server_.options().header_limit},
        {NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, 1},
    };
    nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings,
                            sizeof(settings) / sizeof(settings[0]));
    nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0, kWindow);
    flush();
    read();
    watch_idle();
  }

  size_t thread() const { return thread_; }
  asio::io_context& io() { return server_.io(thread_); }
  bool open() const { return session_ != nullptr && !closed_; }
  H2Stream* stream(int32_t id) {
    auto it = streams_.find(id);
    return it == streams_.end() ? nullptr : it->second.get();
  }

  // Submits the answer's headers (and, when `trailers_only`, its end).
  void submit_headers(H2Stream& s, const Response& head, bool trailers_only, grpc::Code code,
                      const std::string& message) {
    std::vector<std::pair<std::string, std::string>> fields;
    fields.emplace_back(":status", "200");
    fields.emplace_back("content-type", "application/grpc");
    fields.emplace_back("grpc-accept-encoding", "identity");
    for (const auto& f : head) {
      std::string name = lower(std::string_view(f.name_string().data(), f.name_string().size()));
      if (!hop_header(name))
        fields.emplace_back(std::move(name), std::string(f.value()));
    }
    if (trailers_only)
      append_status(fields, code, message);
    std::vector<nghttp2_nv> nva = to_nv(fields);
    s.answered = true;
    if (trailers_only) {
      s.ended = true;
      nghttp2_submit_response(session_, s.id, nva.data(), nva.size(), nullptr);
    } else {
      nghttp2_data_provider provider;
      provider.source.ptr = &s;
      provider.read_callback = &Connection::on_read;
      nghttp2_submit_response(session_, s.id, nva.data(), nva.size(), &provider);
    }
    flush_soon();
  }

  // An answer of one message: headers, the message and the trailers at once.
  void respond_unary(H2Stream& s, const Response& r, const std::string& message) {
    grpc::frame(r.body(), s.out);
    s.queued += r.body().size() + 5;
    s.ended = true;
    append_status(s.trailers, grpc::Code::ok, message);
    submit_headers(s, r, false, grpc::Code::ok, "");
  }

  void queue_message(H2Stream& s, std::string_view message, std::function<void(bool)> written) {
    grpc::frame(message, s.out);
    s.queued += message.size() + 5;
    if (written)
      s.written.emplace_back(s.queued, std::move(written));
    nghttp2_session_resume_data(session_, s.id);
    flush_soon();
  }

  void end_with(H2Stream& s, grpc::Code code, const std::string& message) {
    s.ended = true;
    s.trailers.clear();
    append_status(s.trailers, code, message);
    nghttp2_session_resume_data(session_, s.id);
    flush_soon();
  }

  // A flush after the handler that runs now (once however many answers it
  // gives): the answers of one pass of the loop, e.g. those read from a
  // replica's channel together, leave in one send.
  void flush_soon() {
    if (flush_posted_ || in_recv_)
      return;  // (a read flushes when nghttp2 returns)
    flush_posted_ = true;
    asio::post(io(), [self = shared_from_this()] {
      self->flush_posted_ = false;
      self->flush();
    });
  }

  // Hands what nghttp2 has to send to the socket: with a non-blocking send
  // while the socket takes it (no asynchronous operation, no wake-up: the
  // common case), an asynchronous write only for what it did not take.
  // Callbacks of messages now in the socket run once they are.
  void flush() {
    if (flushing_) {
      flush_again_ = true;
      return;
    }
    if (!open() || in_recv_ || writing_)
      return;
    flushing_ = true;
    do {
      flush_again_ = false;
      if (!collect())
        break;
      if (pending_.empty()) {
        if (!nghttp2_session_want_read(session_) && !nghttp2_session_want_write(session_))
          close();
        break;
      }
      if (tls_) {
        // TLS writes go through the TLS stream.
        auto callbacks = std::move(after_write_);
        after_write_.clear();
        write_rest(0, std::move(callbacks));
        break;
      }
      const ssize_t n = ::send(socket_.native_handle(), pending_.data(), pending_.size(),
                               MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        close();
        break;
      }
      const size_t sent = n > 0 ? size_t(n) : 0;
      auto callbacks = std::move(after_write_);
      after_write_.clear();
      if (sent == pending_.size()) {
        pending_.clear();
        for (auto& f : callbacks)
          f(true);
        flush_again_ = true;  // what the callbacks queued, or more of a stream
        continue;
      }
      write_rest(sent, std::move(callbacks));
    } while (flush_again_ && open() && !writing_);
    flushing_ = false;
  }

 private:
  // Takes what nghttp2 has to send into pending_ (up to kWriteBatch); false
  // when the session failed (closed).
  bool collect() {
    while (pending_.size() < kWriteBatch) {
      const uint8_t* data = nullptr;
      const ssize_t n = nghttp2_session_mem_send(session_, &data);
      if (n < 0) {
        close();
        return false;
      }
      if (n == 0)
        break;
      pending_.append(reinterpret_cast<const char*>(data), size_t(n));
    }
    return true;
  }

  // The socket took `sent` bytes of pending_: the rest goes asynchronously.
  void write_rest(size_t sent, std::vector<std::function<void(bool)>> callbacks) {
    writing_ = true;
    wbuf_.assign(pending_, sent, std::string::npos);
    pending_.clear();
    auto done = [self = shared_from_this(), callbacks = std::move(callbacks)](
                    const boost::system::error_code& ec, size_t) mutable {
      self->writing_ = false;
      self->wbuf_.clear();
      for (auto& f : callbacks)
        f(!ec);
      if (ec) {
        self->close();
        return;
      }
      self->flush();
    };
    if (tls_)
      asio::async_write(*tls_, asio::buffer(wbuf_), std::move(done));
    else
      asio::async_write(socket_, asio::buffer(wbuf_), std::move(done));
  }

  static void append_status(std::vector<std::pair<std::string, std::string>>& fields,
                            grpc::Code code, const std::string& message) {
    fields.emplace_back("grpc-status", std::to_string(int(code)));
    if (!message.empty())
      fields.emplace_back("grpc-message", message);
  }

  // The fields for nghttp2. Only those whose values repeat from call to
  // call go into HPACK's dynamic tables: a value that changes every time (a
  // request id, a message) would only push the others out, and costs a
  // search of the table and an insertion on both sides.
  static std::vector<nghttp2_nv> to_nv(std::vector<std::pair<std::string, std::string>>& fields) {
    std::vector<nghttp2_nv> nva;
    nva.reserve(fields.size());
    for (auto& [name, value] : fields) {
      const bool repeats = name == ":status" || name == "content-type" ||
                           name == "grpc-accept-encoding" || name == "grpc-status";
      nva.push_back({reinterpret_cast<uint8_t*>(name.data()),
                     reinterpret_cast<uint8_t*>(value.data()), name.size(), value.size(),
                     uint8_t(repeats ? NGHTTP2_NV_FLAG_NONE : NGHTTP2_NV_FLAG_NO_INDEX)});
    }
    return nva;
  }

  void read() {
    auto done = [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
      self->on_read_bytes(ec, n);
    };
    if (tls_)
      tls_->async_read_some(asio::buffer(rbuf_), std::move(done));
    else
      socket_.async_read_some(asio::buffer(rbuf_), std::move(done));
  }

  tcp::socket& lowest() { return tls_ ? tls_->next_layer() : socket_; }

  void on_read_bytes(const boost::system::error_code& ec, size_t n) {
    if (!open())
      return;
    if (ec) {
      close();
      return;
    }
    last_read_ = std::chrono::steady_clock::now();
    in_recv_ = true;
    const ssize_t rv =
        nghttp2_session_mem_recv(session_, reinterpret_cast<const uint8_t*>(rbuf_.data()), n);
    in_recv_ = false;
    if (rv < 0) {
      // A protocol error: nghttp2 queued a GOAWAY; send it, then close.
      nghttp2_session_terminate_session(session_, NGHTTP2_PROTOCOL_ERROR);
      flush();
      close_after_write();
      return;
    }
    run_dispatches();
    goaway_if_closing();
    flush();
    if (open())
      read();
  }

  // The server stops accepting (the node drains): the client is told with a
  // GOAWAY that names the last call taken; those go on to their end, and the
  // connection closes after them (nghttp2 wants nothing more then).
  void goaway_if_closing() {
    if (goaway_ || !server_.closing())
      return;
    goaway_ = true;
    nghttp2_submit_goaway(session_, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(session_), NGHTTP2_NO_ERROR,
                          nullptr, 0);
  }

  // A connection with no call open that sends nothing for the server's idle
  // timeout (its keep-alive timeout, as for HTTP/1.1) is ended with a
  // GOAWAY; so is an idle one once the server stops accepting. One timer,
  // re-armed only when it fires.
  void watch_idle() {
    const double idle_s = server_.idle_timeout_s();
    auto wait = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(std::min(idle_s, 1.0)));
    idle_timer_.expires_after(wait);
    idle_timer_.async_wait(
        [self = shared_from_this(), idle_s](const boost::system::error_code& ec) {
          if (ec || !self->open())
            return;
          const auto idle_for = std::chrono::steady_clock::now() - self->last_read_;
          const bool idle =
              self->streams_.empty() &&
              (self->server_.closing() || idle_for >= std::chrono::duration<double>(idle_s));
          if (idle) {
            nghttp2_session_terminate_session(self->session_, NGHTTP2_NO_ERROR);
            self->goaway_ = true;
            self->flush();
            self->close_after_write();
            return;
          }
          self->goaway_if_closing();
          self->flush();
          self->watch_idle();
        });
  }

  void close_after_write() {
    auto self = shared_from_this();
    if (writing_) {
      after_write_.push_back([self](bool) { self->close(); });
      return;
    }
    close();
  }

  void close() {
    if (closed_)
      return;
    closed_ = true;
    idle_timer_.cancel();
    boost::system::error_code ignored;
    lowest().shutdown(tcp::socket::shutdown_both, ignored);
    lowest().close(ignored);
    auto streams = std::move(streams_);
    streams_.clear();
    for (auto& [id, s] : streams) {
      for (auto& [at, f] : s->written)
        f(false);
      if (s->exchange)
        s->exchange->gone();
    }
  }

  // Calls whose request ended in the last read, handed to the proxy after
  // nghttp2 returned (the handler may answer at once).
  void run_dispatches() {
    auto due = std::move(due_);
    due_.clear();
    for (int32_t id : due) {
      if (H2Stream* s = stream(id))
        dispatch(*s);
    }
  }

  void dispatch(H2Stream& s) {
    s.dispatched = true;
    Response refusal{http::status::ok, 11};
    if (s.method != "POST") {
      submit_plain(s, "405", "gRPC calls are POST requests");
      return;
    }
    if (s.content_type.rfind("application/grpc", 0) != 0) {
      submit_plain(s, "415", "gRPC calls have content-type application/grpc");
      return;
    }
    if (s.too_large) {
      submit_headers(s, refusal, true, grpc::Code::resource_exhausted,
                     grpc::percent_encode("the request is larger than " +
                                          std::to_string(server_.options().body_limit) +
                                          " bytes (the node's body limit)"));
      return;
    }
    auto message = grpc::unframe(s.body);
    if (!message) {
      submit_headers(s, refusal, true, grpc::Code::invalid_argument,
                     grpc::percent_encode(message.status().message()));
      return;
    }
    Request req = std::move(s.request);
    req.target(s.path);
    req.body() = std::move(*message);
    s.body.clear();
    s.body.shrink_to_fit();
    s.exchange = std::make_shared<GrpcExchange>(shared_from_this(), s.id, std::move(req));
    auto exchange = s.exchange;
    server_.handler().on_request(exchange);
  }

  // A refusal before gRPC: a plain HTTP/2 status.
  void submit_plain(H2Stream& s, const char* status, const std::string& why) {
    std::vector<std::pair<std::string, std::string>> fields = {{":status", status},
                                                               {"content-type", "text/plain"}};
    auto nva = to_nv(fields);
    s.answered = true;
    s.ended = true;
    s.out = why + "\n";
    nghttp2_data_provider provider;
    provider.source.ptr = &s;
    provider.read_callback = &Connection::on_read_plain;
    nghttp2_submit_response(session_, s.id, nva.data(), nva.size(), &provider);
  }

  static Connection& self_of(void* user) { return *static_cast<Connection*>(user); }

  static int on_begin_headers(nghttp2_session*, const nghttp2_frame* frame, void* user) {
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
      return 0;
    auto s = std::make_unique<H2Stream>();
    s->id = frame->hd.stream_id;
    self_of(user).streams_[s->id] = std::move(s);
    return 0;
  }

  static int on_header(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                       size_t namelen, const uint8_t* value, size_t valuelen, uint8_t, void* user) {
    H2Stream* s = self_of(user).stream(frame->hd.stream_id);
    if (!s || s->dispatched)
      return 0;
    // Metadata over the server's header limit (as SETTINGS_MAX_HEADER_LIST_SIZE
    // counts it) resets the call: HPACK lets a few bytes stand for much more.
    s->header_bytes += namelen + valuelen + 32;
    if (s->header_bytes > self_of(user).server_.options().header_limit)
      return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    std::string_view n(reinterpret_cast<const char*>(name), namelen);
    std::string_view v(reinterpret_cast<const char*>(value), valuelen);
    if (n == ":method")
      s->method = v;
    else if (n == ":path")
      s->path = v;
    else if (n == "content-type")
      s->content_type = v;
    if (!n.empty() && n[0] != ':' && n != "te")
      s->request.insert(boost::beast::string_view(n.data(), n.size()),
                        boost::beast::string_view(v.data(), v.size()));
    return 0;
  }

  static int on_data(nghttp2_session*, uint8_t, int32_t id, const uint8_t* data, size_t len,
                     void* user) {
    auto& self = self_of(user);
    H2Stream* s = self.stream(id);
    if (!s || s->dispatched || s->too_large)
      return 0;
    if (s->body.size() + len > self.server_.options().body_limit + 5) {
      // Answered at once; the rest of the upload is read and dropped.
      s->too_large = true;
      s->body.clear();
      s->body.shrink_to_fit();
      self.due_.push_back(id);
      return 0;
    }
    s->body.append(reinterpret_cast<const char*>(data), len);
    return 0;
  }

  static int on_frame(nghttp2_session*, const nghttp2_frame* frame, void* user) {
    auto& self = self_of(user);
    if ((frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
      H2Stream* s = self.stream(frame->hd.stream_id);
      if (s && !s->dispatched && !s->too_large)
        self.due_.push_back(s->id);
    }
    return 0;
  }

  static int on_close(nghttp2_session*, int32_t id, uint32_t, void* user) {
    auto& self = self_of(user);
    auto it = self.streams_.find(id);
    if (it == self.streams_.end())
      return 0;
    auto s = std::move(it->second);
    self.streams_.erase(it);
    for (auto& [at, f] : s->written)
      self.after_write_.push_back([f = std::move(f)](bool) { f(false); });
    if (s->exchange)
      s->exchange->gone();
    return 0;
  }

  // nghttp2 takes the next bytes of a stream's messages.
  static ssize_t on_read(nghttp2_session* session, int32_t id, uint8_t* buf, size_t length,
                         uint32_t* flags, nghttp2_data_source* source, void* user) {
    auto& self = self_of(user);
    auto& s = *static_cast<H2Stream*>(source->ptr);
    const size_t n = std::min(length, s.out.size());
    std::copy_n(s.out.data(), n, buf);
    s.out.erase(0, n);
    s.taken += n;
    while (!s.written.empty() && s.written.front().first <= s.taken) {
      self.after_write_.push_back(std::move(s.written.front().second));
      s.written.pop_front();
    }
    if (s.out.empty() && s.ended) {
      *flags |= NGHTTP2_DATA_FLAG_EOF;
      if (!s.trailers.empty()) {
        *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
        auto nva = to_nv(s.trailers);
        nghttp2_submit_trailer(session, id, nva.data(), nva.size());
      }
      return ssize_t(n);
    }
    if (n == 0)
      return NGHTTP2_ERR_DEFERRED;
    return ssize_t(n);
  }

  static ssize_t on_read_plain(nghttp2_session*, int32_t, uint8_t* buf, size_t length,
                               uint32_t* flags, nghttp2_data_source* source, void*) {
    auto& s = *static_cast<H2Stream*>(source->ptr);
    const size_t n = std::min(length, s.out.size());
    std::copy_n(s.out.data(), n, buf);
    s.out.erase(0, n);
    if (s.out.empty())
      *flags |= NGHTTP2_DATA_FLAG_EOF;
    return ssize_t(n);
  }

  tcp::socket socket_;  // plain; unused over TLS
  std::shared_ptr<asio::ssl::context> ctx_;
  std::unique_ptr<asio::ssl::stream<tcp::socket>> tls_;
  HttpServer& server_;
  size_t thread_;
  nghttp2_session* session_ = nullptr;
  std::unordered_map<int32_t, std::unique_ptr<H2Stream>> streams_;
  std::vector<int32_t> due_;
  std::array<char, 16384> rbuf_{};
  std::string pending_, wbuf_;
  std::vector<std::function<void(bool)>> after_write_;
  asio::steady_timer idle_timer_;
  std::chrono::steady_clock::time_point last_read_ = std::chrono::steady_clock::now();
  bool goaway_ = false;
  bool writing_ = false;
  bool flushing_ = false;
  bool flush_posted_ = false;
  bool flush_again_ = false;
  bool in_recv_ = false;
  bool closed_ = false;
};

size_t GrpcExchange::thread() const {
  return conn_->thread();
}

asio::io_context& GrpcExchange::io() {
  return conn_->io();
}

void GrpcExchange::respond(Response&& response) {
  done_ = true;
  H2Stream* s = gone_ ? nullptr : conn_->stream(id_);
  if (!s || !conn_->open() || s->answered)
    return;
  grpc::Code code = grpc::code_for_http(response.result_int());
  std::string message;
  if (auto it = response.find("grpc-status"); it != response.end()) {
    if (int own = grpc::own_code(std::string_view(it->value().data(), it->value().size()));
        own >= 0)
      code = grpc::Code(own);
    if (auto m = response.find("grpc-message"); m != response.end())
      message = grpc::percent_encode(std::string(m->value()));
  } else if (code != grpc::Code::ok) {
    message = grpc::message_of(response.body());
  }
  if (code != grpc::Code::ok) {
    conn_->submit_headers(*s, response, true, code, message);
    return;
  }
  conn_->respond_unary(*s, response, message);
}

void GrpcExchange::begin_stream(Response&& head) {
  H2Stream* s = gone_ ? nullptr : conn_->stream(id_);
  if (!s || !conn_->open() || s->answered)
    return;
  stream_code_ = grpc::code_for_http(head.result_int());
  conn_->submit_headers(*s, head, false, stream_code_, "");
}

void GrpcExchange::write_chunk(std::string data, std::function<void(bool ok)> written) {
  H2Stream* s = gone_ ? nullptr : conn_->stream(id_);
  if (!s || !conn_->open() || !s->answered || s->ended) {
    if (written)
      written(false);
    return;
  }
  if (data.empty()) {
    if (written)
      written(true);
    return;
  }
  conn_->queue_message(*s, data, std::move(written));
}

void GrpcExchange::end_stream(bool complete) {
  done_ = true;
  H2Stream* s = gone_ ? nullptr : conn_->stream(id_);
  if (!s || !conn_->open() || !s->answered || s->ended)
    return;
  if (complete)
    conn_->end_with(*s, stream_code_, "");
  else
    conn_->end_with(*s, grpc::Code::internal, "the stream ended early");
}

void GrpcExchange::on_client_gone(std::function<void()> f) {
  on_gone_ = std::move(f);
  if (gone_ && !done_ && on_gone_)
    asio::post(io(), [f = on_gone_] { f(); });
}

void GrpcExchange::gone() {
  if (gone_)
    return;
  gone_ = true;
  if (!done_ && on_gone_) {
    done_ = true;
    asio::post(io(), [f = std::move(on_gone_)] { f(); });
  }
}

}  // namespace

void serve_grpc(tcp::socket socket, HttpServer& server, size_t thread) {
  std::make_shared<Connection>(std::move(socket), server, thread)->start();
}

void serve_grpc_tls(tcp::socket socket, std::shared_ptr<asio::ssl::context> ctx, HttpServer& server,
                    size_t thread) {
  std::make_shared<Connection>(std::move(socket), std::move(ctx), server, thread)->start();
}

}  // namespace troupe::proxy
