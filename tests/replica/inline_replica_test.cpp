// Inline calls of an in-process replica (replica/inline_replica.hpp) and the
// node's registry of them (runtime/local_replicas.hpp): the same admission
// and accounting as the replica's request threads, the same 500 for a
// handler that throws, and the lifetime rules — close() waits for the call
// in progress, then no call reaches the instance and the replica no longer
// holds it. No actor runs; the only threads are the test's own, and every
// wait has a deadline.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "replica/inline_replica.hpp"
#include "replica/streams.hpp"

using namespace troupe;
using namespace troupe::replica;

namespace {

constexpr auto kDeadline = std::chrono::seconds(10);

// A deployment whose handler answers "ok", throws on path /throw, streams on
// /stream, and on /hold waits until the test lets it go (to hold a call in
// progress while the test closes the replica).
class Probe : public Deployment {
 public:
  explicit Probe(DispatchPtr d) : dispatch_(std::move(d)) {}

  Response handle(const Request& request) override {
    in_flight_seen = dispatch_->in_flight();
    if (request.path == "/throw")
      throw std::runtime_error("probe failure");
    if (request.path == "/stream")
      return Response::streaming([](StreamWriter& out) { out.write("x"); });
    if (request.path == "/hold") {
      std::unique_lock<std::mutex> lock(mutex_);
      holding = true;
      changed_.notify_all();
      changed_.wait_for(lock, kDeadline, [&] { return released; });
      returned = true;
    }
    return Response::text("ok " + request.query);
  }
  bool nonblocking() const override { return true; }

  bool wait_holding() {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, kDeadline, [&] { return holding; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    released = true;
    changed_.notify_all();
  }

  uint32_t in_flight_seen = 0;
  std::atomic<bool> returned{false};

 private:
  DispatchPtr dispatch_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool holding = false;
  bool released = false;
};

DispatchPtr make_dispatch(uint32_t limit) {
  auto d = std::make_shared<Dispatch>();
  d->replica_id = "app#Probe#1";
  d->limit = limit;
  d->models = std::make_shared<ModelReport>();
  return d;
}

HttpRequest request(std::string path, std::string query = "") {
  HttpRequest r;
  r.method = "GET";
  r.path = std::move(path);
  r.query = std::move(query);
  r.request_id = "req-1";
  r.call_key = 7;
  return r;
}

// Records the whole answer serve() gives (the request threads' path).
class AnswerSink : public Sink {
 public:
  void answer(HttpResponse&& a) override { got = std::move(a); }
  bool head(HttpResponse&&) override { return false; }
  bool chunk(std::string_view) override { return false; }
  void end(bool, const std::string&) override {}
  HttpResponse got;
};

}  // namespace

TEST_CASE("replica/inline: a call runs in handle() and is counted as a request in flight") {
  auto d = make_dispatch(2);
  auto probe = std::make_shared<Probe>(d);
  auto entry = std::make_shared<InlineReplica>(probe, d);
  HttpResponse answer;
  auto result = entry->serve(request("/x", "a=1"), answer);
  REQUIRE(result.kind == local::InlineResult::answered);
  CHECK(answer.status == 200);
  CHECK(answer.body == "ok a=1");
  CHECK(probe->in_flight_seen == 1);
  CHECK(d->in_flight() == 0);
  bool has_id = false;
  for (const auto& h : answer.headers)
    has_id = has_id || (h.first == "X-Request-Id" && h.second == "req-1");
  CHECK(has_id);
}

TEST_CASE("replica/inline: a stopping replica and a full one refuse and run nothing") {
  auto d = make_dispatch(1);
  auto probe = std::make_shared<Probe>(d);
  auto entry = std::make_shared<InlineReplica>(probe, d);
  HttpResponse answer;

  REQUIRE(d->admit());  // a request of another path holds the only slot
  auto full = entry->serve(request("/x"), answer);
  CHECK(full.kind == local::InlineResult::overloaded);
  CHECK(full.why == "replica app#Probe#1 is at max_ongoing_requests (1)");
  d->finish();

  d->stopping.store(true);
  auto stopping = entry->serve(request("/x"), answer);
  CHECK(stopping.kind == local::InlineResult::stopping);
  CHECK(stopping.why == "replica app#Probe#1 is stopping");
  CHECK(d->in_flight() == 0);
  CHECK(probe->in_flight_seen == 0);  // handle() never ran
}

TEST_CASE("replica/inline: inline calls and request threads share max_ongoing_requests") {
  auto d = make_dispatch(1);
  d->workers.resize(1);
  d->busy = std::make_unique<std::atomic<bool>[]>(1);
  d->busy[0].store(false);
  REQUIRE(d->admit());  // an inline call holds the only slot
  size_t index = 0;
  CHECK_FALSE(d->claim(index));
  CHECK_FALSE(d->busy[0].load());  // the thread stays free
  d->finish();
  CHECK(d->claim(index));
}

TEST_CASE("replica/inline: a handler that throws gets the answer of the request threads") {
  auto d = make_dispatch(2);
  auto probe = std::make_shared<Probe>(d);
  auto entry = std::make_shared<InlineReplica>(probe, d);
  HttpResponse inline_answer;
  REQUIRE(entry->serve(request("/throw"), inline_answer).kind == local::InlineResult::answered);
  AnswerSink sink;
  auto req = request("/throw");
  serve(*probe, req, d->models.get(), d->metrics.get(), d->inflight, sink);
  CHECK(inline_answer.status == 500);
  CHECK(inline_answer.status == sink.got.status);
  CHECK(inline_answer.body == sink.got.body);
  CHECK(inline_answer.body.find("handler raised: probe failure") != std::string::npos);
  CHECK(inline_answer.headers == sink.got.headers);
  CHECK(d->in_flight() == 0);
}

TEST_CASE("replica/inline: a streamed answer holds its slot until its stream is started or dropped") {
  auto d = make_dispatch(2);
  auto probe = std::make_shared<Probe>(d);
  auto entry = std::make_shared<InlineReplica>(probe, d);
  HttpResponse answer;
  auto result = entry->serve(request("/stream"), answer);
  REQUIRE(result.kind == local::InlineResult::streaming);
  REQUIRE(result.stream != nullptr);
  CHECK(d->in_flight() == 1);
  result.stream.reset();  // never started: the request ends at the replica
  CHECK(d->in_flight() == 0);
}

TEST_CASE("replica/inline: close waits for the call in progress - then calls are refused as closed") {
  auto d = make_dispatch(2);
  auto probe = std::make_shared<Probe>(d);
  std::weak_ptr<Probe> instance = probe;
  auto entry = std::make_shared<InlineReplica>(probe, d);
  auto registry = std::make_shared<local::LocalReplicas>();
  registry->add(entry);
  REQUIRE(registry->find("app#Probe#1") == entry);

  auto call = std::async(std::launch::async, [&] {
    HttpResponse answer;
    return entry->serve(request("/hold"), answer).kind;
  });
  REQUIRE(probe->wait_holding());
  // The replica actor exits: deregistered, then closed.
  registry->remove(entry);
  CHECK(registry->find("app#Probe#1") == nullptr);
  auto closer = std::async(std::launch::async, [&] {
    entry->close();
    return probe->returned.load();  // the call had left the instance
  });
  probe->release();
  REQUIRE(call.wait_for(kDeadline) == std::future_status::ready);
  REQUIRE(closer.wait_for(kDeadline) == std::future_status::ready);
  CHECK(call.get() == local::InlineResult::answered);
  CHECK(closer.get());
  CHECK(d->in_flight() == 0);

  HttpResponse answer;
  CHECK(entry->serve(request("/x"), answer).kind == local::InlineResult::closed);
  // The replica no longer holds the instance: its request threads' references
  // decide when it goes (here, the test's own).
  probe.reset();
  CHECK(instance.expired());
  entry->close();  // idempotent
}

TEST_CASE("replica/inline: the registry removes only the object it was given") {
  auto d = make_dispatch(1);
  auto first = std::make_shared<InlineReplica>(std::make_shared<Probe>(d), d);
  auto second = std::make_shared<InlineReplica>(std::make_shared<Probe>(d), d);
  local::LocalReplicas registry;
  registry.add(first);
  registry.add(second);  // the same replica id: the newer one wins
  CHECK(registry.size() == 1);
  registry.remove(first);
  CHECK(registry.find("app#Probe#1") == second);
  registry.remove(second);
  CHECK(registry.size() == 0);
  CHECK(registry.find("app#Probe#1") == nullptr);
}
