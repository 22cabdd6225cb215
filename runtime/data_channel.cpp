#include "runtime/data_channel.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include "schemas/data_channel.capnp.h"

namespace troupe::channel {

namespace {

// The socket buffer each end asks for: requests and answers in flight sit in
// it. The kernel caps it at net.core.wmem_max (without privileges).
constexpr int kWantBuffer = 4 << 20;
// Requests larger than a frame go over CAF; answers are split. Each request
// thread of a replica process has a buffer of one frame.
constexpr size_t kMinFrame = 16 << 10;
constexpr size_t kMaxFrame = 256 << 10;

void close_all(std::vector<int>& fds) {
  for (int fd : fds) {
    if (fd >= 0)
      ::close(fd);
  }
  fds.clear();
}

// SO_SNDBUFFORCE (root) lifts the cap; otherwise as much as wmem_max allows.
// Returns what the socket got (the kernel doubles the request).
int grow_send_buffer(int fd) {
  int want = kWantBuffer;
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &want, sizeof(want)) != 0)
    (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof(want));
  int got = 0;
  socklen_t len = sizeof(got);
  if (::getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &got, &len) != 0)
    return 0;
  return got;
}

Status errno_status(const char* what) {
  return Status(errc::io_error, std::string(what) + ": " + std::strerror(errno));
}

capnp::Text::Reader text(const std::string& s) { return {s.data(), s.size()}; }
capnp::Data::Reader data(const std::string& s) {
  return {reinterpret_cast<const kj::byte*>(s.data()), s.size()};
}
std::string str(capnp::Text::Reader t) { return {t.cStr(), t.size()}; }
std::string str(capnp::Data::Reader d) {
  return {reinterpret_cast<const char*>(d.begin()), d.size()};
}

// A first segment large enough for the whole message in the common case.
uint32_t estimate_words(size_t bytes, size_t headers) {
  return static_cast<uint32_t>(16 + headers * 6 + bytes / 8);
}

// The flat-array form of `message`: the segment table, then the segments,
// as iovecs after `header`. Returns the total size in bytes.
struct Gather {
  uint32_t table[2 * 32];
  iovec iov[2 + 32];
  int count = 0;
  size_t bytes = 0;
  kj::Array<capnp::word> flat;  // when there are too many segments
};

void gather(FrameHeader& header, capnp::MessageBuilder& message, Gather& g) {
  auto segments = message.getSegmentsForOutput();
  g.iov[0] = {&header, sizeof(header)};
  g.count = 1;
  g.bytes = sizeof(header);
  if (segments.size() > 32) {
    g.flat = capnp::messageToFlatArray(segments);
    auto bytes = g.flat.asBytes();
    g.iov[g.count++] = {bytes.begin(), bytes.size()};
    g.bytes += bytes.size();
    return;
  }
  size_t entries = (segments.size() + 2) & ~size_t{1};
  g.table[0] = static_cast<uint32_t>(segments.size() - 1);
  for (size_t i = 0; i < segments.size(); ++i)
    g.table[i + 1] = static_cast<uint32_t>(segments[i].size());
  if (entries > segments.size() + 1)
    g.table[entries - 1] = 0;
  g.iov[g.count++] = {g.table, entries * sizeof(uint32_t)};
  g.bytes += entries * sizeof(uint32_t);
  for (auto seg : segments) {
    auto bytes = seg.asBytes();
    g.iov[g.count++] = {const_cast<kj::byte*>(bytes.begin()), bytes.size()};
    g.bytes += bytes.size();
  }
}

ssize_t send_iov(int fd, iovec* iov, int count, int flags) {
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = static_cast<size_t>(count);
  for (;;) {
    ssize_t n = ::sendmsg(fd, &msg, flags | MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    return n;
  }
}

Sent classify(ssize_t n) {
  if (n >= 0)
    return Sent::sent;
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)
    return Sent::busy;
  if (errno == EMSGSIZE)
    return Sent::too_large;
  return Sent::closed;
}

// Sends a built message as one frame, or as several (kMore) when `split`
// allows it; blocking unless `flags` has MSG_DONTWAIT.
Sent send_message(int fd, FrameHeader header, capnp::MessageBuilder& message, size_t max_frame,
                  bool split, int flags) {
  Gather g;
  gather(header, message, g);
  if (g.bytes <= max_frame)
    return classify(send_iov(fd, g.iov, g.count, flags));
  if (!split)
    return Sent::too_large;
  // One flat copy, sent in chunks of whole words.
  auto flat = capnp::messageToFlatArray(message);
  auto bytes = flat.asBytes();
  size_t chunk = (max_frame - sizeof(FrameHeader)) & ~size_t{7};
  for (size_t off = 0; off < bytes.size(); off += chunk) {
    size_t n = std::min(chunk, bytes.size() - off);
    header.flags = off + n < bytes.size() ? kMore : 0;
    iovec iov[2] = {{&header, sizeof(header)}, {bytes.begin() + off, n}};
    if (auto s = classify(send_iov(fd, iov, 2, flags)); s != Sent::sent)
      return s;
  }
  return Sent::sent;
}

void set_headers(capnp::List<schema::ChannelHeader>::Builder out, const HeaderList& headers) {
  for (size_t i = 0; i < headers.size(); ++i) {
    out[static_cast<unsigned>(i)].setName(text(headers[i].first));
    out[static_cast<unsigned>(i)].setValue(text(headers[i].second));
  }
}

HeaderList get_headers(capnp::List<schema::ChannelHeader>::Reader in) {
  HeaderList out;
  out.reserve(in.size());
  for (auto h : in)
    out.emplace_back(str(h.getName()), str(h.getValue()));
  return out;
}

// The payload bytes of a request (its frame is larger by the encoding).
size_t request_bytes(const HttpRequest& request) {
  size_t bytes = request.method.size() + request.path.size() + request.query.size() +
                 request.body.size() + request.request_id.size();
  for (const auto& [name, value] : request.headers)
    bytes += name.size() + value.size();
  return bytes;
}

size_t answer_bytes(const HttpResponse& answer) {
  size_t bytes = answer.body.size();
  for (const auto& [name, value] : answer.headers)
    bytes += name.size() + value.size();
  return bytes;
}

void build_request(capnp::MessageBuilder& message, const HttpRequest& request,
                   const std::string& replica_id = {});

// Builds `request`'s frame (header and message) and hands it to `send`;
// too_large (nothing built) when it cannot fit in max_frame.
template <class F>
Sent with_request(uint64_t call, uint8_t lane, const HttpRequest& request, size_t max_frame,
                  F&& send) {
  size_t bytes = request_bytes(request);
  if (bytes + sizeof(FrameHeader) > max_frame)
    return Sent::too_large;
  capnp::MallocMessageBuilder message(estimate_words(bytes, request.headers.size()));
  build_request(message, request);
  FrameHeader h;
  h.kind = Kind::request;
  h.lane = lane;
  h.call = call;
  return send(h, message);
}

void build_request(capnp::MessageBuilder& message, const HttpRequest& request,
                   const std::string& replica_id) {
  auto r = message.initRoot<schema::ChannelRequest>();
  if (!replica_id.empty())
    r.setReplicaId(text(replica_id));
  r.setMethod(text(request.method));
  r.setPath(text(request.path));
  r.setQuery(text(request.query));
  set_headers(r.initHeaders(static_cast<unsigned>(request.headers.size())), request.headers);
  r.setBody(data(request.body));
  r.setRequestId(text(request.request_id));
  r.setTimeoutS(request.timeout_s);
}

void build_answer(capnp::MessageBuilder& message, const HttpResponse& answer) {
  auto a = message.initRoot<schema::ChannelAnswer>();
  a.setStatus(answer.status);
  set_headers(a.initHeaders(static_cast<unsigned>(answer.headers.size())), answer.headers);
  a.setBody(data(answer.body));
}

template <class F>
Status read_payload(const void* payload, size_t bytes, const char* what, F&& read) {
  if (bytes % sizeof(capnp::word) != 0 ||
      reinterpret_cast<uintptr_t>(payload) % alignof(capnp::word) != 0) {
    return Status(errc::invalid_argument,
                  std::string("malformed ") + what + " frame: " + std::to_string(bytes) +
                      " bytes is not a whole number of aligned words");
  }
  try {
    // Cap'n Proto's default traversal limit (8M words) would let a few bytes
    // claim millions of empty headers, each one built here (found by
    // tests/fuzz/channel_fuzz.cpp: a 100-byte frame made the proxy allocate
    // half a gigabyte). Twice the frame's size bounds the work by the bytes
    // that came, as for the checkpoint codec.
    capnp::ReaderOptions options;
    options.traversalLimitInWords = 2 * (bytes / sizeof(capnp::word)) + 64;
    capnp::FlatArrayMessageReader reader(
        kj::ArrayPtr<const capnp::word>(reinterpret_cast<const capnp::word*>(payload),
                                        bytes / sizeof(capnp::word)),
        options);
    read(reader);
    return Status::ok();
  } catch (const kj::Exception& e) {
    return Status(errc::invalid_argument,
                  std::string("malformed ") + what + " frame: " + e.getDescription().cStr());
  }
}

}  // namespace

// --- Channel ----------------------------------------------------------------------

Channel::Channel(std::string replica_id, int requests, std::vector<int> answers, size_t max_frame)
    : replica_id_(std::move(replica_id)),
      requests_(requests),
      answers_(std::move(answers)),
      max_frame_(max_frame) {}

Channel::~Channel() {
  if (requests_ >= 0)
    ::close(requests_);
  close_all(answers_);
}

Result<Made> make_channel(const std::string& replica_id, size_t lanes) {
  std::vector<int> node_fds;
  std::vector<int> child_fds;
  auto fail = [&](const char* what) {
    Status s = errno_status(what);
    close_all(node_fds);
    close_all(child_fds);
    return s;
  };
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0)
    return fail("socketpair");
  node_fds.push_back(pair[0]);
  child_fds.push_back(pair[1]);
  int inject = ::fcntl(pair[0], F_DUPFD_CLOEXEC, 0);
  if (inject < 0)
    return fail("dup");
  child_fds.push_back(inject);
  int smallest = grow_send_buffer(pair[0]);
  for (size_t i = 0; i < lanes; ++i) {
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0)
      return fail("socketpair");
    node_fds.push_back(pair[0]);
    child_fds.push_back(pair[1]);
    smallest = std::min(smallest, grow_send_buffer(pair[1]));
    // The node writes only credits and cancellations into a lane: the
    // default buffer is enough.
  }
  // A quarter of the buffer per frame, so that several fit at once.
  size_t max_frame =
      std::clamp<size_t>(static_cast<size_t>(std::max(smallest, 0)) / 4, kMinFrame, kMaxFrame) &
      ~size_t{7};
  int requests = node_fds.front();
  std::vector<int> answers(node_fds.begin() + 1, node_fds.end());
  Made made;
  made.channel = std::make_shared<Channel>(replica_id, requests, std::move(answers), max_frame);
  made.child_fds = std::move(child_fds);
  return made;
}

// --- Registry -----------------------------------------------------------------------

void Registry::add(ChannelPtr channel) {
  std::lock_guard<std::mutex> lock(mutex_);
  channels_[channel->replica_id()] = std::move(channel);
}

void Registry::remove(const std::string& replica_id) {
  ChannelPtr gone;  // closed outside the lock (if this was the last holder)
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = channels_.find(replica_id);
  if (it == channels_.end())
    return;
  gone = std::move(it->second);
  channels_.erase(it);
}

ChannelPtr Registry::find(const std::string& replica_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = channels_.find(replica_id);
  return it == channels_.end() ? nullptr : it->second;
}

size_t Registry::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return channels_.size();
}

// --- frames ---------------------------------------------------------------------------

Sent send_request(int fd, uint64_t call, uint8_t lane, const HttpRequest& request,
                  size_t max_frame) {
  return with_request(call, lane, request, max_frame,
                      [&](FrameHeader h, capnp::MessageBuilder& message) {
                        return send_message(fd, h, message, max_frame, false, MSG_DONTWAIT);
                      });
}

bool send_answer(int fd, uint64_t call, const HttpResponse& answer, size_t max_frame) {
  size_t bytes = answer_bytes(answer);
  capnp::MallocMessageBuilder message(estimate_words(bytes, answer.headers.size()));
  build_answer(message, answer);
  FrameHeader h;
  h.kind = Kind::answer;
  h.call = call;
  return send_message(fd, h, message, max_frame, true, 0) == Sent::sent;
}

bool send_refusal(int fd, uint64_t call, bool overloaded, const std::string& why,
                  size_t max_frame) {
  capnp::MallocMessageBuilder message(estimate_words(why.size(), 0));
  auto r = message.initRoot<schema::ChannelRefusal>();
  r.setOverloaded(overloaded);
  r.setMessage(text(why));
  FrameHeader h;
  h.kind = Kind::refusal;
  h.call = call;
  return send_message(fd, h, message, max_frame, true, 0) == Sent::sent;
}

Sent send_local(int fd, uint64_t token) {
  FrameHeader h;
  h.kind = Kind::local;
  h.call = token;
  iovec iov{&h, sizeof(h)};
  return classify(send_iov(fd, &iov, 1, MSG_DONTWAIT));
}

bool send_head(int fd, uint64_t call, const HttpResponse& head, size_t max_frame) {
  size_t bytes = 0;
  for (const auto& [name, value] : head.headers)
    bytes += name.size() + value.size();
  capnp::MallocMessageBuilder message(estimate_words(bytes, head.headers.size()));
  auto a = message.initRoot<schema::ChannelAnswer>();
  a.setStatus(head.status);
  set_headers(a.initHeaders(static_cast<unsigned>(head.headers.size())), head.headers);
  FrameHeader h;
  h.kind = Kind::head;
  h.call = call;
  return send_message(fd, h, message, max_frame, false, 0) == Sent::sent;
}

bool send_chunk(int fd, uint64_t call, const char* data, size_t bytes, size_t max_frame) {
  FrameHeader h;
  h.kind = Kind::chunk;
  h.call = call;
  size_t piece = max_frame - sizeof(FrameHeader);
  for (size_t off = 0; off < bytes; off += piece) {
    size_t n = std::min(piece, bytes - off);
    iovec iov[2] = {{&h, sizeof(h)}, {const_cast<char*>(data) + off, n}};
    if (classify(send_iov(fd, iov, 2, 0)) != Sent::sent)
      return false;
  }
  return true;
}

bool send_end(int fd, uint64_t call, bool complete, const std::string& why, size_t max_frame) {
  FrameHeader h;
  h.kind = Kind::end;
  h.flags = complete ? kComplete : 0;
  h.call = call;
  size_t n = std::min(why.size(), max_frame - sizeof(FrameHeader));
  iovec iov[2] = {{&h, sizeof(h)}, {const_cast<char*>(why.data()), n}};
  return classify(send_iov(fd, iov, n > 0 ? 2 : 1, 0)) == Sent::sent;
}

Sent send_control(int fd, Kind kind, uint64_t call, uint32_t amount) {
  FrameHeader h;
  h.kind = kind;
  h.call = call;
  h.amount = amount;
  iovec iov{&h, sizeof(h)};
  return classify(send_iov(fd, &iov, 1, MSG_DONTWAIT));
}

// --- frames on a byte stream --------------------------------------------------------------

namespace {

// Room for a frame of `bytes` (header included) at the end of `out`, after its
// prefix; returns where the frame goes. The padding is zeroed.
char* grow_stream(std::vector<uint64_t>& out, size_t bytes) {
  size_t first = out.size();
  out.resize(first + 1 + (bytes + 7) / 8);
  uint32_t prefix[2] = {static_cast<uint32_t>(bytes), 0};
  std::memcpy(out.data() + first, prefix, sizeof(prefix));
  out.back() = 0;
  return reinterpret_cast<char*>(out.data() + first + 1);
}

void append_message(std::vector<uint64_t>& out, FrameHeader header,
                    capnp::MessageBuilder& message) {
  Gather g;
  gather(header, message, g);
  char* to = grow_stream(out, g.bytes);
  for (int i = 0; i < g.count; ++i) {
    std::memcpy(to, g.iov[i].iov_base, g.iov[i].iov_len);
    to += g.iov[i].iov_len;
  }
}

}  // namespace

void append_stream_frame(std::vector<uint64_t>& out, FrameHeader header, const void* payload,
                         size_t bytes) {
  char* to = grow_stream(out, sizeof(header) + bytes);
  std::memcpy(to, &header, sizeof(header));
  if (bytes > 0)
    std::memcpy(to + sizeof(header), payload, bytes);
}

void append_stream_request(std::vector<uint64_t>& out, uint64_t call, const HttpRequest& request,
                           const std::string& replica_id) {
  capnp::MallocMessageBuilder message(
      estimate_words(request_bytes(request) + replica_id.size(), request.headers.size()));
  build_request(message, request, replica_id);
  FrameHeader h;
  h.kind = Kind::request;
  h.call = call;
  append_message(out, h, message);
}

bool append_stream_answer(std::vector<uint64_t>& out, Kind kind, uint64_t call,
                          const HttpResponse& answer) {
  size_t bytes = kind == Kind::head ? 0 : answer_bytes(answer);
  if (bytes + sizeof(FrameHeader) + 64 * (answer.headers.size() + 4) > kMaxStreamFrame)
    return false;
  capnp::MallocMessageBuilder message(estimate_words(bytes, answer.headers.size()));
  auto a = message.initRoot<schema::ChannelAnswer>();
  a.setStatus(answer.status);
  set_headers(a.initHeaders(static_cast<unsigned>(answer.headers.size())), answer.headers);
  if (kind != Kind::head)
    a.setBody(data(answer.body));
  FrameHeader h;
  h.kind = kind;
  h.call = call;
  append_message(out, h, message);
  return true;
}

// --- batches ------------------------------------------------------------------------------

Sent Batch::add(FrameHeader header, capnp::MessageBuilder& message, size_t max_frame) {
  Gather g;
  gather(header, message, g);
  if (g.bytes > max_frame)
    return Sent::too_large;
  size_t first = words_.size();
  words_.resize(first + (g.bytes + 7) / 8);
  auto* out = reinterpret_cast<char*>(words_.data() + first);
  for (int i = 0; i < g.count; ++i) {
    std::memcpy(out, g.iov[i].iov_base, g.iov[i].iov_len);
    out += g.iov[i].iov_len;
  }
  frames_.emplace_back(first, g.bytes);
  return Sent::sent;
}

Sent Batch::add_request(uint64_t call, uint8_t lane, const HttpRequest& request,
                        size_t max_frame) {
  return with_request(call, lane, request, max_frame,
                      [&](FrameHeader h, capnp::MessageBuilder& message) {
                        return add(h, message, max_frame);
                      });
}

Sent Batch::add_answer(uint64_t call, const HttpResponse& answer, size_t max_frame) {
  size_t bytes = answer_bytes(answer);
  if (bytes + sizeof(FrameHeader) > max_frame)
    return Sent::too_large;
  capnp::MallocMessageBuilder message(estimate_words(bytes, answer.headers.size()));
  build_answer(message, answer);
  FrameHeader h;
  h.kind = Kind::answer;
  h.call = call;
  return add(h, message, max_frame);
}

uint64_t Batch::call(size_t i) const {
  return reinterpret_cast<const FrameHeader*>(words_.data() + frames_[i].first)->call;
}

Sent Batch::flush(int fd, int flags) {
  constexpr size_t kPerCall = 64;  // messages per sendmmsg
  iovec iov[kPerCall];
  mmsghdr msgs[kPerCall];
  while (sent_ < frames_.size()) {
    size_t n = std::min(kPerCall, frames_.size() - sent_);
    for (size_t i = 0; i < n; ++i) {
      const auto& [first, bytes] = frames_[sent_ + i];
      iov[i] = {words_.data() + first, bytes};
      msgs[i] = {};
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
    }
    int got = ::sendmmsg(fd, msgs, static_cast<unsigned>(n), flags | MSG_NOSIGNAL);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      return classify(got);
    sent_ += static_cast<size_t>(got);
  }
  return Sent::sent;
}

void Batch::clear() {
  words_.clear();
  frames_.clear();
  sent_ = 0;
}

Status decode_request(const void* payload, size_t bytes, HttpRequest& out) {
  std::string replica_id;
  return decode_request(payload, bytes, out, replica_id);
}

Status decode_request(const void* payload, size_t bytes, HttpRequest& out,
                      std::string& replica_id) {
  return read_payload(payload, bytes, "request", [&](capnp::MessageReader& reader) {
    auto r = reader.getRoot<schema::ChannelRequest>();
    out.method = str(r.getMethod());
    out.path = str(r.getPath());
    out.query = str(r.getQuery());
    out.headers = get_headers(r.getHeaders());
    out.body = str(r.getBody());
    out.request_id = str(r.getRequestId());
    out.timeout_s = r.getTimeoutS();
    replica_id = str(r.getReplicaId());
  });
}

Status decode_answer(const void* payload, size_t bytes, HttpResponse& out) {
  return read_payload(payload, bytes, "answer", [&](capnp::MessageReader& reader) {
    auto a = reader.getRoot<schema::ChannelAnswer>();
    out.status = a.getStatus();
    out.headers = get_headers(a.getHeaders());
    out.body = str(a.getBody());
  });
}

Status decode_refusal(const void* payload, size_t bytes, bool& overloaded, std::string& message) {
  return read_payload(payload, bytes, "refusal", [&](capnp::MessageReader& reader) {
    auto r = reader.getRoot<schema::ChannelRefusal>();
    overloaded = r.getOverloaded();
    message = str(r.getMessage());
  });
}

// --- the process's side ----------------------------------------------------------------

ReplicaEnd::ReplicaEnd(int requests, int inject, std::vector<int> answers, size_t max_frame)
    : requests_(requests), inject_(inject), answers_(std::move(answers)), max_frame_(max_frame) {}

ReplicaEnd::~ReplicaEnd() {
  if (requests_ >= 0)
    ::close(requests_);
  if (inject_ >= 0)
    ::close(inject_);
  close_all(answers_);
}

FrameBuffer::FrameBuffer(size_t max_frame)
    : size_((std::max(max_frame, sizeof(FrameHeader)) + 7) / 8), words_(new uint64_t[size_]) {}

}  // namespace troupe::channel
