#include "replica/request_workers.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <exception>
#include <string>
#include <thread>
#include <utility>
#include <vector>

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
        serve(*instance, req, dispatch->models.get(), dispatch->metrics.get(), dispatch->inflight,
              sink);
        if (dispatch->release(index)) {
          if (auto replica = dispatch->replica.lock())
            caf::anon_send(caf::actor_cast<caf::actor>(replica), done_atom::value);
        }
        return caf::delegated<HttpResponse>{};
      },
  };
}

namespace {

// Serves a `local` frame: a request that came over CAF, parked by the
// dispatch under `token`, answered over CAF.
void serve_local(Deployment& instance, Dispatch& d, uint64_t token) {
  auto m = d.take(token);
  if (!m)
    return;
  CafSink sink(m->sender, m->mid);
  if (m->content().match_elements<handle_atom, HttpRequest>()) {
    serve(instance, m->content().get_mutable_as<HttpRequest>(1), d.models.get(), d.metrics.get(),
          d.inflight, sink);
  } else {
    sink.answer(HttpResponse{});
  }
  d.finish();
}

// A request frame of `size` bytes in `buffer`: decoded into `req` and
// admitted (true), or answered here (false: malformed, the replica is
// stopping, or max_ongoing_requests run). Frames that are not requests, or
// name no lane, are dropped with a warning.
bool take_request(Dispatch& d, const channel::FrameBuffer& buffer, size_t size,
                  HttpRequest& req) {
  auto& ch = *d.channel;
  static auto log = troupe::log::get("replica");
  if (size < sizeof(channel::FrameHeader)) {
    log->warn("replica {}: dropped a channel frame of {} bytes", d.replica_id, size);
    return false;
  }
  const channel::FrameHeader& h = buffer.header();
  if (h.version != channel::kVersion || h.kind != channel::Kind::request ||
      h.lane >= ch.lanes()) {
    log->warn("replica {}: dropped a channel frame (version {}, kind {}, lane {})", d.replica_id,
              h.version, static_cast<int>(h.kind), h.lane);
    return false;
  }
  int answers = ch.answer_fd(h.lane);
  Status decoded =
      size > buffer.capacity()
          ? Status(errc::invalid_argument, "request frame of " + std::to_string(size) +
                                               " bytes exceeds the channel's " +
                                               std::to_string(buffer.capacity()))
          : channel::decode_request(buffer.payload(), size - sizeof(channel::FrameHeader), req);
  if (!decoded) {
    log->warn("replica {}: {}", d.replica_id, decoded.message());
    HttpResponse bad;
    bad.status = 500;
    bad.headers = {{"Content-Type", "application/json"}};
    bad.body = Json{{"error", "replica " + d.replica_id + ": " + decoded.message()}}.dump();
    channel::send_answer(answers, h.call, bad, ch.max_frame());
    return false;
  }
  if (d.stopping.load()) {
    channel::send_refusal(answers, h.call, false, "replica " + d.replica_id + " is stopping",
                          ch.max_frame());
    return false;
  }
  if (!d.admit()) {
    channel::send_refusal(answers, h.call, true,
                          "replica " + d.replica_id + " is at max_ongoing_requests (" +
                              std::to_string(d.limit) + ")",
                          ch.max_frame());
    return false;
  }
  // The proxy names the request by its call key in the frame.
  req.call_key = h.call;
  return true;
}

}  // namespace

// A request thread of a replica with a data channel: blocks in recv() on the
// channel, where the kernel hands each frame to one idle thread, and runs
// the request it got (the thread that reads a request runs it: no hand-off),
// then writes the answer into the lane the request named. Requests that came
// over CAF arrive as `local` frames, and are answered over CAF. Returns when
// the node's end closes.
void channel_worker(Instance instance, DispatchPtr d) {
  auto& ch = *d->channel;
  channel::FrameBuffer buffer(ch.max_frame());
  for (;;) {
    ssize_t n = ::recv(ch.request_fd(), buffer.data(), buffer.capacity(), MSG_TRUNC);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return;
    auto size = static_cast<size_t>(n);
    if (size >= sizeof(channel::FrameHeader) && buffer.header().kind == channel::Kind::local) {
      serve_local(*instance, *d, buffer.header().call);
      continue;
    }
    HttpRequest req;
    if (!take_request(*d, buffer, size, req))
      continue;
    ChannelSink sink(ch.answer_fd(buffer.header().lane), req.call_key, ch.max_frame());
    serve(*instance, req, d->models.get(), d->metrics.get(), d->inflight, sink);
    d->finish();
  }
}

namespace {

// A streamed answer of the request loop: its producer runs on a thread of
// its own (it may block on flow control), as for an inline call.
void stream_apart(Instance instance, DispatchPtr d, std::unique_ptr<Request> in,
                  std::shared_ptr<RequestControl> control, FlowPtr flow, Handled h,
                  HttpRequest req, int answers) {
  std::thread([instance = std::move(instance), d = std::move(d), in = std::move(in),
               control = std::move(control), flow = std::move(flow), h = std::move(h),
               req = std::move(req), answers]() mutable {
    {
      RequestIdScope scope(req.request_id, req.timeout_s, control);
      ChannelSink sink(answers, req.call_key, d->channel->max_frame());
      run_stream(h, req.call_key, *flow, sink, d->metrics.get());
    }
    d->inflight.remove(req.call_key);
    d->finish();
  }).detach();
}

}  // namespace

// The one request thread of a replica process whose deployment declares its
// handler non-blocking: reads every frame the channel holds at once
// (recvmmsg), runs the handlers one after another, and writes the answers of
// each lane with one sendmmsg. While it runs, frames pile up in the socket
// and are taken by the next read without a wake-up, as an event loop does;
// a pool of threads each blocked in recv() costs a thread wake-up (and a
// context switch) per request instead. A streamed answer's producer runs on
// a thread of its own.
void channel_loop(Instance instance, DispatchPtr d) {
  constexpr size_t kRead = 32;  // frames per read
  auto& ch = *d->channel;
  std::vector<channel::FrameBuffer> buffers;
  buffers.reserve(kRead);
  for (size_t i = 0; i < kRead; ++i)
    buffers.emplace_back(ch.max_frame());
  iovec iov[kRead];
  mmsghdr msgs[kRead];
  std::vector<channel::Batch> out(ch.lanes());
  for (;;) {
    for (size_t i = 0; i < kRead; ++i) {
      iov[i] = {buffers[i].data(), buffers[i].capacity()};
      msgs[i] = {};
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
    }
    int got = ::recvmmsg(ch.request_fd(), msgs, kRead, MSG_WAITFORONE | MSG_TRUNC, nullptr);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      return;
    size_t answered = 0;  // admitted requests whose answer is in `out`
    for (int i = 0; i < got; ++i) {
      auto& buffer = buffers[static_cast<size_t>(i)];
      // MSG_TRUNC: the frame's real length, also when it did not fit.
      size_t size = msgs[i].msg_len;
      if (size >= sizeof(channel::FrameHeader) && buffer.header().kind == channel::Kind::local) {
        serve_local(*instance, *d, buffer.header().call);
        continue;
      }
      HttpRequest req;
      if (!take_request(*d, buffer, size, req))
        continue;
      uint8_t lane = buffer.header().lane;
      auto control = request_control(req.timeout_s);
      FlowPtr flow = d->inflight.add(req.call_key, control);
      // On the heap: a streamed answer's producer may keep references into it.
      auto in = std::make_unique<Request>(Request{std::move(req.method), std::move(req.path),
                                                  std::move(req.query), std::move(req.headers),
                                                  std::move(req.body), control});
      Handled h;
      {
        RequestIdScope scope(req.request_id, req.timeout_s, control);
        h = run_handler(*instance, *in, req.request_id, d->models.get(), d->metrics.get());
      }
      if (h.produce) {
        stream_apart(instance, d, std::move(in), std::move(control), std::move(flow),
                     std::move(h), std::move(req), ch.answer_fd(lane));
        continue;
      }
      d->inflight.remove(req.call_key);
      if (out[lane].add_answer(req.call_key, h.out, ch.max_frame()) == channel::Sent::too_large)
        channel::send_answer(ch.answer_fd(lane), req.call_key, h.out, ch.max_frame());
      ++answered;
    }
    for (size_t lane = 0; lane < out.size(); ++lane) {
      if (out[lane].empty())
        continue;
      out[lane].flush(ch.answer_fd(lane), 0);  // fails only when the proxy's end is gone
      out[lane].clear();
    }
    // Counted as ended once their answers are sent: a stopping replica's
    // process may exit after the last.
    for (size_t i = 0; i < answered; ++i)
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
