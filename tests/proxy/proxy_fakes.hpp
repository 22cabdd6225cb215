// What the proxy's unit tests share: an Exchange that records what the
// client would get, an in-process replica called inline, and an io thread of
// a Proxy::Core without its server whose companion lives in an actor system
// (inline_path_test.cpp, peer_data_test.cpp; call_test.cpp uses the
// exchange only).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_companion.hpp>
#include <caf/all.hpp>
#include <caf/scoped_execution_unit.hpp>
#include <doctest/doctest.h>

#include "proxy/call.hpp"
#include "proxy/core.hpp"
#include "runtime/data_channel.hpp"
#include "runtime/local_replicas.hpp"
#include <troupe/deployment.hpp>

namespace troupe::proxy::fakes {

class FakeExchange : public Exchange {
 public:
  explicit FakeExchange(asio::io_context& io, const std::string& target = "/echo/x") : io_(io) {
    request_.method(boost::beast::http::verb::get);
    request_.target(target);
  }
  Request& request() override { return request_; }
  void respond(Response&& response) override { answers.push_back(std::move(response)); }
  size_t thread() const override { return 0; }
  asio::io_context& io() override { return io_; }
  void begin_stream(Response&& head) override { answers.push_back(std::move(head)); }
  void write_chunk(std::string data, std::function<void(bool ok)> written) override {
    chunks.push_back(std::move(data));
    written(true);
  }
  void end_stream(bool complete) override { ended = complete ? 1 : 0; }

  std::vector<Response> answers;  // a stream's head too
  std::vector<std::string> chunks;
  int ended = -1;  // -1: no stream ended; 1: complete; 0: early

 private:
  asio::io_context& io_;
  Request request_;
};

// A replica called inline: answers with its id, or refuses, or is closed.
class FakeReplica : public local::LocalReplica {
 public:
  explicit FakeReplica(std::string id) : id_(std::move(id)) {}
  const std::string& replica_id() const override { return id_; }
  using local::LocalReplica::serve;
  local::InlineResult serve(const HttpRequest& request, const local::InlineCall& call,
                            HttpResponse& answer) override {
    ++calls;
    seen = request;
    seen_call = call;
    if (during)
      during(call);
    local::InlineResult r;
    r.kind = kind;
    saw_cancelled = call.control && call.control->cancelled();
    if (kind == local::InlineResult::overloaded)
      r.why = "replica " + id_ + " is at max_ongoing_requests (1)";
    if (kind == local::InlineResult::answered) {
      answer.status = 200;
      answer.headers = {{"Content-Type", "text/plain"}};
      answer.body = "from " + id_;
    }
    return r;
  }
  bool blocking() const override { return is_blocking; }
  local::InlineResult::Kind kind = local::InlineResult::answered;
  // A handler that may block (called from a handler of its own).
  bool is_blocking = false;
  // Runs inside serve(), before it answers.
  std::function<void(const local::InlineCall&)> during;
  bool saw_cancelled = false;  // the last call's control was cancelled
  int calls = 0;
  HttpRequest seen;  // the last request
  local::InlineCall seen_call;

 private:
  std::string id_;
};

inline const std::string& echo_key() {
  static const std::string key = deployment_key("echo", "Echo");
  return key;
}

// A full snapshot of one route, /echo to echo/Echo, with these replicas.
inline RoutingSnapshot echo_snapshot(std::vector<ReplicaEndpoint> replicas) {
  RoutingSnapshot s;
  s.epoch = 1;
  s.seq = 1;
  s.full = true;
  s.routes = {{"/echo", "echo", "Echo"}};
  s.deployments = {{"echo", "Echo", std::move(replicas), -1}};
  return s;
}

// A call of GET /echo/x on `worker` (of `core`, routed by echo_snapshot()),
// answered to `ex`, not yet placed.
inline CallPtr echo_call(Proxy::Core& core, IoThread& worker, std::shared_ptr<FakeExchange> ex) {
  auto c = std::make_shared<Call>();
  c->exchange = std::move(ex);
  c->worker = &worker;
  c->routes = core.router.routes();
  c->route = c->routes->match("/echo/x").route;
  REQUIRE(c->route != nullptr);
  c->start = Clock::now();
  c->request.method = "GET";
  c->request.path = "/x";
  c->request.request_id = "req-1";
  c->attempts = Attempts(core.options.max_attempts);
  return c;
}

// An io thread of node n1's proxy, without its server: its companion in an
// actor system, the route /echo to echo/Echo, and the replicas the test
// names. Deterministic: nothing runs unless the test runs `io`.
struct IoThreadHarness {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  asio::io_context io;
  std::shared_ptr<channel::Registry> channels = std::make_shared<channel::Registry>();
  std::map<std::string, std::shared_ptr<FakeReplica>> fakes;
  std::unique_ptr<Proxy::Core> core;
  IoThread worker;
  std::vector<caf::actor> stand_ins;

  // `inline_ids`: this node's replicas called inline (fakes).
  explicit IoThreadHarness(const std::vector<std::string>& inline_ids) {
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
  }
  ~IoThreadHarness() {
    core->router.clear();
    for (auto* c : std::vector<Call*>(worker.active))
      worker.untrack(c);
    worker.peers.drop();
    worker.served.drop();
    worker.inline_path.clear();
    worker.channels.clear();
    worker.caf.clear();
    for (auto& a : stand_ins)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(worker.companion_handle, caf::exit_reason::user_shutdown);
  }

  // A stand-in for a replica's handle: requests sent to it are never
  // answered here.
  ReplicaActor stand_in() {
    stand_ins.push_back(sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
      self->set_default_handler(caf::drop);
      return {[](int) {}};
    }));
    return caf::actor_cast<ReplicaActor>(stand_ins.back());
  }

  // The route table: /echo to echo/Echo, with these replicas.
  void route(std::vector<ReplicaEndpoint> replicas) {
    core->router.apply(echo_snapshot(std::move(replicas)));
  }

  // A call of GET /echo/x, not yet placed.
  CallPtr make_call(std::shared_ptr<FakeExchange>& ex) {
    ex = std::make_shared<FakeExchange>(io);
    return echo_call(*core, worker, ex);
  }
};

}  // namespace troupe::proxy::fakes
