// Deployment handle calls (Proxy::caller(), and (call, ...) requests from
// other processes through the proxy actor): a call becomes a Call with a
// synthetic Exchange and takes the data path of HTTP requests unchanged.
#include "proxy/handle_calls.hpp"

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

}  // namespace

void Proxy::Core::call(const std::string& app, const std::string& deployment, HttpRequest request,
                       double timeout_s, CallDone done) {
  auto start = Clock::now();
  auto ex = std::make_shared<HandleExchange>(std::move(done));
  Worker* w = nullptr;
  {
    // Under the mutex stop() takes first: nothing is posted to an io_context
    // that is going away.
    std::lock_guard<std::mutex> lock(actor_mutex);
    if (stopped || workers.empty())
      return;  // `ex` answers 503 as it goes
    w = workers[next_call_worker.fetch_add(1, std::memory_order_relaxed) % workers.size()].get();
    ex->bind(w->index, w->io);
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
      start_call(c, w, start, deadline_s);
      if (app_route && !app_route->shadow.empty())
        send_shadows(w, *app_route, table, c->request, deadline_s);
    });
  }
}

void ReplyTo::send(HttpResponse answer) {
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
    sender_->enqueue(nullptr, mid_.response_id(), std::move(msg), nullptr);
  sender_ = nullptr;
}

}  // namespace troupe::proxy
