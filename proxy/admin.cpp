// The proxy's own endpoints under /-/: /-/livez (200 while the io thread
// that answers runs), /-/readyz (200 when the node can take traffic: a route
// table held, not drained, not shutting down; else 503 with the reason),
// /-/healthz (an alias of /-/readyz), /-/routes (the route table and the
// replicas' load, JSON), /-/metrics (Prometheus text), /-/dashboard and
// /-/dashboard/state (the head). Answered on the io thread, never routed.
//
// The admin listener serves them all; the ingress only the probes (livez,
// readyz, healthz), which a load balancer in front of it needs. The admin
// listener's requests are not the service's: they are neither counted in the
// troupe_http_* metrics nor written to the access log (a Prometheus scraping
// every 15 s would otherwise show up as traffic).
#include <boost/beast/http/field.hpp>
#include <nlohmann/json.hpp>

#include <caf/event_based_actor.hpp>

#include "proxy/core.hpp"
#include "proxy/http_fields.hpp"

namespace troupe::proxy {

using nlohmann::json;

namespace {

json routes_json(const Router& router) {
  json routes = json::array();
  for (const auto& r : router.routes()->routes()) {
    json route = {{"prefix", r.prefix}, {"application", r.app}, {"deployment", r.deployment}};
    if (!r.split.empty()) {
      // Each target's share, from the cumulative weights.
      json traffic = json::object();
      double from = 0;
      for (const auto& t : r.split) {
        traffic[t.route->deployment] = t.upto - from;
        from = t.upto;
      }
      route["traffic"] = std::move(traffic);
      if (!r.split_key_header.empty())
        route["traffic_key_header"] = r.split_key_header;
    }
    if (!r.shadow.empty()) {
      json shadow = json::object();
      for (const auto& t : r.shadow)
        shadow[t.route->deployment] = t.probability;
      route["shadow"] = std::move(shadow);
    }
    if (r.open_inference)
      route["open_inference"] = true;
    routes.push_back(std::move(route));
  }
  json deployments = json::array();
  for (const auto& d : router.deployments()) {
    json replicas = json::array();
    for (const auto& r : d.replicas) {
      json replica = {{"id", r.replica_id},
                      {"node", r.node_id},
                      {"local", r.local},
                      {"in_flight", r.in_flight},
                      {"max_ongoing_requests", r.max_ongoing}};
      if (!r.model_ids.empty())
        replica["model_ids"] = r.model_ids;  // model multiplexing
      replicas.push_back(std::move(replica));
    }
    deployments.push_back({{"application", d.app},
                           {"deployment", d.deployment},
                           {"max_queued_requests", d.max_queued},
                           {"queued", d.queued},
                           {"replicas", replicas}});
  }
  return {{"epoch", router.epoch()},
          {"seq", router.seq()},
          {"routes", routes},
          {"deployments", deployments}};
}

}  // namespace

void Proxy::Core::dashboard_state(ExchangePtr exchange, const std::string& id,
                                  std::function<void(Response&&)> done) {
  ControllerActor to;
  {
    std::lock_guard<std::mutex> lock(actor_mutex);
    to = controller;
  }
  auto* io = &exchange->io();
  auto answer = [self = shared_from_this(), io, done](Response&& r) {
    self->post(io, [done, r = std::move(r)]() mutable { done(std::move(r)); });
  };
  if (!to) {
    done(json_error(http::status::service_unavailable, "no controller known yet", id));
    return;
  }
  // A short-lived actor per request: the io thread never waits.
  sys->spawn([to, answer, id](caf::event_based_actor* self) {
    self->request(to, std::chrono::seconds(5), dashboard_atom::value)
        .then(
            [answer](std::string& body) {
              Response r{http::status::ok, 11};
              r.set(http::field::content_type, "application/json");
              r.set(http::field::cache_control, "no-store");
              r.body() = std::move(body);
              answer(std::move(r));
            },
            [answer, id](caf::error& err) {
              answer(json_error(http::status::service_unavailable,
                                "the controller did not answer: " + from_caf_error(err).message(),
                                id));
            });
  });
}

ServerOptions admin_server_defaults() {
  ServerOptions o;
  o.bind = "127.0.0.1";
  o.port = 0;
  o.io_threads = 1;
  o.body_limit = 64u << 10;  // GETs: nothing to upload
  o.idle_timeout_s = 60;
  o.spin_us = 0;  // a few requests a second: block when idle
  return o;
}

bool is_probe(boost::beast::string_view path) {
  return path == "/-/readyz" || path == "/-/healthz" || path == "/-/livez";
}

namespace {

class AdminHandler : public Handler {
 public:
  explicit AdminHandler(Proxy::Core& core) : core_(core) {}

  void on_request(ExchangePtr exchange) override {
    auto& req = exchange->request();
    boost::beast::string_view target = req.target();
    boost::beast::string_view path = target.substr(0, target.find('?'));
    std::string id = kept_request_id(req);
    if (id.empty())
      id = core_.id_prefix + "-admin-" + std::to_string(++next_id_);
    auto respond = [exchange, id](Response&& r) {
      r.set("X-Request-Id", id);
      exchange->respond(std::move(r));
    };
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      auto r = json_error(http::status::method_not_allowed,
                          "the admin port answers GET and HEAD only", id);
      r.set(http::field::allow, "GET, HEAD");
      respond(std::move(r));
      return;
    }
    // Over TLS (off loopback, with --tls-dir) the client certificate's role
    // decides: the dashboard and its state for operators, the rest also for
    // nodes (a Prometheus given a node certificate).
    if (exchange->secure()) {
      const std::string& role = exchange->client_identity();
      const bool dashboard = path == "/-/dashboard" || path == "/-/dashboard/state";
      if (role != "operator" && (dashboard || role != "node")) {
        respond(json_error(http::status::forbidden,
                           role.empty() ? "the admin port needs a certificate of the cluster with "
                                          "a troupe role"
                                        : "'" + std::string(path) +
                                              "' needs an operator certificate; this one has the " +
                                              role + " role",
                           id));
        return;
      }
    }
    if (path == "/-/dashboard/state" && core_.options.dashboard) {
      core_.dashboard_state(exchange, id, respond);
      return;
    }
    if (path.size() < 3 || path.substr(0, 3) != "/-/") {
      respond(json_error(http::status::not_found,
                         "the admin port serves /-/ endpoints only; the applications are on the "
                         "HTTP port",
                         id));
      return;
    }
    respond(admin_response(core_, path, id));
  }

 private:
  Proxy::Core& core_;
  uint64_t next_id_ = 0;  // its one io thread only
};

}  // namespace

std::unique_ptr<Handler> make_admin_handler(Proxy::Core& core) {
  return std::make_unique<AdminHandler>(core);
}

Response admin_response(Proxy::Core& core, boost::beast::string_view path, const std::string& id) {
  Response r{http::status::ok, 11};
  if (path == "/-/readyz" || path == "/-/healthz") {
    std::string why;
    if (core.shutting_down.load())
      why = "node " + core.options.node_id + " is shutting down";
    else if (core.draining.load())
      why = "node " + core.options.node_id + " is drained";
    else if (!core.router.has_routes())
      why = "no route table yet";
    r.result(why.empty() ? http::status::ok : http::status::service_unavailable);
    r.set(http::field::content_type, "text/plain");
    r.body() = why.empty() ? "success" : why;
  } else if (path == "/-/livez") {
    r.set(http::field::content_type, "text/plain");
    r.body() = "alive";
  } else if (path == "/-/routes") {
    r.set(http::field::content_type, "application/json");
    auto body = routes_json(core.router);
    // The timeouts in force here: the deployed http_options', else this
    // node's own (0: no request timeout).
    body["request_timeout_s"] = core.request_timeout_s();
    body["keep_alive_timeout_s"] = core.server->idle_timeout_s();
    r.body() = body.dump();
  } else if (path == "/-/dashboard") {
    if (!core.options.dashboard)
      return json_error(http::status::not_found,
                        "no dashboard on node " + core.options.node_id +
                            ": the head serves it (unless started with --no-dashboard)",
                        id);
    r.set(http::field::content_type, "text/html; charset=utf-8");
    r.set(http::field::cache_control, "no-store");
    r.body() = dashboard_page();
  } else if (path == "/-/metrics") {
    r.set(http::field::content_type, "text/plain; version=0.0.4");
    r.body() = core.metrics.render(core.router.deployments());
  } else {
    return json_error(http::status::not_found, "no such endpoint", id);
  }
  return r;
}

}  // namespace troupe::proxy
