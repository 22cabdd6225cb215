// Deployment handles through a real Proxy in this process: the handle
// transport of a replica (replica/handle_transport.hpp) sends calls through
// Proxy::caller() to fake replica actors, with the proxy's routing, error
// answers, request ids, timeouts and metrics. No cluster, no sockets but the
// proxy's own listener (port 0).
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <future>
#include <set>
#include <string>
#include <thread>

#include <caf/all.hpp>

#include "proxy/proxy.hpp"
#include "replica/handle_transport.hpp"
#include "runtime/system_setup.hpp"
#include "tests/support/http_client.hpp"
#include "tests/support/process.hpp"

using namespace troupe;
using namespace troupe::testing;
using nlohmann::json;

namespace {

// A replica that answers every request with what it received, as JSON.
caf::behavior fake_replica(caf::event_based_actor*, std::string id) {
  return {
      [id](handle_atom, HttpRequest& r) -> HttpResponse {
        HttpResponse out;
        out.status = 200;
        out.headers = {{"Content-Type", "application/json"}, {"X-Replica", id}};
        out.body = json{{"replica", id},    {"method", r.method}, {"path", r.path},
                        {"query", r.query}, {"body", r.body},     {"request_id", r.request_id}}
                       .dump();
        return out;
      },
  };
}

ReplicaEndpoint endpoint(const std::string& id, const std::string& node, caf::actor handle) {
  ReplicaEndpoint e;
  e.replica_id = id;
  e.node_id = node;
  e.max_ongoing_requests = 2;
  e.handle = std::move(handle);
  return e;
}

struct Fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::unique_ptr<proxy::Proxy> proxy;
  std::vector<caf::actor> replicas;
  std::shared_ptr<const HandleTransport> transport;

  Fixture() {
    configure_actor_system(cfg, TransportOptions{});
    sys = std::make_unique<caf::actor_system>(cfg);
    proxy::ProxyOptions o;
    o.node_id = "n1";
    o.server.port = 0;
    auto started = proxy::Proxy::start(*sys, o);
    REQUIRE(started);
    proxy = std::move(started.value());
    transport = replica::make_handle_transport(proxy->caller());
  }
  ~Fixture() {
    proxy->stop();
    for (auto& r : replicas)
      caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
  }

  caf::actor spawn_replica(const std::string& id) {
    replicas.push_back(sys->spawn(fake_replica, id));
    return replicas.back();
  }

  // The application "shop": ingress Front, and Back with two replicas (one on
  // this node, one on another) and Empty with none.
  void publish() {
    RoutingSnapshot s;
    s.epoch = 1;
    s.seq = 1;
    s.full = true;
    s.routes = {{"/shop", "shop", "Front"}};
    s.deployments = {
        {"shop", "Front", {endpoint("shop#Front#1", "n1", spawn_replica("front-1"))}, -1},
        {"shop",
         "Back",
         {endpoint("shop#Back#1", "n1", spawn_replica("back-1")),
          endpoint("shop#Back#2", "n2", spawn_replica("back-2"))},
         -1},
        {"shop", "Empty", {}, -1}};
    caf::anon_send(proxy->actor(), snapshot_atom::value, s);
    REQUIRE(wait_until(
        [&] {
          auto r = http_get(proxy->port(), "/-/healthz", 5);
          return r && r->status == 200;
        },
        10s));
  }

  DeploymentHandle handle(const std::string& deployment) const {
    return DeploymentHandle(transport, "shop", deployment);
  }
};

Request post(std::string body, std::string path = "/") {
  Request r;
  r.method = "POST";
  r.path = std::move(path);
  r.body = std::move(body);
  return r;
}

}  // namespace

TEST_CASE("handle: a call before the first route table answers 503") {
  Fixture f;
  Response r = f.handle("Back").call(post("x"));
  CHECK(r.status == 503);
  auto body = json::parse(r.body);
  CHECK(body["error"] == "this node has no route table yet; retry shortly");
  CHECK_FALSE(body["request_id"].get<std::string>().empty());
}

TEST_CASE("handle: a call reaches a replica of the named deployment with the request") {
  Fixture f;
  f.publish();
  Request req = post("payload", "/items");
  req.query = "a=1";
  Response r = f.handle("Back").call(req);
  REQUIRE(r.status == 200);
  auto body = json::parse(r.body);
  // The idle local replica is preferred.
  CHECK(body["replica"] == "back-1");
  CHECK(body["method"] == "POST");
  CHECK(body["path"] == "/items");
  CHECK(body["query"] == "a=1");
  CHECK(body["body"] == "payload");
  // The replica's headers come back; the proxy sets X-Request-Id.
  bool replica_header = false;
  std::string id_header;
  for (const auto& [name, value] : r.headers) {
    if (name == "X-Replica")
      replica_header = value == "back-1";
    if (name == "X-Request-Id")
      id_header = value;
  }
  CHECK(replica_header);
  CHECK(id_header == body["request_id"]);
  CHECK_FALSE(id_header.empty());

  // An empty method and path are sent as GET /.
  body = json::parse(f.handle("Front").call(Request{}).body);
  CHECK(body["replica"] == "front-1");
  CHECK(body["method"] == "GET");
  CHECK(body["path"] == "/");
}

TEST_CASE("handle: calls in flight together spread over the replicas") {
  Fixture f;
  f.publish();
  std::vector<std::future<Response>> calls;
  for (int i = 0; i < 4; ++i)
    calls.push_back(f.handle("Back").call_async(post(std::to_string(i))));
  std::set<std::string> bodies;
  for (auto& c : calls) {
    Response r = c.get();
    REQUIRE(r.status == 200);
    bodies.insert(json::parse(r.body)["body"].get<std::string>());
  }
  CHECK(bodies == std::set<std::string>{"0", "1", "2", "3"});
}

TEST_CASE("handle: the calling request's id is carried - unless the request has its own") {
  Fixture f;
  f.publish();
  {
    std::string id = "client-id-42";
    replica::RequestIdScope scope(id);
    CHECK(replica::current_request_id() == "client-id-42");
    auto body = json::parse(f.handle("Back").call(post("x")).body);
    CHECK(body["request_id"] == "client-id-42");

    Request own = post("y");
    own.headers = {{"x-request-id", "own-id"}};
    body = json::parse(f.handle("Back").call(own).body);
    CHECK(body["request_id"] == "own-id");
  }
  CHECK(replica::current_request_id().empty());
  auto body = json::parse(f.handle("Back").call(post("z")).body);
  CHECK(body["request_id"] != "client-id-42");
  CHECK_FALSE(body["request_id"].get<std::string>().empty());
}

TEST_CASE("handle: an unknown deployment answers 404 with a JSON error") {
  Fixture f;
  f.publish();
  std::string id = "req-404";
  replica::RequestIdScope scope(id);
  Response r = f.handle("Nope").call(post("x"));
  CHECK(r.status == 404);
  auto body = json::parse(r.body);
  CHECK(body["error"] == "application shop has no deployment Nope");
  CHECK(body["request_id"] == "req-404");
  // Another application's deployment is not reachable either.
  CHECK(DeploymentHandle(f.transport, "other", "Back").call(post("x")).status == 404);
}

TEST_CASE("handle: a deployment without replicas times out with 504 at the handle's timeout") {
  Fixture f;
  f.publish();
  auto start = std::chrono::steady_clock::now();
  Response r = f.handle("Empty").with_timeout(0.3).call(post("x"));
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(r.status == 504);
  CHECK(json::parse(r.body)["error"] == "request timed out");
  CHECK(took >= 0.25);
  CHECK(took < 5);
}

TEST_CASE("handle: calls are counted in the proxy's metrics by application") {
  Fixture f;
  f.publish();
  REQUIRE(f.handle("Back").call(post("x")).status == 200);
  REQUIRE(f.handle("Nope").call(post("x")).status == 404);
  auto metrics = http_get(f.proxy->port(), "/-/metrics", 5);
  REQUIRE(metrics);
  CHECK(metrics->body.find("troupe_proxy_requests_total{application=\"shop\",code=\"200\"} 1") !=
        std::string::npos);
  CHECK(metrics->body.find("troupe_proxy_requests_total{application=\"shop\",code=\"404\"} 1") !=
        std::string::npos);
}

TEST_CASE("handle: after the proxy stopped a call answers 503 at once") {
  Fixture f;
  f.publish();
  f.proxy->stop();
  Response r = f.handle("Back").call(post("x"));
  CHECK(r.status == 503);
  CHECK(json::parse(r.body)["error"] ==
        "the proxy of this node stopped before the call was answered");
}

TEST_CASE("handle: without a transport every call answers 503") {
  ReplicaContext ctx{"shop", "Front", "shop#Front#1", "n1", "v1", nullptr};
  DeploymentHandle h = ctx.handle("Back");
  CHECK(h.app() == "shop");
  CHECK(h.deployment() == "Back");
  Response r = h.call(post("x"));
  CHECK(r.status == 503);
  CHECK(json::parse(r.body)["error"].get<std::string>().find("no handle transport") == 0);
}
