#include "replica/request_workers.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <exception>
#include <string>

#include <caf/all.hpp>

#include "replica/handle_transport.hpp"
#include "runtime/data_channel.hpp"
#include "runtime/log.hpp"
#include "runtime/multiplex.hpp"
#include "runtime/status.hpp"

namespace troupe::replica {

namespace {

// Answers into the lane of the proxy io thread that sent the request.
class ChannelSink : public Sink {
 public:
  ChannelSink(int fd, uint64_t call, size_t max_frame)
      : fd_(fd), call_(call), max_frame_(max_frame) {}
  void answer(HttpResponse&& answer) override {
    channel::send_answer(fd_, call_, answer, max_frame_);
  }
  bool head(HttpResponse&& head) override {
    if (channel::send_head(fd_, call_, head, max_frame_))
      return true;
    // Headers too large for a frame (or the proxy is gone): a 500 instead.
    HttpResponse bad;
    bad.status = 500;
    bad.headers = {{"Content-Type", "application/json"}};
    bad.body = Json{{"error", "the stream's headers do not fit in a data channel frame"}}.dump();
    channel::send_answer(fd_, call_, bad, max_frame_);
    return false;
  }
  bool chunk(std::string_view data) override {
    return channel::send_chunk(fd_, call_, data.data(), data.size(), max_frame_);
  }
  void end(bool complete, const std::string& why) override {
    channel::send_end(fd_, call_, complete, why, max_frame_);
  }

 private:
  int fd_;
  uint64_t call_;
  size_t max_frame_;
};

}  // namespace

caf::behavior request_worker(caf::event_based_actor* self, Instance instance,
                             DispatchPtr dispatch, size_t index) {
  return {
      [=](handle_atom, HttpRequest& req) -> caf::result<HttpResponse> {
        // Answered by the sink (a stream is more than one message).
        CafSink sink(self->current_sender(), self->current_message_id());
        serve(*instance, req, dispatch->models.get(), dispatch->inflight, sink);
        if (dispatch->release(index)) {
          if (auto replica = dispatch->replica.lock())
            caf::anon_send(caf::actor_cast<caf::actor>(replica), done_atom::value);
        }
        return caf::delegated<HttpResponse>{};
      },
  };
}

// A request thread of a replica with a data channel: blocks in recv() on the
// channel, where the kernel hands each frame to one idle thread, and runs
// the request it got (the thread that reads a request runs it: no hand-off),
// then writes the answer into the lane the request named. Requests that came
// over CAF arrive as `local` frames, and are answered over CAF. Returns when
// the node's end closes.
void channel_worker(Instance instance, DispatchPtr d) {
  auto& ch = *d->channel;
  auto log = troupe::log::get("replica");
  channel::FrameBuffer buffer(ch.max_frame());
  for (;;) {
    ssize_t n = ::recv(ch.request_fd(), buffer.data(), buffer.capacity(), MSG_TRUNC);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return;
    auto size = static_cast<size_t>(n);
    if (size < sizeof(channel::FrameHeader)) {
      log->warn("replica {}: dropped a channel frame of {} bytes", d->replica_id, size);
      continue;
    }
    channel::FrameHeader h = buffer.header();
    if (h.kind == channel::Kind::local) {
      auto m = d->take(h.call);
      if (!m)
        continue;
      CafSink sink(m->sender, m->mid);
      if (m->content().match_elements<handle_atom, HttpRequest>()) {
        serve(*instance, m->content().get_mutable_as<HttpRequest>(1), d->models.get(),
              d->inflight, sink);
      } else {
        sink.answer(HttpResponse{});
      }
      d->finish();
      continue;
    }
    if (h.version != channel::kVersion || h.kind != channel::Kind::request ||
        h.lane >= ch.lanes()) {
      log->warn("replica {}: dropped a channel frame (version {}, kind {}, lane {})", d->replica_id,
                h.version, static_cast<int>(h.kind), h.lane);
      continue;
    }
    int answers = ch.answer_fd(h.lane);
    HttpRequest req;
    Status decoded =
        size > buffer.capacity()
            ? Status(errc::invalid_argument, "request frame of " + std::to_string(size) +
                                                 " bytes exceeds the channel's " +
                                                 std::to_string(buffer.capacity()))
            : channel::decode_request(buffer.payload(), size - sizeof(channel::FrameHeader), req);
    if (!decoded) {
      log->warn("replica {}: {}", d->replica_id, decoded.message());
      HttpResponse bad;
      bad.status = 500;
      bad.headers = {{"Content-Type", "application/json"}};
      bad.body = Json{{"error", "replica " + d->replica_id + ": " + decoded.message()}}.dump();
      channel::send_answer(answers, h.call, bad, ch.max_frame());
      continue;
    }
    if (d->stopping.load()) {
      channel::send_refusal(answers, h.call, false, "replica " + d->replica_id + " is stopping",
                            ch.max_frame());
      continue;
    }
    if (!d->admit()) {
      channel::send_refusal(answers, h.call, true,
                            "replica " + d->replica_id + " is at max_ongoing_requests (" +
                                std::to_string(d->limit) + ")",
                            ch.max_frame());
      continue;
    }
    // The proxy names the request by its call key in the frame.
    req.call_key = h.call;
    ChannelSink sink(answers, h.call, ch.max_frame());
    serve(*instance, req, d->models.get(), d->inflight, sink);
    d->finish();
  }
}

void lane_reader(DispatchPtr d) {
  auto& ch = *d->channel;
  std::vector<pollfd> fds;
  for (size_t i = 0; i < ch.lanes(); ++i)
    fds.push_back(pollfd{ch.answer_fd(i), POLLIN, 0});
  channel::FrameHeader h;
  size_t open = fds.size();
  while (open > 0) {
    int n = ::poll(fds.data(), fds.size(), -1);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return;
    for (auto& p : fds) {
      if (p.fd < 0 || p.revents == 0)
        continue;
      ssize_t got = ::recv(p.fd, &h, sizeof(h), MSG_DONTWAIT | MSG_TRUNC);
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        continue;
      if (got <= 0) {
        p.fd = -1;  // that io thread's end is gone
        --open;
        continue;
      }
      if (static_cast<size_t>(got) != sizeof(h) || h.version != channel::kVersion)
        continue;
      if (h.kind == channel::Kind::credit)
        d->inflight.grant(h.call, h.amount);
      else if (h.kind == channel::Kind::cancel)
        d->inflight.cancel(h.call, h.amount != 0);
    }
  }
}

}  // namespace troupe::replica
