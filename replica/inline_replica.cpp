#include "replica/inline_replica.hpp"

#include <thread>
#include <utility>

#include "replica/batching.hpp"
#include "replica/handle_transport.hpp"
#include "replica/streams.hpp"

namespace troupe::replica {

namespace {

// What a streamed answer of an inline call needs on its own thread: the
// request (the producer may hold references into it), the instance (the
// producer may use it; the thread that drops the last reference destroys
// it, never an io thread), and what handle() answered.
struct StreamJob {
  Instance instance;
  DispatchPtr dispatch;
  std::unique_ptr<Request> in;
  std::shared_ptr<RequestControl> control;
  Handled handled;
  uint64_t key = 0;
  std::string request_id;
  double timeout_s = 0;
};

class InlineStream final : public local::PendingStream {
 public:
  explicit InlineStream(std::unique_ptr<StreamJob> job) : job_(std::move(job)) {}

  ~InlineStream() override {
    // Never started: the request ends here, and so does its admission.
    if (job_)
      job_->dispatch->finish();
  }

  void start(caf::strong_actor_ptr sender, caf::message_id request_id) override {
    std::shared_ptr<StreamJob> job(std::move(job_));
    // Registered before the head can reach the proxy: its credits and a
    // cancellation (the client left) find the stream by its key.
    auto flow = job->dispatch->inflight.add(job->key, job->control);
    std::thread([job, flow, sender = std::move(sender), request_id]() mutable {
      {
        RequestIdScope scope(job->request_id, job->timeout_s, job->control);
        CafSink sink(std::move(sender), request_id);
        run_stream(job->handled, job->key, *flow, sink, job->dispatch->metrics.get());
      }
      job->dispatch->inflight.remove(job->key);
      job->dispatch->finish();
    }).detach();
  }

 private:
  std::unique_ptr<StreamJob> job_;
};

}  // namespace

InlineReplica::InlineReplica(Instance instance, DispatchPtr dispatch, bool blocking)
    : instance_(std::move(instance)), dispatch_(std::move(dispatch)), blocking_(blocking) {}

namespace {

// Lets the last reference to a closed replica's instance go on a thread of
// its own (the user's destructor may take long).
void release_elsewhere(Instance instance) {
  if (instance)
    std::thread([gone = std::move(instance)]() mutable { gone.reset(); }).detach();
}

}  // namespace

Deployment* InlineReplica::enter() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_ || !instance_)
    return nullptr;
  ++users_;
  return instance_.get();
}

void InlineReplica::leave() {
  bool wake;
  Instance gone;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    wake = --users_ == 0 && closed_;
    if (wake && blocking_)
      gone = std::move(instance_);
  }
  if (wake)
    idle_.notify_all();
  release_elsewhere(std::move(gone));
}

void InlineReplica::close() {
  Instance gone;  // released after the lock (the request threads hold it too)
  std::unique_lock<std::mutex> lock(mutex_);
  closed_ = true;
  if (blocking_ && users_ != 0)
    return;  // the last call to end lets it go (leave())
  idle_.wait(lock, [&] { return users_ == 0; });
  gone = std::move(instance_);
}

bool InlineReplica::batching() const {
  return dispatch_->batcher && dispatch_->batcher->active();
}

bool InlineReplica::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_;
}

local::InlineResult InlineReplica::serve(const HttpRequest& req, const local::InlineCall& call,
                                         HttpResponse& answer) {
  local::InlineResult result;
  Deployment* user = enter();
  if (!user)
    return result;  // closed
  struct Leave {
    InlineReplica* self;
    ~Leave() { self->leave(); }
  } leave{this};
  auto& d = *dispatch_;
  if (batching())
    return result;  // `closed`: to the request threads, which batch
  if (d.stopping.load()) {
    result.kind = local::InlineResult::stopping;
    result.why = "replica " + d.replica_id + " is stopping";
    return result;
  }
  if (!d.admit()) {
    result.kind = local::InlineResult::overloaded;
    result.why = "replica " + d.replica_id + " is at max_ongoing_requests (" +
                 std::to_string(d.limit) + ")";
    return result;
  }
  auto control = call.control ? call.control : request_control(call.timeout_s);
  // On the heap: a streamed answer's producer may keep references into it.
  auto in = std::make_unique<Request>(
      Request{req.method, req.path, req.query, req.headers, req.body, control});
  Handled h;
  {
    RequestIdScope scope(req.request_id, call.timeout_s, control);
    h = run_handler(*user, *in, req.request_id, d.models.get(), d.metrics.get());
  }
  if (!h.produce) {
    answer = std::move(h.out);
    d.finish();
    result.kind = local::InlineResult::answered;
    return result;
  }
  auto job = std::make_unique<StreamJob>();
  job->instance = instance_;  // not reset while this call is counted in users_
  job->dispatch = dispatch_;
  job->in = std::move(in);
  job->control = std::move(control);
  job->handled = std::move(h);
  job->key = call.key;
  job->request_id = req.request_id;
  job->timeout_s = call.timeout_s;
  result.kind = local::InlineResult::streaming;
  result.stream = std::make_unique<InlineStream>(std::move(job));
  return result;
}

}  // namespace troupe::replica
