#include "replica/request_workers.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "replica/batching.hpp"
#include "replica/handle_transport.hpp"
#include "replica/replica_metrics.hpp"
#include "runtime/data_channel.hpp"
#include "runtime/inline_gate.hpp"
#include "runtime/log.hpp"
#include "runtime/loop_takeover.hpp"
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

// Hands `req` to the replica's batcher (Dispatch::batcher, active): the
// request is in the requests in flight (a cancel reaches its control) until
// `answer` has its answer, on the batcher's thread.
void batch_request(const DispatchPtr& d, HttpRequest& req,
                   std::function<void(HttpResponse&&)> answer) {
  auto control = request_control(req.timeout_s);
  const uint64_t key = req.call_key;
  d->inflight.add(key, control);
  d->batcher->submit(std::move(req), std::move(control),
                     [d, key, answer = std::move(answer)](HttpResponse&& out) {
                       d->inflight.remove(key);
                       answer(std::move(out));
                     });
}

bool batching(const Dispatch& d) {
  return d.batcher && d.batcher->active();
}

}  // namespace

caf::behavior request_worker(caf::event_based_actor* self, Instance instance,
                             DispatchPtr dispatch, size_t index) {
  return {
      [=](handle_atom, HttpRequest& req) -> caf::result<HttpResponse> {
        if (batching(*dispatch)) {
          // This request thread stays claimed until the batch answered.
          batch_request(dispatch, req,
                        [dispatch, index, sender = self->current_sender(),
                         mid = self->current_message_id()](HttpResponse&& out) {
                          CafSink(sender, mid).answer(std::move(out));
                          if (dispatch->release(index)) {
                            if (auto replica = dispatch->replica.lock())
                              caf::anon_send(caf::actor_cast<caf::actor>(replica),
                                             done_atom::value);
                          }
                        });
          return caf::delegated<HttpResponse>{};
        }
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

// serve_local for a replica that batches now: the parked request goes to
// the batcher, its answer over CAF.
void batch_local(const DispatchPtr& d, uint64_t token) {
  auto m = d->take(token);
  if (!m)
    return;
  if (!m->content().match_elements<handle_atom, HttpRequest>()) {
    CafSink(m->sender, m->mid).answer(HttpResponse{});
    d->finish();
    return;
  }
  batch_request(d, m->content().get_mutable_as<HttpRequest>(1),
                [d, sender = m->sender, mid = m->mid](HttpResponse&& out) {
                  CafSink(sender, mid).answer(std::move(out));
                  d->finish();
                });
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

namespace {

// The frames one recvmmsg reads from a channel's request socket: every frame
// that waits, up to kRead, after waiting for the first.
class FrameReads {
 public:
  static constexpr size_t kRead = 32;
  explicit FrameReads(size_t max_frame) {
    buffers_.reserve(kRead);
    for (size_t i = 0; i < kRead; ++i)
      buffers_.emplace_back(max_frame);
  }
  // False once the node's end of the channel closed.
  bool read(int fd) {
    for (;;) {
      for (size_t i = 0; i < kRead; ++i) {
        iov_[i] = {buffers_[i].data(), buffers_[i].capacity()};
        msgs_[i] = {};
        msgs_[i].msg_hdr.msg_iov = &iov_[i];
        msgs_[i].msg_hdr.msg_iovlen = 1;
      }
      int got = ::recvmmsg(fd, msgs_, kRead, MSG_WAITFORONE | MSG_TRUNC, nullptr);
      if (got < 0 && errno == EINTR)
        continue;
      count_ = got > 0 ? static_cast<size_t>(got) : 0;
      return got > 0;
    }
  }
  size_t count() const { return count_; }
  channel::FrameBuffer& buffer(size_t i) { return buffers_[i]; }
  // MSG_TRUNC: the frame's real length, also when it did not fit.
  size_t size(size_t i) const { return msgs_[i].msg_len; }

 private:
  std::vector<channel::FrameBuffer> buffers_;
  iovec iov_[kRead];
  mmsghdr msgs_[kRead];
  size_t count_ = 0;
};

// The answers of a replica process's batches, per lane: the batcher's
// thread collects a batch's answers here and sends each lane's with one
// sendmmsg when the batch is answered (Batcher::on_answered), instead of a
// send per answer; then the requests end (Dispatch::finish).
class BatchAnswers {
 public:
  explicit BatchAnswers(const DispatchPtr& d) : d_(d), out_(d->channel->lanes()) {}

  void add(uint8_t lane, uint64_t call, const HttpResponse& answer) {
    auto d = d_.lock();
    if (!d)
      return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto& ch = *d->channel;
    if (out_[lane].add_answer(call, answer, ch.max_frame()) == channel::Sent::too_large)
      channel::send_answer(ch.answer_fd(lane), call, answer, ch.max_frame());
    ++answered_;
  }

  void flush() {
    auto d = d_.lock();
    if (!d)
      return;
    size_t answered = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& ch = *d->channel;
      for (size_t lane = 0; lane < out_.size(); ++lane) {
        if (out_[lane].empty())
          continue;
        out_[lane].flush(ch.answer_fd(lane), 0);  // fails only when the proxy's end is gone
        out_[lane].clear();
      }
      std::swap(answered, answered_);
    }
    for (; answered > 0; --answered)
      d->finish();
  }

 private:
  // Weak: the Dispatch holds the batcher, whose hook holds this object.
  // (A request waiting for its answer holds the Dispatch.)
  const std::weak_ptr<Dispatch> d_;
  std::mutex mutex_;
  std::vector<channel::Batch> out_;
  size_t answered_ = 0;
};

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

namespace {

// The request loop of a replica process: reads every frame that waits with
// one recvmmsg, runs the handlers one after another, and writes the answers
// of each lane with one sendmmsg. While it runs, frames pile up in the
// socket and are taken by the next read without a wake-up, as an event loop
// does; a pool of threads each blocked in recv() costs a thread wake-up
// (and a context switch) per request instead. A streamed answer's producer
// runs on a thread of its own.
//
// A non-blocking handler (Deployment::nonblocking()) always runs on the
// loop, and so do requests that came over CAF (`local` frames). A handler
// that may block (the default) runs on the loop while its calls are short,
// as the node's proxy does with an in-process replica
// (runtime/inline_gate.hpp), under a LoopTakeover
// (runtime/loop_takeover.hpp): a call that blocks for 2 ms has the loop
// taken over by another thread, which sends the answers of the batch so far
// and goes on with the rest; the old thread answers its own request when
// the handler returns, and ends. While the gate is closed, and for requests
// that came over CAF, the loop hands requests to a pool of
// max_ongoing_requests threads (a wake-up each). max_ongoing_requests
// bounds the calls that run, on the loop or not (Dispatch::admit).
class RequestLoop {
 public:
  // `blocking`: the handler may block; `threads`: the pool's (blocking only).
  RequestLoop(Instance instance, DispatchPtr d, bool blocking, size_t threads)
      : instance_(std::move(instance)),
        d_(std::move(d)),
        blocking_(blocking),
        ch_(*d_->channel),
        loops_(1, [this](size_t, bool taking_over) { loop(taking_over); }),
        reads_(ch_.max_frame()),
        out_(ch_.lanes()) {
    for (size_t i = 0; i < threads; ++i)
      pool_.emplace_back([this] { pool_worker(); });
    if (d_->batcher) {
      batch_answers_ = std::make_shared<BatchAnswers>(d_);
      d_->batcher->on_answered([answers = batch_answers_] { answers->flush(); });
    }
  }

  // Until the node's end of the channel closes and every call ended.
  void run() {
    loops_.start();
    loops_.join();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = true;
    }
    queued_.notify_all();
    for (auto& t : pool_)
      t.join();
  }

 private:
  using Clock = std::chrono::steady_clock;

  struct Job {
    bool local = false;
    uint64_t token = 0;  // a local frame's
    HttpRequest req;
    uint8_t lane = 0;
  };

  void loop(bool taking_over) {
    if (taking_over) {
      // The thread before this one is in a call that blocks: its replica's
      // next requests go to the pool for a while, and the answers of the
      // batch so far go now.
      gate_.blocked(running_since_, Clock::now());
      if (d_->metrics)
        d_->metrics->loop_taken_over();
      flush();
    }
    for (;;) {
      if (next_ >= reads_.count()) {
        flush();
        if (!reads_.read(ch_.request_fd()))
          return;
        next_ = 0;
      }
      const size_t i = next_++;
      if (!serve_frame(i))
        return;  // taken over
    }
  }

  // Sends the answers of the batch so far; they are ended once sent (a
  // stopping replica's process may exit after the last).
  void flush() {
    for (size_t lane = 0; lane < out_.size(); ++lane) {
      if (out_[lane].empty())
        continue;
      out_[lane].flush(ch_.answer_fd(lane), 0);  // fails only when the proxy's end is gone
      out_[lane].clear();
    }
    for (; answered_ > 0; --answered_)
      d_->finish();
  }

  // False when the loop was taken over while this thread ran the handler.
  bool serve_frame(size_t i) {
    auto& buffer = reads_.buffer(i);
    const size_t size = reads_.size(i);
    if (size >= sizeof(channel::FrameHeader) && buffer.header().kind == channel::Kind::local) {
      if (batching(*d_)) {
        batch_local(d_, buffer.header().call);
        return true;
      }
      if (!blocking_) {
        serve_local(*instance_, *d_, buffer.header().call);
        return true;
      }
      Job job;
      job.local = true;
      job.token = buffer.header().call;
      to_pool(std::move(job));
      return true;
    }
    HttpRequest req;
    if (!take_request(*d_, buffer, size, req))
      return true;
    const uint8_t lane = buffer.header().lane;
    if (batching(*d_)) {
      // The loop goes on reading while the batch fills; the answer goes
      // from the batcher's thread.
      batch_request(d_, req,
                    [answers = batch_answers_, lane, call = req.call_key](HttpResponse&& out) {
                      answers->add(lane, call, out);
                    });
      return true;
    }
    if (blocking_ && !gate_.open(Clock::now())) {
      Job job;
      job.req = std::move(req);
      job.lane = lane;
      to_pool(std::move(job));
      return true;
    }
    auto control = request_control(req.timeout_s);
    FlowPtr flow = d_->inflight.add(req.call_key, control);
    // On the heap: a streamed answer's producer may keep references into it.
    auto in = std::make_unique<Request>(Request{std::move(req.method), std::move(req.path),
                                                std::move(req.query), std::move(req.headers),
                                                std::move(req.body), control});
    Handled h;
    auto run = [&] {
      RequestIdScope scope(req.request_id, req.timeout_s, control);
      h = run_handler(*instance_, *in, req.request_id, d_->models.get(), d_->metrics.get());
    };
    const auto began = Clock::now();
    running_since_ = began;
    bool owner = true;
    if (blocking_)
      owner = loops_.run_blocking(0, run);
    else
      run();
    if (!owner) {
      // Another thread runs the loop now: this one answers its own request
      // and leaves, touching nothing of the loop's.
      if (h.produce) {
        stream_apart(instance_, d_, std::move(in), std::move(control), std::move(flow),
                     std::move(h), std::move(req), ch_.answer_fd(lane));
        return false;
      }
      d_->inflight.remove(req.call_key);
      channel::send_answer(ch_.answer_fd(lane), req.call_key, h.out, ch_.max_frame());
      d_->finish();
      return false;
    }
    if (blocking_)
      gate_.record(began, Clock::now());
    if (h.produce) {
      stream_apart(instance_, d_, std::move(in), std::move(control), std::move(flow),
                   std::move(h), std::move(req), ch_.answer_fd(lane));
      return true;
    }
    d_->inflight.remove(req.call_key);
    if (out_[lane].add_answer(req.call_key, h.out, ch_.max_frame()) == channel::Sent::too_large)
      channel::send_answer(ch_.answer_fd(lane), req.call_key, h.out, ch_.max_frame());
    ++answered_;
    return true;
  }

  void to_pool(Job job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    queued_.notify_one();
  }

  void pool_worker() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        queued_.wait(lock, [&] { return closed_ || !jobs_.empty(); });
        if (jobs_.empty())
          return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      if (job.local) {
        serve_local(*instance_, *d_, job.token);
        continue;
      }
      ChannelSink sink(ch_.answer_fd(job.lane), job.req.call_key, ch_.max_frame());
      serve(*instance_, job.req, d_->models.get(), d_->metrics.get(), d_->inflight, sink);
      d_->finish();
    }
  }

  const Instance instance_;
  const DispatchPtr d_;
  const bool blocking_;
  channel::ReplicaEnd& ch_;
  local::InlineGate gate_;
  LoopTakeover loops_;
  // The loop's state: touched by the thread that runs the loop only.
  FrameReads reads_;
  size_t next_ = 0;  // the next frame of reads_ to serve
  std::vector<channel::Batch> out_;
  size_t answered_ = 0;  // requests whose answer is in out_
  // With a batcher: where its answers wait for the end of their batch.
  std::shared_ptr<BatchAnswers> batch_answers_;
  Clock::time_point running_since_;
  // The pool.
  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<Job> jobs_;
  bool closed_ = false;
  std::vector<std::thread> pool_;
};

}  // namespace

void channel_loop(Instance instance, DispatchPtr d) {
  RequestLoop(std::move(instance), std::move(d), false, 0).run();
}

void channel_blocking_loop(Instance instance, DispatchPtr d, size_t threads) {
  RequestLoop(std::move(instance), std::move(d), true, threads).run();
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
