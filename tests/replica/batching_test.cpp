// A replica's batcher (replica/batching.hpp) with a deployment instance of
// the test's own: answers carry their request ids, a streamed answer of a
// batch is a 500, batching turns on and off in place, an instance that is
// gone answers 503, letting the batcher go never waits for a batch that
// runs, and a class without handle_batch() is refused with a message that
// names the field. Waits are conditions with deadlines.
#include "replica/batching.hpp"
#include "replica/streams.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

using namespace troupe;
using namespace troupe::replica;

namespace {

// Answers each request with its body and the size of its batch; a body
// "stream" gets a streamed answer; while `hold` is set, a batch waits for
// it to be released.
class Batched : public Deployment {
 public:
  Response handle(const Request& r) override { return Response::text(r.body + "/alone"); }
  std::vector<Response> handle_batch(const std::vector<Request>& rs) override {
    if (hold.valid()) {
      entered.set_value();
      hold.wait();
    }
    std::vector<Response> out;
    for (const auto& r : rs) {
      if (r.body == "stream")
        out.push_back(Response::streaming([](StreamWriter&) {}));
      else
        out.push_back(Response::text(r.body + "/" + std::to_string(rs.size())));
    }
    return out;
  }
  std::shared_future<void> hold;
  std::promise<void> entered;  // set when a held batch starts
};

HttpRequest batch_req(const std::string& body, const std::string& id) {
  HttpRequest r;
  r.method = "POST";
  r.path = "/";
  r.body = body;
  r.request_id = id;
  return r;
}

// Submits `req` and returns the future of its answer.
std::future<HttpResponse> submit_to(ReplicaBatcher& b, HttpRequest req) {
  auto answered = std::make_shared<std::promise<HttpResponse>>();
  auto future = answered->get_future();
  b.submit(std::move(req), request_control(0),
           [answered](HttpResponse&& out) { answered->set_value(std::move(out)); });
  return future;
}

std::string header_of(const HttpResponse& r, const std::string& name) {
  for (const auto& [k, v] : r.headers) {
    if (k == name)
      return v;
  }
  return "";
}

BatchSettings batch_of(uint32_t n, double wait_s) {
  BatchSettings s;
  s.max_batch_size = n;
  s.wait_s = wait_s;
  return s;
}

}  // namespace

TEST_CASE("replica batcher: a full batch is answered per request with its request id") {
  auto instance = std::make_shared<Batched>();
  // A wait far longer than the test: only a full batch closes.
  ReplicaBatcher b(instance, batch_of(3, 600), nullptr, nullptr);
  CHECK(b.active());
  auto first = submit_to(b, batch_req("a", "id-a"));
  auto second = submit_to(b, batch_req("b", "id-b"));
  auto third = submit_to(b, batch_req("stream", "id-s"));
  REQUIRE(first.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  REQUIRE(second.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  REQUIRE(third.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  auto a = first.get();
  auto s = third.get();
  CHECK(a.body == "a/3");
  CHECK(header_of(a, "X-Request-Id") == "id-a");
  CHECK(second.get().body == "b/3");
  CHECK(s.status == 500);
  CHECK(s.body.find("handle_batch answered a stream") != std::string::npos);
  CHECK(header_of(s, "X-Request-Id") == "id-s");
}

TEST_CASE("replica batcher: settings change in place - off at max_batch_size 1") {
  auto instance = std::make_shared<Batched>();
  ReplicaBatcher b(instance, batch_of(1, 0.01), nullptr, nullptr);
  CHECK_FALSE(b.active());
  b.apply(batch_of(8, 0.001));
  CHECK(b.active());
  CHECK(b.settings().max_batch_size == 8);
  // A lone request: its batch closes when its wait ends.
  auto one = submit_to(b, batch_req("x", ""));
  REQUIRE(one.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  auto x = one.get();
  CHECK(x.body == "x/1");
  CHECK(header_of(x, "X-Request-Id").empty());
  BatchSettings adaptive = batch_of(8, 0.01);
  adaptive.adaptive = true;
  b.apply(adaptive);
  CHECK(b.active());
  CHECK(b.settings().adaptive);
  b.apply(batch_of(1, 0.01));
  CHECK_FALSE(b.active());
}

TEST_CASE("replica batcher: an instance that is gone answers 503") {
  auto instance = std::make_shared<Batched>();
  ReplicaBatcher b(instance, batch_of(2, 600), nullptr, nullptr);
  instance.reset();  // the batcher holds it weakly
  auto first = submit_to(b, batch_req("a", ""));
  auto second = submit_to(b, batch_req("b", ""));
  REQUIRE(first.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  REQUIRE(second.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(first.get().status == 503);
  CHECK(second.get().status == 503);
}

TEST_CASE("replica batcher: letting it go does not wait for the batch that runs") {
  auto instance = std::make_shared<Batched>();
  std::promise<void> release;
  instance->hold = release.get_future().share();
  auto b = std::make_unique<ReplicaBatcher>(instance, batch_of(2, 600), nullptr, nullptr);
  auto started = instance->entered.get_future();
  auto first = submit_to(*b, batch_req("a", ""));
  auto second = submit_to(*b, batch_req("b", ""));
  // The batch runs (and waits for `release`) while the batcher goes.
  REQUIRE(started.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  auto gone = std::async(std::launch::async, [&] { b.reset(); });
  CHECK(gone.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(first.wait_for(std::chrono::milliseconds(0)) == std::future_status::timeout);
  release.set_value();
  // The batch that ran is still answered, by the batcher's own thread.
  REQUIRE(first.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  REQUIRE(second.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(first.get().body == "a/2");
  CHECK(second.get().body == "b/2");
}

TEST_CASE(
    "replica batcher: a class without handle_batch cannot batch - the message names the "
    "field") {
  CHECK(check_batching(batch_of(1, 0.01), false, "libx.so:X").is_ok());
  CHECK(check_batching(batch_of(32, 0.01), true, "libx.so:X").is_ok());
  auto size = check_batching(batch_of(32, 0.01), false, "libx.so:X");
  CHECK(size.code() == errc::invalid_argument);
  CHECK(size.message().rfind("max_batch_size is 32, but the deployment class X (libx.so) does "
                             "not implement handle_batch()",
                             0) == 0);
  // A pinned library is named by its file name.
  CHECK(check_batching(batch_of(8, 0.01), false, "libx.so@" + std::string(64, 'a') + ":Y")
            .message()
            .rfind("max_batch_size is 8, but the deployment class Y (libx.so) does not", 0) == 0);
  BatchSettings adaptive = batch_of(1, 0.01);
  adaptive.adaptive = true;
  CHECK(wants_batching(adaptive));
  CHECK(check_batching(adaptive, false, "libx.so:X")
            .message()
            .rfind("batch_wait_timeout_s is auto, but", 0) == 0);
}
