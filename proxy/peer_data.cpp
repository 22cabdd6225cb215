// Data ports: requests from one worker's proxy to the replicas of another
// worker, over a TCP connection between the two proxies' io threads, in the
// frames of the data channel (runtime/data_channel.hpp, "frames on a byte
// stream"), instead of CAF's BASP, which costs each request a pass through
// the multiplexer thread of both nodes and a hand-off to and from it.
//
// The side that sends (A): each io thread keeps one connection per peer
// node (Worker::peer_conns), opened on first use once the proxy actor learnt
// the peer's data port from its peer actor (peers.cpp). A request to a
// replica of that node goes as a request frame naming the replica; the
// frames of one pass of the event loop leave with one write. Answers,
// failures and the pieces of a stream come back on the same connection and
// go to the call state machine as over CAF: on_answer, on_error (a failure
// carries the replica's own error, so refusals, crashes and stops are
// judged here as they are for CAF), on_stream_*. A connection that drops
// loses the requests in flight on it: each is placed again, not counted as
// a crash. Until a connection is up, and while it is down, requests go over
// CAF.
//
// The side that serves (B): a listener on the proxy's bind address, on a
// port the kernel picks, hands each connection to an io thread
// (Worker::served). Nothing is served before a `hello` frame with the token
// this node's peer actor gives out (so only a member of the cluster that
// reached that actor over CAF can connect). A request frame is sent to the
// named replica of this node as a CAF request from the io thread's
// companion: a non-blocking in-process replica runs it right there
// (replica/dispatch.cpp, serve_here), others queue it as for any CAF
// request. Its answer, its error or its stream goes back as frames; credits
// and cancellations from A go to the replica as CAF messages. B never
// retries: A decides. A connection that closes cancels what it had in flight.
//
// With TLS the data port is not opened: those clusters keep CAF's encrypted
// connections between workers.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "proxy/call.hpp"
#include "proxy/core.hpp"
#include "runtime/data_channel.hpp"
#include "runtime/local_replicas.hpp"

namespace troupe::proxy {

namespace ip = asio::ip;
using nlohmann::json;

struct DataPort {
  explicit DataPort(asio::io_context& io) : acceptor(io) {}
  ip::tcp::acceptor acceptor;
  size_t next_worker = 0;
};

namespace {

constexpr auto kHelloTimeout = std::chrono::seconds(5);
constexpr uint32_t kMaxBackoffS = 30;

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

}  // namespace

// One connection of a data port, either side: reads frames, writes the
// frames queued during a pass of the event loop together. Lives on its
// worker's io thread.
struct FrameConn : std::enable_shared_from_this<FrameConn> {
  Worker* w = nullptr;
  std::unique_ptr<ip::tcp::socket> sock;
  std::unique_ptr<asio::steady_timer> timer;
  FrameReader in;
  std::vector<uint64_t> out, writing;
  bool writing_now = false;
  bool flush_posted = false;
  bool closed = false;

  explicit FrameConn(Worker* worker)
      : w(worker),
        sock(std::make_unique<ip::tcp::socket>(*worker->io)),
        timer(std::make_unique<asio::steady_timer>(*worker->io)) {}
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

  void schedule_flush() {
    if (flush_posted || writing_now || closed)
      return;
    flush_posted = true;
    asio::post(*w->io, [self = shared_from_this()] {
      self->flush_posted = false;
      self->flush();
    });
  }

  void flush() {
    if (closed || writing_now || out.empty())
      return;
    writing.swap(out);
    out.clear();
    writing_now = true;
    asio::async_write(*sock, asio::buffer(writing.data(), writing.size() * sizeof(uint64_t)),
                      [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                        self->writing_now = false;
                        if (ec) {
                          self->close(ec.message());
                          return;
                        }
                        self->writing.clear();
                        self->flush();
                      });
  }

  void read() {
    sock->async_read_some(
        in.space(), [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
          if (self->closed)
            return;
          if (ec) {
            self->close(ec == asio::error::eof ? "closed by the other side" : ec.message());
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
        });
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

namespace {

uint64_t amount_of(uint64_t v) {
  return std::min<uint64_t>(v, UINT32_MAX);
}

// A caf::error as a `failed` frame's code and payload, and back.
std::string error_payload(const caf::error& err) {
  uint64_t category = static_cast<uint64_t>(err.category());
  std::string out(reinterpret_cast<const char*>(&category), sizeof(category));
  if (err.category() == kErrorCategory)
    out += from_caf_error(err).message();
  return out;
}

caf::error error_of(uint32_t code, const char* payload, size_t bytes) {
  uint64_t category = 0;
  if (bytes >= sizeof(category))
    std::memcpy(&category, payload, sizeof(category));
  auto atom = static_cast<caf::atom_value>(category);
  if (atom == kErrorCategory) {
    std::string message(payload + sizeof(category), bytes - sizeof(category));
    return to_caf_error(Status(static_cast<errc>(code), message));
  }
  return caf::error(static_cast<uint8_t>(code), atom);
}

bool same(const Proxy::Core::DataPortEndpoint& a, const Proxy::Core::DataPortEndpoint& b) {
  return a.host == b.host && a.port == b.port && a.token == b.token;
}

}  // namespace

// --- the sending side (A) ---------------------------------------------------------

struct PeerConn : FrameConn {
  std::string node_id;
  Proxy::Core::DataPortEndpoint endpoint;
  bool up = false;
  uint32_t failures = 0;  // attempts failed since the last success
  Clock::time_point retry_at;

  PeerConn(Worker* worker, std::string node, Proxy::Core::DataPortEndpoint ep)
      : FrameConn(worker), node_id(std::move(node)), endpoint(std::move(ep)) {}

  std::shared_ptr<PeerConn> self() { return std::static_pointer_cast<PeerConn>(shared_from_this()); }

  void start() {
    boost::system::error_code ec;
    auto addr = ip::make_address(endpoint.host, ec);
    if (ec) {
      auto resolver = std::make_shared<ip::tcp::resolver>(*w->io);
      resolver->async_resolve(endpoint.host, std::to_string(endpoint.port),
                              [self = self(), resolver](const boost::system::error_code& ec,
                                                        ip::tcp::resolver::results_type results) {
                                if (self->closed)
                                  return;
                                if (ec || results.empty()) {
                                  self->close("cannot resolve " + self->endpoint.host);
                                  return;
                                }
                                self->connect(results.begin()->endpoint());
                              });
      return;
    }
    connect(ip::tcp::endpoint(addr, endpoint.port));
  }

  void connect(const ip::tcp::endpoint& to) {
    timer->expires_after(kHelloTimeout);
    timer->async_wait([self = self()](const boost::system::error_code& ec) {
      if (!ec && !self->up)
        self->close("no answer within 5 s");
    });
    sock->async_connect(to, [self = self()](const boost::system::error_code& ec) {
      if (self->closed)
        return;
      if (ec) {
        self->close(ec.message());
        return;
      }
      boost::system::error_code ignored;
      self->sock->set_option(ip::tcp::no_delay(true), ignored);
      self->frame(channel::Kind::hello, 0, 0, 0, self->endpoint.token.data(),
                  self->endpoint.token.size());
      self->read();
    });
  }

  bool on_frame(const channel::FrameHeader& h, const char* payload, size_t bytes) override {
    if (h.kind == channel::Kind::hello) {
      if (up)
        return false;
      up = true;
      failures = 0;
      timer->cancel();
      w->core->log->info("data port connection to node {} at {}:{} (io thread {})", node_id,
                         endpoint.host, endpoint.port, w->index);
      return true;
    }
    if (!up)
      return false;
    auto it = w->pending.find(h.call);
    if (it == w->pending.end())
      return true;  // failed over, timed out or cancelled meanwhile
    CallPtr c = it->second;
    if (c->peer.get() != this)
      return true;
    switch (h.kind) {
      case channel::Kind::answer: {
        w->pending.erase(it);
        c->channel_call = 0;
        HttpResponse answer;
        auto st = channel::decode_answer(payload, bytes, answer);
        if (c->done) {
          late_answer(c, Outcome::answered);
          return true;
        }
        if (!st) {
          w->core->log->warn("node {}: {}", node_id, st.message());
          answer = malformed_answer(c, "node " + node_id, st.message());
        }
        on_answer(c, answer);
        return true;
      }
      case channel::Kind::failed: {
        w->pending.erase(it);
        c->channel_call = 0;
        auto err = error_of(h.amount, payload, bytes);
        if (c->done) {
          late_answer(c, Outcome::answered);
          return true;
        }
        on_error(c, err);
        return true;
      }
      case channel::Kind::head: {
        if (c->streaming)
          return false;
        HttpResponse head;
        if (auto st = channel::decode_answer(payload, bytes, head); !st) {
          w->core->log->warn("node {}: {}", node_id, st.message());
          return false;
        }
        on_stream_head(c, head, false);
        return true;
      }
      case channel::Kind::chunk:
        if (!c->streaming)
          return false;
        on_stream_chunk(c, std::string(payload, bytes));
        return true;
      case channel::Kind::end:
        if (!c->streaming)
          return false;
        w->pending.erase(it);
        c->channel_call = 0;
        on_stream_end(c, (h.flags & channel::kComplete) != 0, std::string(payload, bytes));
        return true;
      default:
        return false;
    }
  }

  void on_closed(const std::string& why) override {
    auto* core = w->core;
    ++failures;
    uint32_t backoff = std::min<uint32_t>(kMaxBackoffS, 1u << std::min<uint32_t>(failures, 5));
    retry_at = Clock::now() + std::chrono::seconds(backoff);
    std::vector<CallPtr> victims;
    for (auto& [id, c] : w->pending) {
      if (c->peer.get() == this)
        victims.push_back(c);
    }
    if (up) {
      core->log->warn(
          "lost the data port connection to node {} ({}); {} requests in flight on it are "
          "placed again, others go over CAF until it is back",
          node_id, why, victims.size());
    } else if (failures == 1 || failures % 10 == 0) {
      core->log->warn(
          "no data port connection to node {} at {}:{} ({}); requests to it go over CAF, "
          "retrying in {} s",
          node_id, endpoint.host, endpoint.port, why, backoff);
    }
    up = false;
    for (auto& c : victims) {
      w->pending.erase(c->channel_call);
      c->channel_call = 0;
      c->peer = nullptr;
      w->untrack(c.get());
      std::string what = "replica " + c->slot->replica_id +
                         " was lost with the data port connection to node " + node_id;
      if (c->streaming) {
        stream_lost(c, Outcome::abandoned, what + " mid-stream");
        continue;
      }
      if (c->done) {
        release(c, Outcome::abandoned);
        continue;
      }
      c->tried.push_back(c->slot->replica_id);
      release(c, Outcome::abandoned);
      retry(c, what, false);
    }
  }
};

namespace {

// This io thread's connection to `node_id`'s data port when it is up; else
// null, after starting one when the node has a data port and no attempt is
// under way or waiting for its retry.
PeerConn* peer_conn(Worker* w, const std::string& node_id) {
  auto* core = w->core;
  uint64_t version = core->data_ports_version.load(std::memory_order_acquire);
  if (version != w->data_ports_seen) {
    std::lock_guard<std::mutex> lock(core->data_ports_mutex);
    w->data_ports = core->data_ports;
    w->data_ports_seen = version;
  }
  auto ep = w->data_ports.find(node_id);
  auto it = w->peer_conns.find(node_id);
  if (ep == w->data_ports.end() || (it != w->peer_conns.end() && !same(it->second->endpoint, ep->second))) {
    // Closed after it left the map: the requests it fails over may come back
    // here, and find no connection (they go over CAF). The next request
    // opens the one to the new endpoint.
    if (it != w->peer_conns.end()) {
      auto conn = it->second;
      w->peer_conns.erase(it);
      conn->close(ep == w->data_ports.end() ? "the node has no data port any more"
                                            : "the node's data port moved");
    }
    return nullptr;
  }
  uint32_t failures = 0;
  if (it != w->peer_conns.end()) {
    auto& conn = it->second;
    if (!conn->closed) {
      return conn->up ? conn.get() : nullptr;
    } else if (Clock::now() < conn->retry_at) {
      return nullptr;
    } else {
      failures = conn->failures;
    }
  }
  auto conn = std::make_shared<PeerConn>(w, node_id, ep->second);
  conn->failures = failures;
  w->peer_conns[node_id] = conn;
  conn->start();
  return nullptr;
}

}  // namespace

bool send_peer(const CallPtr& c) {
  auto* w = c->worker;
  const auto& slot = c->slot;
  if (slot->local || slot->node_id.empty() || c->request.body.size() > channel::kMaxStreamFrame / 2)
    return false;
  auto* conn = peer_conn(w, slot->node_id);
  if (!conn)
    return false;
  channel::append_stream_request(conn->out, c->key, c->request, slot->replica_id);
  conn->schedule_flush();
  c->peer = conn->self();
  c->channel_call = c->key;
  c->sent_at = Clock::now();
  w->pending.emplace(c->key, c);
  w->track(c.get());
  w->core->metrics.sent_peer();
  return true;
}

void peer_control(const CallPtr& c, bool credit, uint64_t amount) {
  auto& conn = c->peer;
  if (!conn || conn->closed)
    return;
  conn->frame(credit ? channel::Kind::credit : channel::Kind::cancel, c->key,
              static_cast<uint32_t>(amount_of(amount)), 0, nullptr, 0);
}

// --- the serving side (B) ---------------------------------------------------------

struct ServedConn : FrameConn {
  std::string from;  // the peer's address, for log lines
  bool admitted = false;
  struct InFlight {
    uint64_t key = 0;  // the request's key at its replica (HttpRequest::call_key)
    ReplicaActor handle;
  };
  // By the connecting worker's id of the request.
  std::unordered_map<uint64_t, InFlight> calls;

  using FrameConn::FrameConn;

  std::weak_ptr<ServedConn> weak() {
    return std::static_pointer_cast<ServedConn>(shared_from_this());
  }

  void start() {
    boost::system::error_code ec;
    auto peer = sock->remote_endpoint(ec);
    from = ec ? std::string("?") : peer.address().to_string() + ":" + std::to_string(peer.port());
    sock->set_option(ip::tcp::no_delay(true), ec);
    in.max_frame = 4096;
    timer->expires_after(kHelloTimeout);
    timer->async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      auto* conn = static_cast<ServedConn*>(self.get());
      if (!ec && !conn->admitted)
        conn->close("no hello within 5 s");
    });
    read();
  }

  void fail(uint64_t call, const caf::error& err) {
    auto payload = error_payload(err);
    frame(channel::Kind::failed, call, err.code(), 0, payload.data(), payload.size());
  }

  bool on_frame(const channel::FrameHeader& h, const char* payload, size_t bytes) override {
    auto* core = w->core;
    if (!admitted) {
      const auto& token = core->data_token;
      bool ok = h.kind == channel::Kind::hello && bytes == token.size() &&
                std::equal(token.begin(), token.end(), payload);
      if (!ok) {
        core->log->warn("refused a data port connection from {}: it did not present this node's "
                        "token",
                        from);
        return false;
      }
      admitted = true;
      in.max_frame = channel::kMaxStreamFrame;
      timer->cancel();
      frame(channel::Kind::hello, 0, 0, 0, nullptr, 0);
      return true;
    }
    switch (h.kind) {
      case channel::Kind::request:
        return serve(h.call, payload, bytes);
      case channel::Kind::credit:
      case channel::Kind::cancel: {
        auto it = calls.find(h.call);
        if (it == calls.end())
          return true;  // it ended meanwhile
        if (h.kind == channel::Kind::credit)
          caf::anon_send(it->second.handle, credit_atom::value, it->second.key,
                         uint64_t{h.amount});
        else
          caf::anon_send(it->second.handle, cancel_atom::value, it->second.key, h.amount != 0);
        return true;
      }
      default:
        return false;
    }
  }

  bool serve(uint64_t call, const char* payload, size_t bytes) {
    auto* core = w->core;
    HttpRequest request;
    std::string replica_id;
    if (auto st = channel::decode_request(payload, bytes, request, replica_id); !st) {
      core->log->warn("data port connection from {}: {}", from, st.message());
      return false;
    }
    SlotPtr slot;
    if (auto found = w->served_slots.find(replica_id); found != w->served_slots.end())
      slot = found->second.lock();
    if (!slot || slot->dead || !slot->owner) {
      w->served_slots.erase(replica_id);
      slot = core->router.find_replica(replica_id);
      if (slot)
        w->served_slots[replica_id] = slot;
    }
    if (!slot || !slot->local || !slot->handle) {
      fail(call, to_caf_error(Status(errc::unavailable, "replica " + replica_id +
                                                            " is not a replica of node " +
                                                            core->options.node_id)));
      return true;
    }
    if (calls.count(call) != 0)
      return false;  // a request id in use
    uint64_t key = w->new_key();
    request.call_key = key;
    auto handle = slot->handle;
    if (const auto& replica = slot->local_replica) {
      // A non-blocking in-process replica: run here, as send_inline does.
      HttpResponse answer;
      auto result = replica->serve(request, answer);
      switch (result.kind) {
        case local::InlineResult::closed:
          break;  // exiting: its handle says what became of it
        case local::InlineResult::stopping:
        case local::InlineResult::overloaded:
          fail(call, to_caf_error(Status(result.kind == local::InlineResult::overloaded
                                             ? errc::overloaded
                                             : errc::unavailable,
                                         result.why)));
          return true;
        case local::InlineResult::streaming: {
          auto id = await(call, key, handle);
          result.stream->start(caf::actor_cast<caf::strong_actor_ptr>(w->companion_handle), id);
          return true;
        }
        case local::InlineResult::answered:
          calls.emplace(call, InFlight{key, handle});
          answered(w, weak(), call, key, handle, answer);
          return true;
      }
    }
    auto id = await(call, key, handle);
    auto* self = w->companion;
    handle->enqueue(self->ctrl(), id, caf::make_message(handle_atom::value, std::move(request)),
                    self->context());
    return true;
  }

  // The request `call` (`key` at its replica) is in flight: its answer, or
  // its error, goes back as frames (a CAF response to the io thread's
  // companion, which the returned id names).
  caf::message_id await(uint64_t call, uint64_t key, const ReplicaActor& handle) {
    calls[call] = InFlight{key, handle};
    auto* self = w->companion;
    auto id = self->new_request_id(caf::message_priority::normal);
    Worker* worker = w;
    self->add_multiplexed_response_handler(
        id.response_id(),
        caf::behavior{
            [worker, conn = weak(), call, key, handle](HttpResponse& answer) {
              answered(worker, conn, call, key, handle, answer);
            },
            [conn = weak(), call, handle](caf::error& err) {
              auto c = conn.lock();
              if (!c || c->closed)
                return;
              c->calls.erase(call);
              // A replica that stopped on request (its handle ended with
              // user_shutdown) did not crash with the request: say so, as
              // the sender cannot read this node's handle.
              if (err == caf::sec::request_receiver_down && stopped_on_request(handle))
                c->fail(call, caf::make_error(caf::exit_reason::user_shutdown));
              else
                c->fail(call, err);
            },
        });
    return id;
  }

  static void answered(Worker* w, const std::weak_ptr<ServedConn>& weak, uint64_t call,
                       uint64_t key, const ReplicaActor& handle, HttpResponse& answer) {
    auto conn = weak.lock();
    if (!conn || conn->closed) {
      if (answer.stream != 0)
        caf::anon_send(handle, cancel_atom::value, key, false);  // nobody reads it
      return;
    }
    if (answer.stream != 0) {
      channel::append_stream_answer(conn->out, channel::Kind::head, call, answer);
      conn->schedule_flush();
      w->served_streams[key] = Worker::ServedStream{weak, call, 0};
      return;
    }
    conn->calls.erase(call);
    if (!channel::append_stream_answer(conn->out, channel::Kind::answer, call, answer)) {
      conn->fail(call, to_caf_error(Status(errc::internal,
                                           "the answer is larger than a data port frame (" +
                                               std::to_string(channel::kMaxStreamFrame) +
                                               " bytes)")));
      return;
    }
    conn->schedule_flush();
  }

  void on_closed(const std::string& why) override {
    if (admitted && why != "closed by the other side") {
      w->core->log->info("data port connection from {} closed ({}); cancelling its {} requests",
                         from, why, calls.size());
    }
    for (auto& [call, f] : calls) {
      caf::anon_send(f.handle, cancel_atom::value, f.key, false);
      w->served_streams.erase(f.key);
    }
    calls.clear();
    auto keep = shared_from_this();
    w->served.erase(this);
  }
};

bool served_stream_chunk(Worker* w, uint64_t key, uint64_t seq, std::string& data) {
  auto it = w->served_streams.find(key);
  if (it == w->served_streams.end())
    return false;
  auto conn = it->second.conn.lock();
  if (!conn || conn->closed) {
    w->served_streams.erase(it);
    return true;
  }
  auto& s = it->second;
  if (seq != s.next_seq) {
    // CAF delivers in order; a gap means pieces were lost.
    std::string why = "pieces of the stream were lost";
    conn->frame(channel::Kind::end, s.call, 0, 0, why.data(), why.size());
    if (auto f = conn->calls.find(s.call); f != conn->calls.end()) {
      caf::anon_send(f->second.handle, cancel_atom::value, key, false);
      conn->calls.erase(f);
    }
    w->served_streams.erase(it);
    return true;
  }
  ++s.next_seq;
  conn->frame(channel::Kind::chunk, s.call, 0, 0, data.data(), data.size());
  return true;
}

bool served_stream_end(Worker* w, uint64_t key, uint64_t seq, bool complete,
                       const std::string& why) {
  auto it = w->served_streams.find(key);
  if (it == w->served_streams.end())
    return false;
  auto conn = it->second.conn.lock();
  auto call = it->second.call;
  bool whole = complete && seq == it->second.next_seq;
  w->served_streams.erase(it);
  if (!conn || conn->closed)
    return true;
  conn->calls.erase(call);
  std::string text = whole || !complete ? why : "pieces of the stream were lost";
  conn->frame(channel::Kind::end, call, 0, whole ? channel::kComplete : 0, text.data(),
              text.size());
  return true;
}

// --- the listener and the peers' endpoints ------------------------------------------

namespace {

void accept_next(const std::shared_ptr<Proxy::Core>& core) {
  auto port = core->data_port;
  if (!port)
    return;
  // Connections go to the io threads in turn; each is served by one.
  size_t index = port->next_worker++ % core->server->threads();
  auto* io = &core->server->io(index);
  port->acceptor.async_accept(
      *io, [weak = std::weak_ptr<Proxy::Core>(core), index, io](const boost::system::error_code& ec,
                                                                 ip::tcp::socket socket) {
        auto core = weak.lock();
        if (!core || ec == asio::error::operation_aborted)
          return;
        if (!ec) {
          auto s = std::make_shared<ip::tcp::socket>(std::move(socket));
          core->post(io, [core = core.get(), index, s] {
            Worker* to = core->workers[index].get();
            auto conn = std::make_shared<ServedConn>(to);
            *conn->sock = std::move(*s);
            to->served[conn.get()] = conn;
            conn->start();
          });
        } else {
          core->log->warn("data port: accept failed: {}", ec.message());
        }
        accept_next(core);
      });
}

}  // namespace

Status open_data_port(Proxy::Core& core) {
  if (!core.options.data_port || core.server->threads() == 0)
    return Status::ok();
  auto port = std::make_shared<DataPort>(core.server->io(0));
  boost::system::error_code ec;
  auto addr = ip::make_address(core.options.server.bind, ec);
  if (!ec)
    port->acceptor.open(addr.is_v6() ? ip::tcp::v6() : ip::tcp::v4(), ec);
  if (!ec)
    port->acceptor.set_option(ip::tcp::acceptor::reuse_address(true), ec);
  if (!ec)
    port->acceptor.bind(ip::tcp::endpoint(addr, 0), ec);
  if (!ec)
    port->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status(errc::unavailable,
                  "cannot open the data port on " + core.options.server.bind + ": " + ec.message());
  }
  std::random_device rd;
  static const char* hex = "0123456789abcdef";
  std::string token;
  for (int i = 0; i < 32; ++i) {
    auto v = rd();
    token += hex[v & 15];
    token += hex[(v >> 4) & 15];
  }
  core.data_token = token;
  core.data_port_number = port->acceptor.local_endpoint().port();
  core.data_port = port;
  accept_next(core.shared_from_this());
  return Status::ok();
}

void close_data_ports(Proxy::Core& core) {
  boost::system::error_code ignored;
  if (core.data_port)
    core.data_port->acceptor.close(ignored);
  // The io threads have ended: the sockets and timers go now, before their
  // io_contexts, without the fail-over a closed connection runs.
  auto drop = [&](FrameConn& conn) {
    conn.closed = true;
    conn.sock.reset();
    conn.timer.reset();
  };
  for (auto& w : core.workers) {
    for (auto& [id, conn] : w->peer_conns)
      drop(*conn);
    for (auto& [raw, conn] : w->served)
      drop(*conn);
    w->peer_conns.clear();
    w->served.clear();
    w->served_streams.clear();
    w->served_slots.clear();
  }
  core.data_port.reset();
}

void Proxy::Core::set_data_port(const std::string& node_id, std::optional<DataPortEndpoint> ep) {
  std::lock_guard<std::mutex> lock(data_ports_mutex);
  auto it = data_ports.find(node_id);
  if (!ep) {
    if (it == data_ports.end())
      return;
    data_ports.erase(it);
  } else {
    if (it != data_ports.end() && same(it->second, *ep))
      return;
    data_ports[node_id] = std::move(*ep);
  }
  data_ports_version.fetch_add(1, std::memory_order_release);
}

}  // namespace troupe::proxy
