// Every example deployment, loaded from the built libtroupe_examples.so the
// way a replica loads it, with exact outputs.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "plugin_test_util.hpp"

namespace troupe {
namespace {

using testing::example_context;
using testing::kPluginDir;

// One loader for the whole binary: libraries stay loaded anyway.
PluginLoader& loader() {
  static PluginLoader instance({kPluginDir});
  return instance;
}

std::unique_ptr<Deployment> make(const std::string& class_name, const Json& args = Json()) {
  const DeploymentFactory* factory =
      testing::require_factory(loader(), "libtroupe_examples.so:" + class_name);
  CHECK(std::string(factory->class_name) == class_name);
  return factory->create(args, example_context());
}

Request get(std::string path = "/", std::string query = "") {
  Request request;
  request.method = "GET";
  request.path = std::move(path);
  request.query = std::move(query);
  return request;
}

Json json_of(const Response& response) {
  REQUIRE(response.headers.size() == 1);
  CHECK(response.headers[0].first == "Content-Type");
  CHECK(response.headers[0].second == "application/json");
  return Json::parse(response.body);
}

TEST_CASE("Noop answers the same small JSON body to every request") {
  auto noop = make("Noop");
  Request request;
  request.method = "POST";
  request.path = "/anything";
  request.body = "ignored";
  Response response = noop->handle(request);
  CHECK(response.status == 200);
  CHECK(json_of(response) == Json{{"ok", true}});
  request.path = "/other";
  CHECK(noop->handle(request).body == response.body);
  // It only builds a constant: called inline by the proxy when in_process.
  CHECK(noop->nonblocking());
}

TEST_CASE("Fixed answers like Noop from a handler of the default blocking kind") {
  auto fixed = make("Fixed");
  auto noop = make("Noop");
  Request request;
  request.method = "GET";
  request.path = "/x";
  Response response = fixed->handle(request);
  CHECK(response.status == 200);
  CHECK(json_of(response) == Json{{"ok", true}});
  CHECK(response.body == noop->handle(request).body);
  // Not declared non-blocking: an in-process replica runs it on a request
  // thread, as it would a user's handler.
  CHECK_FALSE(fixed->nonblocking());
}

TEST_CASE("InlineProbe declares its handler non-blocking unless its args say otherwise") {
  auto probe = make("InlineProbe", Json::object());
  CHECK(probe->nonblocking());
  CHECK_FALSE(make("InlineProbe", Json{{"nonblocking", false}})->nonblocking());
  Json first = json_of(probe->handle(get("/", "spin_us=10")));
  CHECK(first["max_running"] == 1);
  CHECK(first["served"] == 1);
  CHECK_THROWS_WITH_AS(probe->handle(get("/", "mode=throw")), "probe failure", std::runtime_error);
  Response streamed = probe->handle(get("/", "mode=stream&n=2"));
  CHECK(static_cast<bool>(streamed.stream));
}

TEST_CASE("Echo returns the request and the replica as JSON") {
  auto echo = make("Echo");
  Request request;
  request.method = "POST";
  request.path = "/a/b";
  request.query = "x=1&y=%20";
  request.headers = {{"Host", "localhost"}, {"X-Tag", "a"}, {"X-Tag", "b"}};
  request.body = "payload";
  Response response = echo->handle(request);
  CHECK(response.status == 200);
  CHECK(json_of(response) == Json{{"method", "POST"},
                                  {"path", "/a/b"},
                                  {"query", "x=1&y=%20"},
                                  {"headers", {{"Host", "localhost"}, {"X-Tag", "a, b"}}},
                                  {"body", "payload"},
                                  {"replica_id", "app#Dep#r1"},
                                  {"node_id", "node-1"}});
}

TEST_CASE("Hello greets with user_config.greeting and changes it on reconfigure") {
  auto hello = make("Hello");
  const Json before = json_of(hello->handle(get()));
  CHECK(before == Json{{"greeting", "hello"},
                       {"replica_id", "app#Dep#r1"},
                       {"node_id", "node-1"},
                       {"version", "v7"}});

  hello->reconfigure(Json{{"greeting", "hi"}});
  CHECK(json_of(hello->handle(get()))["greeting"] == "hi");
  hello->reconfigure(Json{{"greeting", "bonjour"}});
  CHECK(json_of(hello->handle(get()))["greeting"] == "bonjour");
  hello->reconfigure(Json::object());  // no greeting: back to the default
  CHECK(json_of(hello->handle(get()))["greeting"] == "hello");

  CHECK_THROWS_WITH_AS(hello->reconfigure(Json{{"greeting", 3}}),
                       "Hello: user_config.greeting must be a string, got 3",
                       std::invalid_argument);
}

TEST_CASE("Counter counts the requests of its replica - also concurrent ones") {
  auto counter = make("Counter");
  CHECK(json_of(counter->handle(get())) ==
        Json{{"count", 1}, {"replica_id", "app#Dep#r1"}, {"node_id", "node-1"}});
  CHECK(json_of(counter->handle(get()))["count"] == 2);

  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i)
        counter->handle(get());
    });
  }
  for (auto& thread : threads)
    thread.join();
  CHECK(json_of(counter->handle(get()))["count"] == 403);

  auto other = make("Counter");  // another replica starts at 1
  CHECK(json_of(other->handle(get()))["count"] == 1);
}

TEST_CASE("Sleep sleeps ?ms=N - else user_config.ms") {
  auto sleep = make("Sleep");
  CHECK(json_of(sleep->handle(get("/", "ms=5"))) ==
        Json{{"slept_ms", 5}, {"replica_id", "app#Dep#r1"}});
  sleep->reconfigure(Json{{"ms", 3}});
  CHECK(json_of(sleep->handle(get()))["slept_ms"] == 3);
  CHECK(json_of(sleep->handle(get("/", "ms=0")))["slept_ms"] == 0);

  Response bad = sleep->handle(get("/", "ms=-1"));
  CHECK(bad.status == 400);
  CHECK(json_of(bad)["error"] == "ms must be an integer in [0, 3600000], got '-1'");
  CHECK(sleep->handle(get("/", "ms=99999999")).status == 400);
  CHECK_THROWS_AS(sleep->reconfigure(Json{{"ms", "x"}}), std::invalid_argument);
}

TEST_CASE("Burn reports the requested CPU time") {
  auto burn = make("Burn");
  CHECK(json_of(burn->handle(get("/", "ms=2"))) == Json{{"burned_ms", 2}});
  CHECK(json_of(burn->handle(get("/", "ms=0"))) == Json{{"burned_ms", 0}});
  CHECK(burn->handle(get("/", "ms=abc")).status == 400);
}

TEST_CASE("FailInit's constructor throws its message") {
  CHECK_THROWS_WITH_AS(make("FailInit"), "FailInit always fails to start", std::runtime_error);
  CHECK_THROWS_WITH_AS(make("FailInit", Json{{"message", "no GPU here"}}), "no GPU here",
                       std::runtime_error);
}

TEST_CASE("Crash answers with its pid when asked for no crash - and refuses unknown modes") {
  auto crash = make("Crash");
  const Json answer = json_of(crash->handle(get()));
  CHECK(answer ==
        Json{{"replica_id", "app#Dep#r1"}, {"pid", static_cast<int64_t>(getpid())}, {"ok", true}});
  CHECK(json_of(crash->handle(get("/", "mode=")))["ok"] == true);  // empty: no mode

  Response unknown = crash->handle(get("/", "mode=explode"));
  CHECK(unknown.status == 400);
  CHECK(json_of(unknown)["error"] ==
        "mode must be segv, abort, exit, stack or alloc, got 'explode'");

  // Explicit empty init args start it normally too; a constructor crash it
  // does not know is a start failure with a message, not a crash.
  CHECK(json_of(make("Crash", Json::object())->handle(get()))["ok"] == true);
  CHECK_THROWS_WITH_AS(make("Crash", Json{{"constructor", "melt"}}),
                       "Crash: args.constructor must be \"segv\", \"abort\" or \"exit\", got "
                       "\"melt\"",
                       std::invalid_argument);
  CHECK_THROWS_AS(make("Crash", Json{{"constructor", 1}}), std::invalid_argument);
}

TEST_CASE("Crash allocates mb=N MiB - keeps it - and refuses a bad mb") {
  auto crash = make("Crash");
  const Json first = json_of(crash->handle(get("/", "mode=alloc&mb=2")));
  CHECK(first == Json{{"allocated_mb", 2},
                      {"total_mb", 2},
                      {"replica_id", "app#Dep#r1"},
                      {"pid", static_cast<int64_t>(getpid())}});
  CHECK(json_of(crash->handle(get("/", "mode=alloc&mb=3")))["total_mb"] == 5);
  CHECK(json_of(crash->handle(get("/", "mode=alloc&mb=0")))["total_mb"] == 5);
  for (const char* bad : {"mb=-1", "mb=abc", "mb=", "mb=1048577", "mb=99999999"}) {
    CAPTURE(bad);
    Response r = crash->handle(get("/", std::string("mode=alloc&") + bad));
    CHECK(r.status == 400);
    CHECK(json_of(r)["error"].get<std::string>().rfind("mb must be an integer in [0, 1048576]",
                                                       0) == 0);
  }
}

TEST_CASE("FlakyHealth passes exactly N health checks - then fails") {
  SUBCASE("default N = 3") {
    auto flaky = make("FlakyHealth");
    for (int i = 0; i < 3; ++i)
      CHECK_NOTHROW(flaky->check_health());
    CHECK_THROWS_WITH_AS(flaky->check_health(), "unhealthy after 3 checks", std::runtime_error);
    CHECK_THROWS_WITH_AS(flaky->check_health(), "unhealthy after 3 checks", std::runtime_error);
    CHECK(json_of(flaky->handle(get())) ==
          Json{{"checks", 5}, {"healthy_checks", 3}, {"replica_id", "app#Dep#r1"}});
  }
  SUBCASE("N from init args") {
    auto flaky = make("FlakyHealth", Json{{"healthy_checks", 1}});
    CHECK_NOTHROW(flaky->check_health());
    CHECK_THROWS_WITH(flaky->check_health(), "unhealthy after 1 checks");
  }
  SUBCASE("N from user_config overrides init args") {
    auto flaky = make("FlakyHealth", Json{{"healthy_checks", 1}});
    flaky->reconfigure(Json{{"healthy_checks", 2}});
    CHECK_NOTHROW(flaky->check_health());
    CHECK_NOTHROW(flaky->check_health());
    CHECK_THROWS_WITH(flaky->check_health(), "unhealthy after 2 checks");
  }
  SUBCASE("N = 0 fails at once") {
    auto flaky = make("FlakyHealth");
    flaky->reconfigure(Json{{"healthy_checks", 0}});
    CHECK_THROWS_WITH(flaky->check_health(), "unhealthy after 0 checks");
  }
}

TEST_CASE("Release answers its label and status - its health check fails for a while or for ever") {
  SUBCASE("defaults: v1, 200, healthy at once") {
    auto r = make("Release");
    CHECK_NOTHROW(r->check_health());
    Response response = r->handle(get());
    CHECK(response.status == 200);
    CHECK(json_of(response) ==
          Json{{"release", "v1"}, {"replica_id", "app#Dep#r1"}, {"node_id", "node-1"}});
  }
  SUBCASE("a broken release: 500 and a check that never passes") {
    auto r =
        make("Release", Json{{"release", "v2"}, {"status", 500}, {"unhealthy_for_ms", "forever"}});
    CHECK_THROWS_WITH_AS(r->check_health(), "release v2: the model's weights did not load",
                         std::runtime_error);
    CHECK(r->handle(get()).status == 500);
  }
  SUBCASE("unhealthy for a while, then healthy") {
    auto r = make("Release", Json{{"release", "v3"}, {"unhealthy_for_ms", 300}});
    CHECK_THROWS_WITH(r->check_health(), "release v3: still warming up");
    bool passed = false;
    for (int i = 0; i < 200 && !passed; ++i) {
      try {
        r->check_health();
        passed = true;
      } catch (const std::runtime_error&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling its clock
      }
    }
    CHECK(passed);
  }
  SUBCASE("bad args are refused by name") {
    CHECK_THROWS_WITH(make("Release", Json{{"status", 42}}),
                      "Release: init args.status must be an HTTP status, got 42");
    CHECK_THROWS_WITH(make("Release", Json{{"release", 2}}),
                      "Release: init args.release must be a string, got 2");
  }
}

// Routes handle calls to deployments of this process, by name, the way the
// proxy would; unknown names and names in `failing` answer like the proxy.
class LocalTransport : public HandleTransport {
 public:
  std::map<std::string, std::unique_ptr<Deployment>> deployments;
  std::set<std::string> failing;
  mutable std::vector<std::string> calls;  // "app/deployment body"
  mutable std::mutex mutex;

  std::future<Response> call(const std::string& app, const std::string& deployment, Request request,
                             double /*timeout_s*/) const override {
    {
      std::lock_guard<std::mutex> lock(mutex);
      calls.push_back(app + "/" + deployment + " " + request.body);
    }
    // Answered on another thread, as the proxy does.
    return std::async(std::launch::async, [this, app, deployment, request] {
      if (failing.count(deployment))
        return Response::json({{"error", "request timed out"}}, 504);
      auto it = deployments.find(deployment);
      if (it == deployments.end())
        return Response::json(
            {{"error", "application " + app + " has no deployment " + deployment}}, 404);
      return it->second->handle(request);
    });
  }
};

TEST_CASE("Gateway calls Upper and Reverse through handles and combines their answers") {
  auto transport = std::make_shared<LocalTransport>();
  transport->deployments["Upper"] = make("Upper");
  transport->deployments["Reverse"] = make("Reverse");
  ReplicaContext ctx = example_context();
  ctx.handles = transport;
  const DeploymentFactory* factory =
      testing::require_factory(loader(), "libtroupe_examples.so:Gateway");
  auto gateway = factory->create(Json::object(), ctx);

  const Json answer = json_of(gateway->handle(get("/", "text=Hello")));
  CHECK(answer ==
        Json{{"input", "Hello"},
             {"upper", {{"text", "HELLO"}, {"replica_id", "app#Dep#r1"}, {"node_id", "node-1"}}},
             {"reverse", {{"text", "olleH"}, {"replica_id", "app#Dep#r1"}, {"node_id", "node-1"}}},
             {"gateway", {{"replica_id", "app#Dep#r1"}, {"node_id", "node-1"}}}});
  {
    std::lock_guard<std::mutex> lock(transport->mutex);
    std::sort(transport->calls.begin(), transport->calls.end());
    CHECK(transport->calls == std::vector<std::string>{"app/Reverse Hello", "app/Upper Hello"});
  }

  // The body wins over ?text=.
  Request post = get("/", "text=ignored");
  post.method = "POST";
  post.body = "abc";
  CHECK(json_of(gateway->handle(post))["reverse"]["text"] == "cba");

  // /call/<name> passes that deployment's answer through; an unknown one is
  // the handle's 404.
  Response upper = gateway->handle(get("/call/Upper", "text=x"));
  CHECK(upper.status == 200);
  CHECK(json_of(upper)["text"] == "X");
  Response missing = gateway->handle(get("/call/Nope", "text=x"));
  CHECK(missing.status == 404);
  CHECK(json_of(missing)["error"] == "application app has no deployment Nope");

  // A failed call fails the whole request with 502 and says which one.
  transport->failing.insert("Reverse");
  Response failed = gateway->handle(get("/", "text=Hello"));
  CHECK(failed.status == 502);
  const Json failure = json_of(failed);
  CHECK(failure["error"] == "the call to Reverse failed");
  CHECK(failure["reverse"] == Json{{"status", 504}, {"body", "{\"error\":\"request timed out\"}"}});
  CHECK(failure["upper"]["text"] == "HELLO");
}

TEST_CASE("Gateway without a handle transport answers 502 with the handles' 503") {
  auto gateway = make("Gateway");
  Response r = gateway->handle(get("/", "text=a"));
  CHECK(r.status == 502);
  const Json answer = json_of(r);
  CHECK(answer["error"] == "the calls to Upper and Reverse failed");
  CHECK(answer["upper"]["status"] == 503);
}

}  // namespace
}  // namespace troupe
