#include "replica/handle_transport.hpp"

#include <future>
#include <utility>

namespace troupe::replica {

namespace {

thread_local const std::string* current_id = nullptr;

class ProxyTransport : public HandleTransport {
 public:
  explicit ProxyTransport(ProxyCall call) : call_(std::move(call)) {}

  std::future<Response> call(const std::string& app, const std::string& deployment, Request request,
                             double timeout_s) const override {
    auto promise = std::make_shared<std::promise<Response>>();
    auto future = promise->get_future();
    call_(app, deployment, to_http_request(std::move(request), current_request_id()), timeout_s,
          [promise](HttpResponse answer) { promise->set_value(to_response(std::move(answer))); });
    return future;
  }

 private:
  ProxyCall call_;
};

}  // namespace

std::shared_ptr<const HandleTransport> make_handle_transport(ProxyCall call) {
  return std::make_shared<ProxyTransport>(std::move(call));
}

RequestIdScope::RequestIdScope(const std::string& request_id) : previous_(current_id) {
  current_id = &request_id;
}

RequestIdScope::~RequestIdScope() {
  current_id = previous_;
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
