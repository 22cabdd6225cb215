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
// node (PeerClient, paths.hpp), opened on first use once the proxy actor learnt
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
// (PeerServer). Nothing is served before a `hello` frame with the token
// this node's peer actor gives out (so only a member of the cluster that
// reached that actor over CAF can connect). A request frame is sent to the
// named replica of this node as a CAF request from the io thread's
// companion: a non-blocking in-process replica runs it right there
// (replica/dispatch.cpp, serve_here), others queue it as for any CAF
// request. Its answer, its error or its stream goes back as frames; credits
// and cancellations from A go to the replica as CAF messages. B never
// retries: A decides. A connection that closes cancels what it had in flight.
//
// With TLS (troupe-node --tls-dir) both sides speak TLS on the data port
// with the cluster's certificates (proxy/data_tls.hpp): a peer that does not
// show a node certificate of the cluster's CA is refused, and the sending
// side's requests go over CAF meanwhile, as for any connection that is down.
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



// --- the sending side (A) ---------------------------------------------------------

struct PeerConn : FrameConn {
  PeerClient& client;
  IoThread& t;
  std::string node_id;
  DataPortEndpoint endpoint;
  bool up = false;
  uint32_t failures = 0;  // attempts failed since the last success
  Clock::time_point retry_at;

  PeerConn(PeerClient& c, IoThread& thread, std::string node, DataPortEndpoint ep)
      : FrameConn(*thread.io), client(c), t(thread), node_id(std::move(node)),
        endpoint(std::move(ep)) {}

  std::shared_ptr<PeerConn> self() { return std::static_pointer_cast<PeerConn>(shared_from_this()); }
  std::string sender() const { return "node " + node_id; }

  void start() {
    boost::system::error_code ec;
    auto addr = ip::make_address(endpoint.host, ec);
    if (ec) {
      auto resolver = std::make_shared<ip::tcp::resolver>(*t.io);
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

  void await_hello() {
    timer->expires_after(kHelloTimeout);
    timer->async_wait([self = self()](const boost::system::error_code& ec) {
      if (!ec && !self->up)
        self->close("no answer within 5 s");
    });
  }

  void connect(const ip::tcp::endpoint& to) {
    await_hello();
    sock->async_connect(to, [self = self()](const boost::system::error_code& ec) {
      if (self->closed)
        return;
      if (ec) {
        self->close(ec.message());
        return;
      }
      self->connected();
    });
  }

  // The TCP connection is up: with TLS, the handshake (the peer must show a
  // node certificate of the cluster's CA); then hello with the peer's
  // token, then its answers.
  void connected() {
    boost::system::error_code ignored;
    sock->set_option(ip::tcp::no_delay(true), ignored);
    auto& tls = t.core->options.data_tls;
    if (!tls) {
      hello();
      return;
    }
    handshake(tls->context(), false, [self = self()](const std::string& refused) {
      if (!refused.empty()) {
        self->close("TLS: " + refused);
        return;
      }
      self->hello();
    });
  }

  void hello() {
    frame(channel::Kind::hello, 0, 0, 0, endpoint.token.data(), endpoint.token.size());
    read();
  }

  bool on_frame(const channel::FrameHeader& h, const char* payload, size_t bytes) override {
    if (h.kind == channel::Kind::hello) {
      if (up)
        return false;
      up = true;
      failures = 0;
      timer->cancel();
      t.core->log->info("data port connection to node {} at {}:{} (io thread {}{})", node_id,
                        endpoint.host, endpoint.port, t.index, tls ? ", TLS" : "");
      return true;
    }
    if (!up)
      return false;
    if (h.kind != channel::Kind::answer && h.kind != channel::Kind::failed &&
        h.kind != channel::Kind::head && h.kind != channel::Kind::chunk &&
        h.kind != channel::Kind::end)
      return false;  // not what a data port sends back
    return on_answer_frame(client.calls_, this, sender(), h, payload, bytes);
  }

  void on_closed(const std::string& why) override {
    auto* core = t.core;
    ++failures;
    uint32_t backoff = reconnect_backoff_s(failures);
    retry_at = Clock::now() + std::chrono::seconds(backoff);
    auto victims = client.calls_.take(this);
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
      attempt_lost(c, Outcome::abandoned,
                   "replica " + c->slot->replica_id +
                       " was lost with the data port connection to node " + node_id,
                   false);
    }
  }
};

PeerClient::~PeerClient() = default;

// This io thread's connection to `node_id`'s data port when it is up; else
// null, after starting one when the node has a data port and no attempt is
// under way or waiting for its retry.
PeerConn* PeerClient::conn_to(const std::string& node_id) {
  auto* core = t_.core;
  uint64_t version = core->data_ports_version.load(std::memory_order_acquire);
  if (version != data_ports_seen_) {
    std::lock_guard<std::mutex> lock(core->data_ports_mutex);
    data_ports_ = core->data_ports;
    data_ports_seen_ = version;
  }
  auto ep = data_ports_.find(node_id);
  auto it = conns_.find(node_id);
  if (ep == data_ports_.end() || (it != conns_.end() && !(it->second->endpoint == ep->second))) {
    // Closed after it left the map: the requests it fails over may come back
    // here, and find no connection (they go over CAF). The next request
    // opens the one to the new endpoint.
    if (it != conns_.end()) {
      auto conn = it->second;
      conns_.erase(it);
      conn->close(ep == data_ports_.end() ? "the node has no data port any more"
                                          : "the node's data port moved");
    }
    return nullptr;
  }
  uint32_t failures = 0;
  if (it != conns_.end()) {
    auto& conn = it->second;
    if (!conn->closed) {
      return conn->up ? conn.get() : nullptr;
    } else if (Clock::now() < conn->retry_at) {
      return nullptr;
    } else {
      failures = conn->failures;
    }
  }
  auto conn = std::make_shared<PeerConn>(*this, t_, node_id, ep->second);
  conn->failures = failures;
  conns_[node_id] = conn;
  conn->start();
  return nullptr;
}

void PeerClient::adopt(const std::string& node_id, DataPortEndpoint endpoint,
                       asio::ip::tcp::socket sock) {
  auto conn = std::make_shared<PeerConn>(*this, t_, node_id, endpoint);
  *conn->sock = std::move(sock);
  conns_[node_id] = conn;
  data_ports_[node_id] = std::move(endpoint);
  data_ports_seen_ = t_.core->data_ports_version.load(std::memory_order_acquire);
  conn->await_hello();
  conn->connected();
}

bool PeerClient::up(const std::string& node_id) const {
  auto it = conns_.find(node_id);
  return it != conns_.end() && !it->second->closed && it->second->up;
}

bool PeerClient::send(const CallPtr& c) {
  const auto& slot = c->slot;
  if (slot->local || slot->node_id.empty() || c->request.body.size() > channel::kMaxStreamFrame / 2)
    return false;
  auto* conn = conn_to(slot->node_id);
  if (!conn)
    return false;
  channel::append_stream_request(conn->out, c->key, c->request, slot->replica_id);
  conn->schedule_flush();
  c->via = this;
  c->sent_at = Clock::now();
  calls_.add(c, conn);
  t_.track(c.get());
  t_.core->metrics.sent_peer();
  return true;
}

namespace {

// The connection that carries the call's attempt while it is in flight or
// streaming; null otherwise.
PeerConn* carrier(const FrameCalls& calls,
                  const std::unordered_map<std::string, std::shared_ptr<PeerConn>>& conns,
                  const CallPtr& c) {
  if (!c->slot || calls.get(c->key) != c)
    return nullptr;
  auto it = conns.find(c->slot->node_id);
  if (it == conns.end() || it->second->closed)
    return nullptr;
  bool stranger = false;
  calls.find(c->key, it->second.get(), stranger);
  return stranger ? nullptr : it->second.get();
}

}  // namespace

void PeerClient::credit(const CallPtr& c, uint64_t bytes) {
  if (auto* conn = carrier(calls_, conns_, c))
    conn->frame(channel::Kind::credit, c->key, static_cast<uint32_t>(amount_of(bytes)), 0,
                nullptr, 0);
}

void PeerClient::cancel(const CallPtr& c, bool deadline_passed) {
  if (auto* conn = carrier(calls_, conns_, c))
    conn->frame(channel::Kind::cancel, c->key, deadline_passed ? 1 : 0, 0, nullptr, 0);
}

void PeerClient::forget(const CallPtr& c) {
  if (calls_.get(c->key) == c)
    calls_.remove(c->key);
}

void PeerClient::expire(const CallPtr& c) {
  forget(c);
  attempt_expired(c);
}

void PeerClient::drop() {
  for (auto& [id, conn] : conns_)
    conn->drop();
  conns_.clear();
  calls_.clear();
}

void Proxy::Core::set_data_port(const std::string& node_id, std::optional<DataPortEndpoint> ep) {
  std::lock_guard<std::mutex> lock(data_ports_mutex);
  auto it = data_ports.find(node_id);
  if (!ep) {
    if (it == data_ports.end())
      return;
    data_ports.erase(it);
  } else {
    if (it != data_ports.end() && it->second == *ep)
      return;
    data_ports[node_id] = std::move(*ep);
  }
  data_ports_version.fetch_add(1, std::memory_order_release);
}

}  // namespace troupe::proxy
