// ChannelPath (paths.hpp): requests to this node's replica processes over
// their data channels (runtime/data_channel.hpp). The io thread writes a
// request frame without blocking and reads the answers of its requests on
// its own lane of the channel, by call id. Answers, refusals and streams go
// the one answer path (on_answer_frame, transport.hpp); a closed lane loses
// its calls (attempt_lost) as a replica's down does.
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proxy/call.hpp"
#include "proxy/core.hpp"
#include "proxy/paths.hpp"
#include "runtime/data_channel.hpp"

namespace troupe::proxy {

namespace {

// Answers in several frames that add up to more than this on one lane end
// the lane: no replica's answers are that large, and a runaway or hostile
// process must not exhaust the node's memory with answers it never ends.
constexpr size_t kMaxChannelAnswer = size_t{1} << 30;

}  // namespace

ChannelPath::~ChannelPath() = default;

// The lane's replica process closed its end (it exited) or broke the
// protocol: its requests in flight on this io thread will never be answered
// here. Each is a crash of the request, as when the replica's handle goes
// down (see retry()); the first of the two signals to arrive fails it over.
// Not so (`crash` false) when the process said it ends because it was told
// to stop (a `closing` frame): they are placed again as lost requests.
// Later requests to that replica take another way.
void ChannelPath::closed(Lane* lane, const std::string& why, bool crash) {
  auto ch = lane->channel;
  ch->set_broken();
  auto victims = calls_.take(ch.get());
  lanes_.erase(ch.get());  // `lane` is gone from here on
  if (!victims.empty() || (crash && why != "closed")) {
    t_.core->log->info("data channel of replica {}: {} ({} requests in flight here)",
                       ch->replica_id(), why, victims.size());
  }
  for (auto& c : victims) {
    owed_.erase(c->key);
    attempt_lost(c, Outcome::died, "replica " + c->slot->replica_id + (crash ? " died" : " stopped"),
                 crash);
  }
}

// One frame from a lane (`size` bytes at `frame`). False when the replica
// broke the protocol (the lane is closed then).
bool ChannelPath::on_frame(Lane* lane, const uint64_t* frame, size_t size) {
  if (size < sizeof(channel::FrameHeader) || size > frames_.capacity())
    return false;
  channel::FrameHeader h = *reinterpret_cast<const channel::FrameHeader*>(frame);
  if (h.version != channel::kVersion)
    return false;
  const void* payload = frame + 2;
  size_t bytes = size - sizeof(channel::FrameHeader);
  const std::string sender = "replica " + lane->channel->replica_id();
  if (h.kind != channel::Kind::answer && h.kind != channel::Kind::refusal &&
      h.kind != channel::Kind::head && h.kind != channel::Kind::chunk &&
      h.kind != channel::Kind::end)
    return false;  // not what a replica process sends on its lane
  if (h.kind != channel::Kind::answer && h.kind != channel::Kind::refusal)
    return on_answer_frame(calls_, lane->channel.get(), sender, h, payload, bytes);
  auto part = lane->partial.find(h.call);
  if ((h.flags & channel::kMore) != 0 || part != lane->partial.end()) {
    if (part == lane->partial.end())
      part = lane->partial.emplace(h.call, Lane::Partial{}).first;
    auto& p = part->second;
    if (p.bytes % sizeof(uint64_t) != 0 || lane->partial_bytes + bytes > kMaxChannelAnswer)
      return false;
    p.words.resize((p.bytes + bytes + 7) / 8);
    std::memcpy(reinterpret_cast<char*>(p.words.data()) + p.bytes, payload, bytes);
    p.bytes += bytes;
    lane->partial_bytes += bytes;
    if ((h.flags & channel::kMore) != 0)
      return true;
  }
  Lane::Partial whole;
  if (part != lane->partial.end()) {
    whole = std::move(part->second);
    lane->partial.erase(part);
    lane->partial_bytes -= whole.bytes;
    payload = whole.words.data();
    bytes = whole.bytes;
  }
  return on_answer_frame(calls_, lane->channel.get(), sender, h, payload, bytes);
}

// Reads what the lane has (a bounded batch, so that one busy replica does
// not starve the others on this io thread), then waits for more. A replica
// answers the requests of one pass together, so their frames are read with
// one recvmmsg; one that returns fewer frames than it could take emptied the
// socket, and no call is spent to hear EAGAIN.
void ChannelPath::read(Lane* lane) {
  constexpr size_t kBatch = Frames::kBatch;
  const int fd = lane->fd.native_handle();
  mmsghdr msgs[kBatch];
  iovec iov[kBatch];
  for (int calls = 0; calls < 4;) {
    for (size_t i = 0; i < kBatch; ++i) {
      iov[i] = {frames_.buffer(i), frames_.capacity()};
      msgs[i] = {};
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
    }
    // MSG_TRUNC: each frame's real length, also when it did not fit.
    int got = ::recvmmsg(fd, msgs, kBatch, MSG_DONTWAIT | MSG_TRUNC, nullptr);
    if (got < 0 && errno == EINTR)
      continue;
    ++calls;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      break;
    if (got < 0)
      return closed(lane, std::strerror(errno));
    for (int i = 0; i < got; ++i) {
      const size_t n = msgs[i].msg_len;
      const uint64_t* frame = frames_.buffer(static_cast<size_t>(i));
      // A frame is never empty: an empty read is the end of the socket.
      if (n == 0)
        return closed(lane, "closed");
      if (n == sizeof(channel::FrameHeader) &&
          reinterpret_cast<const channel::FrameHeader*>(frame)->kind == channel::Kind::closing)
        return closed(lane, "stopped on request", false);
      if (!on_frame(lane, frame, n))
        return closed(lane, "protocol error (a malformed frame)");
    }
    if (static_cast<size_t>(got) < kBatch)
      break;
  }
  arm(lane);
}

void ChannelPath::arm(Lane* lane) {
  lane->fd.async_wait(asio::posix::descriptor_base::wait_read,
                      [this, lane](const boost::system::error_code& ec) {
                        if (!ec)
                          read(lane);
                      });
}

// This io thread's lane of `ch`, opened on first use; null when it cannot be.
ChannelPath::Lane* ChannelPath::lane_of(const channel::ChannelPtr& ch) {
  auto it = lanes_.find(ch.get());
  if (it != lanes_.end())
    return it->second.get();
  if (t_.index >= ch->lanes())
    return nullptr;
  int fd = ::fcntl(ch->answer_fd(t_.index), F_DUPFD_CLOEXEC, 0);
  if (fd < 0)
    return nullptr;
  frames_.fit(ch->max_frame());
  auto lane = std::make_unique<Lane>(ch, *t_.io, fd);
  auto* raw = lane.get();
  lanes_.emplace(ch.get(), std::move(lane));
  arm(raw);
  return raw;
}

// Sends the request frames queued in this pass (send). A call whose frame
// the socket does not take goes over CAF, unless it ended meanwhile.
void ChannelPath::flush() {
  flush_posted_ = false;
  auto outboxes = std::move(outboxes_);
  outboxes_.clear();
  for (auto& [key, box] : outboxes) {
    auto& ch = box.channel;
    auto sent = box.batch.flush(ch->request_fd(), MSG_DONTWAIT);
    size_t done = box.batch.sent_count();
    for (size_t i = 0; i < done; ++i)
      t_.core->metrics.sent(true);
    if (sent == channel::Sent::sent)
      continue;
    if (sent == channel::Sent::closed)
      ch->set_broken();
    for (size_t i = done; i < box.calls.size(); ++i) {
      auto& c = box.calls[i];
      if (calls_.get(box.batch.call(i)) != c)
        continue;  // it ended in this pass (its client left, say)
      calls_.remove(c->key);
      t_.untrack(c.get());
      t_.caf.send(c);
    }
  }
}

bool ChannelPath::send(const CallPtr& c) {
  const auto& ch = c->slot->channel;
  if (!ch || ch->broken() || !lane_of(ch))
    return false;
  auto& box = outboxes_[ch.get()];
  if (!box.channel)
    box.channel = ch;
  if (box.batch.add_request(c->key, static_cast<uint8_t>(t_.index), c->request,
                            ch->max_frame()) != channel::Sent::sent)
    return false;
  box.calls.push_back(c);
  if (!flush_posted_) {
    flush_posted_ = true;
    asio::post(*t_.io, [this] { flush(); });
  }
  c->via = this;
  c->sent_at = Clock::now();
  calls_.add(c, ch.get());
  t_.track(c.get());
  return true;
}

// The lane of the call's replica process, while this transport carries the
// call (in flight or streaming); -1 otherwise.
int ChannelPath::lane_fd(const CallPtr& c) {
  if (!c->slot || !c->slot->channel || calls_.get(c->key) != c)
    return -1;
  auto it = lanes_.find(c->slot->channel.get());
  return it == lanes_.end() ? -1 : it->second->fd.native_handle();
}

void ChannelPath::retry_credit(uint64_t key) {
  auto& o = owed_[key];
  if (!o.timer)
    o.timer = std::make_unique<asio::steady_timer>(*t_.io);
  o.timer->expires_after(std::chrono::milliseconds(1));
  o.timer->async_wait([this, key](const boost::system::error_code& ec) {
    if (ec)
      return;
    auto it = owed_.find(key);
    if (it == owed_.end() || it->second.bytes == 0)
      return;
    uint64_t bytes = it->second.bytes;
    it->second.bytes = 0;
    if (auto c = calls_.get(key))
      credit(c, bytes);
  });
}

void ChannelPath::credit(const CallPtr& c, uint64_t bytes) {
  int fd = lane_fd(c);
  if (fd < 0)
    return;  // the stream ended (or was given up) meanwhile
  auto sent = channel::send_control(fd, channel::Kind::credit, c->key,
                                    static_cast<uint32_t>(std::min<uint64_t>(bytes, UINT32_MAX)));
  if (sent == channel::Sent::busy) {
    // The process reads its lanes on a thread of its own; a full lane is
    // momentary. Owed, and sent again shortly.
    auto& o = owed_[c->key];
    bool armed = o.bytes > 0;
    o.bytes += bytes;
    if (!armed)
      retry_credit(c->key);
  }
}

void ChannelPath::cancel(const CallPtr& c, bool deadline_passed) {
  // Best effort: a full lane loses it, and the replica sees the deadline or
  // the closed connection's missing credits instead.
  if (int fd = lane_fd(c); fd >= 0)
    (void)channel::send_control(fd, channel::Kind::cancel, c->key, deadline_passed ? 1 : 0);
}

void ChannelPath::forget(const CallPtr& c) {
  if (calls_.get(c->key) == c)
    calls_.remove(c->key);
  owed_.erase(c->key);
}

void ChannelPath::expire(const CallPtr& c) {
  forget(c);
  attempt_expired(c);
}

void ChannelPath::clear() {
  calls_.clear();
  owed_.clear();
  outboxes_.clear();
  lanes_.clear();
}

}  // namespace troupe::proxy
