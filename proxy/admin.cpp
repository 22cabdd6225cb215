// The proxy's own endpoints under /-/: /-/livez (200 while the io thread
// that answers runs), /-/readyz (200 when the node can take traffic: a route
// table held, not drained, not shutting down; else 503 with the reason),
// /-/healthz (an alias of /-/readyz), /-/routes (the route table and the
// replicas' load, JSON) and /-/metrics (Prometheus text). Answered on the io
// thread, never routed.
#include <boost/beast/http/field.hpp>
#include <nlohmann/json.hpp>

#include <caf/event_based_actor.hpp>

#include "proxy/core.hpp"

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
