// The batcher (replica/batcher.hpp) driven step by step: no thread runs the
// batches (Batcher::step) and the clock is the test's, moved by hand; only
// the last case runs the Batcher's own thread, and it waits on conditions
// with deadlines.
#include "replica/batcher.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <map>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace troupe;
using namespace troupe::replica;
using Clock = BatchQueue::Clock;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

// A clock that moves only when told.
struct BatchClock {
  Clock::time_point t = Clock::time_point{} + std::chrono::hours(1);
  std::function<Clock::time_point()> fn() {
    return [this] { return t; };
  }
};

Request queued_request(const std::string& body, std::shared_ptr<RequestControl> control = nullptr) {
  Request r;
  r.method = "POST";
  r.path = "/";
  r.body = body;
  r.control = std::move(control);
  return r;
}

// What each request was answered, by its body; and the batches run.
struct BatchRecord {
  std::vector<std::vector<std::string>> batches;
  std::map<std::string, Response> answers;
  std::function<void(Response)> done(const std::string& body) {
    return [this, body](Response r) {
      CHECK_MESSAGE(answers.count(body) == 0, "answered twice: " << body);
      answers[body] = std::move(r);
    };
  }
  // Answers every request with "answer to <body>".
  Batcher::Run echo() {
    return [this](const std::vector<Request>& requests) {
      std::vector<std::string> bodies;
      std::vector<Response> out;
      for (const auto& r : requests) {
        bodies.push_back(r.body);
        out.push_back(Response::text("answer to " + r.body));
      }
      batches.push_back(bodies);
      return out;
    };
  }
};

BatchOptions fixed_wait(size_t max, double wait_s) {
  BatchOptions o;
  o.max_batch_size = max;
  o.wait_s = wait_s;
  return o;
}

}  // namespace

TEST_CASE("batcher: a full batch closes at once and a partial one at exactly its wait") {
  BatchClock clock;
  BatchRecord rec;
  Batcher b(fixed_wait(4, 0.010), rec.echo(), false, clock.fn());
  for (int i = 0; i < 6; ++i)
    b.submit(queued_request(std::to_string(i)), rec.done(std::to_string(i)));
  // Four of six: full, at once, in the order they came.
  CHECK(b.step() == 4);
  REQUIRE(rec.batches.size() == 1);
  CHECK(rec.batches[0] == std::vector<std::string>{"0", "1", "2", "3"});
  // The other two wait for the oldest's 10 ms: not a microsecond less.
  clock.t += microseconds(9999);
  CHECK(b.step() == 0);
  CHECK(b.queued() == 2);
  clock.t += microseconds(1);
  CHECK(b.step() == 2);
  CHECK(rec.batches[1] == std::vector<std::string>{"4", "5"});
  CHECK(b.step() == 0);
  CHECK(rec.answers.size() == 6);
}

TEST_CASE("batcher: every request gets its own answer") {
  BatchClock clock;
  BatchRecord rec;
  Batcher b(fixed_wait(8, 0.005), rec.echo(), false, clock.fn());
  for (int i = 0; i < 20; ++i)
    b.submit(queued_request("value-" + std::to_string(i)), rec.done("value-" + std::to_string(i)));
  while (b.queued() > 0) {
    clock.t += milliseconds(5);
    b.step();
  }
  CHECK(rec.batches.size() == 3);  // 8, 8, 4
  REQUIRE(rec.answers.size() == 20);
  for (int i = 0; i < 20; ++i) {
    const auto& a = rec.answers["value-" + std::to_string(i)];
    CHECK(a.status == 200);
    CHECK(a.body == "answer to value-" + std::to_string(i));
  }
}

TEST_CASE("batcher: cancelled and expired requests are left out of their batch") {
  BatchClock clock;
  BatchRecord rec;
  Batcher b(fixed_wait(4, 0.010), rec.echo(), false, clock.fn());
  auto cancelled = std::make_shared<RequestControl>();
  auto expired = std::make_shared<RequestControl>(RequestControl::Clock::now() - milliseconds(1));
  auto later = std::make_shared<RequestControl>(RequestControl::Clock::now() + std::chrono::hours(1));
  b.submit(queued_request("a"), rec.done("a"));
  b.submit(queued_request("cancelled", cancelled), rec.done("cancelled"));
  b.submit(queued_request("expired", expired), rec.done("expired"));
  b.submit(queued_request("b", later), rec.done("b"));
  cancelled->cancel();
  // Four came, two are out: the batch is not full and waits its 10 ms; the
  // two are answered at once, and never run.
  CHECK(b.step() == 0);
  CHECK(rec.answers.at("cancelled").status == 499);
  CHECK(rec.answers.at("expired").status == 504);
  CHECK(rec.batches.empty());
  clock.t += milliseconds(10);
  CHECK(b.step() == 2);
  CHECK(rec.batches[0] == std::vector<std::string>{"a", "b"});
  CHECK(rec.answers.at("a").body == "answer to a");
  CHECK(rec.answers.at("b").body == "answer to b");
}

TEST_CASE("batcher: a batch handler that throws fails its own batch only") {
  BatchClock clock;
  BatchRecord rec;
  int calls = 0;
  Batcher b(
      fixed_wait(2, 0.010),
      [&](const std::vector<Request>& requests) {
        if (++calls == 1)
          throw std::runtime_error("model exploded");
        return rec.echo()(requests);
      },
      false, clock.fn());
  for (const char* body : {"x1", "x2", "y1", "y2"})
    b.submit(queued_request(body), rec.done(body));
  CHECK(b.step() == 2);
  CHECK(b.step() == 2);
  for (const char* body : {"x1", "x2"}) {
    CHECK(rec.answers.at(body).status == 500);
    CHECK(rec.answers.at(body).body == R"({"error":"model exploded"})");
  }
  for (const char* body : {"y1", "y2"})
    CHECK(rec.answers.at(body).body == std::string("answer to ") + body);
}

TEST_CASE("batcher: a batch handler that returns the wrong number of answers fails that batch") {
  BatchClock clock;
  BatchRecord rec;
  Batcher b(
      fixed_wait(3, 0.010),
      [](const std::vector<Request>&) { return std::vector<Response>{Response::text("one")}; },
      false, clock.fn());
  for (const char* body : {"a", "b", "c"})
    b.submit(queued_request(body), rec.done(body));
  CHECK(b.step() == 3);
  for (const char* body : {"a", "b", "c"}) {
    CHECK(rec.answers.at(body).status == 500);
    CHECK(rec.answers.at(body).body ==
          R"({"error":"handle_batch returned 1 answers for 3 requests"})");
  }
}

TEST_CASE("batcher: new options apply to the requests already queued") {
  BatchClock clock;
  BatchRecord rec;
  Batcher b(fixed_wait(8, 1.0), rec.echo(), false, clock.fn());
  b.submit(queued_request("a"), rec.done("a"));
  b.submit(queued_request("b"), rec.done("b"));
  clock.t += milliseconds(5);
  CHECK(b.step() == 0);  // waits 1 s
  b.set_options(fixed_wait(2, 1.0));
  CHECK(b.step() == 2);  // full under the new size
  b.submit(queued_request("c"), rec.done("c"));
  b.set_options(fixed_wait(8, 0.001));
  clock.t += milliseconds(1);
  CHECK(b.step() == 1);  // the new, shorter wait
  CHECK(b.options().max_batch_size == 8);
}

TEST_CASE("batcher: requests still queued when it stops are answered 503") {
  BatchClock clock;
  BatchRecord rec;
  {
    Batcher b(fixed_wait(8, 1.0), rec.echo(), false, clock.fn());
    b.submit(queued_request("a"), rec.done("a"));
  }
  CHECK(rec.answers.at("a").status == 503);
  CHECK(rec.batches.empty());
}

TEST_CASE("batcher: the adaptive wait is none at light load and fills batches at heavy load") {
  BatchOptions o;
  o.max_batch_size = 4;
  o.adaptive = true;
  BatchQueue q(o);
  auto t = Clock::time_point{} + std::chrono::hours(1);
  auto nothing = [](Response) {};
  // Nothing learned yet: a request runs at once.
  q.push(queued_request("first"), nothing, t);
  CHECK(q.wait_s() == 0);
  CHECK(q.closes_at() == t);
  q.take(t, true);
  q.ran(milliseconds(5));  // a batch takes 5 ms

  // Requests 100 ms apart (light load): no wait.
  for (int i = 0; i < 10; ++i) {
    t += milliseconds(100);
    q.push(queued_request("light"), nothing, t);
    CHECK(q.take(t, true).batch.size() == 1);
    q.ran(milliseconds(5));
  }
  CHECK(q.mean_interarrival_s() > 0.05);
  CHECK(q.wait_s() == 0);

  // Requests 1 ms apart: wait for the batch to fill, (4 - 1) x ~1 ms, less
  // than a batch takes.
  for (int i = 0; i < 40; ++i) {
    t += milliseconds(1);
    q.push(queued_request("heavy"), nothing, t);
    auto taken = q.take(t, true);
    if (!taken.batch.empty())
      q.ran(milliseconds(5));
  }
  CHECK(q.mean_interarrival_s() == doctest::Approx(0.001).epsilon(0.05));
  CHECK(q.wait_s() == doctest::Approx(0.003).epsilon(0.05));
  CHECK(q.wait_s() < q.mean_batch_s());

  // Never longer than a batch takes, nor than the cap.
  o.max_batch_size = 1000;
  q.set_options(o);
  CHECK(q.wait_s() == doctest::Approx(q.mean_batch_s()));
  for (int i = 0; i < 40; ++i)
    q.ran(std::chrono::seconds(1));
  CHECK(q.wait_s() == BatchQueue::kAdaptiveCap);
}

TEST_CASE("batcher: with a fixed wait requests that queued behind a running batch wait it out") {
  BatchQueue q(fixed_wait(8, 0.005));
  auto t = Clock::time_point{} + std::chrono::hours(1);
  auto nothing = [](Response) {};
  q.push(queued_request("a"), nothing, t);
  t += milliseconds(5);
  CHECK(q.take(t, true).batch.size() == 1);
  t += milliseconds(1);
  const auto b_arrived = t;
  q.push(queued_request("b"), nothing, t);
  t += milliseconds(1);
  q.ran(milliseconds(2));
  // Ray Serve's rule: a partial batch closes when its oldest has waited
  // batch_wait_timeout_s, whatever ran before it.
  CHECK(q.closes_at() == b_arrived + milliseconds(5));
  CHECK(q.take(t, true).batch.empty());
  t = b_arrived + milliseconds(5);
  CHECK(q.take(t, true).batch.size() == 1);
}

TEST_CASE("batcher: on its own thread - requests from many threads each get their own answer") {
  std::atomic<int> largest{0};
  Batcher b(
      fixed_wait(16, 0.002),
      [&](const std::vector<Request>& requests) {
        largest = std::max<int>(largest, static_cast<int>(requests.size()));
        std::vector<Response> out;
        for (const auto& r : requests)
          out.push_back(Response::text("answer to " + r.body));
        return out;
      });
  constexpr int kThreads = 8, kEach = 50;
  std::atomic<int> right{0}, wrong{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < kThreads; ++t) {
    clients.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const std::string body = std::to_string(t) + "-" + std::to_string(i);
        auto answered = std::make_shared<std::promise<Response>>();
        auto future = answered->get_future();
        b.submit(queued_request(body), [answered](Response r) { answered->set_value(std::move(r)); });
        if (future.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
          ++wrong;
          return;
        }
        (future.get().body == "answer to " + body ? right : wrong) += 1;
      }
    });
  }
  for (auto& c : clients)
    c.join();
  CHECK(wrong == 0);
  CHECK(right == kThreads * kEach);
  CHECK(largest <= 16);
}

TEST_CASE("batcher: on_answered runs once after the answers of each batch and of its drops") {
  BatchClock clock;
  BatchRecord record;
  std::vector<size_t> answered_when;  // answers given when the hook ran
  Batcher b(fixed_wait(3, 0.01), record.echo(), false, clock.fn());
  b.on_answered([&] { answered_when.push_back(record.answers.size()); });
  b.submit(queued_request("a"), record.done("a"));
  b.submit(queued_request("b"), record.done("b"));
  CHECK(b.step() == 0);
  CHECK(answered_when.empty());  // nothing answered: no call
  b.submit(queued_request("c"), record.done("c"));
  CHECK(b.step() == 3);
  CHECK(answered_when == std::vector<size_t>{3});
  // A cancelled request left out: its 499 is followed by the hook too.
  auto control = std::make_shared<RequestControl>();
  b.submit(queued_request("d", control), record.done("d"));
  control->cancel();
  CHECK(b.step() == 0);
  CHECK(record.answers.at("d").status == 499);
  CHECK(answered_when == std::vector<size_t>{3, 4});
}
