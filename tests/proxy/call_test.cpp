// The proxy's call state machine (proxy/call.hpp) without sockets, actors or
// a cluster: a Proxy::Core without its server, one IoThread on an io_context
// the test runs itself, replicas known to the router only, and an Exchange
// that records the answer. Replicas have no handle, so a call the router
// places on one is treated as sent to a replica that is gone
// (request_receiver_down: a crash); the other outcomes are delivered by
// calling the state machine's entry points directly, as the companion's
// response handler, the data channel or the call's timer would.
// Deterministic: no timers expire, io_context::run() only runs posted work.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <unistd.h>

#include "proxy/call.hpp"
#include "proxy/core.hpp"
#include "tests/proxy/proxy_fakes.hpp"

using namespace troupe;
using namespace troupe::proxy;

namespace {

// The client's request target carries a query, which log lines never show.
struct FakeExchange : fakes::FakeExchange {
  explicit FakeExchange(asio::io_context& io) : fakes::FakeExchange(io, "/echo/x?secret=1") {}
};

ReplicaEndpoint replica(const std::string& id, uint32_t max) {
  ReplicaEndpoint e;
  e.replica_id = id;
  e.node_id = "n1";
  e.max_ongoing_requests = max;
  return e;
}

ProxyOptions options(uint32_t max_attempts, std::shared_ptr<channel::Registry> channels) {
  ProxyOptions o;
  o.node_id = "n1";
  o.max_attempts = max_attempts;
  o.channels = std::move(channels);
  return o;
}

const std::string kEcho = deployment_key("echo", "Echo");

struct Harness {
  asio::io_context io;
  Proxy::Core core;
  IoThread worker;

  // `channels`: the data channels of the replicas (runtime/data_channel.hpp)
  // that have one.
  Harness(std::vector<ReplicaEndpoint> replicas, uint32_t max_attempts = 5,
          std::shared_ptr<channel::Registry> channels = nullptr)
      : core(options(max_attempts, std::move(channels))) {
    core.id_prefix = "t";
    worker.core = &core;
    worker.io = &io;
    core.router.apply(fakes::echo_snapshot(std::move(replicas)));
  }
  ~Harness() {
    // Queued waiters hold calls, and calls hold timers of `io`.
    core.router.clear();
  }

  // A call of GET /echo/x, not yet placed.
  CallPtr make_call(std::shared_ptr<FakeExchange>& ex) {
    ex = std::make_shared<FakeExchange>(io);
    return fakes::echo_call(core, worker, ex);
  }

  // Places `c` on a replica as send() does once the request is on its way:
  // the slot taken and the call tracked, no message sent.
  void place(const CallPtr& c, std::vector<std::string> exclude = {}) {
    auto a = core.router.admit(kEcho, exclude, [](SlotPtr) {});
    REQUIRE(a.kind == Router::Admit::assigned);
    c->slot = std::move(a.slot);
    ++c->sends;
    c->sent_at = Clock::now();
    worker.track(c.get());
  }

  // Takes a slot for a request of someone else (another call, another proxy).
  SlotPtr occupy() {
    auto a = core.router.admit(kEcho, {}, [](SlotPtr) {});
    REQUIRE(a.kind == Router::Admit::assigned);
    return a.slot;
  }
  void give_back(const SlotPtr& slot, Outcome outcome = Outcome::answered) {
    auto ready = core.router.release(slot, outcome);
    core.run(ready);
  }

  std::map<std::string, uint32_t> in_flight() const {
    std::map<std::string, uint32_t> m;
    for (const auto& d : core.router.deployments()) {
      for (const auto& r : d.replicas)
        m[r.replica_id] = r.in_flight;
    }
    return m;
  }
  size_t queued() const {
    size_t n = 0;
    for (const auto& d : core.router.deployments())
      n += d.queued;
    return n;
  }
  bool metrics_have(const std::string& line) const {
    return core.metrics.render(core.router.deployments()).find(line) != std::string::npos;
  }
};

int status_of(const FakeExchange& ex) {
  REQUIRE(ex.answers.size() == 1);
  return ex.answers[0].result_int();
}

}  // namespace

TEST_CASE("proxy/call: a request that crashes two replicas is answered 502 and not sent again") {
  Harness h({replica("a", 5), replica("b", 5), replica("c", 5)});
  std::shared_ptr<FakeExchange> ex;
  auto c = h.make_call(ex);
  // Placed on a replica without a handle: it is gone with the request, a
  // crash. Retried once on another replica, which is gone too: 502.
  start_call(c, &h.worker, c->start, 0);
  REQUIRE(c->done);
  CHECK(status_of(*ex) == 502);
  CHECK(ex->answers[0].body().find("crashed 2 replicas of echo/Echo") != std::string::npos);
  CHECK(ex->answers[0].body().find("req-1") != std::string::npos);
  CHECK(std::string(ex->answers[0]["X-Request-Id"]) == "req-1");
  CHECK(c->attempts.crashes() == 2);
  CHECK(c->tried.size() == 2);
  CHECK(c->tried[0] != c->tried[1]);
  CHECK(h.core.metrics.crashes("echo") == 1);
  CHECK(h.core.metrics.count("echo", 502) == 1);
  CHECK(h.metrics_have("troupe_proxy_retries_total{application=\"echo\"} 1"));
  // No slot stays taken, and no third replica was tried.
  for (auto& [id, n] : h.in_flight())
    CHECK(n == 0);
  CHECK(h.worker.active.empty());
}

TEST_CASE("proxy/call: after one crash the request is retried on another replica") {
  Harness h({replica("a", 1), replica("b", 1)});
  std::shared_ptr<FakeExchange> ex;
  auto c = h.make_call(ex);
  h.place(c);
  std::string first = c->slot->replica_id;
  auto other = h.occupy();  // the other replica is busy: the retry waits for it
  on_error(c, caf::make_error(caf::sec::request_receiver_down));
  CHECK_FALSE(c->done);
  CHECK(ex->answers.empty());
  CHECK(c->attempts.crashes() == 1);
  CHECK(c->tried == std::vector<std::string>{first});
  CHECK(c->queued);
  CHECK(h.queued() == 1);
  CHECK(h.in_flight()[first] == 0);
  CHECK(h.worker.active.empty());
  // The replica that died is never chosen again; the other one frees up and
  // takes the retry (here gone too: the second crash answers 502).
  h.give_back(other);
  h.io.run();
  REQUIRE(c->done);
  CHECK(status_of(*ex) == 502);
  CHECK(c->tried.size() == 2);
  CHECK(c->tried[1] == other->replica_id);
  CHECK(h.core.metrics.crashes("echo") == 1);
}

TEST_CASE("proxy/call: an exit reason and request_receiver_down are crashes") {
  for (auto err :
       {caf::make_error(caf::sec::request_receiver_down), caf::make_error(caf::exit_reason::kill),
        caf::make_error(caf::exit_reason::unhandled_exception)}) {
    Harness h({replica("a", 1), replica("b", 1)});
    std::shared_ptr<FakeExchange> ex;
    auto c = h.make_call(ex);
    // One crash already: the next one answers 502.
    REQUIRE(c->attempts.lost(true) == Attempts::Loss::retry);
    h.place(c);
    on_error(c, err);
    REQUIRE(c->done);
    CHECK(status_of(*ex) == 502);
    CHECK(h.core.metrics.crashes("echo") == 1);
  }
}

namespace {

// A handle that has ended with `reason`, as a replica's handle does when its
// replica actor ends (replica/replica_actor.cpp).
ReplicaActor ended_handle(caf::actor_system& sys, caf::exit_reason reason) {
  auto a = sys.spawn([]() -> caf::behavior { return {[](int) {}}; });
  caf::scoped_actor self{sys};
  self->monitor(a);
  caf::anon_send_exit(a, reason);
  bool down = false;
  self->receive([&](const caf::down_msg&) { down = true; },
                caf::after(std::chrono::seconds(30)) >> [] {});
  REQUIRE(down);
  return caf::actor_cast<ReplicaActor>(a);
}

}  // namespace

// A replica told to stop (a rolling update, a scale-down, a delete) ends with
// user_shutdown; a request that reached it after it stopped taking new ones
// (this proxy's routes did not say so yet) is lost with it, not its cause.
// Before, such a loss counted as a crash, and a request that met two stopped
// replicas in a row was answered 502 as a "query of death".
TEST_CASE("proxy/call: a replica that stopped on request is not a crash of the request") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  for (int how = 0; how < 2; ++how) {
    CAPTURE(how);
    auto a = replica("a", 1);
    a.handle = ended_handle(sys, caf::exit_reason::user_shutdown);
    Harness h({a, replica("b", 1)});
    std::shared_ptr<FakeExchange> ex;
    auto c = h.make_call(ex);
    REQUIRE(c->attempts.lost(true) == Attempts::Loss::retry);  // one crash already
    h.place(c, {"b"});
    REQUIRE(c->slot->replica_id == "a");
    auto other = h.occupy();
    // Bounced by the ended handle (request_receiver_down), or by the replica
    // actor as it ended (the request failed with its exit reason).
    on_error(c, how == 0 ? caf::make_error(caf::sec::request_receiver_down)
                         : caf::make_error(caf::exit_reason::user_shutdown));
    CHECK_FALSE(c->done);
    CHECK(c->attempts.crashes() == 1);
    CHECK(c->attempts.losses() == 2);
    CHECK(c->tried == std::vector<std::string>{"a"});
    CHECK(c->queued);
    CHECK(h.core.metrics.crashes("echo") == 0);
    h.give_back(other);
  }
  // A handle that ended otherwise: request_receiver_down is a crash, and the
  // second one answers 502.
  auto a = replica("a", 1);
  a.handle = ended_handle(sys, caf::exit_reason::kill);
  Harness h({a, replica("b", 1)});
  std::shared_ptr<FakeExchange> ex;
  auto c = h.make_call(ex);
  REQUIRE(c->attempts.lost(true) == Attempts::Loss::retry);
  h.place(c, {"b"});
  REQUIRE(c->slot->replica_id == "a");
  on_error(c, caf::make_error(caf::sec::request_receiver_down));
  REQUIRE(c->done);
  CHECK(status_of(*ex) == 502);
  CHECK(h.core.metrics.crashes("echo") == 1);
}

// A replica process told to stop writes a `closing` frame on every lane
// before it exits: the requests the proxy wrote after its last read are lost
// with it, not crashed by it. Without the frame, the lane's end is a crash.
TEST_CASE("proxy/call: requests on the data channel of a process that stopped on request are not crashes") {
  for (bool says_closing : {true, false}) {
    CAPTURE(says_closing);
    auto made = channel::make_channel("a", 1);
    REQUIRE(made);
    auto registry = std::make_shared<channel::Registry>();
    registry->add(made->channel);
    // The process's ends: requests, inject, lane 0.
    REQUIRE(made->child_fds.size() == 3);
    Harness h({replica("a", 1), replica("b", 1)}, 5, registry);
    std::shared_ptr<FakeExchange> ex;
    auto c = h.make_call(ex);
    auto a = h.core.router.admit(kEcho, {"b"}, [](SlotPtr) {});
    REQUIRE(a.kind == Router::Admit::assigned);
    c->slot = std::move(a.slot);
    REQUIRE(c->slot->replica_id == "a");
    REQUIRE(c->slot->channel);
    c->key = 7;
    REQUIRE(h.worker.channels.send(c));
    REQUIRE(c->via == &h.worker.channels);
    h.io.poll();  // the request frame goes out; the lane is read from now on
    auto other = h.occupy();  // b is busy: the call waits for it
    if (says_closing) {
      REQUIRE(channel::send_control(made->child_fds[2], channel::Kind::closing, 0, 0) ==
              channel::Sent::sent);
    }
    for (int fd : made->child_fds)
      ::close(fd);  // the process is gone
    h.io.restart();
    h.io.run();
    CHECK_FALSE(c->done);
    CHECK(c->tried == std::vector<std::string>{"a"});
    CHECK(c->attempts.losses() == 1);
    CHECK(c->attempts.crashes() == (says_closing ? 0 : 1));
    CHECK(c->queued);
    CHECK(h.in_flight()["a"] == 0);
    h.give_back(other);
  }
}

TEST_CASE("proxy/call: a replica gone before the request reached it is not a crash") {
  // unexpected_response: the replica's handle answered with an empty message.
  Harness h({replica("a", 1), replica("b", 1)});
  std::shared_ptr<FakeExchange> ex;
  auto c = h.make_call(ex);
  REQUIRE(c->attempts.lost(true) == Attempts::Loss::retry);  // one crash already
  h.place(c);
  auto other = h.occupy();
  on_error(c, caf::make_error(caf::sec::unexpected_response));
  CHECK_FALSE(c->done);
  CHECK(c->attempts.crashes() == 1);
  CHECK(c->attempts.losses() == 2);
  CHECK(c->queued);
  h.give_back(other);
}

TEST_CASE("proxy/call: losses that are not crashes end at max_attempts with 503") {
  Harness h({replica("a", 1), replica("b", 1), replica("c", 1)}, /*max_attempts=*/2);
  std::shared_ptr<FakeExchange> ex;
  auto c = h.make_call(ex);
  h.place(c);
  std::string first = c->slot->replica_id;
  auto blocker = h.occupy();
  auto blocker2 = h.occupy();
  // Bounced for lack of a route: the replica may be fine, not the request's
  // fault. Retried (queued: the others are busy).
  on_error(c, caf::make_error(caf::exit_reason::remote_link_unreachable));
  CHECK_FALSE(c->done);
  CHECK(c->attempts.crashes() == 0);
  CHECK(c->attempts.losses() == 1);
  CHECK(c->queued);
  CHECK(h.in_flight()[first] == 0);
  // It gets a slot, and is lost again: max_attempts (2) reached, 503.
  REQUIRE(h.core.router.cancel(kEcho, c->ticket));
  c->queued = false;
  h.give_back(blocker);
  h.place(c, c->tried);
  on_error(c, caf::make_error(caf::exit_reason::remote_link_unreachable));
  REQUIRE(c->done);
  CHECK(status_of(*ex) == 503);
  CHECK(std::string(ex->answers[0][boost::beast::http::field::retry_after]) == "1");
  CHECK(ex->answers[0].body().find("after 2 attempts") != std::string::npos);
  CHECK(h.core.metrics.crashes("echo") == 0);
  for (auto& [id, n] : h.in_flight())
    CHECK(n == (id == blocker2->replica_id ? 1u : 0u));
  h.give_back(blocker2);
}

TEST_CASE("proxy/call: a refusal is placed again at once and then after a backoff") {
  Harness h({replica("a", 1)});
  std::shared_ptr<FakeExchange> ex;
  auto c = h.make_call(ex);
  h.place(c);
  // Another request waits for the replica: it takes the slot the refusal
  // frees, so the refused call has to queue behind it.
  SlotPtr other;
  auto waiting = h.core.router.admit(kEcho, {}, [&](SlotPtr s) { other = std::move(s); });
  REQUIRE(waiting.kind == Router::Admit::queued);
  on_error(c, to_caf_error(Status(errc::overloaded, "at max_ongoing_requests")));
  // Not counted against the request: placed again at once.
  REQUIRE(other != nullptr);
  CHECK_FALSE(c->done);
  CHECK(c->attempts.refusals() == 1);
  CHECK(c->attempts.losses() == 0);
  CHECK(c->attempts.crashes() == 0);
  CHECK(c->queued);
  CHECK(c->tried == std::vector<std::string>{"a"});
  CHECK(c->backoff == nullptr);
  // The second refusal waits before the request is placed again.
  REQUIRE(h.core.router.cancel(kEcho, c->ticket));
  c->queued = false;
  h.give_back(other);
  h.place(c);
  on_error(c, to_caf_error(Status(errc::unavailable, "stopping")));
  CHECK_FALSE(c->done);
  CHECK(c->attempts.refusals() == 2);
  REQUIRE(c->backoff != nullptr);
  CHECK_FALSE(c->queued);
  CHECK(h.queued() == 0);
  CHECK(h.in_flight()["a"] == 0);
  CHECK(h.metrics_have("troupe_proxy_retries_total{application=\"echo\"} 2"));
  // Cancelled, the wait places nothing.
  c->backoff->cancel();
  h.io.run();
  CHECK(h.in_flight()["a"] == 0);
  CHECK_FALSE(c->done);
}

TEST_CASE("proxy/call: more than 40 refusals answer 503") {
  Harness h({replica("a", 1)});
  std::shared_ptr<FakeExchange> ex;
  auto c = h.make_call(ex);
  for (uint32_t i = 0; i < Attempts::kMaxRefusals; ++i)
    c->attempts.refused();
  h.place(c);
  on_error(c, to_caf_error(Status(errc::overloaded, "busy")));
  REQUIRE(c->done);
  CHECK(status_of(*ex) == 503);
  CHECK(h.in_flight()["a"] == 0);
}

TEST_CASE("proxy/call: a timeout answers 504 and the slot stays taken until the late answer") {
  Harness h({replica("a", 1)});
  std::shared_ptr<FakeExchange> ex;
  auto c = h.make_call(ex);
  h.place(c);
  on_timeout(c);
  REQUIRE(c->done);
  CHECK(status_of(*ex) == 504);
  CHECK(h.core.metrics.count("echo", 504) == 1);
  // The replica still works on it: the router must not believe it is free.
  CHECK(h.in_flight()["a"] == 1);
  std::shared_ptr<FakeExchange> ex2;
  auto c2 = h.make_call(ex2);
  dispatch(c2);
  CHECK(c2->queued);
  // The late answer frees the slot, and the queued call gets it.
  late_answer(c, Outcome::answered);
  CHECK(h.worker.active.empty());
  CHECK(h.queued() == 0);
  CHECK(h.in_flight()["a"] == 1);  // now c2's
  // A second timeout does not answer twice.
  on_timeout(c);
  CHECK(ex->answers.size() == 1);
}

TEST_CASE("proxy/call: a late answer after the timeout releases the slot") {
  Harness h({replica("a", 2)});
  for (auto outcome : {Outcome::answered, Outcome::abandoned, Outcome::refused}) {
    std::shared_ptr<FakeExchange> ex;
    auto c = h.make_call(ex);
    h.place(c);
    on_timeout(c);
    CHECK(h.in_flight()["a"] == 1);
    late_answer(c, outcome);
    CHECK(h.in_flight()["a"] == 0);
    CHECK(c->slot == nullptr);
    CHECK(ex->answers.size() == 1);
  }
}

TEST_CASE("proxy/call: CAF's request timeout answers 504 and abandons the slot") {
  Harness h({replica("a", 1)});
  std::shared_ptr<FakeExchange> ex;
  auto c = h.make_call(ex);
  h.place(c);
  on_error(c, caf::make_error(caf::sec::request_timeout));
  REQUIRE(c->done);
  CHECK(status_of(*ex) == 504);
  CHECK(h.in_flight()["a"] == 0);
  CHECK(c->attempts.losses() == 0);
}

TEST_CASE("proxy/call: an answer is passed on and frees the slot") {
  Harness h({replica("a", 1)});
  std::shared_ptr<FakeExchange> ex;
  auto c = h.make_call(ex);
  h.place(c);
  HttpResponse answer;
  answer.status = 201;
  answer.headers = {{"X-Custom", "1"}, {"Content-Length", "999"}, {"X-Request-Id", "forged"}};
  answer.body = "made";
  on_answer(c, answer);
  REQUIRE(c->done);
  CHECK(status_of(*ex) == 201);
  CHECK(ex->answers[0].body() == "made");
  CHECK(std::string(ex->answers[0]["X-Custom"]) == "1");
  CHECK(std::string(ex->answers[0]["X-Request-Id"]) == "req-1");
  CHECK(ex->answers[0].count(boost::beast::http::field::content_length) == 0);
  CHECK(h.in_flight()["a"] == 0);
  CHECK(h.worker.active.empty());

  std::shared_ptr<FakeExchange> ex2;
  auto c2 = h.make_call(ex2);
  h.place(c2);
  HttpResponse bad;
  bad.status = 42;
  on_answer(c2, bad);
  CHECK(status_of(*ex2) == 502);
  CHECK(h.in_flight()["a"] == 0);
}

// A transport that only records what the call state machine asks of it.
struct RecordingTransport : Transport {
  std::vector<Call*> forgotten, expired;
  bool send(const CallPtr&) override { return false; }
  void credit(const CallPtr&, uint64_t) override {}
  void cancel(const CallPtr&, bool) override {}
  void forget(const CallPtr& c) override { forgotten.push_back(c.get()); }
  void expire(const CallPtr& c) override { expired.push_back(c.get()); }
};

TEST_CASE("proxy/call: fail_over retries the requests of a replica that died with them") {
  Harness h({replica("a", 2), replica("b", 2)});
  // Two calls on a (b is chosen only when a is full), over a transport that
  // records what it is told; one was already answered 504.
  std::shared_ptr<FakeExchange> ex1, ex2;
  auto c1 = h.make_call(ex1);
  auto c2 = h.make_call(ex2);
  h.place(c1, {"b"});
  h.place(c2, {"b"});
  REQUIRE(c1->slot->replica_id == "a");
  REQUIRE(c2->slot->replica_id == "a");
  RecordingTransport via;
  c1->via = &via;
  c2->via = &via;
  on_timeout(c2);
  fail_over(
      &h.worker, [](const ReplicaSlot& s) { return s.replica_id == "a"; }, "died", true);
  // Each attempt's transport forgot it: a late answer finds no call.
  CHECK(via.forgotten.size() == 2);
  CHECK(std::count(via.forgotten.begin(), via.forgotten.end(), c1.get()) == 1);
  CHECK(std::count(via.forgotten.begin(), via.forgotten.end(), c2.get()) == 1);
  CHECK(h.in_flight()["a"] == 0);
  // c1 is retried on b (here without a handle: a second crash, 502); c2 had
  // its answer and is only released.
  REQUIRE(c1->done);
  CHECK(status_of(*ex1) == 502);
  CHECK(c1->attempts.crashes() == 2);
  CHECK(c1->tried == std::vector<std::string>{"a", "b"});
  CHECK(status_of(*ex2) == 504);
  CHECK(c2->attempts.crashes() == 0);
  CHECK(h.worker.active.empty());
}

TEST_CASE("proxy/call: a deployment that is gone answers 503 and an unknown handle target 404") {
  Harness h({replica("a", 1)});
  std::shared_ptr<FakeExchange> ex;
  auto c = h.make_call(ex);
  c->handle_route =
      std::make_shared<Route>(Route{std::string(), "echo", "Nope", deployment_key("echo", "Nope")});
  c->route = c->handle_route.get();
  dispatch(c);
  CHECK(status_of(*ex) == 404);

  std::shared_ptr<FakeExchange> ex2;
  auto c2 = h.make_call(ex2);
  auto slot = h.occupy();
  dispatch(c2);
  REQUIRE(c2->queued);
  resumed(c2, nullptr);
  CHECK(status_of(*ex2) == 503);
  h.give_back(slot);
}

TEST_CASE("proxy/call: X-Request-Timeout-Seconds takes a number of seconds above 0 - at most 86400") {
  CHECK(parse_request_timeout("0.5").value() == doctest::Approx(0.5));
  CHECK(parse_request_timeout("2").value() == doctest::Approx(2));
  CHECK(parse_request_timeout("86400").value() == doctest::Approx(86400));
  for (const char* bad : {"", "0", "-1", "abc", "1s", "nan", "inf", "86401", " ", "1e9"}) {
    CAPTURE(bad);
    auto r = parse_request_timeout(bad);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.status().message() == std::string("X-Request-Timeout-Seconds: '") + bad +
                                      "' is not a number of seconds greater than 0 and at most "
                                      "86400");
  }
}

TEST_CASE(
    "proxy/call: request ids are the node's prefix - the io thread in 2 hex digits - a count in "
    "12") {
  Harness h({replica("r1", 1)});
  h.core.id_prefix = "a1b2c3";
  h.worker.index = 0x1f;
  CHECK(h.worker.new_request_id() == "a1b2c31f000000000001");
  CHECK(h.worker.new_request_id() == "a1b2c31f000000000002");
  h.worker.next_id = 0xabcdef012344;
  CHECK(h.worker.new_request_id() == "a1b2c31fabcdef012345");
  h.worker.index = 0;
  h.core.id_prefix = "";
  CHECK(h.worker.new_request_id() == "00abcdef012346");
}
