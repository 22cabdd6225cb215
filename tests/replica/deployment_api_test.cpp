// The inline helpers of <troupe/deployment.hpp> and TROUPE_DEPLOYMENT's
// choice of constructor, exercised in-process (no library loading).
#include <troupe/deployment.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace {

// Only (init_args): built with the init args, the context is dropped.
class ArgsOnly : public troupe::Deployment {
 public:
  explicit ArgsOnly(const troupe::Json& args) : name_(args.value("name", "")) {}
  troupe::Response handle(const troupe::Request&) override { return troupe::Response::text(name_); }

 private:
  std::string name_;
};

// Both constructors: the one with the context wins.
class WithContext : public troupe::Deployment {
 public:
  explicit WithContext(const troupe::Json&) : which_("args only") {}
  WithContext(const troupe::Json& args, const troupe::ReplicaContext& ctx)
      : which_(args.value("name", "") + "@" + ctx.replica_id + "/" + ctx.node_id) {}
  troupe::Response handle(const troupe::Request&) override {
    return troupe::Response::text(which_);
  }

 private:
  std::string which_;
};

// Implements handle_batch(): each answer names its request and the batch's
// size.
class Batches : public troupe::Deployment {
 public:
  explicit Batches(const troupe::Json&) {}
  troupe::Response handle(const troupe::Request& r) override {
    return troupe::Response::text(r.body + "/alone");
  }
  std::vector<troupe::Response> handle_batch(const std::vector<troupe::Request>& rs) override {
    std::vector<troupe::Response> out;
    for (const auto& r : rs)
      out.push_back(troupe::Response::text(r.body + "/" + std::to_string(rs.size())));
    return out;
  }
};

// Inherits handle_batch() from a base class of its own.
class BatchesToo : public Batches {
 public:
  using Batches::Batches;
};

}  // namespace

TROUPE_DEPLOYMENT(ArgsOnly)
TROUPE_DEPLOYMENT(WithContext)
TROUPE_DEPLOYMENT(Batches)
TROUPE_DEPLOYMENT(BatchesToo)

namespace troupe {
namespace {

ReplicaContext test_context() {
  return {"app", "Dep", "app#Dep#r1", "node-1", "v1", nullptr};
}

TEST_CASE("TROUPE_DEPLOYMENT exports a factory with the current ABI and class name") {
  const DeploymentFactory* factory = troupe_deployment_ArgsOnly();
  REQUIRE(factory != nullptr);
  CHECK(factory->abi_version == kDeploymentAbiVersion);
  CHECK(std::string(factory->class_name) == "ArgsOnly");
  CHECK(troupe_deployment_ArgsOnly() == factory);  // one static factory
  CHECK(deployment_symbol("ArgsOnly") == "troupe_deployment_ArgsOnly");
}

TEST_CASE("TROUPE_DEPLOYMENT records whether the class implements handle_batch") {
  CHECK_FALSE(troupe_deployment_ArgsOnly()->batches);
  CHECK_FALSE(troupe_deployment_WithContext()->batches);
  CHECK(troupe_deployment_Batches()->batches);
  CHECK(troupe_deployment_BatchesToo()->batches);
  auto d = troupe_deployment_Batches()->create(Json::object(), test_context());
  std::vector<Request> requests(2);
  requests[0].body = "a";
  requests[1].body = "b";
  auto answers = d->handle_batch(requests);
  REQUIRE(answers.size() == 2);
  CHECK(answers[0].body == "a/2");
  CHECK(answers[1].body == "b/2");
}

TEST_CASE("the default handle_batch answers each request with handle") {
  auto d = troupe_deployment_ArgsOnly()->create(Json{{"name", "x"}}, test_context());
  auto answers = d->handle_batch(std::vector<Request>(3));
  REQUIRE(answers.size() == 3);
  for (const auto& a : answers)
    CHECK(a.body == "x");
}

TEST_CASE("TROUPE_DEPLOYMENT uses (init_args) when that is the only constructor") {
  auto d = troupe_deployment_ArgsOnly()->create(Json{{"name", "a"}}, test_context());
  CHECK(d->handle(Request{}).body == "a");
}

TEST_CASE("a deployment declares nothing about blocking unless it overrides nonblocking()") {
  auto d = troupe_deployment_ArgsOnly()->create(Json{{"name", "a"}}, test_context());
  CHECK_FALSE(d->nonblocking());
}

TEST_CASE("TROUPE_DEPLOYMENT prefers (init_args - ctx) when it exists") {
  auto d = troupe_deployment_WithContext()->create(Json{{"name", "w"}}, test_context());
  CHECK(d->handle(Request{}).body == "w@app#Dep#r1/node-1");
}

TEST_CASE("Request::header matches names case-insensitively - first one wins") {
  Request request;
  request.headers = {{"Content-Type", "text/plain"}, {"X-Token", "one"}, {"x-token", "two"}};
  CHECK(request.header("content-type") == "text/plain");
  CHECK(request.header("CONTENT-TYPE") == "text/plain");
  CHECK(request.header("x-TOKEN") == "one");
  CHECK(request.header("Accept") == "");
  CHECK(request.header("Content-Typ") == "");
}

TEST_CASE("Request::query_param decodes percent escapes and '+'") {
  Request request;
  request.query = "ms=10&name=J%C3%BCrgen+Smith&a%20b=c%2Bd&flag&empty=&bad=%zz%4&ms=20";
  CHECK(request.query_param("ms") == "10");  // first occurrence
  CHECK(request.query_param("name") == "J\xC3\xBCrgen Smith");
  CHECK(request.query_param("a b") == "c+d");  // names are decoded too
  CHECK(request.query_param("flag", "x") == "");
  CHECK(request.query_param("empty", "x") == "");
  CHECK(request.query_param("bad") == "%zz%4");  // malformed escapes kept as is
  CHECK(request.query_param("missing") == "");
  CHECK(request.query_param("missing", "fallback") == "fallback");
  CHECK(request.query_param("m") == "");  // no prefix match

  Request empty;
  CHECK(empty.query_param("ms", "5") == "5");
  Request odd;
  odd.query = "&&x=1&";
  CHECK(odd.query_param("x") == "1");
  CHECK(odd.query_param("", "none") == "none");
}

TEST_CASE("Response::text and Response::json set body - status and Content-Type") {
  Response text = Response::text("hi\n");
  CHECK(text.status == 200);
  CHECK(text.body == "hi\n");
  REQUIRE(text.headers.size() == 1);
  CHECK(text.headers[0] ==
        std::make_pair(std::string("Content-Type"), std::string("text/plain; charset=utf-8")));

  Response json = Response::json({{"a", 1}, {"b", "x"}}, 201);
  CHECK(json.status == 201);
  CHECK(json.body == R"({"a":1,"b":"x"})");
  REQUIRE(json.headers.size() == 1);
  CHECK(json.headers[0] ==
        std::make_pair(std::string("Content-Type"), std::string("application/json")));

  // Invalid UTF-8 does not throw.
  CHECK(Response::json(Json("\xff")).body == "\"\xEF\xBF\xBD\"");
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

// Records what a handle asks of its transport and answers with it.
class RecordingTransport : public HandleTransport {
 public:
  std::future<Response> call(const std::string& app, const std::string& deployment, Request request,
                             double timeout_s) const override {
    std::promise<Response> p;
    p.set_value(Response::json({{"app", app},
                                {"deployment", deployment},
                                {"path", request.path},
                                {"body", request.body},
                                {"timeout_s", timeout_s}}));
    return p.get_future();
  }
};

TEST_CASE("ReplicaContext::handle targets a deployment of the replica's own application") {
  ReplicaContext ctx = test_context();
  ctx.handles = std::make_shared<RecordingTransport>();
  DeploymentHandle h = ctx.handle("Other");
  CHECK(h.app() == "app");
  CHECK(h.deployment() == "Other");
  CHECK(h.timeout_s() == 0);
  Request request;
  request.path = "/x";
  request.body = "b";
  CHECK(Json::parse(h.call(request).body) == Json{{"app", "app"},
                                                  {"deployment", "Other"},
                                                  {"path", "/x"},
                                                  {"body", "b"},
                                                  {"timeout_s", 0}});
  // with_timeout gives a copy with its own timeout; the original keeps its own.
  CHECK(Json::parse(h.with_timeout(1.5).call_async(request).get().body)["timeout_s"] == 1.5);
  CHECK(h.with_timeout(-3).timeout_s() == 0);
  CHECK(h.timeout_s() == 0);
}

TEST_CASE("a DeploymentHandle without a transport answers 503 with a JSON error") {
  DeploymentHandle none = test_context().handle("Other");
  Response r = none.call(Request{});
  CHECK(r.status == 503);
  CHECK(Json::parse(r.body)["error"] ==
        "no handle transport: deployment handles work only in a replica run by troupe-node");
  CHECK(DeploymentHandle().call(Request{}).status == 503);
}

}  // namespace
}  // namespace troupe
