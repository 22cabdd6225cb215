// Proxy: starts the HTTP server, one worker (companion actor, sweep) per io
// thread, the proxy actor and its keeper; stops them in reverse order. And
// Core::on_request, where an HTTP request becomes a Call (call.hpp). The
// other parts of the proxy: see core.hpp.
#include "proxy/proxy.hpp"

#include <cstdio>
#include <random>

#include <boost/asio/post.hpp>
#include <caf/actor_companion.hpp>
#include <caf/all.hpp>
#include <caf/scoped_execution_unit.hpp>
#include <nlohmann/json.hpp>

#include "proxy/call.hpp"
#include "proxy/core.hpp"
#include "proxy/grpc_fields.hpp"
#include "proxy/handle_calls.hpp"
#include "proxy/oip.hpp"
#include "proxy/tls_context.hpp"

namespace troupe::proxy {

using nlohmann::json;

const Route& split_target(const Route& route, const Request& req) {
  if (route.split.empty())
    return route;
  auto key = route.split_key_header.empty() ? req.end() : req.find(route.split_key_header);
  double point = key != req.end()
                     ? key_point(std::string_view(key->value().data(), key->value().size()))
                     : SplitRandom::thread_local_instance().next();
  return pick_target(route, point);
}

namespace {

// A client may ask for a shorter deadline than the application's
// request_timeout_s (0: none), never a longer one.
double shorter_deadline(double app_s, double asked_s) {
  return !(app_s > 0) || asked_s < app_s ? asked_s : app_s;
}

}  // namespace

Proxy::Core::Core(ProxyOptions o)
    : options(std::move(o)), router(router_options(options)), metrics(options.registry) {}

Proxy::Core::~Core() = default;

RouterOptions Proxy::Core::router_options(const ProxyOptions& o) {
  RouterOptions r;
  r.local_node = o.node_id;
  if (o.channels) {
    r.channel_of = [channels = o.channels](const std::string& replica_id) {
      return channels->find(replica_id);
    };
    r.local_replica_of = [locals = o.channels->local_replicas()](const std::string& replica_id) {
      return locals->find(replica_id);
    };
  }
  return r;
}

void Proxy::Core::log_local(IoThread& w, std::string_view method, std::string_view path,
                            std::string_view id, int status, double seconds) {
  metrics.observe_http("", "", method, status, seconds);
  if (!options.access_log || !options.access_log->wants(status))
    return;
  AccessEntry e;
  e.request_id = id;
  e.method = method;
  e.path = path;
  e.status = status;
  e.seconds = seconds;
  options.access_log->add(e, w.access_batch);
}

void Proxy::Core::answer_local(Exchange& exchange, IoThread& w, Clock::time_point start,
                               std::string_view method, std::string_view path,
                               const std::string& id, Response&& r) {
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  metrics.observe("", r.result_int(), seconds);
  metrics.request_finished();
  log_local(w, method, path, id, r.result_int(), seconds);
  if (exchange.grpc())
    metrics.observe_grpc("", int(grpc::code_for_http(r.result_int())));
  r.set("X-Request-Id", id);
  exchange.respond(std::move(r));
}

void Proxy::Core::on_request(ExchangePtr exchange) {
  auto start = Clock::now();
  metrics.request_started();
  metrics.scheme(exchange->secure());
  auto* w = workers[exchange->thread()].get();
  auto& req = exchange->request();
  boost::beast::string_view target = req.target();
  auto qpos = target.find('?');
  boost::beast::string_view path = target.substr(0, qpos);
  std::string id = kept_request_id(req);
  if (id.empty())
    id = w->new_request_id();
  auto answer_local = [&](Response&& r) {
    this->answer_local(*exchange, *w, start,
                       std::string_view(req.method_string().data(), req.method_string().size()),
                       std::string_view(path.data(), path.size()), id, std::move(r));
  };
  if (exchange->grpc()) {
    if (!oip::is_grpc_method(std::string_view(target.data(), target.size())) ||
        !on_oip_grpc(exchange, w, start, id))
      on_grpc_call(std::move(exchange), w, start, std::move(id));
    return;
  }
  if (oip::is_rest_path(std::string_view(path.data(), path.size())) &&
      on_oip_rest(exchange, w, start, std::string_view(path.data(), path.size()),
                  qpos != boost::beast::string_view::npos
                      ? std::string_view(target.data() + qpos + 1, target.size() - qpos - 1)
                      : std::string_view(),
                  id))
    return;
  if (path.size() >= 3 && path.substr(0, 3) == "/-/") {
    // The ingress answers the probes only; the cluster's state stays on the
    // admin listener.
    if (is_probe(path))
      answer_local(admin_response(*this, path, id));
    else
      answer_local(json_error(http::status::not_found,
                              "'" + std::string(path) +
                                  "' is not served on the ingress: this node's admin port "
                                  "(--admin-port) serves it",
                              id));
    return;
  }
  auto table = router.routes();
  auto match = table->match(std::string_view(path.data(), path.size()));
  if (!match.route) {
    if (!router.has_routes()) {
      // A node that just started has no route table yet: that is not a 404
      // (the path may well be served a moment later); ask the client to retry.
      auto r = json_error(http::status::service_unavailable,
                          "this node has no route table yet; retry shortly", id);
      r.set(http::field::retry_after, "1");
      answer_local(std::move(r));
      return;
    }
    answer_local(json_error(http::status::not_found,
                            "no application serves path '" + std::string(path) + "'", id));
    return;
  }
  if (match.route->open_inference)
    drop_oip_marks(req);
  const Route* to = &split_target(*match.route, req);
  auto timeout_s = asked_deadline(req, false);
  if (!timeout_s) {
    answer_local(json_error(http::status::bad_request, timeout_s.status().message(), id));
    return;
  }
  launch(std::move(exchange), w, start, *match.route, to, std::move(table), std::string(match.rest),
         qpos != boost::beast::string_view::npos ? std::string(target.substr(qpos + 1))
                                                 : std::string(),
         *timeout_s, std::move(id));
}

Result<double> Proxy::Core::asked_deadline(const Request& req, bool grpc) const {
  // A client may ask for a shorter deadline than the application's
  // request_timeout_s, never a longer one.
  double timeout_s = request_timeout_s();
  auto t = req.find(grpc ? boost::beast::string_view("grpc-timeout")
                         : boost::beast::string_view(kRequestTimeoutHeader));
  if (t == req.end())
    return timeout_s;
  auto asked = grpc ? grpc::parse_timeout(std::string_view(t->value().data(), t->value().size()))
                    : parse_request_timeout(t->value());
  if (!asked)
    return asked.status();
  return shorter_deadline(timeout_s, *asked);
}

void Proxy::Core::launch(ExchangePtr exchange, IoThread* w, Clock::time_point start,
                         const Route& route, const Route* to,
                         std::shared_ptr<const RouteTable> table, std::string path,
                         std::string query, double timeout_s, std::string id) {
  auto& req = exchange->request();
  auto c = std::make_shared<Call>();
  c->exchange = std::move(exchange);
  c->worker = w;
  c->route = to;  // kept alive by the table, which owns its split targets
  c->routes = std::move(table);
  c->start = start;
  auto& hr = c->request;
  hr.method = std::string(req.method_string());
  hr.path = std::move(path);
  hr.query = std::move(query);
  hr.headers.reserve(std::distance(req.begin(), req.end()));
  for (const auto& f : req)
    hr.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
  hr.body = std::move(req.body());
  hr.request_id = std::move(id);
  // A client that leaves is not waited for: its call is dropped from the
  // queue, or cancelled at its replica.
  c->exchange->on_client_gone([weak = std::weak_ptr<Call>(c)] {
    if (auto call = weak.lock())
      client_gone(call);
  });
  start_call(c, w, start, timeout_s);
  // Copies to the application's shadows, after the request itself is on its
  // way (its request stays intact in the call for retries).
  if (!route.shadow.empty())
    send_shadows(w, route, c->routes, c->request, timeout_s);
}

void Proxy::Core::on_grpc_call(ExchangePtr exchange, IoThread* w, Clock::time_point start,
                               std::string id) {
  auto& req = exchange->request();
  const std::string method(req.target());
  auto answer_local = [&](Response&& r) {
    this->answer_local(*exchange, *w, start, "POST", method, id, std::move(r));
  };
  // The application: its `application` metadata (Ray Serve's key), else the
  // only one there is.
  auto table = router.routes();
  const Route* route = nullptr;
  if (auto app = req.find(grpc::kApplicationKey); app != req.end()) {
    route = table->find_app(std::string_view(app->value().data(), app->value().size()));
    if (!route) {
      answer_local(json_error(http::status::not_found,
                              "no application named '" + std::string(app->value()) +
                                  "' is served here (metadata '" + grpc::kApplicationKey + "')",
                              id));
      return;
    }
  } else if (table->routes().size() == 1) {
    route = &table->routes().front();
  } else if (!router.has_routes()) {
    auto r = json_error(http::status::service_unavailable,
                        "this node has no route table yet; retry shortly", id);
    answer_local(std::move(r));
    return;
  } else {
    answer_local(json_error(http::status::bad_request,
                            std::to_string(table->routes().size()) +
                                " applications are served here: name one in the metadata '" +
                                grpc::kApplicationKey + "'",
                            id));
    return;
  }
  if (route->open_inference)
    drop_oip_marks(req);
  const Route* to = &split_target(*route, req);
  auto timeout_s = asked_deadline(req, true);
  if (!timeout_s) {
    answer_local(json_error(http::status::bad_request, timeout_s.status().message(), id));
    return;
  }
  launch(std::move(exchange), w, start, *route, to, std::move(table), method, std::string(),
         *timeout_s, std::move(id));
}

Result<std::unique_ptr<Proxy>> Proxy::start(caf::actor_system& sys, ProxyOptions options) {
  auto core = std::make_shared<Core>(std::move(options));
  core->sys = &sys;
  uint64_t key_base = 0;
  {
    std::random_device rd;
    char buf[16];
    std::snprintf(buf, sizeof(buf), "%06x", rd() & 0xffffff);
    core->id_prefix = buf;
    key_base = (uint64_t(rd()) << 32) ^ rd();
  }
  oip::route_protobuf_log();
  core->server = std::make_unique<HttpServer>(core->options.server, *core);
  if (auto st = core->server->listen(); !st)
    return st;
  core->admin = make_admin_handler(*core);
  core->admin_server = std::make_unique<HttpServer>(core->options.admin, *core->admin);
  if (auto st = core->admin_server->listen(); !st)
    return Status(st.code(), "admin listener: " + st.message());
  // Before anything that needs stopping: it accepts once the io threads run.
  if (auto st = open_data_port(*core); !st)
    return st;
  for (size_t i = 0; i < core->server->threads(); ++i) {
    auto w = std::make_unique<IoThread>();
    w->core = core.get();
    w->index = i;
    w->core_key_base = key_base;
    w->io = &core->server->io(i);
    w->unit = std::make_unique<caf::scoped_execution_unit>(&sys);
    w->companion_handle = sys.spawn<caf::actor_companion>();
    w->companion = static_cast<caf::actor_companion*>(
        caf::actor_cast<caf::abstract_actor*>(w->companion_handle));
    w->companion->context(w->unit.get());
    // Besides answers and timeouts, the companion receives the pieces of
    // streamed answers (streams.cpp). (Without a behavior it would terminate
    // after its first answer.)
    IoThread* self_worker = w.get();
    w->companion->become(caf::behavior{
        [](caf::ok_atom) {},
        // A piece of a stream relayed to another worker's data port, or of
        // a call's own stream over CAF.
        [self_worker](chunk_atom, uint64_t key, uint64_t seq, std::string& data) {
          if (!self_worker->served.chunk(key, seq, data))
            self_worker->caf.chunk(key, seq, data);
        },
        [self_worker](chunk_atom, uint64_t key, uint64_t seq, bool complete,
                      const std::string& why) {
          if (!self_worker->served.end(key, seq, complete, why))
            self_worker->caf.end(key, seq, complete, why);
        },
        // From the callers of streamed handle calls (handle_calls.hpp).
        [self_worker](credit_atom, uint64_t key, uint64_t bytes) {
          relay_credit(self_worker, key, bytes);
        },
        [self_worker](cancel_atom, uint64_t key) { relay_cancel(self_worker, key); },
    });
    w->companion->set_default_handler(caf::drop);
    IoThread* raw = w.get();
    w->companion->on_enqueue([raw](caf::mailbox_element_ptr m) {
      raw->core->post(raw->io, [raw, m = std::shared_ptr<caf::mailbox_element>(std::move(m))] {
        raw->companion->activate(raw->unit.get(), *m);
      });
    });
    w->sweeper = std::make_unique<asio::steady_timer>(*w->io);
    asio::post(*w->io, [raw] { sweep(raw); });
    core->workers.push_back(std::move(w));
  }
  core->actor = sys.spawn(proxy_actor, core);
  core->keeper = spawn_proxy_keeper(sys, core);
  // An io thread stayed in a blocking handler (inline_path.cpp): the thread
  // that takes its loop over runs the calls that waited behind it.
  core->server->on_takeover([raw = core.get()](size_t i) {
    raw->metrics.io_takeover();
    raw->log->debug("io thread {} stayed in a blocking handler; another thread runs its loop", i);
    raw->workers[i]->inline_path.taken_over();
  });
  core->server->on_pass([raw = core.get()](size_t i) { return raw->workers[i]->inline_path.drain(); });
  core->server->run();
  core->admin_server->run();
  core->log->info("proxy listening on {}:{}{} ({} io threads), admin on {}:{}",
                  core->options.server.bind, core->server->port(),
                  core->server->https_port()
                      ? ", HTTPS on port " + std::to_string(core->server->https_port())
                      : std::string(),
                  core->server->threads(), core->options.admin.bind, core->admin_server->port());
  return std::unique_ptr<Proxy>(new Proxy(core));
}

ProxyKeeperActor Proxy::keeper() const {
  return core_->keeper;
}

Proxy::Caller Proxy::caller() const {
  return [weak = std::weak_ptr<Core>(core_)](const std::string& app, const std::string& deployment,
                                             HttpRequest request, double timeout_s, CallDone done) {
    if (auto core = weak.lock()) {
      core->call(app, deployment, std::move(request), timeout_s, std::move(done));
      return;
    }
    HttpResponse r;
    r.status = 503;
    r.headers = {{"Content-Type", "application/json"}, {"Retry-After", "1"}};
    r.body = json{{"error", "the proxy of this node is gone"}}.dump();
    done(std::move(r));
  };
}

ProxyActor Proxy::actor() const {
  std::lock_guard<std::mutex> lock(core_->actor_mutex);
  return core_->actor;
}

uint16_t Proxy::port() const {
  return core_->server->port();
}

uint16_t Proxy::https_port() const {
  return core_->server->https_port();
}

Status Proxy::reload_tls() {
  const auto& tls = core_->options.server.tls;
  return tls ? tls->reload() : Status::ok();
}

uint16_t Proxy::admin_port() const {
  return core_->admin_server->port();
}

size_t Proxy::io_threads() const {
  return core_->workers.size();
}

uint16_t Proxy::data_port() const {
  return core_->data_port_number;
}

std::string Proxy::data_token() const {
  return core_->data_token;
}

int64_t Proxy::in_flight() const {
  return core_->metrics.in_flight();
}

void Proxy::shutting_down() {
  if (!core_->shutting_down.exchange(true))
    core_->log->info("node {} is shutting down: not ready (/-/readyz 503)", core_->options.node_id);
}

void Proxy::stop_accepting() {
  if (core_->server)
    core_->server->stop_accepting();
  if (core_->admin_server)
    core_->admin_server->stop_accepting();
}

void Proxy::stop() {
  auto& core = *core_;
  {
    std::lock_guard<std::mutex> lock(core.actor_mutex);
    if (core.stopped)
      return;
    core.stopped = true;
  }
  {
    std::unique_lock<std::shared_mutex> lock(core.io_mutex);
    core.io_closed = true;
  }
  core.server->stop();
  core.admin_server->stop();
  close_data_ports(core);
  // No io thread runs now: the companions can be taken down from here. Their
  // pending answers (and the calls they hold) go with them.
  for (auto& w : core.workers) {
    w->companion->on_enqueue(nullptr);
    w->companion->cleanup(caf::exit_reason::user_shutdown, w->unit.get());
  }
  ProxyActor proxy_actor;
  {
    std::lock_guard<std::mutex> lock(core.actor_mutex);
    proxy_actor = core.actor;  // not restarted any more: `stopped` is set
  }
  {
    // Both are gone before anything they use is destroyed.
    caf::scoped_actor self{*core.sys};
    self->send_exit(core.keeper, caf::exit_reason::user_shutdown);
    if (proxy_actor) {
      self->send_exit(proxy_actor, caf::exit_reason::user_shutdown);
      self->wait_for(core.keeper, proxy_actor);
    } else {
      self->wait_for(core.keeper);
    }
  }
  {
    // The Core outlives this object (captures of the actors and threads that
    // used it): it holds no actor from here. A head candidate's controller
    // is a detached actor, and CAF 0.17's actor system waits at its end
    // until every detached actor is destroyed: the handle of the last one
    // that pushed a snapshot kept a node that had led from exiting until
    // its stop watchdog fired.
    std::lock_guard<std::mutex> lock(core.actor_mutex);
    core.actor = nullptr;
    core.controller = nullptr;
  }
  // Queued calls hold exchanges, and timers belong to io_contexts: drop them
  // before the io_contexts go.
  core.router.clear();
  for (auto& w : core.workers) {
    w->sweeper.reset();
    w->inline_path.clear();
    w->channels.clear();
    w->caf.clear();
    w->relays.clear();
    w->handle_calls.clear();
  }
  core.server.reset();
  for (auto& w : core.workers) {
    w->active.clear();
    w->companion = nullptr;
    w->companion_handle = nullptr;
    // The lines of the last second (and of calls dropped above).
    if (core.options.access_log)
      core.options.access_log->flush(w->access_batch);
  }
}

Proxy::~Proxy() {
  stop();
}

}  // namespace troupe::proxy
