// The runtime side of deployment handles (include/troupe/deployment.hpp,
// "Deployment handles"): a HandleTransport that sends each call through this
// node's HTTP proxy (proxy::Proxy::caller() in the node's process, or
// make_remote_proxy_call() from a replica process), and the request id of the
// request a replica's request thread is handling, which calls made on that
// thread carry.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <troupe/deployment.hpp>

#include "runtime/wire.hpp"

namespace troupe::replica {

// Routes one call to a replica of (app, deployment); `done` runs exactly once
// with the answer or an error answer. The signature of proxy::Proxy::Caller.
using ProxyCall =
    std::function<void(const std::string& app, const std::string& deployment, HttpRequest request,
                       double timeout_s, std::function<void(HttpResponse)> done)>;

// A ProxyCall for a process other than the proxy's (a replica process): each
// call is a CAF request (call, app, deployment, HttpRequest, timeout_s) ->
// HttpResponse to `proxy` (the node's proxy::Proxy::keeper(), or its proxy
// actor), made by a short-lived actor of `sys`. Its timeout is timeout_s +
// 5 s (the proxy answers 504 at timeout_s itself), or 3605 s when timeout_s
// is 0 (the proxy then applies the application's request timeout). `done`
// runs exactly once, on a thread of `sys`: with the proxy's answer (which
// may be its own error answer: 404, 502, 503, 504), or, when the request
// fails, with a JSON error like the proxy's: 504 when it timed out, else 503
// with Retry-After (the proxy is stopped or unreachable; also when `proxy`
// goes down before answering; at once, on the calling thread, when `proxy`
// is invalid). `sys` must outlive the returned function and every call in
// flight.
ProxyCall make_remote_proxy_call(caf::actor_system& sys, HandleCallActor proxy);

// Starts one call whose answer is read as it arrives (DeploymentHandle::
// stream()); the source always ends, with an error answer when the call
// fails.
using ProxyStream = std::function<std::shared_ptr<StreamSource>(
    const std::string& app, const std::string& deployment, HttpRequest request, double timeout_s)>;

// A ProxyStream for a replica process: each call is a CAF request (call,
// app, deployment, HttpRequest, timeout_s, true) to `proxy`, made by an actor
// of `sys` that lives until the answer ended. The proxy answers a whole
// answer as usual, or the head of a stream (HttpResponse::stream), whose
// pieces then come from the proxy's io thread as (chunk, ...) messages; the
// reader acknowledges each piece it took with (credit, key, bytes) to that
// sender, and cancels with (cancel, key). Like make_remote_proxy_call
// otherwise (bounds, errors, the proxy going down).
ProxyStream make_remote_proxy_stream(caf::actor_system& sys, HandleCallActor proxy);

// Cancels the handle call whose HttpRequest::call_key was `key` (chosen by
// the transport): the proxy treats it like an HTTP client that left.
using ProxyCancel = std::function<void(uint64_t key)>;

// A ProxyCancel for a replica process: (cancel, key) to `proxy`.
ProxyCancel make_remote_proxy_cancel(HandleCallActor proxy);

// A transport for ReplicaContext::handles. A call's X-Request-Id is the
// request's own X-Request-Id header when it has one, else the id of the
// request the calling thread handles (RequestIdScope), else none (the proxy
// makes one).
// `stream`: how stream() calls go; without one, stream() reads the whole
// answer of call(). `cancel`: how calls are cancelled; with one, every call
// gets a random call key, and a call made while a request runs (a
// RequestIdScope with its RequestControl) is cancelled when that request is
// (its client left, its deadline passed), so cancellation crosses handles.
std::shared_ptr<const HandleTransport> make_handle_transport(ProxyCall call,
                                                             ProxyStream stream = nullptr,
                                                             ProxyCancel cancel = nullptr);

// While it lives, handle calls made on this thread carry `request_id` and
// inherit the request's deadline, `timeout_s` from now (0: none), and every
// line the thread logs carries `request_id` (runtime/log.hpp): a call
// gets at most the time that is left (less when it asks for less), and one
// made after the deadline passed answers 504 at once. The replica's request
// threads hold one around handle().
class RequestIdScope {
 public:
  // `control`: the request's cancellation, which handle calls made in the
  // scope follow (see make_handle_transport).
  explicit RequestIdScope(const std::string& request_id, double timeout_s = 0,
                          std::shared_ptr<RequestControl> control = nullptr);
  ~RequestIdScope();
  RequestIdScope(const RequestIdScope&) = delete;
  RequestIdScope& operator=(const RequestIdScope&) = delete;

 private:
  const std::string* previous_;
  const std::string* previous_log_id_;
  std::chrono::steady_clock::time_point previous_deadline_;
  std::shared_ptr<RequestControl> previous_control_;
};

// The RequestControl of the innermost RequestIdScope of this thread (null
// when there is none, or it has none).
std::shared_ptr<RequestControl> current_control();

// The id set by the innermost RequestIdScope of this thread, or "".
const std::string& current_request_id();
// The deadline set by the innermost RequestIdScope of this thread;
// time_point::max() when there is none.
std::chrono::steady_clock::time_point current_deadline();
// The timeout a handle call asking for `timeout_s` (0: the callee's own)
// gets under the current deadline: the smaller of the two; 0 when neither
// bounds it; negative when the deadline has passed.
double inherited_timeout(double timeout_s);

// The Request a handle sends, as the replica that answers it receives it.
HttpRequest to_http_request(Request request, const std::string& fallback_request_id);
Response to_response(HttpResponse response);

}  // namespace troupe::replica
