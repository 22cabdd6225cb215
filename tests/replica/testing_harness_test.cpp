// include/troupe/testing.hpp, the local test harness, with real example
// deployments compiled into this test (examples/compose.cpp, hello.cpp,
// stream.cpp, flaky_health.cpp, fail_init.cpp), and from a config with the
// built examples library (TROUPE_TEST_PLUGIN_DIR).
#include <future>
#include <stdexcept>
#include <string>

#include <doctest/doctest.h>
#include <troupe/testing.hpp>

// Their factories, as TROUPE_DEPLOYMENT exports them.
extern "C" const troupe::DeploymentFactory* troupe_deployment_Gateway();
extern "C" const troupe::DeploymentFactory* troupe_deployment_Upper();
extern "C" const troupe::DeploymentFactory* troupe_deployment_Reverse();
extern "C" const troupe::DeploymentFactory* troupe_deployment_Hello();
extern "C" const troupe::DeploymentFactory* troupe_deployment_Ticker();
extern "C" const troupe::DeploymentFactory* troupe_deployment_Relay();
extern "C" const troupe::DeploymentFactory* troupe_deployment_FlakyHealth();
extern "C" const troupe::DeploymentFactory* troupe_deployment_FailInit();

using troupe::Json;
using troupe::testing::App;

namespace {

App compose_app() {
  App app("compose");
  app.add("Gateway", *troupe_deployment_Gateway());
  app.add("Upper", *troupe_deployment_Upper());
  app.add("Reverse", *troupe_deployment_Reverse());
  return app;
}

}  // namespace

TEST_CASE("harness: the ingress calls its handles in process") {
  App app = compose_app();
  CHECK(app.ingress() == "Gateway");
  troupe::Response r = app.get("/?text=Hello");
  REQUIRE(r.status == 200);
  Json body = Json::parse(r.body);
  CHECK(body["input"] == "Hello");
  CHECK(body["upper"]["text"] == "HELLO");
  CHECK(body["reverse"]["text"] == "olleH");
  // Every instance sees the ReplicaContext the harness made for it.
  CHECK(body["upper"]["replica_id"] == "compose#Upper#test");
  CHECK(body["gateway"]["node_id"] == "test-node");
  CHECK(body["gateway"]["replica_id"] == "compose#Gateway#test");
}

TEST_CASE("harness: a POST body reaches the ingress") {
  App app = compose_app();
  troupe::Response r = app.post("/", "abc");
  REQUIRE(r.status == 200);
  CHECK(Json::parse(r.body)["reverse"]["text"] == "cba");
}

TEST_CASE("harness: a handle to an unknown deployment answers 404") {
  App app = compose_app();
  troupe::Response r = app.get("/call/Nope?text=x");
  CHECK(r.status == 404);
  CHECK(Json::parse(r.body)["error"] == "application compose has no deployment Nope");
  // And straight from the test: call() of a name the app does not have.
  CHECK(app.call("Nope", App::request("GET", "/")).status == 404);
}

TEST_CASE("harness: a deployment is called by name or through a handle") {
  App app = compose_app();
  troupe::Response direct = app.call("Upper", App::request("POST", "/", "hi"));
  CHECK(Json::parse(direct.body)["text"] == "HI");
  std::future<troupe::Response> f = app.handle("Reverse").call_async(App::request("POST", "/", "ab"));
  CHECK(Json::parse(f.get().body)["text"] == "ba");
}

TEST_CASE("harness: a deployment missing from the app fails the ingress call") {
  App app("compose");
  app.add("Gateway", *troupe_deployment_Gateway());
  app.add("Upper", *troupe_deployment_Upper());
  troupe::Response r = app.get("/?text=Hi");
  CHECK(r.status == 502);
  Json body = Json::parse(r.body);
  CHECK(body["error"] == "the call to Reverse failed");
  CHECK(body["reverse"]["status"] == 404);
}

TEST_CASE("harness: user_config reaches reconfigure before the first request and after") {
  App app("greeter");
  app.add("Hello", *troupe_deployment_Hello(), Json::object(), Json{{"greeting", "hi"}});
  CHECK(Json::parse(app.get("/").body)["greeting"] == "hi");
  app.reconfigure("Hello", Json{{"greeting", "bonjour"}});
  CHECK(Json::parse(app.get("/").body)["greeting"] == "bonjour");
  // A bad user_config fails the update with the deployment's own message.
  CHECK_THROWS_WITH_AS(app.reconfigure("Hello", Json{{"greeting", 3}}),
                       doctest::Contains("greeting must be a string"), std::invalid_argument);
}

TEST_CASE("harness: no user_config means no reconfigure call") {
  App app("greeter");
  app.add("Hello", *troupe_deployment_Hello());
  CHECK(Json::parse(app.get("/").body)["greeting"] == "hello");
}

TEST_CASE("harness: a constructor that throws fails add") {
  App app("broken");
  CHECK_THROWS_WITH_AS(app.add("FailInit", *troupe_deployment_FailInit(),
                               Json{{"message", "no model file"}}),
                       "no model file", std::runtime_error);
  CHECK(app.deployments().empty());
  CHECK(app.get("/").status == 404);
}

TEST_CASE("harness: check_health reports what the deployment throws") {
  App app("health");
  app.add("FlakyHealth", *troupe_deployment_FlakyHealth(), Json{{"healthy_checks", 2}});
  CHECK(app.check_health("FlakyHealth") == "");
  CHECK(app.check_health("FlakyHealth") == "");
  CHECK(app.check_health("FlakyHealth") == "unhealthy after 2 checks");
  // user_config overrides the init args' count (and not the count so far).
  app.reconfigure("FlakyHealth", Json{{"healthy_checks", 10}});
  CHECK(app.check_health("FlakyHealth") == "");
  CHECK(Json::parse(app.get("/").body)["checks"] == 4);
}

TEST_CASE("harness: a streamed answer is read whole") {
  App app("stream");
  app.add("Ticker", *troupe_deployment_Ticker());
  troupe::Response r = app.get("/?n=3&ms=0");
  CHECK(r.status == 200);
  CHECK(r.body == "data: 0\n\ndata: 1\n\ndata: 2\n\n");
  CHECK(r.stream == nullptr);
}

TEST_CASE("harness: a producer that throws ends the body early and says why") {
  App app("stream");
  app.add("Ticker", *troupe_deployment_Ticker());
  troupe::Response r = app.get("/?n=3&ms=0&fail_after=1");
  CHECK(r.status == 200);
  CHECK(r.body == "data: 0\n\n");
  std::string why;
  for (const auto& [name, value] : r.headers) {
    if (name == troupe::testing::kStreamErrorHeader)
      why = value;
  }
  CHECK(why == "Ticker: failing after 1 events, as asked (fail_after)");
}

TEST_CASE("harness: a stream relayed through a handle") {
  App app("relay");
  app.add("Relay", *troupe_deployment_Relay());
  app.add("Ticker", *troupe_deployment_Ticker());
  troupe::Response r = app.get("/?n=2&ms=0");
  CHECK(r.status == 200);
  CHECK(r.body == "data: 0\n\ndata: 1\n\n");
}

TEST_CASE("harness: an error answer of a relayed call passes through") {
  App app("relay");
  app.add("Relay", *troupe_deployment_Relay(), Json{{"to", "Ticker"}});
  app.add("Ticker", *troupe_deployment_Ticker());
  // n=-1 is refused by the Ticker (400) and passed on by the Relay.
  CHECK(app.get("/?n=-1").status == 400);
  // A handle to a deployment the app does not have: the Relay gets the 404
  // answer (read as a stream of one piece) and passes it on.
  App lonely("lonely");
  lonely.add("Relay", *troupe_deployment_Relay());
  CHECK(lonely.get("/").status == 404);
}

namespace {

// Classes of the test's own, added with add<T>(): one built from init args
// only, one that calls another through a handle it took in its constructor.
class Thrower : public troupe::Deployment {
 public:
  explicit Thrower(const Json& init_args) : message_(init_args.value("message", "boom")) {}
  troupe::Response handle(const troupe::Request&) override { throw std::runtime_error(message_); }
  bool nonblocking() const override { return true; }

 private:
  std::string message_;
};

class Asker : public troupe::Deployment {
 public:
  Asker(const Json&, const troupe::ReplicaContext& ctx) : thrower_(ctx.handle("Thrower")) {}
  troupe::Response handle(const troupe::Request& request) override {
    troupe::Response r = thrower_.call(request);
    return troupe::Response::text("thrower said " + std::to_string(r.status) + ": " + r.body);
  }

 private:
  troupe::DeploymentHandle thrower_;
};

}  // namespace

TEST_CASE("harness: a handler that throws is a 500 with its message") {
  App app("errors");
  app.add<Asker>("Asker");
  app.add<Thrower>("Thrower", Json{{"message", "no such model"}});
  CHECK(app.nonblocking("Thrower"));
  CHECK_FALSE(app.nonblocking("Asker"));
  troupe::Response direct = app.call("Thrower", App::request("GET", "/"));
  CHECK(direct.status == 500);
  CHECK(Json::parse(direct.body)["error"] == "handler raised: no such model");
  troupe::Response asked = app.get("/");
  CHECK(asked.status == 200);
  CHECK(asked.body == "thrower said 500: {\"error\":\"handler raised: no such model\"}");
}

TEST_CASE("harness: a name added twice is refused") {
  App app("greeter");
  app.add("Hello", *troupe_deployment_Hello());
  CHECK_THROWS_AS(app.add("Hello", *troupe_deployment_Hello()), std::invalid_argument);
}

TEST_CASE("harness: metrics and logs stay in the deployment's context") {
  App app("greeter");
  app.add("Hello", *troupe_deployment_Hello());
  auto hits = app.context("Hello").counter("test_hits_total", "made by the test");
  hits->inc();
  CHECK(app.context("Hello").counter("test_hits_total", "again")->value() == 1.0);
  app.context("Hello").log(troupe::LogLevel::warn, "a line");
  auto lines = app.logs("Hello");
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].message == "a line");
  CHECK(lines[0].level == troupe::LogLevel::warn);
}

TEST_CASE("harness: a factory of another ABI version is refused") {
  troupe::DeploymentFactory old = *troupe_deployment_Hello();
  old.abi_version = troupe::kDeploymentAbiVersion - 1;
  App app("greeter");
  CHECK_THROWS_WITH_AS(app.add("Hello", old), doctest::Contains("ABI"), std::invalid_argument);
}

TEST_CASE("harness: an application built from a config and the built library") {
  // examples/compose.yaml's application, as JSON.
  Json config = Json::parse(R"({
    "applications": [{
      "name": "compose", "route_prefix": "/compose",
      "import_path": "libtroupe_examples.so:Gateway",
      "deployments": [{"name": "Upper", "num_replicas": 2},
                      {"name": "Gateway", "num_replicas": 3},
                      {"name": "Reverse"}]
    }, {
      "name": "greeter", "import_path": "libtroupe_examples.so:Hello",
      "deployments": [{"name": "Hello", "user_config": {"greeting": "hi"}}]
    }]})");
  App app = App::from_config(config, {"/nonexistent", TROUPE_TEST_PLUGIN_DIR}, "compose");
  CHECK(app.name() == "compose");
  CHECK(app.ingress() == "Gateway");
  CHECK(app.deployments() == std::vector<std::string>{"Gateway", "Upper", "Reverse"});
  Json body = Json::parse(app.get("/?text=Hi").body);
  CHECK(body["upper"]["text"] == "HI");
  CHECK(body["reverse"]["text"] == "iH");

  App greeter = App::from_config(config, {TROUPE_TEST_PLUGIN_DIR}, "greeter");
  CHECK(Json::parse(greeter.get("/").body)["greeting"] == "hi");
}

TEST_CASE("harness: a config's errors are named") {
  Json app = {{"name", "a"}, {"import_path", "libtroupe_examples.so:Nope"}};
  CHECK_THROWS_WITH_AS(App::from_config(app, {TROUPE_TEST_PLUGIN_DIR}),
                       doctest::Contains("has no deployment class Nope"), std::invalid_argument);
  app["import_path"] = "libmissing.so:Hello";
  CHECK_THROWS_WITH_AS(App::from_config(app, {TROUPE_TEST_PLUGIN_DIR}),
                       doctest::Contains("in none of the plugin dirs"), std::invalid_argument);
  app["import_path"] = "Hello";
  CHECK_THROWS_WITH_AS(App::from_config(app, {TROUPE_TEST_PLUGIN_DIR}),
                       doctest::Contains("is not LIBRARY:CLASS"), std::invalid_argument);
  Json two = {{"applications", Json::array({app, app})}};
  CHECK_THROWS_WITH_AS(App::from_config(two, {TROUPE_TEST_PLUGIN_DIR}),
                       doctest::Contains("name the one to build"), std::invalid_argument);
}
