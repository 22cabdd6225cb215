// The data channel between a node's HTTP proxy and one of its replica
// processes: requests and answers go over Unix SOCK_SEQPACKET socket pairs
// that the node agent creates when it starts the process, instead of over
// CAF's BASP (which costs each request a hop through the multiplexer thread
// of the node and of the replica process). CAF stays the control path, and
// the path of requests that do not fit (see Channel::max_frame) or come
// from other nodes.
//
// Per replica process:
//   requests   one socket pair. The proxy's io threads write request frames
//              into the node's end (a send is atomic per frame, so the io
//              threads share it); the replica's request threads all block in
//              recv() on the process's end, and the kernel hands each frame
//              to exactly one of them: the thread that receives a request
//              runs it, with no hand-off inside the process. The process also
//              holds the node's end (`inject`), through which its CAF
//              dispatch queues requests that came over CAF as `local` frames,
//              so that both paths share its request threads and its
//              max_ongoing_requests.
//   answers    one socket pair per proxy io thread ("lane"): the thread that
//              ran a request writes the answer into the lane the request
//              named; that io thread reads it on its own event loop. An
//              answer larger than max_frame goes as several frames (kMore),
//              reassembled by call id. A streamed answer is a `head`, any
//              number of `chunk`s and an `end` on the lane. The other way,
//              the io thread writes `credit` (room for more of a stream) and
//              `cancel` frames into its lane, read by one thread of the
//              process (replica/streams.hpp).
// Nothing else can reach these sockets: they are inherited by that one
// process and have no name. A process that dies closes its ends: the proxy
// reads end-of-file on its lanes and fails its requests over at once.
//
// Frames: a FrameHeader (16 bytes) followed by a Cap'n Proto message
// (schemas/data_channel.capnp) in the standard flat-array form.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/status.hpp"
#include "runtime/local_replicas.hpp"
#include "runtime/wire.hpp"

namespace capnp {
class MessageBuilder;
}

namespace troupe::channel {

constexpr uint8_t kVersion = 1;

enum class Kind : uint8_t {
  request = 1,  // ChannelRequest, proxy -> replica
  answer = 2,   // ChannelAnswer, replica -> proxy
  refusal = 3,  // ChannelRefusal, replica -> proxy
  local = 4,    // no payload: a request the process queued for itself
  head = 5,     // ChannelAnswer without body, replica -> proxy: a stream begins
  chunk = 6,    // raw bytes of a stream, replica -> proxy
  end = 7,      // a stream ends (kComplete, else early; payload: why, raw text)
  credit = 8,   // no payload, proxy -> replica: `amount` more bytes of `call`
  cancel = 9,   // no payload, proxy -> replica: request `call` is cancelled
                // (`amount` 1: its deadline passed; 0: its client left)
  closing = 10,  // no payload, replica -> proxy, on every lane: the process
                 // ends because it was told to stop; the requests of this
                 // lane it did not answer never will be, and are not its
                 // crash (the proxy places them again)
  // Only on a worker's data port (a TCP connection between two workers'
  // proxies, proxy/peer_client.cpp and proxy/peer_server.cpp):
  hello = 11,   // raw payload: the port's token; the first frame a
                // connecting worker sends, and nothing is served before it
  failed = 12,  // the request failed at the replica: `amount` is the error
                // code; raw payload: the category (8 bytes), then the
                // message (text) of an error of troupe's category
};

constexpr uint8_t kMore = 1;      // flags: more frames of this answer follow
constexpr uint8_t kComplete = 2;  // flags of an `end`: the stream is whole

struct FrameHeader {
  uint8_t version = kVersion;
  Kind kind = Kind::request;
  uint8_t flags = 0;
  uint8_t lane = 0;  // requests: the answer lane
  uint32_t amount = 0;  // credits: bytes granted (else 0)
  uint64_t call = 0;  // the sender's id of the request (local: its token)
};
static_assert(sizeof(FrameHeader) == 16, "a frame header is two words");

// The node's ends of one replica process's channel. Shared by the proxy's
// router slot and io threads; the fds close with the last holder.
class Channel {
 public:
  Channel(std::string replica_id, int requests, std::vector<int> answers, size_t max_frame);
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  const std::string& replica_id() const { return replica_id_; }
  int request_fd() const { return requests_; }
  size_t lanes() const { return answers_.size(); }
  int answer_fd(size_t lane) const { return answers_[lane]; }
  // The largest frame (header included) either side sends.
  size_t max_frame() const { return max_frame_; }
  // Set when the process's end closed or the channel misbehaved: requests
  // take the CAF path from then on.
  bool broken() const { return broken_.load(std::memory_order_relaxed); }
  void set_broken() { broken_.store(true, std::memory_order_relaxed); }

 private:
  std::string replica_id_;
  int requests_;
  std::vector<int> answers_;
  size_t max_frame_;
  std::atomic<bool> broken_{false};
};
using ChannelPtr = std::shared_ptr<Channel>;

// A new channel for `replica_id` with `lanes` answer lanes. `child_fds` are
// the process's ends, in the order troupe-replica expects them (requests,
// inject, lane 0, lane 1, ...); the caller hands them to the process and
// closes them. The error names the system call that failed.
struct Made {
  ChannelPtr channel;
  std::vector<int> child_fds;
};
Result<Made> make_channel(const std::string& replica_id, size_t lanes);

// The channels of a node's replica processes by replica id: the node agent
// adds one when it starts a process and removes it when the process exits;
// the proxy looks up the channel of a local replica when it learns of it.
//
// It also carries the node's in-process replicas that the proxy may call
// inline (runtime/local_replicas.hpp): the node agent and the proxy share
// this object, and both paths are "how the proxy reaches a replica of this
// node without CAF".
class Registry {
 public:
  const std::shared_ptr<local::LocalReplicas>& local_replicas() const { return local_replicas_; }
  void add(ChannelPtr channel);
  void remove(const std::string& replica_id);
  ChannelPtr find(const std::string& replica_id) const;
  size_t size() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, ChannelPtr> channels_;
  const std::shared_ptr<local::LocalReplicas> local_replicas_ =
      std::make_shared<local::LocalReplicas>();
};

// --- frames -------------------------------------------------------------------

enum class Sent { sent, too_large, busy, closed };

// Sends one request frame without blocking: too_large when it does not fit
// in max_frame, busy when the socket's buffer is full, closed when the
// process's end is gone.
Sent send_request(int fd, uint64_t call, uint8_t lane, const HttpRequest& request,
                  size_t max_frame);
// Sends an answer (blocking; in several frames when it is larger than
// max_frame). False when the proxy's end is gone.
bool send_answer(int fd, uint64_t call, const HttpResponse& answer, size_t max_frame);
bool send_refusal(int fd, uint64_t call, bool overloaded, const std::string& message,
                  size_t max_frame);
// A `local` frame (no payload), without blocking.
Sent send_local(int fd, uint64_t token);

// Streams (blocking, like send_answer; false when the proxy's end is gone).
// The head is the answer's status and headers; it must fit in one frame.
bool send_head(int fd, uint64_t call, const HttpResponse& head, size_t max_frame);
// `data` as one or more chunk frames.
bool send_chunk(int fd, uint64_t call, const char* data, size_t bytes, size_t max_frame);
bool send_end(int fd, uint64_t call, bool complete, const std::string& why, size_t max_frame);
// A credit, cancel or closing frame (no payload), without blocking.
Sent send_control(int fd, Kind kind, uint64_t call, uint32_t amount);

// Frames for one socket, sent with one system call (sendmmsg): the requests
// an io thread queued for one replica process during a pass of its event
// loop, or the answers a replica process's request loop made for one lane
// from the frames it read at once. Each frame is still one message on the
// socket: the receiver reads them as if they had been sent one by one.
class Batch {
 public:
  // Encodes a frame at the end of the batch. too_large when it does not fit
  // in max_frame (nothing is added): requests take CAF then, answers go with
  // send_answer (in several frames).
  Sent add_request(uint64_t call, uint8_t lane, const HttpRequest& request, size_t max_frame);
  Sent add_answer(uint64_t call, const HttpResponse& answer, size_t max_frame);

  size_t size() const { return frames_.size(); }
  bool empty() const { return frames_.empty(); }
  // The call id of frame `i`.
  uint64_t call(size_t i) const;

  // Sends the frames not sent yet, in order, until all are sent or the
  // socket refuses one; `flags` as for send (MSG_DONTWAIT, or 0 to block).
  // Returns sent, or why the frame at sent_count() was not sent (busy or
  // closed); the frames before it are on their way.
  Sent flush(int fd, int flags);
  size_t sent_count() const { return sent_; }
  // Forgets every frame (sent or not).
  void clear();

 private:
  Sent add(FrameHeader header, capnp::MessageBuilder& message, size_t max_frame);
  std::vector<uint64_t> words_;                        // the frames, word-aligned
  std::vector<std::pair<size_t, size_t>> frames_;      // (first word, bytes)
  size_t sent_ = 0;
};

// A received payload (after the header): word-aligned, as Cap'n Proto reads it.
// The decoders return an error naming what is wrong with a malformed payload.
Status decode_request(const void* payload, size_t bytes, HttpRequest& out);
Status decode_answer(const void* payload, size_t bytes, HttpResponse& out);
Status decode_refusal(const void* payload, size_t bytes, bool& overloaded, std::string& message);

// The process's side: its ends, and a receive buffer per request thread.
class ReplicaEnd {
 public:
  // Takes ownership of the fds.
  ReplicaEnd(int requests, int inject, std::vector<int> answers, size_t max_frame);
  ~ReplicaEnd();
  ReplicaEnd(const ReplicaEnd&) = delete;
  ReplicaEnd& operator=(const ReplicaEnd&) = delete;

  int request_fd() const { return requests_; }
  int inject_fd() const { return inject_; }
  size_t lanes() const { return answers_.size(); }
  int answer_fd(size_t lane) const { return answers_[lane]; }
  size_t max_frame() const { return max_frame_; }

 private:
  int requests_;
  int inject_;
  std::vector<int> answers_;
  size_t max_frame_;
};

// --- frames on a byte stream: a worker's data port -----------------------------
//
// A TCP connection keeps no message boundaries. There each frame follows an
// 8-byte prefix (the frame's size in bytes, header included, little-endian;
// then 4 zero bytes) and is padded to whole words, so that every frame's
// payload stays word-aligned in the reader's buffer.
constexpr size_t kStreamPrefix = 8;
// The largest frame either side accepts on a data port (as the largest
// answer a replica process's channel takes); a larger answer is sent as a
// failure instead.
constexpr size_t kMaxStreamFrame = size_t{1} << 30;

// Appends one frame with a raw payload (`bytes` from `payload`; none for 0).
void append_stream_frame(std::vector<uint64_t>& out, FrameHeader header, const void* payload,
                         size_t bytes);
// Appends a request frame naming the replica it is for (ChannelRequest's
// replicaId).
void append_stream_request(std::vector<uint64_t>& out, uint64_t call, const HttpRequest& request,
                           const std::string& replica_id);
// Appends an answer, or a stream's head (`kind` head: the body is not sent).
// False (nothing appended) when the frame would exceed kMaxStreamFrame.
bool append_stream_answer(std::vector<uint64_t>& out, Kind kind, uint64_t call,
                          const HttpResponse& answer);
// decode_request, also reading the replica id of a data port's request.
Status decode_request(const void* payload, size_t bytes, HttpRequest& out,
                      std::string& replica_id);

// A word-aligned buffer for one frame of at most max_frame bytes.
// Not zeroed: pages a thread never fills cost address space, not memory.
class FrameBuffer {
 public:
  explicit FrameBuffer(size_t max_frame);
  void* data() { return words_.get(); }
  size_t capacity() const { return size_ * sizeof(uint64_t); }
  const FrameHeader& header() const { return *reinterpret_cast<const FrameHeader*>(words_.get()); }
  const void* payload() const { return words_.get() + 2; }

 private:
  size_t size_;
  std::unique_ptr<uint64_t[]> words_;
};

}  // namespace troupe::channel
