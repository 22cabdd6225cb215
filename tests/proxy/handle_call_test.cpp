// Deployment handles through a real Proxy in this process: the handle
// transport of a replica (replica/handle_transport.hpp) sends calls through
// Proxy::caller() to fake replica actors, with the proxy's routing, error
// answers, request ids, timeouts and metrics. No cluster, no sockets but the
// proxy's own listener (port 0) - and, for calls from another process
// (make_remote_proxy_call), a second actor system connected over loopback.
// Also the bound on retries of a request that crashes replicas (the "query of
// death"), over HTTP and through handles.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "proxy/proxy.hpp"
#include "replica/handle_transport.hpp"
#include "runtime/system_setup.hpp"
#include "tests/support/http_client.hpp"
#include "tests/support/process.hpp"

using namespace troupe;
using namespace troupe::testing;
using nlohmann::json;

namespace {

// What a fake replica answers: the request it received, as JSON.
HttpResponse echo(const std::string& id, const HttpRequest& r) {
  HttpResponse out;
  out.status = 200;
  out.headers = {{"Content-Type", "application/json"}, {"X-Replica", id}};
  out.body = json{{"replica", id},    {"method", r.method}, {"path", r.path},
                  {"query", r.query}, {"body", r.body},     {"request_id", r.request_id}}
                 .dump();
  return out;
}

// A replica that answers every request with what it received, as JSON.
caf::behavior fake_replica(caf::event_based_actor*, std::string id) {
  return {
      [id](handle_atom, HttpRequest& r) -> HttpResponse { return echo(id, r); },
  };
}

// Holds the requests of held_replica until released, and counts them by
// replica: calls that are in flight together stay in flight together however
// fast the machine is.
struct Gate {
  std::mutex mutex;
  std::condition_variable released;
  bool open = false;
  std::map<std::string, int> held;  // replica -> requests it received

  void arrive(const std::string& replica) {
    std::lock_guard<std::mutex> lock(mutex);
    ++held[replica];
  }
  std::map<std::string, int> arrived() {
    std::lock_guard<std::mutex> lock(mutex);
    return held;
  }
  int total() {
    int n = 0;
    for (auto& [replica, count] : arrived())
      n += count;
    return n;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      open = true;
    }
    released.notify_all();
  }
};

// A replica that answers like fake_replica once the gate is open (a detached
// helper waits for it, at most 30 s, so the replica itself never blocks).
caf::behavior held_replica(caf::event_based_actor* self, std::string id,
                           std::shared_ptr<Gate> gate) {
  return {
      [=](handle_atom, HttpRequest& r) -> caf::result<HttpResponse> {
        gate->arrive(id);
        auto rp = self->make_response_promise<HttpResponse>();
        self->spawn<caf::detached>([rp, gate, answer = echo(id, r)]() mutable {
          {
            std::unique_lock<std::mutex> lock(gate->mutex);
            gate->released.wait_for(lock, std::chrono::seconds(30), [&] { return gate->open; });
          }
          rp.deliver(answer);
        });
        return rp;
      },
  };
}

// Who received a poisoned request: (replica, request id), in order.
struct Victims {
  std::mutex mutex;
  std::vector<std::pair<std::string, std::string>> hits;
  void add(const std::string& replica, const std::string& request_id) {
    std::lock_guard<std::mutex> lock(mutex);
    hits.emplace_back(replica, request_id);
  }
  std::vector<std::pair<std::string, std::string>> get() {
    std::lock_guard<std::mutex> lock(mutex);
    return hits;
  }
};

// A replica whose user code crashes on a request for /poison: it dies with
// `reason` while it has the request, without answering (the proxy learns it
// from its down message, as it would of a replica process that crashed).
// Other requests are answered like fake_replica's.
caf::behavior dying_replica(caf::event_based_actor* self, std::string id,
                            std::shared_ptr<Victims> victims, caf::error reason) {
  return {
      [=](handle_atom, HttpRequest& r) -> caf::result<HttpResponse> {
        if (r.path == "/poison") {
          victims->add(id, r.request_id);
          self->quit(reason);
          // Never delivered: the replica is gone.
          return self->make_response_promise<HttpResponse>();
        }
        return echo(id, r);
      },
  };
}

// Like dying_replica, but the way a replica's handle fails the request: it
// hands the request to its request thread (here: an actor), which dies with
// it in its mailbox, so the request fails with request_receiver_down. The
// handle itself stays up: only that error tells the proxy.
caf::behavior bouncing_replica(caf::event_based_actor* self, std::string id,
                               std::shared_ptr<Victims> victims) {
  auto worker = self->spawn([id]() -> caf::behavior {
    return {[id](handle_atom, HttpRequest& r) { return echo(id, r); }};
  });
  self->attach_functor(
      [worker](const caf::error&) { caf::anon_send_exit(worker, caf::exit_reason::kill); });
  return {
      [=](handle_atom, HttpRequest& r) -> caf::result<HttpResponse> {
        if (r.path != "/poison")
          return echo(id, r);
        victims->add(id, r.request_id);
        // The exit is processed before the request (exits are urgent): the
        // request is bounced.
        self->send_exit(worker, caf::exit_reason::kill);
        self->delegate(worker, handle_atom::value, std::move(r));
        return caf::delegated<HttpResponse>{};
      },
  };
}

ReplicaEndpoint endpoint(const std::string& id, const std::string& node, caf::actor handle) {
  ReplicaEndpoint e;
  e.replica_id = id;
  e.node_id = node;
  e.max_ongoing_requests = 2;
  e.handle = caf::actor_cast<ReplicaActor>(std::move(handle));
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

  caf::actor spawn_held(const std::string& id, std::shared_ptr<Gate> gate) {
    replicas.push_back(sys->spawn(held_replica, id, std::move(gate)));
    return replicas.back();
  }

  // The application "shop": ingress Front, and Back with two replicas (one on
  // this node, one on another; held by `gate` when given) and Empty with none.
  void publish(std::shared_ptr<Gate> gate = nullptr) {
    auto back = [&](const std::string& id) {
      return gate ? spawn_held(id, gate) : spawn_replica(id);
    };
    RoutingSnapshot s;
    s.epoch = 1;
    s.seq = 1;
    s.full = true;
    s.routes = {{"/shop", "shop", "Front"}};
    s.deployments = {
        {"shop", "Front", {endpoint("shop#Front#1", "n1", spawn_replica("front-1"))}, -1},
        {"shop",
         "Back",
         {endpoint("shop#Back#1", "n1", back("back-1")),
          endpoint("shop#Back#2", "n2", back("back-2"))},
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

  // shop's traffic split, pushed as a route change (publish() first).
  void publish_traffic(TrafficWeights traffic) {
    RoutingSnapshot s;
    s.epoch = 1;
    s.seq = 2;
    s.routes_changed = true;
    s.routes = {{"/shop", "shop", "Front", std::move(traffic)}};
    caf::anon_send(proxy->actor(), snapshot_atom::value, s);
    REQUIRE(wait_until(
        [&] {
          auto r = http_get(proxy->admin_port(), "/-/routes", 5);
          return r && r->status == 200 && json::parse(r->body).value("seq", 0) == 2;
        },
        10s));
  }

  // shop's shadows, pushed as a route change (publish() first).
  void publish_shadow(TrafficWeights shadow) {
    RoutingSnapshot s;
    s.epoch = 1;
    s.seq = 2;
    s.routes_changed = true;
    s.routes = {{"/shop", "shop", "Front", {}, "", std::move(shadow)}};
    caf::anon_send(proxy->actor(), snapshot_atom::value, s);
    REQUIRE(wait_until(
        [&] {
          auto r = http_get(proxy->admin_port(), "/-/routes", 5);
          return r && r->status == 200 && json::parse(r->body).value("seq", 0) == 2;
        },
        10s));
  }

  // troupe_proxy_shadow_requests_total of shop's `deployment` with `outcome`.
  long long shadow_count(const std::string& deployment, const std::string& outcome) const {
    auto r = http_get(proxy->admin_port(), "/-/metrics", 5);
    if (!r || r->status != 200)
      return -1;
    const std::string line =
        "troupe_proxy_shadow_requests_total{application=\"shop\",deployment=\"" + deployment +
        "\",outcome=\"" + outcome + "\"} ";
    auto at = r->body.find(line);
    return at == std::string::npos ? 0 : std::stoll(r->body.substr(at + line.size()));
  }

  DeploymentHandle handle(const std::string& deployment) const {
    return DeploymentHandle(transport, "shop", deployment);
  }

  caf::actor spawn_bouncing(const std::string& id) {
    replicas.push_back(sys->spawn(bouncing_replica, id, victims));
    return replicas.back();
  }

  caf::actor spawn_dying(const std::string& id, caf::error reason) {
    replicas.push_back(sys->spawn(dying_replica, id, victims, std::move(reason)));
    return replicas.back();
  }

  // Replicas that crash on /poison. HTTP: /poison -> application "crash"
  // (three dying replicas), /mixed -> "mixed" (a dying replica on this node,
  // which the router prefers when both are idle, and a healthy one on
  // another). Handles: shop/Poison and shop/Mixed, the same (dying with an
  // error instead of a kill), and shop/Bounce (bouncing_replica).
  std::shared_ptr<Victims> victims = std::make_shared<Victims>();
  void publish_dying() {
    auto kill = caf::make_error(caf::exit_reason::kill);
    auto failure = caf::make_error(caf::sec::runtime_error);
    RoutingSnapshot s;
    s.epoch = 1;
    s.seq = 1;
    s.full = true;
    s.routes = {{"/poison", "crash", "Poison"}, {"/mixed", "mixed", "Mixed"}};
    s.deployments = {{"crash",
                      "Poison",
                      {endpoint("crash#Poison#1", "n1", spawn_dying("poison-1", kill)),
                       endpoint("crash#Poison#2", "n1", spawn_dying("poison-2", kill)),
                       endpoint("crash#Poison#3", "n1", spawn_dying("poison-3", kill))},
                      -1},
                     {"mixed",
                      "Mixed",
                      {endpoint("mixed#Mixed#1", "n1", spawn_dying("mixed-dying", kill)),
                       endpoint("mixed#Mixed#2", "n2", spawn_replica("mixed-ok"))},
                      -1},
                     {"shop",
                      "Poison",
                      {endpoint("shop#Poison#1", "n1", spawn_dying("shop-poison-1", failure)),
                       endpoint("shop#Poison#2", "n1", spawn_dying("shop-poison-2", failure)),
                       endpoint("shop#Poison#3", "n1", spawn_dying("shop-poison-3", failure))},
                      -1},
                     {"shop",
                      "Mixed",
                      {endpoint("shop#Mixed#1", "n1", spawn_dying("shop-mixed-dying", failure)),
                       endpoint("shop#Mixed#2", "n2", spawn_replica("shop-mixed-ok"))},
                      -1},
                     {"shop",
                      "Bounce",
                      {endpoint("shop#Bounce#1", "n1", spawn_bouncing("bounce-1")),
                       endpoint("shop#Bounce#2", "n1", spawn_bouncing("bounce-2")),
                       endpoint("shop#Bounce#3", "n1", spawn_bouncing("bounce-3"))},
                      -1}};
    caf::anon_send(proxy->actor(), snapshot_atom::value, s);
    REQUIRE(wait_until(
        [&] {
          auto r = http_get(proxy->port(), "/-/healthz", 5);
          return r && r->status == 200;
        },
        10s));
  }

  std::string metrics() {
    auto r = http_get(proxy->admin_port(), "/-/metrics", 5);
    REQUIRE(r);
    return r->body;
  }
};

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The replicas a poisoned request reached, each once, and the request ids
// they saw.
std::set<std::string> replicas_hit(Victims& v, const std::string& request_id) {
  std::set<std::string> out;
  for (const auto& [replica, id] : v.get()) {
    CHECK(id == request_id);
    CHECK(out.insert(replica).second);
  }
  return out;
}

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

TEST_CASE("handle: calls to the ingress follow the application's traffic split - others do not") {
  Fixture f;
  f.publish();
  auto replica_of = [](const Response& r) {
    REQUIRE(r.status == 200);
    return json::parse(r.body)["replica"].get<std::string>();
  };
  CHECK(replica_of(f.handle("Front").call(post("x"))) == "front-1");
  // Everything to Back: calls to the ingress and HTTP requests go there.
  f.publish_traffic({{"Back", 1.0}, {"Front", 0.0}});
  for (int i = 0; i < 20; ++i) {
    CHECK(replica_of(f.handle("Front").call(post("x"))).rfind("back-", 0) == 0);
    auto http = http_get(f.proxy->port(), "/shop/x", 10);
    REQUIRE(http);
    CHECK(json::parse(http->body)["replica"].get<std::string>().rfind("back-", 0) == 0);
  }
  // A call naming another deployment goes to it, split or not.
  f.publish_traffic({{"Front", 1.0}});
  for (int i = 0; i < 5; ++i) {
    CHECK(replica_of(f.handle("Front").call(post("x"))) == "front-1");
    CHECK(replica_of(f.handle("Back").call(post("x"))).rfind("back-", 0) == 0);
  }
}

TEST_CASE("handle: shadow copies of calls to the ingress - never waited for - dropped when full") {
  Fixture f;
  auto gate = std::make_shared<Gate>();  // holds Back's replicas: a shadow that never answers
  f.publish(gate);
  f.publish_shadow({{"Back", 1.0}});
  auto routes = http_get(f.proxy->admin_port(), "/-/routes", 5);
  REQUIRE(routes);
  CHECK(json::parse(routes->body)["routes"][0]["shadow"] == json({{"Back", 1.0}}));
  // Every answer comes from Front at once, while Back holds its copies.
  for (int i = 0; i < 10; ++i) {
    Response r = f.handle("Front").call(post("x"));
    REQUIRE(r.status == 200);
    CHECK(json::parse(r.body)["replica"] == "front-1");
    auto http = http_get(f.proxy->port(), "/shop/x", 10);
    REQUIRE(http);
    REQUIRE(http->status == 200);
    CHECK(json::parse(http->body)["replica"] == "front-1");
  }
  // Back has room for 4 (2 replicas x max_ongoing_requests 2): 4 copies
  // held, the other 16 dropped, none queued.
  CHECK(wait_until([&] { return gate->total() == 4; }, 10s));
  CHECK(f.shadow_count("Back", "dropped") == 16);
  CHECK(f.shadow_count("Back", "200") == 0);
  // A call naming Back itself is no copy: it queues behind the held copies
  // like any call, and is answered once they are.
  auto direct = std::async(std::launch::async, [&] { return f.handle("Back").call(post("x")); });
  gate->release();
  CHECK(direct.get().status == 200);
  CHECK(wait_until([&] { return f.shadow_count("Back", "200") == 4; }, 10s));
  CHECK(f.shadow_count("Back", "dropped") == 16);
}

TEST_CASE("handle: calls in flight together spread over the replicas") {
  Fixture f;
  auto gate = std::make_shared<Gate>();
  f.publish(gate);
  std::vector<std::future<Response>> calls;
  for (int i = 0; i < 4; ++i)
    calls.push_back(f.handle("Back").call_async(post(std::to_string(i))));
  // Back's two replicas take max_ongoing_requests = 2 each: the four calls,
  // held in the replicas, all arrive only when spread two and two.
  bool all_arrived = wait_until([&] { return gate->total() == 4; }, 10s);
  auto arrived = gate->arrived();
  gate->release();
  CHECK(all_arrived);
  const std::map<std::string, int> two_each{{"back-1", 2}, {"back-2", 2}};
  CHECK(arrived == two_each);
  std::set<std::string> bodies;
  std::map<std::string, int> answered_by;
  for (auto& c : calls) {
    Response r = c.get();
    REQUIRE(r.status == 200);
    auto body = json::parse(r.body);
    bodies.insert(body["body"].get<std::string>());
    ++answered_by[body["replica"].get<std::string>()];
  }
  CHECK(bodies == std::set<std::string>{"0", "1", "2", "3"});
  CHECK(answered_by == two_each);
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
  auto metrics = http_get(f.proxy->admin_port(), "/-/metrics", 5);
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

// -- the query of death: a request that crashes replicas ---------------------

TEST_CASE("crash: a request that crashes two replicas is answered 502 and never sent again") {
  Fixture f;
  f.publish_dying();
  auto r = http_get(f.proxy->port(), "/poison/poison", 10);
  REQUIRE(r);
  CHECK(r->status == 502);
  CHECK(has(r->head, "Content-Type: application/json"));
  auto body = json::parse(r->body);
  std::string id = body["request_id"];
  REQUIRE_FALSE(id.empty());
  CHECK(has(r->head, "X-Request-Id: " + id));
  CHECK(body["error"] ==
        "request " + id + " crashed 2 replicas of crash/Poison; it is not retried again");
  // Exactly two of the three replicas received it; the third never did, and
  // still serves.
  auto hit = replicas_hit(*f.victims, id);
  CHECK(hit.size() == 2);
  auto ok = http_get(f.proxy->port(), "/poison/fine", 10);
  REQUIRE(ok);
  CHECK(ok->status == 200);
  std::string survivor = json::parse(ok->body)["replica"];
  CHECK(hit.count(survivor) == 0);
  CHECK(f.victims->get().size() == 2);
  auto metrics = f.metrics();
  CHECK(has(metrics, "troupe_proxy_requests_crashed_total{application=\"crash\"} 1\n"));
  CHECK(has(metrics, "troupe_proxy_requests_total{application=\"crash\",code=\"502\"} 1\n"));
  CHECK(has(metrics, "troupe_proxy_retries_total{application=\"crash\"} 1\n"));
}

TEST_CASE("crash: a request whose replica died is retried once and served by a healthy one") {
  Fixture f;
  f.publish_dying();
  auto r = http_get(f.proxy->port(), "/mixed/poison", 10);
  REQUIRE(r);
  CHECK(r->status == 200);
  auto body = json::parse(r->body);
  CHECK(body["replica"] == "mixed-ok");
  // The local (dying) replica was tried first and died with it.
  auto hits = f.victims->get();
  REQUIRE(hits.size() == 1);
  CHECK(hits[0].first == "mixed-dying");
  CHECK(hits[0].second == body["request_id"]);
  auto metrics = f.metrics();
  CHECK(has(metrics, "troupe_proxy_retries_total{application=\"mixed\"} 1\n"));
  CHECK_FALSE(has(metrics, "troupe_proxy_requests_crashed_total{application=\"mixed\"}"));
  CHECK(has(metrics, "troupe_proxy_requests_total{application=\"mixed\",code=\"200\"} 1\n"));
}

TEST_CASE("crash: a handle call is bound the same way - 502 after two crashed replicas") {
  Fixture f;
  f.publish_dying();
  std::string id = "poison-call-1";
  replica::RequestIdScope scope(id);
  Response r = f.handle("Poison").call(post("x", "/poison"));
  CHECK(r.status == 502);
  auto body = json::parse(r.body);
  CHECK(body["request_id"] == id);
  CHECK(body["error"] ==
        "request poison-call-1 crashed 2 replicas of shop/Poison; it is not retried again");
  CHECK(replicas_hit(*f.victims, id).size() == 2);
  CHECK(has(f.metrics(), "troupe_proxy_requests_crashed_total{application=\"shop\"} 1\n"));
  // One dying replica and a healthy one: served after one retry.
  std::string id2 = "poison-call-2";
  replica::RequestIdScope scope2(id2);
  r = f.handle("Mixed").call(post("y", "/poison"));
  REQUIRE(r.status == 200);
  CHECK(json::parse(r.body)["replica"] == "shop-mixed-ok");
  auto hits = f.victims->get();
  REQUIRE(hits.size() == 3);
  CHECK(hits[2] == std::make_pair(std::string("shop-mixed-dying"), id2));
  CHECK(has(f.metrics(), "troupe_proxy_requests_crashed_total{application=\"shop\"} 1\n"));
}

TEST_CASE("crash: a request bounced by replicas that died with it counts the same") {
  Fixture f;
  f.publish_dying();
  std::string id = "bounce-call-1";
  replica::RequestIdScope scope(id);
  Response r = f.handle("Bounce").call(post("x", "/poison"));
  CHECK(r.status == 502);
  CHECK(json::parse(r.body)["error"] ==
        "request bounce-call-1 crashed 2 replicas of shop/Bounce; it is not retried again");
  CHECK(replicas_hit(*f.victims, id).size() == 2);
  // The third one serves other calls.
  r = f.handle("Bounce").call(post("y", "/fine"));
  REQUIRE(r.status == 200);
  CHECK(f.victims->get().size() == 2);
}

// -- calls from another process: make_remote_proxy_call ----------------------

TEST_CASE("remote: a call through make_remote_proxy_call to the keeper reaches a replica") {
  Fixture f;
  f.publish();
  auto remote =
      replica::make_handle_transport(replica::make_remote_proxy_call(*f.sys, f.proxy->keeper()));
  std::string id = "remote-1";
  replica::RequestIdScope scope(id);
  Response r = DeploymentHandle(remote, "shop", "Back").call(post("payload", "/items"));
  REQUIRE(r.status == 200);
  auto body = json::parse(r.body);
  CHECK(body["replica"] == "back-1");
  CHECK(body["path"] == "/items");
  CHECK(body["body"] == "payload");
  CHECK(body["request_id"] == "remote-1");
  // An unknown deployment: the proxy's 404, through the same path.
  r = DeploymentHandle(remote, "shop", "Nope").call(post("x"));
  CHECK(r.status == 404);
  body = json::parse(r.body);
  CHECK(body["error"] == "application shop has no deployment Nope");
  CHECK(body["request_id"] == "remote-1");
  // The proxy actor itself takes the call too.
  auto direct =
      replica::make_handle_transport(replica::make_remote_proxy_call(*f.sys, f.proxy->actor()));
  CHECK(DeploymentHandle(direct, "shop", "Front").call(post("x")).status == 200);
  // Its timeout is the proxy's: 504 from the proxy, not the request's.
  r = DeploymentHandle(remote, "shop", "Empty").with_timeout(0.3).call(post("x"));
  CHECK(r.status == 504);
  CHECK(json::parse(r.body)["error"] == "request timed out");
}

TEST_CASE(
    "remote: a call from another actor system over the network - and after the proxy stopped") {
  Fixture f;
  f.publish();
  // Published untyped, as troupe-node publishes its actors (runtime/wire.hpp).
  auto published =
      f.sys->middleman().publish(caf::actor_cast<caf::actor>(f.proxy->keeper()), 0, "127.0.0.1");
  REQUIRE_MESSAGE(published, f.sys->render(published.error()));
  caf::actor_system_config cfg;
  configure_actor_system(cfg, TransportOptions{});
  caf::actor_system other(cfg);
  auto keeper = other.middleman().remote_actor("127.0.0.1", *published);
  REQUIRE_MESSAGE(keeper, other.render(keeper.error()));
  auto remote = replica::make_handle_transport(
      replica::make_remote_proxy_call(other, caf::actor_cast<HandleCallActor>(*keeper)));
  Response r = DeploymentHandle(remote, "shop", "Back").call(post("over the wire", "/x"));
  REQUIRE(r.status == 200);
  auto body = json::parse(r.body);
  CHECK(body["replica"] == "back-1");
  CHECK(body["body"] == "over the wire");
  CHECK(DeploymentHandle(remote, "shop", "Nope").call(post("x")).status == 404);
  // The proxy stopped (its keeper exits): a JSON 503, at once.
  f.proxy->stop();
  auto start = std::chrono::steady_clock::now();
  r = DeploymentHandle(remote, "shop", "Back").call(post("x"));
  CHECK(r.status == 503);
  CHECK(json::parse(r.body).contains("error"));
  CHECK(std::chrono::steady_clock::now() - start < 5s);
}

// A replica of this node that died while the snapshot naming it was on its
// way arrives with an empty handle (CAF deserializes the handle of a local
// actor that is gone that way). Routing to it dereferenced a null handle: a
// SIGSEGV of the node, caught by the exit checks of node_faults_test.
TEST_CASE("handle: a replica with an empty handle in a snapshot is never chosen") {
  Fixture f;
  RoutingSnapshot s;
  s.epoch = 1;
  s.seq = 1;
  s.full = true;
  s.routes = {};
  // The local one (preferred when idle) has no handle.
  s.deployments = {{"shop",
                    "Back",
                    {endpoint("shop#Back#1", "n1", caf::actor{}),
                     endpoint("shop#Back#2", "n2", f.spawn_replica("back-2"))},
                    -1}};
  caf::anon_send(f.proxy->actor(), snapshot_atom::value, s);
  REQUIRE(wait_until([&] { return f.handle("Back").call(post("x")).status == 200; }, 10s));
  for (int i = 0; i < 20; ++i) {
    Response r = f.handle("Back").call(post(std::to_string(i)));
    REQUIRE(r.status == 200);
    CHECK(json::parse(r.body)["replica"] == "back-2");
  }
}

TEST_CASE("handle: a call inherits what is left of the calling request's deadline - never more") {
  using std::chrono::steady_clock;
  // No deadline: the call's own timeout (0: the callee's).
  CHECK(replica::current_deadline() == steady_clock::time_point::max());
  CHECK(replica::inherited_timeout(0) == 0);
  CHECK(replica::inherited_timeout(7) == 7);
  {
    std::string id = "with-deadline";
    replica::RequestIdScope scope(id, 60);
    // At most the time left (a little under 60 s), less when asked for less.
    CHECK(replica::inherited_timeout(0) <= 60);
    CHECK(replica::inherited_timeout(0) > 50);
    CHECK(replica::inherited_timeout(3600) <= 60);
    CHECK(replica::inherited_timeout(2) == 2);
    {
      std::string inner = "inner";
      replica::RequestIdScope nested(inner);  // a scope without a deadline has none
      CHECK(replica::inherited_timeout(0) == 0);
    }
    CHECK(replica::inherited_timeout(0) > 50);
  }
  CHECK(replica::current_deadline() == steady_clock::time_point::max());
}

TEST_CASE("handle: a call made after the calling request's deadline passed answers 504 at once") {
  Fixture f;
  f.publish();
  std::string id = "late-caller";
  replica::RequestIdScope scope(id, 1e-9);  // passed by the time the call is made
  auto r = f.handle("Back").call(post("x"));
  CHECK(r.status == 504);
  CHECK(r.body.find("deadline passed") != std::string::npos);
}

namespace {

// A replica whose ModelCache holds models: answers like fake_replica, plus
// the held-models header a replica process adds (runtime/multiplex.hpp).
caf::behavior model_replica(caf::event_based_actor*, std::string id, std::string held) {
  return {
      [id, held](handle_atom, HttpRequest& r) -> HttpResponse {
        auto out = echo(id, r);
        out.headers.emplace_back("X-Troupe-Held-Models", held);
        return out;
      },
  };
}

}  // namespace

TEST_CASE(
    "multiplex: a handle call for a model goes to its holder - the answer's held models are learnt "
    "and stripped") {
  Fixture f;
  auto spawn = [&](const std::string& id, const std::string& held) {
    f.replicas.push_back(f.sys->spawn(model_replica, id, held));
    return f.replicas.back();
  };
  auto local = endpoint("shop#Back#1", "n1", spawn("back-1", "5 m1"));
  auto remote = endpoint("shop#Back#2", "n2", spawn("back-2", "9 m7,m8"));
  remote.model_ids = {"m7"};
  remote.model_ids_seq = 1;
  RoutingSnapshot s;
  s.epoch = 1;
  s.seq = 1;
  s.full = true;
  s.routes = {{"/shop", "shop", "Back"}};
  s.deployments = {{"shop", "Back", {local, remote}, -1}};
  caf::anon_send(f.proxy->actor(), snapshot_atom::value, s);
  REQUIRE(wait_until(
      [&] {
        auto r = http_get(f.proxy->port(), "/-/healthz", 5);
        return r && r->status == 200;
      },
      10s));
  auto replica_of = [](const Response& r) {
    REQUIRE(r.status == 200);
    for (const auto& [name, value] : r.headers)
      CHECK_FALSE(name == "X-Troupe-Held-Models");  // never passed on
    return json::parse(r.body)["replica"].get<std::string>();
  };
  auto m7 = f.handle("Back").with_multiplexed_model_id("m7");
  // The remote holder, not the idle local replica.
  for (int i = 0; i < 5; ++i)
    CHECK(replica_of(m7.call(post("x"))) == "back-2");
  // back-2's answers said it holds m8 too (its list number 9 > 1).
  CHECK(replica_of(f.handle("Back").with_multiplexed_model_id("m8").call(post("x"))) == "back-2");
  // Without a model: the local replica, as usual.
  CHECK(replica_of(f.handle("Back").call(post("x"))) == "back-1");
  // HTTP requests name the model in a header, either spelling.
  for (const char* header : {"serve_multiplexed_model_id", "X-Troupe-Model-Id"}) {
    CAPTURE(header);
    auto r = http_request(f.proxy->port(), "GET", "/shop/", "", 10, {{header, "m7"}});
    REQUIRE(r);
    CHECK(json::parse(r->body)["replica"] == "back-2");
    CHECK(r->head.find("X-Troupe-Held-Models") == std::string::npos);
  }
}
