#include "replica/handle_transport.hpp"

#include <algorithm>
#include <chrono>
#include <future>
#include <utility>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

namespace troupe::replica {

namespace {

thread_local const std::string* current_id = nullptr;
thread_local std::chrono::steady_clock::time_point current_deadline_at =
    std::chrono::steady_clock::time_point::max();

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

class ProxyTransport : public HandleTransport {
 public:
  explicit ProxyTransport(ProxyCall call) : call_(std::move(call)) {}

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
    call_(app, deployment, std::move(out), bounded_s,
          [promise](HttpResponse answer) { promise->set_value(to_response(std::move(answer))); });
    return future;
  }

 private:
  ProxyCall call_;
};

}  // namespace

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

std::shared_ptr<const HandleTransport> make_handle_transport(ProxyCall call) {
  return std::make_shared<ProxyTransport>(std::move(call));
}

RequestIdScope::RequestIdScope(const std::string& request_id, double timeout_s)
    : previous_(current_id), previous_deadline_(current_deadline_at) {
  current_id = &request_id;
  if (timeout_s > 0) {
    current_deadline_at = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(timeout_s));
  } else {
    current_deadline_at = std::chrono::steady_clock::time_point::max();
  }
}

RequestIdScope::~RequestIdScope() {
  current_id = previous_;
  current_deadline_at = previous_deadline_;
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
