// The runtime side of deployment handles (include/troupe/deployment.hpp,
// "Deployment handles"): a HandleTransport that sends each call through this
// node's HTTP proxy (proxy::Proxy::caller()), and the request id of the
// request a replica's request thread is handling, which calls made on that
// thread carry.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <troupe/deployment.hpp>

#include "runtime/wire.hpp"

namespace troupe::replica {

// Routes one call to a replica of (app, deployment); `done` runs exactly once
// with the answer or an error answer. The signature of proxy::Proxy::Caller.
using ProxyCall =
    std::function<void(const std::string& app, const std::string& deployment, HttpRequest request,
                       double timeout_s, std::function<void(HttpResponse)> done)>;

// A transport for ReplicaContext::handles. A call's X-Request-Id is the
// request's own X-Request-Id header when it has one, else the id of the
// request the calling thread handles (RequestIdScope), else none (the proxy
// makes one).
std::shared_ptr<const HandleTransport> make_handle_transport(ProxyCall call);

// While it lives, handle calls made on this thread carry `request_id`. The
// replica's request threads hold one around handle().
class RequestIdScope {
 public:
  explicit RequestIdScope(const std::string& request_id);
  ~RequestIdScope();
  RequestIdScope(const RequestIdScope&) = delete;
  RequestIdScope& operator=(const RequestIdScope&) = delete;

 private:
  const std::string* previous_;
};

// The id set by the innermost RequestIdScope of this thread, or "".
const std::string& current_request_id();

// The Request a handle sends, as the replica that answers it receives it.
HttpRequest to_http_request(Request request, const std::string& fallback_request_id);
Response to_response(HttpResponse response);

}  // namespace troupe::replica
