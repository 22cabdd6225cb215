// Requests to this node's replica processes over their data channels
// (runtime/data_channel.hpp): the io thread writes a request frame without
// blocking and reads the answers of its requests on its own lane of the
// channel, by call id (Worker::pending). Part of the call state machine
// (call.hpp): answers, refusals and a closed lane go to on_answer(),
// on_error() and retry() like their CAF counterparts.
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "proxy/call.hpp"
#include "proxy/core.hpp"
#include "runtime/data_channel.hpp"

namespace troupe::proxy {

using nlohmann::json;

namespace {

// Answers in several frames that add up to more than this on one lane end
// the lane: no replica's answers are that large, and a runaway or hostile
// process must not exhaust the node's memory with answers it never ends.
constexpr size_t kMaxChannelAnswer = size_t{1} << 30;

void arm(Worker* w, Lane* lane);

// The lane's replica process closed its end (it exited) or broke the
// protocol: its requests in flight on this io thread will never be answered
// here. Each is a crash of the request, as when the replica's handle goes
// down (see retry()); the first of the two signals to arrive fails it over.
// Not so (`crash` false) when the process said it ends because it was told
// to stop (a `closing` frame): they are placed again as lost requests.
// Later requests to that replica take the CAF path.
void lane_closed(Worker* w, Lane* lane, const std::string& why, bool crash = true) {
  auto ch = lane->channel;
  ch->set_broken();
  std::vector<CallPtr> victims;
  for (auto& [id, c] : w->pending) {
    if (c->slot && c->slot->channel == ch)
      victims.push_back(c);
  }
  w->lanes.erase(ch.get());  // `lane` is gone from here on
  auto* core = w->core;
  if (!victims.empty() || (crash && why != "closed")) {
    core->log->info("data channel of replica {}: {} ({} requests in flight here)", ch->replica_id(),
                    why, victims.size());
  }
  for (auto& c : victims) {
    w->pending.erase(c->channel_call);
    c->channel_call = 0;
    w->untrack(c.get());
    const char* ended = crash ? " died" : " stopped";
    if (c->streaming) {
      stream_lost(c, Outcome::died, "replica " + c->slot->replica_id + ended + " mid-stream");
      continue;
    }
    if (c->done) {
      release(c, Outcome::died);
      continue;
    }
    std::string what = "replica " + c->slot->replica_id + ended;
    c->tried.push_back(c->slot->replica_id);
    release(c, Outcome::died);
    retry(c, what, crash);
  }
}

// A frame of a streamed answer: the head, a chunk or the end. The call stays
// pending (by its key) until the end.
bool on_stream_frame(Worker* w, Lane* lane, const channel::FrameHeader& h, const void* payload,
                     size_t bytes) {
  auto it = w->pending.find(h.call);
  if (it == w->pending.end())
    return true;  // given up here meanwhile; the replica was told to stop
  CallPtr c = it->second;
  if (!c->slot || c->slot->channel != lane->channel) {
    w->core->log->warn("replica {} streamed to a request it was not sent; closing its data channel",
                       lane->channel->replica_id());
    return false;
  }
  if (h.kind == channel::Kind::head) {
    if (c->streaming)
      return false;  // a second head
    HttpResponse head;
    auto st = channel::decode_answer(payload, bytes, head);
    if (!st) {
      w->core->log->warn("replica {}: {}", lane->channel->replica_id(), st.message());
      return false;
    }
    on_stream_head(c, head, false);
    return true;
  }
  if (!c->streaming)
    return false;  // a chunk or an end before the head
  if (h.kind == channel::Kind::chunk) {
    on_stream_chunk(c, std::string(static_cast<const char*>(payload), bytes));
    return true;
  }
  w->pending.erase(it);
  c->channel_call = 0;
  on_stream_end(c, (h.flags & channel::kComplete) != 0,
                std::string(static_cast<const char*>(payload), bytes));
  return true;
}

// One frame from a lane, in w->frame (`size` bytes). False when the replica
// broke the protocol (the lane is closed then).
bool on_frame(Worker* w, Lane* lane, size_t size) {
  auto* core = w->core;
  if (size < sizeof(channel::FrameHeader) || size > w->frame.size() * sizeof(uint64_t))
    return false;
  channel::FrameHeader h = *reinterpret_cast<const channel::FrameHeader*>(w->frame.data());
  if (h.version != channel::kVersion)
    return false;
  const void* payload = w->frame.data() + 2;
  size_t bytes = size - sizeof(channel::FrameHeader);
  if (h.kind == channel::Kind::head || h.kind == channel::Kind::chunk ||
      h.kind == channel::Kind::end)
    return on_stream_frame(w, lane, h, payload, bytes);
  if (h.kind != channel::Kind::answer && h.kind != channel::Kind::refusal)
    return false;
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
  auto it = w->pending.find(h.call);
  if (it == w->pending.end())
    return true;  // failed over or timed out meanwhile
  CallPtr c = it->second;
  if (!c->slot || c->slot->channel != lane->channel) {
    // Only the replica a request went to answers it.
    core->log->warn("replica {} answered a request it was not sent; closing its data channel",
                    lane->channel->replica_id());
    return false;
  }
  w->pending.erase(it);
  c->channel_call = 0;
  if (h.kind == channel::Kind::refusal) {
    bool overloaded = false;
    std::string message;
    auto st = channel::decode_refusal(payload, bytes, overloaded, message);
    if (!st)
      message = st.message();
    if (c->done) {
      late_answer(c, Outcome::refused);
      return true;
    }
    on_error(c, to_caf_error(Status(overloaded ? errc::overloaded : errc::unavailable, message)));
    return true;
  }
  HttpResponse answer;
  auto st = channel::decode_answer(payload, bytes, answer);
  if (c->done) {
    late_answer(c, Outcome::answered);
    return true;
  }
  if (!st) {
    core->log->warn("replica {}: {}", lane->channel->replica_id(), st.message());
    answer = malformed_answer(c, "replica " + lane->channel->replica_id(), st.message());
  }
  on_answer(c, answer);
  return true;
}

// Reads what the lane has (a bounded batch, so that one busy replica does
// not starve the others on this io thread), then waits for more.
void read_lane(Worker* w, Lane* lane) {
  int fd = lane->fd.native_handle();
  size_t capacity = w->frame.size() * sizeof(uint64_t);
  for (int i = 0; i < 64; ++i) {
    ssize_t n = ::recv(fd, w->frame.data(), capacity, MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      break;
    if (n <= 0)
      return lane_closed(w, lane, n == 0 ? "closed" : std::strerror(errno));
    if (static_cast<size_t>(n) == sizeof(channel::FrameHeader) &&
        reinterpret_cast<const channel::FrameHeader*>(w->frame.data())->kind ==
            channel::Kind::closing)
      return lane_closed(w, lane, "stopped on request", false);
    if (!on_frame(w, lane, static_cast<size_t>(n)))
      return lane_closed(w, lane, "protocol error (a malformed frame)");
  }
  arm(w, lane);
}

void arm(Worker* w, Lane* lane) {
  lane->fd.async_wait(asio::posix::descriptor_base::wait_read,
                      [w, lane](const boost::system::error_code& ec) {
                        if (!ec)
                          read_lane(w, lane);
                      });
}

// This io thread's lane of `ch`, opened on first use; null when it cannot be.
Lane* lane_of(Worker* w, const channel::ChannelPtr& ch) {
  auto it = w->lanes.find(ch.get());
  if (it != w->lanes.end())
    return it->second.get();
  if (w->index >= ch->lanes())
    return nullptr;
  int fd = ::fcntl(ch->answer_fd(w->index), F_DUPFD_CLOEXEC, 0);
  if (fd < 0)
    return nullptr;
  if (w->frame.size() * sizeof(uint64_t) < ch->max_frame())
    w->frame.resize((ch->max_frame() + 7) / 8);
  auto lane = std::make_unique<Lane>(ch, *w->io, fd);
  auto* raw = lane.get();
  w->lanes.emplace(ch.get(), std::move(lane));
  arm(w, raw);
  return raw;
}

}  // namespace

namespace {

// Sends the request frames queued in this pass (send_channel). A call whose
// frame the socket does not take goes over CAF, unless it ended meanwhile.
void flush_channels(Worker* w) {
  w->flush_posted = false;
  auto outboxes = std::move(w->outboxes);
  w->outboxes.clear();
  for (auto& [key, box] : outboxes) {
    auto& ch = box.channel;
    auto sent = box.batch.flush(ch->request_fd(), MSG_DONTWAIT);
    size_t done = box.batch.sent_count();
    for (size_t i = 0; i < done; ++i)
      w->core->metrics.sent(true);
    if (sent == channel::Sent::sent)
      continue;
    if (sent == channel::Sent::closed)
      ch->set_broken();
    for (size_t i = done; i < box.calls.size(); ++i) {
      auto& c = box.calls[i];
      auto it = w->pending.find(box.batch.call(i));
      if (it == w->pending.end() || it->second != c)
        continue;  // it ended in this pass (its client left, say)
      w->pending.erase(it);
      c->channel_call = 0;
      w->untrack(c.get());
      send_caf(c);
    }
  }
}

}  // namespace

bool send_channel(const CallPtr& c) {
  auto* w = c->worker;
  const auto& ch = c->slot->channel;
  if (!ch || ch->broken() || !lane_of(w, ch))
    return false;
  uint64_t id = c->key;
  auto& box = w->outboxes[ch.get()];
  if (!box.channel)
    box.channel = ch;
  if (box.batch.add_request(id, static_cast<uint8_t>(w->index), c->request, ch->max_frame()) !=
      channel::Sent::sent)
    return false;
  box.calls.push_back(c);
  if (!w->flush_posted) {
    w->flush_posted = true;
    asio::post(*w->io, [w] { flush_channels(w); });
  }
  c->channel_call = id;
  c->sent_at = Clock::now();
  w->pending.emplace(id, c);
  w->track(c.get());
  return true;
}

}  // namespace troupe::proxy
