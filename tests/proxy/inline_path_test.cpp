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
#include "tests/proxy/proxy_fakes.hpp"

using namespace troupe;
using namespace troupe::proxy;

namespace {

using fakes::FakeExchange;
using fakes::FakeReplica;

const std::string kEcho = fakes::echo_key();

struct Harness : fakes::IoThreadHarness {
  // `inline_ids`: the replicas registered as called inline; `remote`: on
  // another node. One stand-in handle serves every replica (requests sent to
  // it are never answered here).
  Harness(std::vector<std::string> ids, std::vector<std::string> inline_ids,
          std::vector<std::string> remote = {})
      : IoThreadHarness(inline_ids) {
    auto handle = stand_in();
    std::vector<ReplicaEndpoint> eps;
    for (const auto& id : ids) {
      ReplicaEndpoint e;
      e.replica_id = id;
      e.node_id = std::find(remote.begin(), remote.end(), id) != remote.end() ? "n2" : "n1";
      e.max_ongoing_requests = 1;
      e.handle = handle;
      eps.push_back(e);
    }
    route(std::move(eps));
  }

  CallPtr make_call(std::shared_ptr<FakeExchange>& ex) {
    auto c = IoThreadHarness::make_call(ex);
    c->request.body = "payload";
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

// --- blocking handlers (the default): queued, run by drain() after a pass --

TEST_CASE("proxy/inline: a blocking handler is queued and run after the io thread's pass - with a RequestControl for its attempt - and answers") {
  Harness h({"a"}, {"a"});
  h.fakes["a"]->is_blocking = true;
  std::shared_ptr<FakeExchange> ex;
  auto c = h.make_call(ex);
  h.core->metrics.request_started();
  dispatch(c);
  // Sent, not run yet: it waits for the end of the io thread's pass.
  CHECK(h.fakes["a"]->calls == 0);
  CHECK(ex->answers.empty());
  CHECK(h.worker.inline_path.queued() == 1);
  CHECK(h.worker.active.size() == 1);
  CHECK(h.in_flight("a") == 1);
  CHECK(h.core->metrics.sent_inline_count() == 1);
  h.worker.inline_path.drain();
  CHECK(h.fakes["a"]->calls == 1);
  REQUIRE(ex->answers.size() == 1);
  CHECK(ex->answers[0].result_int() == 200);
  CHECK(ex->answers[0].body() == "from a");
  CHECK(h.fakes["a"]->seen_call.key == c->key);
  CHECK(h.fakes["a"]->seen_call.control != nullptr);
  CHECK_FALSE(h.fakes["a"]->saw_cancelled);
  CHECK(h.worker.inline_path.kept() == 0);
  CHECK(h.worker.active.empty());
  CHECK(h.in_flight("a") == 0);
  CHECK(h.core->metrics.sent_over(false) == 0);
}

TEST_CASE("proxy/inline: a blocking handler whose calls take long closes its gate - its next request goes to its request threads over CAF") {
  Harness h({"a"}, {"a"});
  auto& a = h.fakes["a"];
  a->is_blocking = true;
  // A handler that computes for 1 ms a call (the gate's `fast` is 100 us on
  // average): the second such call closes the gate.
  a->during = [](const local::InlineCall&) {
    auto until = Clock::now() + std::chrono::milliseconds(1);
    while (Clock::now() < until) {
    }
  };
  for (int i = 0; i < 2; ++i) {
    std::shared_ptr<FakeExchange> ex;
    auto c = h.make_call(ex);
    dispatch(c);
    h.worker.inline_path.drain();
    REQUIRE(ex->answers.size() == 1);
  }
  CHECK(a->gate.closes() == 1);
  CHECK_FALSE(a->gate.open(Clock::now()));

  std::shared_ptr<FakeExchange> ex3;
  auto c3 = h.make_call(ex3);
  dispatch(c3);
  h.worker.inline_path.drain();
  CHECK(a->calls == 2);
  CHECK(h.core->metrics.sent_inline_count() == 2);
  CHECK(h.core->metrics.sent_over(false) == 1);
  CHECK(h.in_flight("a") == 1);  // on its way over CAF
}

TEST_CASE("proxy/inline: a blocking call whose client left never runs while it waits - one that runs is cancelled") {
  Harness h({"a"}, {"a"});
  auto& a = h.fakes["a"];
  a->is_blocking = true;
  std::shared_ptr<FakeExchange> ex1;
  auto c1 = h.make_call(ex1);
  dispatch(c1);
  client_gone(c1);
  REQUIRE(ex1->answers.size() == 1);
  CHECK(ex1->answers[0].result_int() == 499);
  h.worker.inline_path.drain();
  CHECK(a->calls == 0);
  CHECK(h.in_flight("a") == 0);
  CHECK(h.worker.inline_path.kept() == 0);
  CHECK(h.worker.active.empty());

  // The client leaves while the handler runs: its RequestControl says so.
  std::shared_ptr<FakeExchange> ex2;
  auto c2 = h.make_call(ex2);
  dispatch(c2);
  a->during = [&](const local::InlineCall&) { client_gone(c2); };
  h.worker.inline_path.drain();
  CHECK(a->calls == 1);
  CHECK(a->saw_cancelled);
  REQUIRE(ex2->answers.size() == 1);
  CHECK(ex2->answers[0].result_int() == 499);
  CHECK(h.in_flight("a") == 0);
  CHECK(h.worker.inline_path.kept() == 0);
  CHECK(h.worker.active.empty());
}

TEST_CASE("proxy/inline: a blocking call past max_request_time_s fails with request_timeout - it never runs") {
  Harness h({"a"}, {"a"});
  auto& a = h.fakes["a"];
  a->is_blocking = true;
  std::shared_ptr<FakeExchange> ex;
  auto c = h.make_call(ex);
  dispatch(c);
  REQUIRE(c->via != nullptr);
  c->via->expire(c);
  REQUIRE(ex->answers.size() == 1);
  CHECK(ex->answers[0].result_int() == 504);
  h.worker.inline_path.drain();
  CHECK(a->calls == 0);
  CHECK(h.in_flight("a") == 0);
  CHECK(h.worker.inline_path.kept() == 0);
}
