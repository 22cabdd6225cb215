// Deployment handle calls (Proxy::caller(), and (call, ...) requests from
// other processes through the proxy actor): a call becomes a Call with a
// synthetic Exchange and takes the data path of HTTP requests unchanged.
#include "proxy/handle_calls.hpp"

#include <deque>
#include <functional>

#include <boost/asio/post.hpp>
#include <boost/beast/core/string.hpp>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "proxy/call.hpp"
#include "proxy/core.hpp"

namespace troupe::proxy {

using nlohmann::json;

namespace {

// The Exchange of a deployment handle's call: no socket; the answer goes to
// the caller's callback. Destroyed unanswered (the proxy stopped with the
// call queued or in flight), it answers 503 so the caller never waits forever.
class HandleExchange : public Exchange {
 public:
  explicit HandleExchange(Proxy::CallDone done) : done_(std::move(done)) {}
  ~HandleExchange() override {
    if (done_) {
      HttpResponse r;
      r.status = 503;
      r.headers = {{"Content-Type", "application/json"}, {"Retry-After", "1"}};
      r.body =
          json{{"error", "the proxy of this node stopped before the call was answered"}}.dump();
      answer(std::move(r));
    }
  }
  void bind(size_t thread, asio::io_context* io) {
    thread_ = thread;
    io_ = io;
  }
  Request& request() override { return request_; }
  void respond(Response&& response) override {
    HttpResponse r;
    r.status = response.result_int();
    for (const auto& f : response)
      r.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    r.body = std::move(response.body());
    answer(std::move(r));
  }
  size_t thread() const override { return thread_; }
  asio::io_context& io() override { return *io_; }

 private:
  void answer(HttpResponse r) {
    auto done = std::move(done_);
    done_ = nullptr;
    if (done)
      done(std::move(r));
  }
  Proxy::CallDone done_;
  Request request_;  // method and target, for log lines
  size_t thread_ = 0;
  asio::io_context* io_ = nullptr;
};

// The Exchange of a handle call from another process whose answer is relayed
// as the callee streams it (relay_call): a whole answer goes as the response,
// a stream's head too, then its pieces as (chunk, ...) messages to the
// caller; a piece is released to the callee (`written`) when the caller
// acknowledges it. Lives on its worker's io thread.
class RelayExchange : public Exchange,
                      public Relay,
                      public std::enable_shared_from_this<RelayExchange> {
 public:
  explicit RelayExchange(const caf::mailbox_element& m) : reply_(m), caller_(m.sender) {}
  ~RelayExchange() override {
    if (!answered_) {
      HttpResponse r;
      r.status = 503;
      r.headers = {{"Content-Type", "application/json"}, {"Retry-After", "1"}};
      r.body =
          json{{"error", "the proxy of this node stopped before the call was answered"}}.dump();
      reply_.send(std::move(r));
    }
  }
  void bind(IoThread* w) {
    worker_ = w;
    key_ = w->new_key();
  }
  Request& request() override { return request_; }
  size_t thread() const override { return worker_->index; }
  asio::io_context& io() override { return *worker_->io; }

  void respond(Response&& response) override {
    answered_ = true;
    reply_.send(to_http(response));
  }
  void begin_stream(Response&& head) override {
    answered_ = true;
    streaming_ = true;
    worker_->relays[key_] = shared_from_this();
    auto r = to_http(head);
    r.body.clear();
    r.stream = key_;
    // From the companion: the caller sends its credits there.
    reply_.send(std::move(r), worker_->companion->ctrl());
  }
  void write_chunk(std::string data, std::function<void(bool)> written) override {
    if (!streaming_ || !caller_) {
      written(false);
      return;
    }
    sent_ += data.size();
    unacknowledged_.emplace_back(sent_, std::move(written));
    caller_->enqueue(worker_->companion->ctrl(), caf::make_message_id(),
                     caf::make_message(chunk_atom::value, key_, seq_++, std::move(data)),
                     nullptr);
  }
  void end_stream(bool complete) override {
    if (!streaming_)
      return;
    streaming_ = false;
    worker_->relays.erase(key_);
    if (caller_) {
      caller_->enqueue(worker_->companion->ctrl(), caf::make_message_id(),
                       caf::make_message(chunk_atom::value, key_, seq_++, complete,
                                         std::string(complete ? "" : "the stream ended early")),
                       nullptr);
    }
    // The callbacks hold the call: release them.
    auto pending = std::move(unacknowledged_);
    for (auto& [end, written] : pending)
      written(false);
  }
  void on_client_gone(std::function<void()> f) override { gone_ = std::move(f); }

  void credit(uint64_t bytes) override {
    acknowledged_ += bytes;
    while (!unacknowledged_.empty() && unacknowledged_.front().first <= acknowledged_) {
      auto written = std::move(unacknowledged_.front().second);
      unacknowledged_.pop_front();
      written(true);
    }
  }
  void cancel() override {
    if (auto f = std::move(gone_))
      f();
  }

 private:
  static HttpResponse to_http(Response& response) {
    HttpResponse r;
    r.status = response.result_int();
    for (const auto& f : response)
      r.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    r.body = std::move(response.body());
    return r;
  }

  ReplyTo reply_;
  caf::strong_actor_ptr caller_;
  IoThread* worker_ = nullptr;
  uint64_t key_ = 0;
  uint64_t seq_ = 0;
  bool answered_ = false;
  bool streaming_ = false;
  uint64_t sent_ = 0;
  uint64_t acknowledged_ = 0;
  // (bytes sent up to and including the piece, its callback)
  std::deque<std::pair<uint64_t, std::function<void(bool)>>> unacknowledged_;
  std::function<void()> gone_;
  Request request_;  // method and target, for log lines
};

}  // namespace

void relay_call(Proxy::Core& core, const std::string& app, const std::string& deployment,
                HttpRequest request, double timeout_s, const caf::mailbox_element& m) {
  core.start_handle_call(app, deployment, std::move(request), timeout_s, [&m](IoThread* w) {
    auto ex = std::make_shared<RelayExchange>(m);
    if (w)
      ex->bind(w);
    return ex;
  });
}

void Proxy::Core::cancel_handle_call(uint64_t key) {
  for (auto& w : workers) {
    post(w->io, [w = w.get(), key] {
      auto it = w->handle_calls.find(key);
      if (it == w->handle_calls.end())
        return;
      auto c = it->second.lock();
      w->handle_calls.erase(it);
      if (c)
        client_gone(c);
    });
  }
}

void relay_credit(IoThread* w, uint64_t key, uint64_t bytes) {
  auto it = w->relays.find(key);
  if (it == w->relays.end())
    return;
  if (auto relay = it->second.lock())
    relay->credit(bytes);
}

void relay_cancel(IoThread* w, uint64_t key) {
  auto it = w->relays.find(key);
  if (it == w->relays.end())
    return;
  if (auto relay = it->second.lock())
    relay->cancel();
}

void Proxy::Core::call(const std::string& app, const std::string& deployment, HttpRequest request,
                       double timeout_s, CallDone done) {
  auto shared_done = std::make_shared<CallDone>(std::move(done));
  start_handle_call(app, deployment, std::move(request), timeout_s, [shared_done](IoThread* w) {
    auto ex = std::make_shared<HandleExchange>(std::move(*shared_done));
    if (w)
      ex->bind(w->index, w->io);
    return ex;
  });
}

void Proxy::Core::start_handle_call(const std::string& app, const std::string& deployment,
                                    HttpRequest request, double timeout_s,
                                    const std::function<ExchangePtr(IoThread*)>& make) {
  auto start = Clock::now();
  IoThread* w = nullptr;
  {
    // Under the mutex stop() takes first: nothing is posted to an io_context
    // that is going away.
    std::lock_guard<std::mutex> lock(actor_mutex);
    if (stopped || workers.empty()) {
      make(nullptr);  // unbound, it answers 503 as it goes
      return;
    }
    w = workers[next_call_worker.fetch_add(1, std::memory_order_relaxed) % workers.size()].get();
    ExchangePtr ex = make(w);
    metrics.request_started();
    asio::post(*w->io, [this, w, ex, app, deployment, request = std::move(request), timeout_s,
                        start]() mutable {
      auto c = std::make_shared<Call>();
      c->handle_route = std::make_shared<Route>(
          Route{std::string(), app, deployment, deployment_key(app, deployment)});
      c->route = c->handle_route.get();
      // A call to the application's ingress follows its traffic split, like
      // an HTTP request to the application.
      auto table = router.routes();
      // The application's route when the call is to its ingress: its split
      // and its shadows apply.
      const Route* app_route = table->find_app(app);
      if (app_route && app_route->deployment != deployment)
        app_route = nullptr;
      if (const Route* r = app_route; r && !r->split.empty()) {
        const std::string* key = nullptr;
        if (!r->split_key_header.empty()) {
          for (const auto& [name, value] : request.headers) {
            if (boost::beast::iequals(name, r->split_key_header)) {
              key = &value;
              break;
            }
          }
        }
        c->route = &pick_target(*r, key ? key_point(*key)
                                        : SplitRandom::thread_local_instance().next());
        c->routes = table;
      }
      c->worker = w;
      c->start = start;
      if (request.method.empty())
        request.method = "GET";
      if (request.path.empty() || request.path[0] != '/')
        request.path = "/" + request.path;
      if (!valid_request_id(request.request_id))
        request.request_id = w->new_request_id();
      auto& shown = ex->request();
      shown.method_string(request.method);
      shown.target("handle:" + deployment + request.path);
      c->exchange = std::move(ex);
      c->caller_key = request.call_key;
      if (c->caller_key != 0)
        w->handle_calls[c->caller_key] = c;
      c->request = std::move(request);
      if (!router.has_routes()) {
        auto r =
            json_error(http::status::service_unavailable,
                       "this node has no route table yet; retry shortly", c->request.request_id);
        r.set(http::field::retry_after, "1");
        finish(c, std::move(r));
        return;
      }
      double deadline_s = timeout_s > 0 ? timeout_s : request_timeout_s();
      // A caller that gives up (a relayed stream's reader cancels) cancels
      // the call like an HTTP client that leaves.
      c->exchange->on_client_gone([weak = std::weak_ptr<Call>(c)] {
        if (auto call = weak.lock())
          client_gone(call);
      });
      start_call(c, w, start, deadline_s);
      if (app_route && !app_route->shadow.empty())
        send_shadows(w, *app_route, table, c->request, deadline_s);
    });
  }
}

void ReplyTo::send(HttpResponse answer, caf::strong_actor_ptr from) {
  auto msg = caf::make_message(std::move(answer));
  if (!stages_.empty()) {
    // Forwarded with stages left: the next stage receives the answer as the
    // request (what response_promise::deliver does).
    auto next = std::move(stages_.back());
    stages_.pop_back();
    next->enqueue(
        caf::make_mailbox_element(std::move(sender_), mid_, std::move(stages_), std::move(msg)),
        nullptr);
    return;
  }
  if (sender_ && mid_.is_request())
    sender_->enqueue(std::move(from), mid_.response_id(), std::move(msg), nullptr);
  sender_ = nullptr;
}

void forget_ended_handle_calls(IoThread* w) {
  for (auto it = w->handle_calls.begin(); it != w->handle_calls.end();) {
    if (it->second.expired())
      it = w->handle_calls.erase(it);
    else
      ++it;
  }
}

}  // namespace troupe::proxy
