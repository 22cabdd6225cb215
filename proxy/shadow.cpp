// Shadow traffic: copies of an application's requests to its shadow
// deployments (ApplicationSpec::shadow), fire and forget. A copy is a Call of
// its own that takes the data path of requests (send, answers, errors,
// timeouts, fail-over; call.hpp) with three differences: it is sent only when
// a replica of the shadow has a free slot now (Router::admit_if_free), else
// dropped; it is never queued, retried or placed again; and its end is
// counted in troupe_proxy_shadow_requests_total instead of being answered.
//
// Bound: a copy holds a slot of the shadow deployment from its send until its
// replica answers (also past its deadline), so the copies in flight on a
// shadow never exceed the max_ongoing_requests of its replicas; beyond, they
// are dropped. A slow shadow therefore costs the proxy at most that many
// calls, and the client's request never waits for any of them.
#include <boost/beast/http/field.hpp>

#include "proxy/call.hpp"
#include "proxy/core.hpp"
#include "runtime/time.hpp"

namespace troupe::proxy {

namespace {

// The Exchange of a shadow copy: no client; the answer is discarded (the
// copy is counted in end_shadow()). Holds the method and target for log
// lines.
class ShadowExchange : public Exchange {
 public:
  ShadowExchange(size_t thread, asio::io_context* io) : thread_(thread), io_(io) {}
  Request& request() override { return request_; }
  void respond(Response&&) override {}
  size_t thread() const override { return thread_; }
  asio::io_context& io() override { return *io_; }

 private:
  Request request_;
  size_t thread_;
  asio::io_context* io_;
};

}  // namespace

void send_shadows(IoThread* w, const Route& route, const std::shared_ptr<const RouteTable>& table,
                  const HttpRequest& request, double timeout_s) {
  if (route.shadow.empty())
    return;
  auto* core = w->core;
  for (const Route* to : pick_shadows(route, SplitRandom::thread_local_instance())) {
    auto admission = core->router.admit_if_free(to->key);
    if (admission.kind != Router::Admit::assigned) {
      core->metrics.shadow(to->app, to->deployment, "dropped");
      continue;
    }
    auto start = Clock::now();
    auto c = std::make_shared<Call>();
    c->shadow = true;
    c->worker = w;
    c->route = to;
    c->routes = table;
    c->start = start;
    auto ex = std::make_shared<ShadowExchange>(w->index, w->io);
    ex->request().method_string(request.method);
    ex->request().target("shadow:" + to->deployment + request.path);
    c->exchange = std::move(ex);
    c->request = request;
    // The shadow's code can tell a copy from a request (and, e.g., skip
    // side effects that must happen once).
    c->request.headers.emplace_back("X-Troupe-Shadow", "1");
    c->attempts = Attempts(core->options.max_attempts);
    arm_deadline(c, w, start, timeout_s);
    send(c, std::move(admission.slot));
  }
}

void end_shadow(const CallPtr& c, const std::string& outcome) {
  if (c->done)
    return;
  c->done = true;
  auto* core = c->worker->core;
  if (c->timer)
    c->timer->cancel();
  core->metrics.shadow(c->route->app, c->route->deployment, outcome);
  if (core->log->should_log(spdlog::level::debug)) {
    double elapsed = std::chrono::duration<double>(Clock::now() - c->start).count();
    core->log->debug("shadow copy of request {} to {}/{} -> {} in {:.2f} ms", c->request.request_id,
                     c->route->app, c->route->deployment, outcome, elapsed * 1000);
  }
  c->exchange.reset();
}

}  // namespace troupe::proxy
