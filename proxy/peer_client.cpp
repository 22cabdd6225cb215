// Data ports, the sending side (the serving side: proxy/peer_server.cpp;
// the framed connection both use: proxy/frame_conn.hpp).
//
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

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "proxy/call.hpp"
#include "proxy/core.hpp"
#include "proxy/peer_frames.hpp"
#include "runtime/data_channel.hpp"
#include "runtime/local_replicas.hpp"

namespace troupe::proxy {

using nlohmann::json;

namespace {

constexpr uint32_t kMaxBackoffS = 30;

}  // namespace

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


// --- the sending side (A) ---------------------------------------------------------

struct PeerConn : FrameConn {
  Worker* w;
  std::string node_id;
  Proxy::Core::DataPortEndpoint endpoint;
  bool up = false;
  uint32_t failures = 0;  // attempts failed since the last success
  Clock::time_point retry_at;

  PeerConn(Worker* worker, std::string node, Proxy::Core::DataPortEndpoint ep)
      : FrameConn(*worker->io), w(worker), node_id(std::move(node)), endpoint(std::move(ep)) {}

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

void drop_peer_conns(Worker& w) {
  for (auto& [id, conn] : w.peer_conns)
    conn->drop();
  w.peer_conns.clear();
}

void peer_control(const CallPtr& c, bool credit, uint64_t amount) {
  auto& conn = c->peer;
  if (!conn || conn->closed)
    return;
  conn->frame(credit ? channel::Kind::credit : channel::Kind::cancel, c->key,
              static_cast<uint32_t>(amount_of(amount)), 0, nullptr, 0);
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
