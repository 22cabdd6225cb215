// The Open Inference Protocol at the ingress (docs/inference.md). The node
// answers the server's own calls (live, ready, metadata) and a model's
// readiness while the application has no replica to ask; the model's calls
// (metadata, ready, infer) go to the application named as the model like any
// request of it (routing, retries, limits, deadlines, cancellation), marked
// with troupe-oip headers (include/troupe/inference.hpp). Over REST the
// deployment's JSON answer goes back as it is; over gRPC the request message
// becomes the REST body on the way in and the answer a message on the way out
// (proxy/oip.hpp), in an Exchange that wraps the call's own.
#include <chrono>
#include <string>
#include <utility>

#include <google/protobuf/stubs/logging.h>
#include <nlohmann/json.hpp>
#include <troupe/inference.hpp>

#include "proxy/call.hpp"
#include "proxy/core.hpp"
#include "proxy/grpc_fields.hpp"
#include "proxy/oip.hpp"
#include "runtime/log.hpp"

namespace troupe::proxy {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// The call's exchange, with the answer turned into what the client's
// transport and the protocol want.
class OipExchange : public Exchange {
 public:
  OipExchange(ExchangePtr inner, oip::Kind kind, bool raw, std::string app, std::string id)
      : inner_(std::move(inner)),
        kind_(kind),
        raw_(raw),
        app_(std::move(app)),
        id_(std::move(id)) {}
  Request& request() override { return inner_->request(); }
  size_t thread() const override { return inner_->thread(); }
  asio::io_context& io() override { return inner_->io(); }
  bool secure() const override { return inner_->secure(); }
  bool grpc() const override { return inner_->grpc(); }
  const std::string& client_identity() const override { return inner_->client_identity(); }
  void on_client_gone(std::function<void()> f) override { inner_->on_client_gone(std::move(f)); }
  bool client_gone() const override { return inner_->client_gone(); }
  // Before the answer is counted: a class that is not a model, the
  // transport's "not ready", and over gRPC the message.
  void shape_answer(Response& r) override {
    shaped_ = true;
    const bool spoke = r.find(kOipHeader) != r.end();
    r.erase(kOipHeader);
    const int status = r.result_int();
    if (!spoke && status / 100 == 2) {
      // A class that is not a troupe::InferenceModel answered the call as a
      // plain request: its answer means nothing here.
      Response e = json_error(http::status::not_implemented,
                              "application '" + app_ +
                                  "' declares open_inference, but its ingress deployment's class "
                                  "does not derive troupe::InferenceModel "
                                  "(include/troupe/inference.hpp)",
                              id_);
      copy_id(r, e);
      r = std::move(e);
      return;
    }
    if (spoke && kind_ == oip::Kind::model_ready && status == 200) {
      bool ready = json::parse(r.body(), nullptr, false).value("ready", false);
      if (inner_->grpc()) {
        r.body() = oip::ready_message(ready);
      } else if (!ready) {
        // The protocol's REST answer for "not ready" is a 4xx.
        r.result(http::status::bad_request);
      }
    } else if (spoke && inner_->grpc() && status == 200) {
      auto message = oip::encode_answer(kind_, r.body(), raw_);
      if (!message) {
        Response e =
            json_error(http::status::internal_server_error, message.status().message(), id_);
        copy_id(r, e);
        r = std::move(e);
        return;
      }
      r.body() = std::move(*message);
    }
  }
  // (A streamed answer is collected by Exchange's default and comes here
  // unshaped.)
  void respond(Response&& r) override {
    if (!shaped_)
      shape_answer(r);
    inner_->respond(std::move(r));
  }

 private:
  static void copy_id(const Response& from, Response& to) {
    if (auto it = from.find("X-Request-Id"); it != from.end())
      to.set("X-Request-Id", it->value());
  }

  ExchangePtr inner_;
  oip::Kind kind_;
  bool raw_;
  std::string app_;
  std::string id_;
  bool shaped_ = false;
};

// Whether a route declares the protocol, and whether any route does.
bool any_model(const RouteTable& table) {
  for (const auto& r : table.routes()) {
    if (r.open_inference)
      return true;
  }
  return false;
}

Response json_answer(const json& body, http::status status = http::status::ok) {
  Response r{status, 11};
  r.set(http::field::content_type, "application/json");
  r.body() = body.dump();
  return r;
}

// An answer of the gRPC port: the message, or the error it maps to.
Response grpc_answer(std::string message) {
  Response r{http::status::ok, 11};
  r.body() = std::move(message);
  return r;
}

}  // namespace

// The protocol's shared part: the node's own answers, the model's route, and
// the call on its way.
struct OipCall {
  Proxy::Core& core;
  ExchangePtr& exchange;
  IoThread* w;
  Clock::time_point start;
  std::string& id;
  std::string method_text;  // for the access log
  std::string path_text;
  bool grpc;

  void answer_local(Response&& r) {
    core.answer_local(*exchange, *w, start, method_text, path_text, id, std::move(r));
  }

  void error(http::status status, const std::string& message) {
    answer_local(json_error(status, message, id));
  }

  // Ready: the node has its route table, is not draining, and every model's
  // application has a replica that passed its health check (Triton's strict
  // readiness: a node a load balancer sends inference to can serve them all).
  bool server_ready(const RouteTable& table) const {
    if (!core.router.has_routes() || core.draining || core.shutting_down)
      return false;
    for (const auto& r : table.routes()) {
      if (r.open_inference && !core.router.has_replica(r.key))
        return false;
    }
    return true;
  }

  // The server's own calls.
  void server(oip::Kind kind, const RouteTable& table) {
    if (kind == oip::Kind::live) {
      answer_local(grpc ? grpc_answer(oip::live_message(true)) : json_answer({{"live", true}}));
    } else if (kind == oip::Kind::ready) {
      bool ready = server_ready(table);
      answer_local(grpc ? grpc_answer(oip::ready_message(ready))
                        : json_answer({{"ready", ready}},
                                      ready ? http::status::ok : http::status::bad_request));
    } else {
      answer_local(grpc ? grpc_answer(oip::server_metadata_message("troupe", TROUPE_VERSION))
                        : json_answer({{"name", "troupe"},
                                       {"version", TROUPE_VERSION},
                                       {"extensions", json::array()}}));
    }
  }

  // A model's call: to the application named as the model.
  void model(oip::Kind kind, std::shared_ptr<const RouteTable> table, const std::string& model,
             const std::string& version, bool raw, std::string path, std::string query) {
    const Route* route = table->find_app(model);
    if (!route || !route->open_inference) {
      error(http::status::not_found,
            route ? "application '" + model +
                        "' is not served by the Open Inference Protocol (it does not declare "
                        "open_inference)"
                  : "no model named '" + model + "' is served here");
      return;
    }
    auto& req = exchange->request();
    const Route* to = &split_target(*route, req);
    if (kind == oip::Kind::model_ready && !core.router.has_replica(to->key)) {
      // Nothing to ask: not ready, without waiting for a replica.
      answer_local(grpc ? grpc_answer(oip::ready_message(false))
                        : json_answer({{"name", model},
                                       {"ready", false},
                                       {"error",
                                        "the application has no replica that passed its "
                                        "health check"}},
                                      http::status::bad_request));
      return;
    }
    auto timeout_s = core.asked_deadline(req, grpc);
    if (!timeout_s) {
      error(http::status::bad_request, timeout_s.status().message());
      return;
    }
    // Only the node marks a call as the protocol's.
    req.set(kOipHeader, oip::call_name(kind));
    req.set(kOipModelHeader, model);
    if (version.empty())
      req.erase(kOipVersionHeader);
    else
      req.set(kOipVersionHeader, version);
    auto wrapped = std::make_shared<OipExchange>(std::move(exchange), kind, raw, route->app, id);
    core.launch(std::move(wrapped), w, start, *route, to, std::move(table), std::move(path),
                std::move(query), *timeout_s, std::move(id));
  }
};

namespace oip {

void route_protobuf_log() {
  // protobuf writes to stderr what it finds wrong in a message it parses
  // (a string field that is not UTF-8, ...): a client could fill the node's
  // log with one line per call. The caller gets the error; the line goes to
  // the debug level.
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel level, const char* file, int line, const std::string& message) {
        static const auto log = troupe::log::get("protobuf");
        if (level >= google::protobuf::LOGLEVEL_FATAL)
          log->critical("{}:{}: {}", file, line, message);
        else
          log->debug("{}:{}: {}", file, line, message);
      });
}

}  // namespace oip

void drop_oip_marks(Request& req) {
  req.erase(kOipHeader);
  req.erase(kOipModelHeader);
  req.erase(kOipVersionHeader);
}

bool Proxy::Core::on_oip_rest(ExchangePtr& exchange, IoThread* w, Clock::time_point start,
                              std::string_view path, std::string_view query, std::string& id) {
  auto table = router.routes();
  if (!any_model(*table))
    return false;
  auto& req = exchange->request();
  OipCall call{*this, exchange, w, start, id, std::string(req.method_string()), std::string(path),
               false};
  auto target = oip::parse_rest(path);
  if (!target) {
    call.error(target.status().code() == errc::not_found ? http::status::not_found
                                                         : http::status::bad_request,
               target.status().message());
    return true;
  }
  const bool post = target->kind == oip::Kind::infer;
  if (req.method() != (post ? http::verb::post : http::verb::get)) {
    auto r = json_error(
        http::status::method_not_allowed,
        std::string("use ") + (post ? "POST" : "GET") + " for '" + std::string(path) + "'", id);
    r.set(http::field::allow, post ? "POST" : "GET");
    call.answer_local(std::move(r));
    return true;
  }
  if (target->model.empty()) {
    call.server(target->kind, *table);
    return true;
  }
  call.model(target->kind, std::move(table), target->model, target->version, false,
             std::string(path), std::string(query));
  return true;
}

bool Proxy::Core::on_oip_grpc(ExchangePtr& exchange, IoThread* w, Clock::time_point start,
                              std::string& id) {
  auto table = router.routes();
  if (!any_model(*table))
    return false;
  auto& req = exchange->request();
  std::string method(req.target());
  OipCall call{*this, exchange, w, start, id, "POST", method, true};
  auto kind = oip::grpc_kind(method);
  if (!kind) {
    call.error(http::status::not_implemented, kind.status().message());
    return true;
  }
  if (*kind == oip::Kind::live || *kind == oip::Kind::ready ||
      *kind == oip::Kind::server_metadata) {
    call.server(*kind, *table);
    return true;
  }
  auto decoded = oip::decode_call(*kind, req.body());
  if (!decoded) {
    call.error(http::status::bad_request, decoded.status().message());
    return true;
  }
  req.body() = std::move(decoded->json);
  call.model(*kind, std::move(table), decoded->model, decoded->version, decoded->raw,
             std::move(method), std::string());
  return true;
}

}  // namespace troupe::proxy
