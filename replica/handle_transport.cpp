#include "replica/handle_transport.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <random>
#include <utility>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "runtime/log.hpp"

namespace troupe::replica {

namespace {

thread_local const std::string* current_id = nullptr;
thread_local std::chrono::steady_clock::time_point current_deadline_at =
    std::chrono::steady_clock::time_point::max();
thread_local std::shared_ptr<RequestControl> current_control_at;

// A random call key per handle call (never 0).
uint64_t new_call_key() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  uint64_t key = 0;
  while (key == 0)
    key = rng();
  return key;
}

// How much longer than the call's own timeout the request to the proxy may
// take (the proxy answers 504 at the call's timeout; this covers the way
// there and back).
constexpr double kRemoteCallMargin_s = 5;
// The bound of a call without a timeout of its own (the proxy applies the
// application's request timeout, or none): the proxy's default
// max_request_time_s plus the margin.
constexpr double kRemoteCallBound_s = 3600 + kRemoteCallMargin_s;

// A JSON error answer like the proxy's own (proxy/call.cpp: json_error).
HttpResponse error_answer(int32_t status, const std::string& message,
                          const std::string& request_id) {
  HttpResponse r;
  r.status = status;
  r.headers = {{"Content-Type", "application/json"}};
  if (status == 503)
    r.headers.emplace_back("Retry-After", "1");
  if (!request_id.empty())
    r.headers.emplace_back("X-Request-Id", request_id);
  r.body = nlohmann::json{{"error", message}, {"request_id", request_id}}.dump();
  return r;
}

// The reading end of a streaming handle call: what the caller's actor
// receives, queued for the user's thread. Thread-safe.
class RemoteStream : public StreamSource {
 public:
  // From the caller's actor.
  void head(HttpResponse& r, caf::strong_actor_ptr relay) {
    std::lock_guard<std::mutex> lock(mutex_);
    status_ = r.status;
    headers_ = std::move(r.headers);
    key_ = r.stream;
    relay_ = caf::actor_cast<caf::actor>(relay);
    has_head_ = true;
    if (r.stream == 0) {
      // A whole answer: one piece, and the end.
      if (!r.body.empty())
        pieces_.push_back(std::move(r.body));
      ended_ = true;
      complete_ = true;
    }
    changed_.notify_all();
  }
  void piece(std::string& data) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!cancelled_)
      pieces_.push_back(std::move(data));
    changed_.notify_all();
  }
  void end(bool complete) {
    std::lock_guard<std::mutex> lock(mutex_);
    ended_ = true;
    complete_ = complete;
    changed_.notify_all();
  }
  // The call failed before a head: the error answer is the whole answer.
  void fail(HttpResponse r) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (has_head_) {
      ended_ = true;  // mid-stream: the stream breaks
      changed_.notify_all();
      return;
    }
    lock_free_head(std::move(r));
  }
  bool ended() {
    std::lock_guard<std::mutex> lock(mutex_);
    return ended_;
  }
  void set_actor(caf::actor a) {
    std::lock_guard<std::mutex> lock(mutex_);
    actor_ = std::move(a);
  }
  // How to cancel the call before its head named a relay.
  void set_cancel(std::function<void()> f) {
    std::lock_guard<std::mutex> lock(mutex_);
    cancel_call_ = std::move(f);
  }

  int status() override {
    wait_head();
    return status_;
  }
  const Headers& headers() override {
    wait_head();
    return headers_;
  }
  bool next(std::string& chunk) override {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return !pieces_.empty() || ended_ || cancelled_; });
    if (cancelled_ || pieces_.empty())
      return false;
    chunk = std::move(pieces_.front());
    pieces_.pop_front();
    // Taken: the relay may send as much more.
    if (key_ != 0 && relay_)
      caf::anon_send(relay_, credit_atom::value, key_, uint64_t{chunk.size()});
    return true;
  }
  bool complete() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return ended_ && complete_ && !cancelled_ && pieces_.empty();
  }
  void cancel() override {
    caf::actor relay, actor;
    uint64_t key = 0;
    std::function<void()> cancel_call;
    bool ended = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cancelled_)
        return;
      cancelled_ = true;
      pieces_.clear();
      relay = relay_;
      actor = actor_;
      key = key_;
      cancel_call = cancel_call_;
      ended = ended_;
      changed_.notify_all();
    }
    if (key != 0 && relay)
      caf::anon_send(relay, cancel_atom::value, key);
    else if (cancel_call && !ended)
      cancel_call();  // no head yet: through the proxy, by the call's own key
    if (actor)
      caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  }

 private:
  void wait_head() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return has_head_; });
  }
  // With mutex_ held.
  void lock_free_head(HttpResponse r) {
    status_ = r.status;
    headers_ = std::move(r.headers);
    if (!r.body.empty())
      pieces_.push_back(std::move(r.body));
    has_head_ = true;
    ended_ = true;
    complete_ = true;
    changed_.notify_all();
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  bool has_head_ = false;
  int status_ = 0;
  Headers headers_;
  std::deque<std::string> pieces_;
  bool ended_ = false;
  bool complete_ = false;
  bool cancelled_ = false;
  uint64_t key_ = 0;
  caf::actor relay_;
  caf::actor actor_;
  std::function<void()> cancel_call_;
};

class ProxyTransport : public HandleTransport {
 public:
  ProxyTransport(ProxyCall call, ProxyStream stream, ProxyCancel cancel)
      : call_(std::move(call)), stream_(std::move(stream)), cancel_(std::move(cancel)) {}

  std::shared_ptr<StreamSource> stream(const std::string& app, const std::string& deployment,
                                       Request request, double timeout_s) const override {
    if (!stream_)
      return HandleTransport::stream(app, deployment, std::move(request), timeout_s);
    HttpRequest out = to_http_request(std::move(request), current_request_id());
    const double bounded_s = inherited_timeout(timeout_s);
    if (bounded_s < 0) {
      std::promise<Response> late;
      late.set_value(to_response(error_answer(
          504, "request timed out: the calling request's deadline passed", out.request_id)));
      return std::make_shared<detail::WholeAnswer>(late.get_future());
    }
    const uint64_t key = follow_caller(out);
    auto source = stream_(app, deployment, std::move(out), bounded_s);
    if (key != 0) {
      if (auto remote = std::dynamic_pointer_cast<RemoteStream>(source))
        remote->set_cancel([cancel = cancel_, key] { cancel(key); });
    }
    return source;
  }

  std::future<Response> call(const std::string& app, const std::string& deployment, Request request,
                             double timeout_s) const override {
    auto promise = std::make_shared<std::promise<Response>>();
    auto future = promise->get_future();
    HttpRequest out = to_http_request(std::move(request), current_request_id());
    const double bounded_s = inherited_timeout(timeout_s);
    if (bounded_s < 0) {  // the calling request's deadline has passed
      promise->set_value(to_response(error_answer(
          504, "request timed out: the calling request's deadline passed", out.request_id)));
      return future;
    }
    follow_caller(out);
    call_(app, deployment, std::move(out), bounded_s,
          [promise](HttpResponse answer) { promise->set_value(to_response(std::move(answer))); });
    return future;
  }

 private:
  // With a way to cancel: the call gets a key, and the request this thread
  // runs (if any) cancels it when it is cancelled itself. Returns the key
  // (0: none).
  uint64_t follow_caller(HttpRequest& out) const {
    if (!cancel_)
      return 0;
    out.call_key = new_call_key();
    if (auto control = current_control()) {
      // A caller whose deadline passed needs nothing: the call has the same
      // deadline at most, and its proxy answers it 504 by itself.
      std::weak_ptr<RequestControl> weak = control;
      control->on_cancel([cancel = cancel_, key = out.call_key, weak] {
        auto caller = weak.lock();
        if (!caller || !caller->timed_out())
          cancel(key);
      });
    }
    return out.call_key;
  }

  ProxyCall call_;
  ProxyStream stream_;
  ProxyCancel cancel_;
};

}  // namespace

ProxyStream make_remote_proxy_stream(caf::actor_system& sys, HandleCallActor proxy) {
  return [&sys, proxy](const std::string& app, const std::string& deployment, HttpRequest request,
                       double timeout_s) -> std::shared_ptr<StreamSource> {
    auto source = std::make_shared<RemoteStream>();
    std::string id = request.request_id;
    if (!proxy) {
      source->fail(error_answer(503, "no proxy to send the call to", id));
      return source;
    }
    double bound_s = timeout_s > 0 ? timeout_s + kRemoteCallMargin_s : kRemoteCallBound_s;
    auto bound = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::duration<double>(bound_s));
    auto actor = sys.spawn([proxy, app, deployment, request = std::move(request), timeout_s, bound,
                            source, id](caf::event_based_actor* self) mutable -> caf::behavior {
      self->monitor(proxy);
      self->set_down_handler([self, source, id](caf::down_msg&) {
        source->fail(error_answer(503, "the proxy went away before the call's answer ended", id));
        self->quit();
      });
      self->request(proxy, bound, call_atom::value, app, deployment, std::move(request), timeout_s,
                    true)
          .then(
              [self, source](HttpResponse& r) {
                bool whole = r.stream == 0;
                source->head(r, self->current_sender());
                if (whole)
                  self->quit();
                // Else the pieces follow; the relay's io thread sends them.
              },
              [self, source, id](caf::error& err) {
                if (err == caf::sec::request_timeout) {
                  source->fail(error_answer(504, "request timed out", id));
                } else {
                  source->fail(error_answer(
                      503, "the call could not reach the proxy: " + from_caf_error(err).message(),
                      id));
                }
                self->quit();
              });
      return {
          [source](chunk_atom, uint64_t, uint64_t, std::string& data) {
            source->piece(data);
          },
          [self, source](chunk_atom, uint64_t, uint64_t, bool complete, const std::string&) {
            source->end(complete);
            self->quit();
          },
      };
    });
    source->set_actor(actor);
    return source;
  };
}

ProxyCall make_remote_proxy_call(caf::actor_system& sys, HandleCallActor proxy) {
  return [&sys, proxy](const std::string& app, const std::string& deployment, HttpRequest request,
                       double timeout_s, std::function<void(HttpResponse)> done) {
    // `done` runs once: the first of the answer, the error and the proxy's
    // down message takes it.
    auto once = std::make_shared<std::function<void(HttpResponse)>>(std::move(done));
    auto answer = [once](HttpResponse r) {
      auto f = std::move(*once);
      *once = nullptr;
      if (f)
        f(std::move(r));
    };
    std::string id = request.request_id;
    if (!proxy) {
      answer(error_answer(503, "no proxy to send the call to", id));
      return;
    }
    double bound_s = timeout_s > 0 ? timeout_s + kRemoteCallMargin_s : kRemoteCallBound_s;
    auto bound = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::duration<double>(bound_s));
    sys.spawn([proxy, app, deployment, request = std::move(request), timeout_s, bound, answer,
               id](caf::event_based_actor* self) mutable {
      // The proxy's node or process gone: a request in flight to it would
      // neither be answered nor bounced until the timeout.
      self->monitor(proxy);
      self->set_down_handler([self, answer, id](caf::down_msg&) {
        answer(error_answer(503, "the proxy went away before answering the call", id));
        self->quit();
      });
      self->request(proxy, bound, call_atom::value, app, deployment, std::move(request), timeout_s)
          .then(
              [self, answer](HttpResponse& r) {
                answer(std::move(r));
                self->quit();
              },
              [self, answer, id](caf::error& err) {
                if (err == caf::sec::request_timeout) {
                  answer(error_answer(504, "request timed out", id));
                } else {
                  answer(error_answer(
                      503, "the call could not reach the proxy: " + from_caf_error(err).message(),
                      id));
                }
                self->quit();
              });
    });
  };
}

std::shared_ptr<const HandleTransport> make_handle_transport(ProxyCall call, ProxyStream stream,
                                                             ProxyCancel cancel) {
  return std::make_shared<ProxyTransport>(std::move(call), std::move(stream), std::move(cancel));
}

ProxyCancel make_remote_proxy_cancel(HandleCallActor proxy) {
  return [proxy](uint64_t key) {
    if (proxy)
      caf::anon_send(proxy, cancel_atom::value, key);
  };
}

RequestIdScope::RequestIdScope(const std::string& request_id, double timeout_s,
                               std::shared_ptr<RequestControl> control)
    : previous_(current_id),
      previous_log_id_(log::set_request_id(&request_id)),
      previous_deadline_(current_deadline_at),
      previous_control_(std::move(current_control_at)) {
  current_id = &request_id;
  current_control_at = std::move(control);
  if (timeout_s > 0) {
    current_deadline_at = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(timeout_s));
  } else {
    current_deadline_at = std::chrono::steady_clock::time_point::max();
  }
}

RequestIdScope::~RequestIdScope() {
  log::set_request_id(previous_log_id_);
  current_id = previous_;
  current_deadline_at = previous_deadline_;
  current_control_at = std::move(previous_control_);
}

std::shared_ptr<RequestControl> current_control() {
  return current_control_at;
}

std::chrono::steady_clock::time_point current_deadline() {
  return current_deadline_at;
}

double inherited_timeout(double timeout_s) {
  if (current_deadline_at == std::chrono::steady_clock::time_point::max())
    return timeout_s > 0 ? timeout_s : 0;
  const double left =
      std::chrono::duration<double>(current_deadline_at - std::chrono::steady_clock::now()).count();
  if (left <= 0)
    return -1;
  return timeout_s > 0 ? std::min(timeout_s, left) : left;
}

const std::string& current_request_id() {
  static const std::string none;
  return current_id ? *current_id : none;
}

HttpRequest to_http_request(Request request, const std::string& fallback_request_id) {
  HttpRequest out;
  out.request_id = request.header("X-Request-Id");
  if (out.request_id.empty())
    out.request_id = fallback_request_id;
  out.method = std::move(request.method);
  out.path = std::move(request.path);
  out.query = std::move(request.query);
  out.headers = std::move(request.headers);
  out.body = std::move(request.body);
  return out;
}

Response to_response(HttpResponse response) {
  Response out;
  out.status = response.status;
  out.headers = std::move(response.headers);
  out.body = std::move(response.body);
  return out;
}

}  // namespace troupe::replica
