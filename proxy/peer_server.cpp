// Data ports, the serving side: a listener on the proxy's bind address hands
// each connection to an io thread, which serves the requests of a connection
// that presented this node's token (proxy/peer_client.cpp has the whole
// picture and the sending side).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "proxy/call.hpp"
#include "proxy/core.hpp"
#include "proxy/data_tls.hpp"
#include "proxy/paths.hpp"
#include "proxy/peer_frames.hpp"
#include "runtime/data_channel.hpp"
#include "runtime/local_replicas.hpp"

namespace troupe::proxy {

using nlohmann::json;

// --- the serving side (B) ---------------------------------------------------------

struct ServedConn : FrameConn {
  PeerServer& server;
  IoThread* w;
  std::string from;  // the peer's address, for log lines
  bool admitted = false;
  struct InFlight {
    uint64_t key = 0;  // the request's key at its replica (HttpRequest::call_key)
    ReplicaActor handle;
  };
  // By the connecting worker's id of the request.
  std::unordered_map<uint64_t, InFlight> calls;

  ServedConn(PeerServer& s, IoThread* worker) : FrameConn(*worker->io), server(s), w(worker) {}

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
    auto* core = w->core;
    if (!core->options.data_tls) {
      read();
      return;
    }
    // With TLS: the handshake first (within the same 5 s), the token inside.
    handshake(core->options.data_tls->context(), true,
              [self = weak()](const std::string& refused) {
                auto conn = self.lock();
                if (!conn)
                  return;
                if (!refused.empty()) {
                  conn->w->core->log->warn("refused a data port connection from {}: {}",
                                           conn->from, refused);
                  conn->close(refused);
                  return;
                }
                conn->read();
              });
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
    auto& slots = server.slots_;
    if (auto found = slots.find(replica_id); found != slots.end())
      slot = found->second.lock();
    if (!slot || slot->dead || !slot->owner) {
      slots.erase(replica_id);
      slot = core->router.find_replica(replica_id);
      if (slot)
        slots[replica_id] = slot;
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
    if (const auto& replica = slot->local_replica;
        replica && !replica->blocking() && !replica->batching()) {
      // A non-blocking in-process replica: run here, as InlinePath::send does.
      // (A blocking one's requests go to its request threads.)
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
          answered(server, weak(), call, key, handle, answer);
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
    PeerServer* to = &server;
    self->add_multiplexed_response_handler(
        id.response_id(),
        caf::behavior{
            [to, conn = weak(), call, key, handle](HttpResponse& answer) {
              answered(*to, conn, call, key, handle, answer);
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

  static void answered(PeerServer& server, const std::weak_ptr<ServedConn>& weak, uint64_t call,
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
      server.streams_[key] = PeerServer::Stream{weak, call, 0};
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
      server.streams_.erase(f.key);
    }
    calls.clear();
    auto keep = shared_from_this();
    server.conns_.erase(this);
  }
};

PeerServer::~PeerServer() = default;

void PeerServer::serve(asio::ip::tcp::socket sock) {
  auto conn = std::make_shared<ServedConn>(*this, &t_);
  *conn->sock = std::move(sock);
  conns_[conn.get()] = conn;
  conn->start();
}

void PeerServer::drop() {
  for (auto& [raw, conn] : conns_)
    conn->drop();
  conns_.clear();
  streams_.clear();
  slots_.clear();
}

bool PeerServer::chunk(uint64_t key, uint64_t seq, std::string& data) {
  auto it = streams_.find(key);
  if (it == streams_.end())
    return false;
  auto conn = it->second.conn.lock();
  if (!conn || conn->closed) {
    streams_.erase(it);
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
    streams_.erase(it);
    return true;
  }
  ++s.next_seq;
  conn->frame(channel::Kind::chunk, s.call, 0, 0, data.data(), data.size());
  return true;
}

bool PeerServer::end(uint64_t key, uint64_t seq, bool complete, const std::string& why) {
  auto it = streams_.find(key);
  if (it == streams_.end())
    return false;
  auto conn = it->second.conn.lock();
  auto call = it->second.call;
  bool whole = complete && seq == it->second.next_seq;
  streams_.erase(it);
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
            core->workers[index]->served.serve(std::move(*s));
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
  for (auto& w : core.workers) {
    w->peers.drop();
    w->served.drop();
  }
  core.data_port.reset();
}

}  // namespace troupe::proxy
