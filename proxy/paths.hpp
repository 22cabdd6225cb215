// The transports of one io thread (internal to proxy/; transport.hpp says how
// they share the work), and the serving side of its data port. Each keeps
// its own state; the io thread (core.hpp) owns one of each, and nothing else
// changes what they keep.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <caf/message_id.hpp>

#include "proxy/transport.hpp"
#include "runtime/data_channel.hpp"

namespace troupe {
class RequestControl;  // include/troupe/deployment.hpp
namespace local {
class LocalReplica;  // runtime/local_replicas.hpp
}  // namespace local
}  // namespace troupe

namespace troupe::proxy {

namespace asio = boost::asio;

struct IoThread;
struct PeerConn;
struct ServedConn;

// Where another worker's data port is, and the token it wants (from its
// peer actor, peers.cpp).
struct DataPortEndpoint {
  std::string host;
  uint16_t port = 0;
  std::string token;
  bool operator==(const DataPortEndpoint& o) const {
    return host == o.host && port == o.port && token == o.token;
  }
};

// In-process replicas' handlers, run on the io thread (inline_path.cpp). A
// non-blocking handler runs within send(): the attempt ends before send()
// returns (a streamed answer goes on over CAF), there is nothing to keep,
// credit or cancel. A blocking one (while its replica's gate is open,
// runtime/inline_gate.hpp) is queued by send() and runs in drain(), which
// the io thread calls after each pass over its ready handlers, under its
// LoopTakeover (runtime/loop_takeover.hpp): if it blocks, another thread takes
// the io thread's loop over, and the answer comes back as a posted handler.
// Such an attempt is kept until it ends, to be cancelled, forgotten or
// expired like any other.
class InlinePath final : public Transport {
 public:
  explicit InlinePath(IoThread& t) : t_(t) {}
  bool send(const CallPtr& c) override;
  void credit(const CallPtr&, uint64_t) override {}
  void cancel(const CallPtr& c, bool deadline_passed) override;
  void forget(const CallPtr& c) override;
  void expire(const CallPtr& c) override;
  // Runs the queued blocking calls, on the io thread, outside its handlers.
  // False when the loop was taken over meanwhile: this thread must leave it.
  bool drain();
  // Another thread runs this io thread's loop from now on (the old one is
  // still in a blocking handler; the new one drains the rest of the queue).
  void taken_over();
  // The proxy stops: the attempts kept here go.
  void clear();
  // Blocking calls waiting for their turn, and running (for tests).
  size_t queued() const { return queue_.size(); }
  size_t kept() const { return blocking_.size(); }

  struct Ran;  // what a blocking call's handler gave (inline_path.cpp)

 private:
  bool send_nonblocking(const CallPtr& c);
  // A blocking call ended: its answer into the call.
  void ended(const CallPtr& c, Ran& ran);
  // The answer of a call whose io thread was taken over, back on the loop.
  void ended_elsewhere(uint64_t key, const std::shared_ptr<Ran>& ran);

  IoThread& t_;
  struct Blocking {
    CallPtr call;
    std::shared_ptr<RequestControl> control;
  };
  // Blocking calls by key: queued, or running.
  std::unordered_map<uint64_t, Blocking> blocking_;
  std::deque<uint64_t> queue_;
  // The replica whose blocking handler this thread runs now, and since when
  // (read by the thread that takes the loop over, taken_over()).
  std::shared_ptr<local::LocalReplica> running_;
  std::chrono::steady_clock::time_point running_since_;
};

// The data channels of this node's replica processes (channel_path.cpp):
// requests go as frames on the process's request socket, answers come back
// on this io thread's lane of the channel.
class ChannelPath final : public Transport {
 public:
  explicit ChannelPath(IoThread& t) : t_(t) {}
  ~ChannelPath() override;
  // Queues the request frame (sent with the pass's other frames to that
  // process, after the pass's other handlers); false when the replica has no
  // channel, a broken one, or the request does not fit in a frame.
  bool send(const CallPtr& c) override;
  void credit(const CallPtr& c, uint64_t bytes) override;
  void cancel(const CallPtr& c, bool deadline_passed) override;
  void forget(const CallPtr& c) override;
  void expire(const CallPtr& c) override;
  // The proxy stops (the io threads have ended): lanes and calls go.
  void clear();

 private:
  // This io thread's lane of one replica process's channel.
  struct Lane {
    channel::ChannelPtr channel;
    asio::posix::stream_descriptor fd;  // a dup of the lane's node end
    // Answers that come in several frames, by call id: the payload so far.
    struct Partial {
      std::vector<uint64_t> words;
      size_t bytes = 0;
    };
    std::unordered_map<uint64_t, Partial> partial;
    size_t partial_bytes = 0;  // of all of them
    Lane(channel::ChannelPtr ch, asio::io_context& io, int dup)
        : channel(std::move(ch)), fd(io, dup) {}
  };
  // Request frames written during this pass of the event loop, for one
  // process: sent together (one sendmmsg) by a handler posted behind the
  // pass's other handlers (flush()).
  struct Outbox {
    channel::ChannelPtr channel;
    channel::Batch batch;
    std::vector<CallPtr> calls;  // of the frames, in order
  };
  // Credit a full lane did not take, sent again shortly.
  struct Owed {
    uint64_t bytes = 0;
    std::unique_ptr<asio::steady_timer> timer;
  };
  Lane* lane_of(const channel::ChannelPtr& ch);
  int lane_fd(const CallPtr& c);
  void arm(Lane* lane);
  void read(Lane* lane);
  bool on_frame(Lane* lane, const uint64_t* frame, size_t size);
  void closed(Lane* lane, const std::string& why, bool crash = true);
  void flush();
  void retry_credit(uint64_t key);

  IoThread& t_;
  FrameCalls calls_;  // by key; the connection is the lane's channel
  std::unordered_map<const channel::Channel*, std::unique_ptr<Lane>> lanes_;
  std::unordered_map<const channel::Channel*, Outbox> outboxes_;
  bool flush_posted_ = false;
  std::unordered_map<uint64_t, Owed> owed_;
  // The frames one read takes from a lane (one recvmmsg): kBatch buffers of
  // the largest max_frame of the lanes so far, allocated without being
  // written, so that only what the kernel copies in becomes resident.
  struct Frames {
    static constexpr size_t kBatch = 16;
    size_t words = 0;  // per buffer
    std::unique_ptr<uint64_t[]> data;
    void fit(size_t max_frame) {
      size_t w = (max_frame + 7) / 8;
      if (w <= words)
        return;
      data.reset(new uint64_t[w * kBatch]);
      words = w;
    }
    uint64_t* buffer(size_t i) { return data.get() + i * words; }
    size_t capacity() const { return words * sizeof(uint64_t); }
  };
  Frames frames_;
};

// Connections to other workers' data ports (peer_client.cpp): one per peer
// node, opened on first use, over which requests go to that node's replicas
// and their answers and streams come back.
class PeerClient final : public Transport {
 public:
  explicit PeerClient(IoThread& t) : t_(t) {}
  ~PeerClient() override;
  // Queues the request frame on the connection to the replica's node; false
  // when it is not up (one is opened for later requests when the node has a
  // data port) or the request is too large.
  bool send(const CallPtr& c) override;
  void credit(const CallPtr& c, uint64_t bytes) override;
  void cancel(const CallPtr& c, bool deadline_passed) override;
  void forget(const CallPtr& c) override;
  void expire(const CallPtr& c) override;
  // Uses `sock`, connected already, as the connection to `node_id`'s data
  // port at `endpoint` (it says hello and waits for the answer): what a
  // connection does once its TCP connect succeeds. For tests over socket
  // pairs; send() opens its connections itself.
  void adopt(const std::string& node_id, DataPortEndpoint endpoint, asio::ip::tcp::socket sock);
  // Whether the connection to `node_id` is up (said hello back).
  bool up(const std::string& node_id) const;
  // The io threads have ended: the connections go without the fail-over a
  // closed connection runs.
  void drop();

 private:
  friend struct PeerConn;
  PeerConn* conn_to(const std::string& node_id);

  IoThread& t_;
  FrameCalls calls_;  // by key; the connection is the PeerConn
  std::unordered_map<std::string, std::shared_ptr<PeerConn>> conns_;
  // This thread's copy of Core::data_ports, taken when its version changed.
  std::map<std::string, DataPortEndpoint> data_ports_;
  uint64_t data_ports_seen_ = UINT64_MAX;
};

// CAF requests through the io thread's companion (caf_path.cpp): the way
// every request can go, and the way streamed answers of in-process replicas
// come back.
class CafPath final : public Transport {
 public:
  explicit CafPath(IoThread& t) : t_(t) {}
  bool send(const CallPtr& c) override;
  void credit(const CallPtr& c, uint64_t bytes) override;
  void cancel(const CallPtr& c, bool deadline_passed) override;
  void forget(const CallPtr& c) override;
  void expire(const CallPtr& c) override;
  // The response handler of the call's current attempt on the companion
  // (answers, stream heads, errors); the call is tracked (sweep, fail_over).
  // Returns the request id to send the request with.
  caf::message_id await(const CallPtr& c);
  // (chunk, key, seq, data) and (chunk, key, seq, complete, why) from a
  // replica that streams over CAF. A gap in `seq` ends the stream early.
  void chunk(uint64_t key, uint64_t seq, std::string& data);
  void end(uint64_t key, uint64_t seq, bool complete, const std::string& why);
  void clear();

 private:
  IoThread& t_;
  // The attempts whose answer has not come, by key: their request id (an
  // attempt forgotten here is ended at the companion with request_timeout,
  // which its handler then ignores).
  std::unordered_map<uint64_t, caf::message_id> responses_;
  struct Stream {
    CallPtr call;
    uint64_t next_seq = 0;
  };
  std::unordered_map<uint64_t, Stream> streams_;
};

// This io thread's share of its data port (peer_server.cpp): the
// connections from other workers it serves, and the streams it relays to
// them.
class PeerServer {
 public:
  explicit PeerServer(IoThread& t) : t_(t) {}
  ~PeerServer();
  // Serves `sock`: a connection accepted on the data port (or, in tests, one
  // end of a socket pair). Nothing is served before a hello with the token.
  void serve(asio::ip::tcp::socket sock);
  // A piece of a stream relayed to a connection (true: it was one,
  // forwarded or dropped with its closed connection).
  bool chunk(uint64_t key, uint64_t seq, std::string& data);
  bool end(uint64_t key, uint64_t seq, bool complete, const std::string& why);
  size_t connections() const { return conns_.size(); }
  // The io threads have ended: the connections go.
  void drop();

 private:
  friend struct ServedConn;
  IoThread& t_;
  std::unordered_map<ServedConn*, std::shared_ptr<ServedConn>> conns_;
  struct Stream {
    std::weak_ptr<ServedConn> conn;
    uint64_t call = 0;  // the connecting worker's id of the request
    uint64_t next_seq = 0;
  };
  std::unordered_map<uint64_t, Stream> streams_;  // by the key at the replica
  std::unordered_map<std::string, std::weak_ptr<ReplicaSlot>> slots_;
};

}  // namespace troupe::proxy
