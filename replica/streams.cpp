#include "replica/streams.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include <caf/all.hpp>

#include "replica/handle_transport.hpp"
#include "replica/replica_metrics.hpp"
#include "runtime/multiplex.hpp"

namespace troupe::replica {

// --- Flow ----------------------------------------------------------------------

Flow::Flow(std::shared_ptr<RequestControl> control, bool windowed)
    : control_(std::move(control)), windowed_(windowed) {}

bool Flow::acquire(size_t bytes) {
  const auto deadline = control_->deadline();
  std::unique_lock<std::mutex> lock(mutex_);
  auto room = [&] {
    return cancelled_ || !windowed_ || unacknowledged_ == 0 ||
           unacknowledged_ + bytes <= kStreamWindow;
  };
  // A receiver that acknowledges nothing for kStallLimit is taken as gone
  // (a proxy whose node vanished sends no cancel).
  auto until = std::min(deadline, RequestControl::Clock::now() + kStallLimit);
  if (!changed_.wait_until(lock, until, room))
    return false;  // the deadline passed, or the stall limit, while the receiver was behind
  if (cancelled_)
    return false;
  unacknowledged_ += bytes;
  lock.unlock();
  return !control_->cancelled();
}

void Flow::grant(uint64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    unacknowledged_ = bytes >= unacknowledged_ ? 0 : unacknowledged_ - bytes;
  }
  changed_.notify_all();
}

void Flow::cancel(bool deadline_passed) {
  // The request is cancelled before a producer waiting here wakes: it tells
  // why it stopped by the request's state.
  control_->cancel(deadline_passed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancelled_ = true;
  }
  changed_.notify_all();
}

// --- Inflight ------------------------------------------------------------------

FlowPtr Inflight::add(uint64_t key, std::shared_ptr<RequestControl> control) {
  auto flow = std::make_shared<Flow>(std::move(control), key != 0);
  if (key == 0)
    return flow;
  std::optional<bool> cancelled;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    flows_[key] = flow;
    if (auto it = early_.find(key); it != early_.end()) {
      cancelled = it->second;
      early_.erase(it);  // its place in early_order_ goes when it is the oldest
    }
  }
  if (cancelled)
    flow->cancel(*cancelled);  // nothing is registered on it yet
  return flow;
}

void Inflight::remove(uint64_t key) {
  if (key == 0)
    return;
  std::lock_guard<std::mutex> lock(mutex_);
  flows_.erase(key);
}

FlowPtr Inflight::find(uint64_t key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = flows_.find(key);
  return it == flows_.end() ? nullptr : it->second;
}

void Inflight::grant(uint64_t key, uint64_t bytes) {
  if (auto flow = find(key))
    flow->grant(bytes);
}

void Inflight::cancel(uint64_t key, bool deadline_passed) {
  FlowPtr flow;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = flows_.find(key); it != flows_.end()) {
      flow = it->second;
    } else if (key != 0 && early_.emplace(key, deadline_passed).second) {
      early_order_.push_back(key);
      while (early_order_.size() > kEarlyKept) {
        early_.erase(early_order_.front());
        early_order_.pop_front();
      }
    }
  }
  // Outside the lock: it runs the user's on_cancel callbacks.
  if (flow)
    flow->cancel(deadline_passed);
}

size_t Inflight::early_size() {
  std::lock_guard<std::mutex> lock(mutex_);
  return early_.size();
}

size_t Inflight::size() {
  std::lock_guard<std::mutex> lock(mutex_);
  return flows_.size();
}

// --- serve ---------------------------------------------------------------------

namespace {

HttpResponse error_answer(const std::string& message) {
  HttpResponse out;
  out.status = 500;
  out.headers = {{"Content-Type", "application/json"}};
  out.body = Json{{"error", message}}.dump();
  return out;
}

// The producer's writer: each piece waits for room in the window, then goes
// to the sink.
class Writer : public StreamWriter {
 public:
  Writer(Flow& flow, Sink& sink) : flow_(flow), sink_(sink) {}
  bool write(std::string_view chunk) override {
    if (broken_)
      return false;
    if (chunk.empty())
      return !flow_.control()->cancelled();
    if (!flow_.acquire(chunk.size()) || !sink_.chunk(chunk)) {
      broken_ = true;
      return false;
    }
    return true;
  }
  bool cancelled() const override { return broken_ || flow_.control()->cancelled(); }
  bool broken() const { return broken_; }

 private:
  Flow& flow_;
  Sink& sink_;
  bool broken_ = false;
};

// Removes the request from the table however serve() ends.
struct Registered {
  Inflight& inflight;
  uint64_t key;
  ~Registered() { inflight.remove(key); }
};

}  // namespace

std::shared_ptr<RequestControl> request_control(double timeout_s) {
  auto deadline = RequestControl::Clock::time_point::max();
  if (timeout_s > 0) {
    deadline = RequestControl::Clock::now() +
               std::chrono::duration_cast<RequestControl::Clock::duration>(
                   std::chrono::duration<double>(timeout_s));
  }
  return std::make_shared<RequestControl>(deadline);
}

Handled run_handler(Deployment& d, const Request& in, const std::string& request_id,
                    const ModelReport* models, ReplicaMetrics* metrics) {
  Handled h;
  auto started = std::chrono::steady_clock::now();
  if (metrics)
    metrics->started();
  try {
    Response r = d.handle(in);
    h.out.status = r.status;
    h.out.headers = std::move(r.headers);
    h.out.body = std::move(r.body);
    h.produce = std::move(r.stream);
  } catch (const std::exception& e) {
    h.out = error_answer(std::string("handler raised: ") + e.what());
  } catch (...) {
    h.out = error_answer("handler raised a non-standard exception");
  }
  if (metrics) {
    metrics->finished(h.out.status >= 500,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
                          .count());
  }
  if (!request_id.empty())
    h.out.headers.emplace_back("X-Request-Id", request_id);
  if (models && models->active() && !in.multiplexed_model_id().empty())
    h.out.headers.emplace_back(multiplex::kHeldModelsHeader, multiplex::encode_held(models->held()));
  return h;
}

void run_stream(Handled& h, uint64_t key, Flow& flow, Sink& sink, ReplicaMetrics* metrics) {
  struct InProgress {
    LoadWindow* load;
    explicit InProgress(LoadWindow* l) : load(l) {
      if (load)
        load->stream_started();
    }
    ~InProgress() {
      if (load)
        load->stream_ended();
    }
  } in_progress(metrics ? &metrics->load() : nullptr);
  h.out.body.clear();
  h.out.stream = key != 0 ? key : 1;
  if (!sink.head(std::move(h.out)))
    return;
  Writer writer(flow, sink);
  try {
    h.produce(writer);
  } catch (const std::exception& e) {
    sink.end(false, std::string("the stream's producer raised: ") + e.what());
    return;
  } catch (...) {
    sink.end(false, "the stream's producer raised a non-standard exception");
    return;
  }
  if (writer.broken())
    sink.end(false, flow.control()->cancelled() ? "cancelled" : "the receiver is gone");
  else
    sink.end(true, "");
}

void serve(Deployment& d, HttpRequest& req, const ModelReport* models, ReplicaMetrics* metrics,
           Inflight& inflight, Sink& sink) {
  auto control = request_control(req.timeout_s);
  FlowPtr flow = inflight.add(req.call_key, control);
  Registered registered{inflight, req.call_key};
  Request in{std::move(req.method), std::move(req.path), std::move(req.query),
             std::move(req.headers), std::move(req.body), control};
  // Handle calls made by handle() (and by a stream's producer) carry this
  // request's id and inherit what is left of its deadline.
  RequestIdScope scope(req.request_id, req.timeout_s, control);
  Handled h = run_handler(d, in, req.request_id, models, metrics);
  if (!h.produce) {
    sink.answer(std::move(h.out));
    return;
  }
  run_stream(h, req.call_key, *flow, sink, metrics);
}

// --- CafSink -------------------------------------------------------------------

void CafSink::answer(HttpResponse&& answer) {
  if (sender_ && request_id_.is_request())
    sender_->enqueue(nullptr, request_id_.response_id(), caf::make_message(std::move(answer)),
                     nullptr);
}

bool CafSink::head(HttpResponse&& head) {
  if (!sender_ || !request_id_.is_request())
    return false;
  key_ = head.stream;
  sender_->enqueue(nullptr, request_id_.response_id(), caf::make_message(std::move(head)),
                   nullptr);
  return true;
}

bool CafSink::chunk(std::string_view data) {
  sender_->enqueue(nullptr, caf::make_message_id(),
                   caf::make_message(chunk_atom::value, key_, seq_++, std::string(data)), nullptr);
  return true;
}

void CafSink::end(bool complete, const std::string& why) {
  sender_->enqueue(nullptr, caf::make_message_id(),
                   caf::make_message(chunk_atom::value, key_, seq_++, complete, why), nullptr);
}

}  // namespace troupe::replica
