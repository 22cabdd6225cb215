// Running a request in a replica (replica/streams.hpp): whole answers and
// streams reach the sink in order, the credit window bounds what a producer
// has unacknowledged, cancellation and deadlines stop producers and waits,
// and exceptions end streams early. No actor and no socket: a recording
// sink, and threads where a producer must block. A wait for something that
// must not happen is bounded (a future's wait_for); every other wait is a
// condition.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "replica/streams.hpp"

using namespace troupe;
using namespace troupe::replica;
using namespace std::chrono_literals;

namespace {

struct Recorded {
  std::string kind;  // answer, head, chunk, end
  HttpResponse response;
  std::string data;
  bool complete = false;
};

class RecordingSink : public Sink {
 public:
  void answer(HttpResponse&& a) override { add({"answer", std::move(a), "", false}); }
  bool head(HttpResponse&& h) override {
    add({"head", std::move(h), "", false});
    return true;
  }
  bool chunk(std::string_view data) override {
    add({"chunk", {}, std::string(data), false});
    return !refuse_chunks;
  }
  void end(bool complete, const std::string& why) override {
    add({"end", {}, why, complete});
  }
  std::vector<Recorded> events() {
    std::lock_guard<std::mutex> lock(mutex);
    return log;
  }
  size_t chunks() {
    std::lock_guard<std::mutex> lock(mutex);
    size_t n = 0;
    for (auto& e : log)
      n += e.kind == "chunk";
    return n;
  }
  std::atomic<bool> refuse_chunks{false};

 private:
  void add(Recorded r) {
    std::lock_guard<std::mutex> lock(mutex);
    log.push_back(std::move(r));
  }
  std::mutex mutex;
  std::vector<Recorded> log;
};

// Answers what the test sets: a function of the request.
class Scripted : public Deployment {
 public:
  explicit Scripted(std::function<Response(const Request&)> f) : f_(std::move(f)) {}
  Response handle(const Request& r) override { return f_(r); }

 private:
  std::function<Response(const Request&)> f_;
};

HttpRequest request_with_key(uint64_t key, double timeout_s = 0) {
  HttpRequest r;
  r.method = "GET";
  r.path = "/";
  r.request_id = "req-1";
  r.call_key = key;
  r.timeout_s = timeout_s;
  return r;
}

}  // namespace

TEST_CASE("serve: a whole answer goes to the sink once - with the request id") {
  Scripted d([](const Request&) { return Response::text("hi"); });
  RecordingSink sink;
  Inflight inflight;
  auto req = request_with_key(7);
  serve(d, req, nullptr, nullptr, inflight, sink);
  auto ev = sink.events();
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].kind == "answer");
  CHECK(ev[0].response.body == "hi");
  CHECK(ev[0].response.stream == 0);
  CHECK(ev[0].response.headers.back() == std::make_pair(std::string("X-Request-Id"),
                                                       std::string("req-1")));
  CHECK(inflight.size() == 0);
}

TEST_CASE("serve: a stream is its head with the call key - its chunks in order - a complete end") {
  Scripted d([](const Request&) {
    return Response::event_stream([](StreamWriter& out) {
      CHECK(out.event("0"));
      CHECK(out.write(""));  // nothing sent
      CHECK(out.event("a\nb", "tick", "9"));
    });
  });
  RecordingSink sink;
  Inflight inflight;
  auto req = request_with_key(7);
  serve(d, req, nullptr, nullptr, inflight, sink);
  auto ev = sink.events();
  REQUIRE(ev.size() == 4);
  CHECK(ev[0].kind == "head");
  CHECK(ev[0].response.stream == 7);
  CHECK(ev[0].response.status == 200);
  CHECK(ev[0].response.body.empty());
  CHECK(ev[0].response.headers[0].second == "text/event-stream");
  CHECK(ev[1].data == "data: 0\n\n");
  CHECK(ev[2].data == "event: tick\nid: 9\ndata: a\ndata: b\n\n");
  CHECK(ev[3].kind == "end");
  CHECK(ev[3].complete);
  CHECK(inflight.size() == 0);
}

TEST_CASE("serve: a producer that throws ends the stream early - a handler that throws answers 500") {
  Scripted streaming([](const Request&) {
    return Response::streaming([](StreamWriter& out) {
      out.write("x");
      throw std::runtime_error("model crashed");
    });
  });
  RecordingSink sink;
  Inflight inflight;
  auto req = request_with_key(1);
  serve(streaming, req, nullptr, nullptr, inflight, sink);
  auto ev = sink.events();
  REQUIRE(ev.size() == 3);
  CHECK(ev[2].kind == "end");
  CHECK_FALSE(ev[2].complete);
  CHECK(ev[2].data.find("model crashed") != std::string::npos);

  Scripted failing([](const Request&) -> Response { throw std::runtime_error("bad input"); });
  RecordingSink sink2;
  auto req2 = request_with_key(2);
  serve(failing, req2, nullptr, nullptr, inflight, sink2);
  auto ev2 = sink2.events();
  REQUIRE(ev2.size() == 1);
  CHECK(ev2[0].response.status == 500);
  CHECK(ev2[0].response.body.find("bad input") != std::string::npos);
}

TEST_CASE("serve: a producer blocks at the credit window until the receiver grants more") {
  const size_t piece = kStreamWindow / 4;
  Scripted d([piece](const Request&) {
    return Response::streaming([piece](StreamWriter& out) {
      std::string data(piece, 'z');
      for (int i = 0; i < 8; ++i) {
        if (!out.write(data))
          return;
      }
    });
  });
  RecordingSink sink;
  Inflight inflight;
  auto done = std::async(std::launch::async, [&] {
    auto req = request_with_key(5);
    serve(d, req, nullptr, nullptr, inflight, sink);
  });
  // Four pieces fill the window; the fifth waits for credit.
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (sink.chunks() < 4 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  REQUIRE(sink.chunks() == 4);
  CHECK(done.wait_for(100ms) == std::future_status::timeout);
  CHECK(sink.chunks() == 4);
  inflight.grant(5, piece * 2);  // room for two more
  while (sink.chunks() < 6 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  CHECK(sink.chunks() == 6);
  CHECK(done.wait_for(100ms) == std::future_status::timeout);
  inflight.grant(5, piece * 4);
  REQUIRE(done.wait_for(10s) == std::future_status::ready);
  auto ev = sink.events();
  CHECK(ev.back().kind == "end");
  CHECK(ev.back().complete);
}

TEST_CASE("serve: a cancel stops a producer waiting for credit - and a handler waiting in wait_cancelled") {
  Scripted d([](const Request& request) {
    if (request.path == "/wait") {
      bool cancelled = request.wait_cancelled(60s);
      return Response::text(cancelled ? "cancelled" : "slept");
    }
    return Response::streaming([](StreamWriter& out) {
      std::string data(kStreamWindow, 'z');
      while (out.write(data)) {
      }
      CHECK(out.cancelled());
    });
  });
  RecordingSink sink;
  Inflight inflight;
  auto stream = std::async(std::launch::async, [&] {
    auto req = request_with_key(11);
    serve(d, req, nullptr, nullptr, inflight, sink);
  });
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (sink.chunks() < 1 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  REQUIRE(sink.chunks() == 1);
  inflight.cancel(11, false);
  REQUIRE(stream.wait_for(10s) == std::future_status::ready);
  auto ev = sink.events();
  CHECK(ev.back().kind == "end");
  CHECK_FALSE(ev.back().complete);
  CHECK(ev.back().data == "cancelled");

  RecordingSink sink2;
  auto waiting = std::async(std::launch::async, [&] {
    auto req = request_with_key(12);
    req.path = "/wait";
    serve(d, req, nullptr, nullptr, inflight, sink2);
  });
  while (inflight.size() < 1 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  REQUIRE(inflight.size() == 1);
  auto started = std::chrono::steady_clock::now();
  inflight.cancel(12, false);
  REQUIRE(waiting.wait_for(10s) == std::future_status::ready);
  CHECK(std::chrono::steady_clock::now() - started < 5s);  // not the 60 s wait
  CHECK(sink2.events().at(0).response.body == "cancelled");
}

TEST_CASE("serve: a cancel that overtakes its request is kept - the request starts cancelled") {
  std::atomic<int> on_cancel_calls{0};
  Scripted d([&](const Request& request) {
    request.control->on_cancel([&] { ++on_cancel_calls; });
    bool cancelled = request.wait_cancelled(60s);
    return Response::text(cancelled ? "cancelled" : "slept");
  });
  RecordingSink sink;
  Inflight inflight;
  // The cancellation comes first (another thread than the request's worker).
  inflight.cancel(21, false);
  CHECK(inflight.early_size() == 1);
  auto started = std::chrono::steady_clock::now();
  auto req = request_with_key(21);
  serve(d, req, nullptr, nullptr, inflight, sink);
  CHECK(std::chrono::steady_clock::now() - started < 5s);  // not the 60 s wait
  REQUIRE(sink.events().size() == 1);
  CHECK(sink.events()[0].response.body == "cancelled");
  CHECK(on_cancel_calls == 1);
  CHECK(inflight.early_size() == 0);  // used once
  CHECK(inflight.size() == 0);

  // Another request with no cancellation kept for it runs in full.
  Scripted quick([](const Request& request) {
    return Response::text(request.cancelled() ? "cancelled" : "ran");
  });
  RecordingSink sink2;
  auto req2 = request_with_key(22);
  serve(quick, req2, nullptr, nullptr, inflight, sink2);
  CHECK(sink2.events().at(0).response.body == "ran");
}

TEST_CASE("Inflight: kept cancellations are bounded - the oldest go first - key 0 is never kept") {
  Inflight inflight;
  inflight.cancel(0, false);
  CHECK(inflight.early_size() == 0);
  for (uint64_t k = 1; k <= Inflight::kEarlyKept + 10; ++k)
    inflight.cancel(k, k % 2 == 0);
  CHECK(inflight.early_size() == Inflight::kEarlyKept);
  // Key 1 was dropped: its request runs uncancelled. The newest is kept,
  // with why it was cancelled.
  auto first = std::make_shared<RequestControl>();
  inflight.add(1, first);
  CHECK_FALSE(first->cancelled());
  auto newest = std::make_shared<RequestControl>();
  inflight.add(Inflight::kEarlyKept + 10, newest);
  CHECK(newest->cancelled());
  CHECK(newest->timed_out());
  // A cancellation for a registered request is not kept.
  inflight.cancel(1, false);
  CHECK(first->cancelled());
  CHECK(inflight.early_size() == Inflight::kEarlyKept - 1);
}

TEST_CASE("serve: the deadline stops a producer waiting for credit - and is the request's deadline") {
  std::promise<std::chrono::steady_clock::time_point> seen;
  Scripted d([&](const Request& request) {
    seen.set_value(request.deadline());
    return Response::streaming([](StreamWriter& out) {
      std::string data(kStreamWindow, 'z');
      while (out.write(data)) {
      }
    });
  });
  RecordingSink sink;
  Inflight inflight;
  auto before = std::chrono::steady_clock::now();
  auto req = request_with_key(3, 0.2);
  serve(d, req, nullptr, nullptr, inflight, sink);  // returns once the deadline passed
  auto deadline = seen.get_future().get();
  CHECK(deadline > before);
  CHECK(deadline <= before + 1s);
  CHECK(std::chrono::steady_clock::now() >= deadline);
  auto ev = sink.events();
  CHECK(ev.back().kind == "end");
  CHECK_FALSE(ev.back().complete);
}

TEST_CASE("serve: a receiver that is gone ends the stream - write says so") {
  std::atomic<int> writes{0};
  Scripted d([&](const Request&) {
    return Response::streaming([&](StreamWriter& out) {
      while (out.write("x"))
        ++writes;
    });
  });
  RecordingSink sink;
  sink.refuse_chunks = true;
  Inflight inflight;
  auto req = request_with_key(4);
  serve(d, req, nullptr, nullptr, inflight, sink);
  CHECK(writes == 0);
  CHECK(sink.events().back().kind == "end");
  CHECK_FALSE(sink.events().back().complete);
}

TEST_CASE("RequestControl: on_cancel runs once - at once when already cancelled - and never for a request that ends") {
  RequestControl control;
  int calls = 0;
  control.on_cancel([&] { ++calls; });
  CHECK_FALSE(control.cancelled());
  control.cancel();
  control.cancel();
  CHECK(calls == 1);
  CHECK(control.cancelled());
  control.on_cancel([&] { ++calls; });
  CHECK(calls == 2);

  CHECK_FALSE(control.timed_out());  // cancelled: its client left

  RequestControl expired;
  expired.cancel(true);
  CHECK(expired.timed_out());

  RequestControl past(std::chrono::steady_clock::now() - 1ms);
  CHECK(past.timed_out());
  CHECK(past.cancelled());
  CHECK(past.wait_cancelled(10s));  // at once: the deadline passed

  Request bare;  // built by hand: never cancelled, no deadline
  CHECK_FALSE(bare.cancelled());
  CHECK(bare.deadline() == std::chrono::steady_clock::time_point::max());
}
