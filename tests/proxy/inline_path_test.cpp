// The proxy's inline path (proxy/inline_path.cpp) on a Proxy::Core without
// its server: replicas of this node whose fake LocalReplica answers on the
// calling thread. What it decides: an answer goes to the client with the
// slot given back and the request counted; a refusal places the request on
// another replica; a replica that is gone (closed) sends the request the
// normal way (over CAF, through the worker's companion); a replica that is
// not registered, or on another node, is never called inline.
// Deterministic: no timer expires, io_context::run() only runs posted work.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <caf/actor_companion.hpp>
#include <caf/all.hpp>
#include <caf/scoped_execution_unit.hpp>

#include "proxy/call.hpp"
#include "proxy/core.hpp"
#include "runtime/data_channel.hpp"
#include "runtime/local_replicas.hpp"

using namespace troupe;
using namespace troupe::proxy;

namespace {

class FakeExchange : public Exchange {
 public:
  explicit FakeExchange(asio::io_context& io) : io_(io) {
    request_.method(boost::beast::http::verb::get);
    request_.target("/echo/x");
  }
  Request& request() override { return request_; }
  void respond(Response&& response) override { answers.push_back(std::move(response)); }
  size_t thread() const override { return 0; }
  asio::io_context& io() override { return io_; }
  std::vector<Response> answers;

 private:
  asio::io_context& io_;
  Request request_;
};

// A replica called inline: answers with its id, or refuses, or is closed.
class FakeReplica : public local::LocalReplica {
 public:
  explicit FakeReplica(std::string id) : id_(std::move(id)) {}
  const std::string& replica_id() const override { return id_; }
  local::InlineResult serve(const HttpRequest& request, HttpResponse& answer) override {
    ++calls;
    seen = request;
    local::InlineResult r;
    r.kind = kind;
    if (kind == local::InlineResult::overloaded)
      r.why = "replica " + id_ + " is at max_ongoing_requests (1)";
    if (kind == local::InlineResult::answered) {
      answer.status = 200;
      answer.headers = {{"Content-Type", "text/plain"}};
      answer.body = "from " + id_;
    }
    return r;
  }
  local::InlineResult::Kind kind = local::InlineResult::answered;
  int calls = 0;
  HttpRequest seen;

 private:
  std::string id_;
};

const std::string kEcho = deployment_key("echo", "Echo");

struct Harness {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::actor dummy;
  asio::io_context io;
  std::shared_ptr<channel::Registry> channels = std::make_shared<channel::Registry>();
  std::map<std::string, std::shared_ptr<FakeReplica>> fakes;
  std::unique_ptr<Proxy::Core> core;
  IoThread worker;

  // `inline_ids`: the replicas registered as called inline; `remote`: on
  // another node.
  Harness(std::vector<std::string> ids, std::vector<std::string> inline_ids,
          std::vector<std::string> remote = {}) {
    for (const auto& id : inline_ids) {
      fakes[id] = std::make_shared<FakeReplica>(id);
      channels->local_replicas()->add(fakes[id]);
    }
    ProxyOptions o;
    o.node_id = "n1";
    o.channels = channels;
    core = std::make_unique<Proxy::Core>(o);
    core->id_prefix = "t";
    worker.core = core.get();
    worker.io = &io;
    worker.unit = std::make_unique<caf::scoped_execution_unit>(&sys);
    worker.companion_handle = sys.spawn<caf::actor_companion>();
    worker.companion = static_cast<caf::actor_companion*>(
        caf::actor_cast<caf::abstract_actor*>(worker.companion_handle));
    worker.companion->context(worker.unit.get());
    // A stand-in for every replica's handle (requests sent to it are never
    // answered here).
    dummy = sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
      self->set_default_handler(caf::drop);
      return {[](int) {}};
    });
    std::vector<ReplicaEndpoint> eps;
    for (const auto& id : ids) {
      ReplicaEndpoint e;
      e.replica_id = id;
      e.node_id = std::find(remote.begin(), remote.end(), id) != remote.end() ? "n2" : "n1";
      e.max_ongoing_requests = 1;
      e.handle = caf::actor_cast<ReplicaActor>(dummy);
      eps.push_back(e);
    }
    RoutingSnapshot s;
    s.epoch = 1;
    s.seq = 1;
    s.full = true;
    s.routes = {{"/echo", "echo", "Echo"}};
    s.deployments = {{"echo", "Echo", std::move(eps), -1}};
    core->router.apply(s);
  }
  ~Harness() {
    core->router.clear();
    for (auto* c : std::vector<Call*>(worker.active))
      worker.untrack(c);
    caf::anon_send_exit(dummy, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(worker.companion_handle, caf::exit_reason::user_shutdown);
  }

  CallPtr make_call(std::shared_ptr<FakeExchange>& ex) {
    ex = std::make_shared<FakeExchange>(io);
    auto c = std::make_shared<Call>();
    c->exchange = ex;
    c->worker = &worker;
    c->routes = core->router.routes();
    c->route = c->routes->match("/echo/x").route;
    REQUIRE(c->route != nullptr);
    c->start = Clock::now();
    c->request.method = "GET";
    c->request.path = "/x";
    c->request.request_id = "req-1";
    c->request.body = "payload";
    c->attempts = Attempts(core->options.max_attempts);
    return c;
  }
  uint32_t in_flight(const std::string& id) const {
    for (const auto& d : core->router.deployments()) {
      for (const auto& r : d.replicas) {
        if (r.replica_id == id)
          return r.in_flight;
      }
    }
    return 0;
  }
  bool metrics_have(const std::string& line) const {
    return core->metrics.render(core->router.deployments()).find(line) != std::string::npos;
  }
};

}  // namespace

TEST_CASE("proxy/inline: a local registered replica answers on the io thread and frees its slot") {
  Harness h({"a"}, {"a"});
  std::shared_ptr<FakeExchange> ex;
  auto c = h.make_call(ex);
  h.core->metrics.request_started();
  dispatch(c);
  REQUIRE(ex->answers.size() == 1);
  CHECK(ex->answers[0].result_int() == 200);
  CHECK(ex->answers[0].body() == "from a");
  CHECK(std::string(ex->answers[0]["X-Request-Id"]) == "req-1");
  CHECK(h.fakes["a"]->calls == 1);
  // The request as the replica would get it over CAF: deadline left, key.
  CHECK(h.fakes["a"]->seen.body == "payload");
  CHECK(h.fakes["a"]->seen.call_key != 0);
  CHECK(c->request.body == "payload");  // kept for a retry or a shadow copy
  CHECK(c->done);
  CHECK(h.in_flight("a") == 0);
  CHECK(h.worker.active.empty());
  CHECK(h.core->metrics.sent_inline_count() == 1);
  CHECK(h.core->metrics.sent_over(false) == 0);
  CHECK(h.metrics_have("troupe_proxy_replica_sends_total{transport=\"inline\"} 1"));
  CHECK(h.metrics_have("troupe_proxy_requests_total{application=\"echo\",code=\"200\"} 1"));
}

TEST_CASE("proxy/inline: a replica that refuses is left for another one") {
  Harness h({"a", "b"}, {"a", "b"});
  h.fakes["a"]->kind = local::InlineResult::overloaded;
  h.fakes["b"]->kind = local::InlineResult::overloaded;
  std::shared_ptr<FakeExchange> ex;
  auto c = h.make_call(ex);
  dispatch(c);
  // The first refusal places it again at once, on the other replica; the
  // second waits for a backoff (a timer of `io`, not run here).
  CHECK(h.fakes["a"]->calls == 1);
  CHECK(h.fakes["b"]->calls == 1);
  CHECK(ex->answers.empty());
  CHECK(h.in_flight("a") == 0);
  CHECK(h.in_flight("b") == 0);
  CHECK(c->tried.size() == 2);
  h.fakes["a"]->kind = local::InlineResult::answered;
  h.fakes["b"]->kind = local::InlineResult::answered;
  dispatch(c);
  REQUIRE(ex->answers.size() == 1);
  CHECK(ex->answers[0].result_int() == 200);
  CHECK(h.in_flight("a") + h.in_flight("b") == 0);
  c->backoff.reset();
}

TEST_CASE("proxy/inline: a stopping replica's refusal is placed again like one over CAF") {
  Harness h({"a"}, {"a"});
  h.fakes["a"]->kind = local::InlineResult::stopping;
  std::shared_ptr<FakeExchange> ex;
  auto c = h.make_call(ex);
  dispatch(c);
  // Placed again at once (the only replica, so the same one), then after a
  // backoff (a timer of `io`, not run here).
  CHECK(h.fakes["a"]->calls == 2);
  CHECK(ex->answers.empty());
  CHECK(c->tried == std::vector<std::string>{"a", "a"});
  CHECK(h.in_flight("a") == 0);
  REQUIRE(c->backoff != nullptr);
  CHECK(h.core->metrics.sent_over(false) == 0);
  c->backoff.reset();
}

TEST_CASE("proxy/inline: a closed replica sends the request over its handle") {
  Harness h({"a"}, {"a"});
  h.fakes["a"]->kind = local::InlineResult::closed;
  std::shared_ptr<FakeExchange> ex;
  auto c = h.make_call(ex);
  dispatch(c);
  CHECK(h.fakes["a"]->calls == 1);
  CHECK(ex->answers.empty());
  CHECK(h.in_flight("a") == 1);  // on its way over CAF
  CHECK(h.worker.active.size() == 1);
  CHECK(h.core->metrics.sent_over(false) == 1);
  CHECK(h.core->metrics.sent_inline_count() == 0);
}

TEST_CASE("proxy/inline: unregistered and remote replicas are never called inline") {
  Harness h({"a", "r"}, {"r"}, {"r"});
  // Registered after the slots were made: a slot looks its replica up once.
  auto late = std::make_shared<FakeReplica>("a");
  h.channels->local_replicas()->add(late);
  auto& remote = h.fakes["r"];
  for (int i = 0; i < 2; ++i) {
    std::shared_ptr<FakeExchange> ex;
    auto c = h.make_call(ex);
    dispatch(c);
  }
  CHECK(late->calls == 0);
  CHECK(remote->calls == 0);
  CHECK(h.core->metrics.sent_over(false) == 2);
}
