// The framed byte stream of a data port (proxy/peer_client.cpp,
// proxy/peer_server.cpp): frames of the data channel (runtime/data_channel.hpp,
// "frames on a byte stream") read into a word-aligned buffer, and a
// connection that reads them and writes the frames queued during one pass
// of its io_context together. Neither knows the proxy: each side of a data
// port derives from FrameConn. Tested over socket pairs:
// tests/proxy/frame_conn_test.cpp.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include "runtime/data_channel.hpp"
#include "runtime/security/tls.hpp"

namespace troupe::proxy {

namespace asio = boost::asio;
namespace ip = asio::ip;

// Frames read from a byte stream into a word-aligned buffer.
struct FrameReader {
  std::vector<uint64_t> words = std::vector<uint64_t>(8192);
  size_t bytes = 0;  // read and not yet consumed
  size_t wanted = 0;  // the size of the frame that is incomplete
  // The largest frame taken (a serving side takes small ones until the
  // connection presented its token: no stranger makes it allocate).
  size_t max_frame = channel::kMaxStreamFrame;

  asio::mutable_buffer space() {
    size_t need = std::max(bytes + 4096, wanted);
    if (need > words.size() * 8)
      words.resize((need + 7) / 8 + 1024);
    return asio::buffer(reinterpret_cast<char*>(words.data()) + bytes, words.size() * 8 - bytes);
  }

  // Calls f(header, payload, payload bytes) for every whole frame, until f
  // returns false. False when a prefix or header is malformed, or f refused.
  template <class F>
  bool drain(F&& f) {
    size_t off = 0;
    wanted = 0;
    bool ok = true;
    auto* base = reinterpret_cast<const char*>(words.data());
    while (bytes - off >= channel::kStreamPrefix) {
      uint32_t len = 0;
      std::memcpy(&len, base + off, sizeof(len));
      if (len < sizeof(channel::FrameHeader) || len > max_frame) {
        ok = false;
        break;
      }
      size_t total = channel::kStreamPrefix + ((size_t{len} + 7) & ~size_t{7});
      if (bytes - off < total) {
        wanted = total;
        break;
      }
      channel::FrameHeader h;
      std::memcpy(&h, base + off + channel::kStreamPrefix, sizeof(h));
      if (h.version != channel::kVersion ||
          !f(h, base + off + channel::kStreamPrefix + sizeof(h), len - sizeof(h))) {
        ok = false;
        break;
      }
      off += total;
    }
    if (off > 0 && ok) {
      std::memmove(words.data(), base + off, bytes - off);
      bytes -= off;
    }
    return ok;
  }
};


// One connection of a data port, either side: reads frames, writes the
// frames queued during a pass of the event loop together; over TLS once
// handshake() succeeded (proxy/data_tls.hpp). Lives on the thread of its
// io_context (an io thread of the proxy).
struct FrameConn : std::enable_shared_from_this<FrameConn> {
  using TlsStream = asio::ssl::stream<ip::tcp::socket&>;
  asio::io_context& io;
  std::unique_ptr<ip::tcp::socket> sock;
  std::unique_ptr<TlsStream> tls;  // over `sock`; null: plain TCP
  std::shared_ptr<asio::ssl::context> tls_context;  // kept while `tls` lives
  std::string tls_refusal;  // why our verification refused the peer
  bool handshaking = false;  // frames queued meanwhile leave after it
  std::unique_ptr<asio::steady_timer> timer;
  FrameReader in;
  std::vector<uint64_t> out, writing;
  bool writing_now = false;
  bool flush_posted = false;
  bool closed = false;

  explicit FrameConn(asio::io_context& context)
      : io(context),
        sock(std::make_unique<ip::tcp::socket>(context)),
        timer(std::make_unique<asio::steady_timer>(context)) {}
  virtual ~FrameConn() = default;
  // A frame; false: the other side broke the protocol (the connection closes).
  virtual bool on_frame(const channel::FrameHeader& h, const char* payload, size_t bytes) = 0;
  // The connection closed (once), for `why`.
  virtual void on_closed(const std::string& why) = 0;

  void frame(channel::Kind kind, uint64_t call, uint32_t amount, uint8_t flags,
             const void* payload, size_t bytes) {
    channel::FrameHeader h;
    h.kind = kind;
    h.call = call;
    h.amount = amount;
    h.flags = flags;
    channel::append_stream_frame(out, h, payload, bytes);
    schedule_flush();
  }

  // Runs the TLS handshake on the connected socket with `context` (as the
  // accepting side when `server`): the peer must present a certificate of
  // the cluster's CA with the node role. done(""), or done(why it failed),
  // after which the connection is to be closed; reads and writes go
  // through TLS from then on.
  template <class Done>
  void handshake(std::shared_ptr<asio::ssl::context> context, bool server, Done done) {
    tls_context = std::move(context);
    tls = std::make_unique<TlsStream>(*sock, *tls_context);
    handshaking = true;
    security::report_handshake_failure_myself(tls->native_handle());
    tls->set_verify_callback([this](bool preverified, asio::ssl::verify_context& vc) {
      auto why = security::node_peer_refusal(preverified, vc.native_handle());
      if (!why.empty() && tls_refusal.empty())
        tls_refusal = why;
      return why.empty();
    });
    tls->async_handshake(server ? TlsStream::server : TlsStream::client,
                         [self = shared_from_this(), done = std::move(done)](
                             const boost::system::error_code& ec) mutable {
                           self->handshaking = false;
                           if (self->closed)
                             return;
                           done(ec ? self->handshake_failure(ec) : std::string());
                           self->flush();
                         });
  }

  // Why a handshake failed, in the words of the node's refused-peer lines.
  std::string handshake_failure(const boost::system::error_code& ec) const {
    if (!tls_refusal.empty())
      return tls_refusal;
    if (ec.category() == asio::error::get_ssl_category())
      return security::handshake_error_reason(static_cast<unsigned long>(ec.value()));
    if (ec == asio::error::eof || ec == asio::ssl::error::stream_truncated)
      return "it closed the connection during the handshake";
    return ec.message();
  }

  void schedule_flush() {
    if (flush_posted || writing_now || closed)
      return;
    flush_posted = true;
    asio::post(io, [self = shared_from_this()] {
      self->flush_posted = false;
      self->flush();
    });
  }

  void flush() {
    if (closed || writing_now || handshaking || out.empty())
      return;
    writing.swap(out);
    out.clear();
    writing_now = true;
    auto done = [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
      self->writing_now = false;
      if (ec) {
        self->close(ec.message());
        return;
      }
      self->writing.clear();
      self->flush();
    };
    auto bytes = asio::buffer(writing.data(), writing.size() * sizeof(uint64_t));
    if (tls)
      asio::async_write(*tls, bytes, std::move(done));
    else
      asio::async_write(*sock, bytes, std::move(done));
  }

  void read() {
    auto done = [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
      if (self->closed)
        return;
      if (ec) {
        bool eof = ec == asio::error::eof || ec == asio::ssl::error::stream_truncated;
        self->close(eof ? "closed by the other side" : ec.message());
        return;
      }
      self->in.bytes += n;
      bool ok = self->in.drain([&](const channel::FrameHeader& h, const char* p, size_t b) {
        return !self->closed && self->on_frame(h, p, b);
      });
      if (self->closed)
        return;
      if (!ok) {
        self->close("protocol error (a malformed frame)");
        return;
      }
      self->read();
    };
    if (tls)
      tls->async_read_some(in.space(), std::move(done));
    else
      sock->async_read_some(in.space(), std::move(done));
  }

  // Gone with its io_context (which has stopped): the socket and the timer
  // go now, without on_closed().
  void drop() {
    closed = true;
    tls.reset();
    sock.reset();
    timer.reset();
  }

  void close(const std::string& why) {
    if (closed)
      return;
    closed = true;
    boost::system::error_code ignored;
    if (sock)
      sock->close(ignored);
    if (timer)
      timer->cancel();
    on_closed(why);
  }
};

}  // namespace troupe::proxy
