// Composition end to end (issue 5, acceptance 4): examples/compose.yaml on a
// 3-node cluster. The ingress Gateway calls Upper and Reverse through
// deployment handles, which go through the proxy of the Gateway replica's own
// node; the replicas of every deployment are spread over the nodes, so some
// handle calls cross nodes. Every wait is a condition with a deadline.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <map>
#include <set>
#include <string>

#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"

using namespace troupe::testing;
using nlohmann::json;

namespace {

struct Composed {
  Cluster cluster;

  Composed() {
    cluster.start({"w1", "w2"}, 30s);
    auto r = cluster.ctl(
        {"deploy", std::string(TROUPE_SOURCE_DIR) + "/examples/compose.yaml", "--wait"}, 120s);
    CAPTURE(r.out);
    CAPTURE(r.err);
    if (r.exit_code != 0)
      cluster.dump_output();
    REQUIRE(r.exit_code == 0);
  }

  json status() {
    auto s = cluster.status(120s);
    REQUIRE(s.is_object());
    return s;
  }

  // The answer of `target` through `node`'s proxy, once it is a 200 (a proxy
  // may get the route table a moment after the deploy returned).
  std::optional<HttpReply> get_ok(const std::string& node, const std::string& target) {
    std::optional<HttpReply> last;
    bool ok = wait_until(
        [&] {
          last = http_get(cluster.http_ports.at(node), target, 30);
          return last && last->status == 200;
        },
        30s, 100ms);
    if (!ok) {
      MESSAGE("last answer from " << node << ": "
                                  << (last ? std::to_string(last->status) + " " + last->body
                                           : std::string("none")));
      return std::nullopt;
    }
    return last;
  }
};

}  // namespace

TEST_CASE("compose: Gateway answers through every proxy with Upper and Reverse spread over nodes") {
  Composed c;

  // Replicas of every deployment on more than one node (the scheduler spreads
  // a deployment's replicas over the ALIVE nodes).
  auto s = c.status();
  const auto& app = s.at("applications").at("compose");
  CHECK(app.at("status") == "RUNNING");
  std::map<std::string, std::set<std::string>> nodes_of;     // deployment -> nodes
  std::map<std::string, std::set<std::string>> replicas_of;  // deployment -> replica ids
  std::map<std::string, std::string> node_of_replica;
  for (const auto& [name, dep] : app.at("deployments").items()) {
    for (const auto& r : dep.at("replicas")) {
      CHECK(r.at("state") == "RUNNING");
      nodes_of[name].insert(r.at("node").get<std::string>());
      replicas_of[name].insert(r.at("id").get<std::string>());
      node_of_replica[r.at("id").get<std::string>()] = r.at("node").get<std::string>();
    }
  }
  CHECK(replicas_of["Gateway"].size() == 3);
  CHECK(replicas_of["Upper"].size() == 2);
  CHECK(replicas_of["Reverse"].size() == 2);
  CHECK(nodes_of["Gateway"] == std::set<std::string>{"head", "w1", "w2"});
  CHECK(nodes_of["Upper"].size() == 2);
  CHECK(nodes_of["Reverse"].size() == 2);

  // Through every node's proxy: the right answer, computed by replicas the
  // status lists, on the nodes it lists.
  bool crossed = false;  // a handle call served by a replica on another node
  for (const std::string node : {"head", "w1", "w2"}) {
    CAPTURE(node);
    auto reply = c.get_ok(node, "/compose/?text=Hello");
    REQUIRE(reply);
    auto answer = json::parse(reply->body);
    CHECK(answer.at("input") == "Hello");
    CHECK(answer.at("upper").at("text") == "HELLO");
    CHECK(answer.at("reverse").at("text") == "olleH");
    const std::string gateway = answer.at("gateway").at("replica_id");
    const std::string upper = answer.at("upper").at("replica_id");
    const std::string reverse = answer.at("reverse").at("replica_id");
    CHECK(replicas_of["Gateway"].count(gateway) == 1);
    CHECK(replicas_of["Upper"].count(upper) == 1);
    CHECK(replicas_of["Reverse"].count(reverse) == 1);
    CHECK(answer.at("gateway").at("node_id") == node_of_replica[gateway]);
    CHECK(answer.at("upper").at("node_id") == node_of_replica[upper]);
    CHECK(answer.at("reverse").at("node_id") == node_of_replica[reverse]);
    // An idle local replica is preferred: this proxy's own Gateway, and that
    // Gateway's node's Upper/Reverse when it hosts one.
    CHECK(node_of_replica[gateway] == node);
    if (nodes_of["Upper"].count(node))
      CHECK(node_of_replica[upper] == node);
    crossed = crossed || node_of_replica[upper] != node_of_replica[gateway] ||
              node_of_replica[reverse] != node_of_replica[gateway];
  }
  // Upper runs on two of the three nodes: the third node's Gateway reaches a
  // remote one.
  CHECK(crossed);

  // A steady run through all proxies: every request answers correctly.
  int good = 0;
  for (int i = 0; i < 30; ++i) {
    const std::string node = i % 3 == 0 ? "head" : i % 3 == 1 ? "w1" : "w2";
    const std::string text = "abc" + std::to_string(i);
    auto reply = http_get(c.cluster.http_ports.at(node), "/compose/?text=" + text, 30);
    if (!reply || reply->status != 200) {
      MESSAGE("request " << i << " via " << node << ": "
                         << (reply ? std::to_string(reply->status) + " " + reply->body : "none"));
      continue;
    }
    auto answer = json::parse(reply->body);
    std::string reversed(text.rbegin(), text.rend());
    if (answer.at("upper").at("text") == "ABC" + std::to_string(i) &&
        answer.at("reverse").at("text") == reversed)
      ++good;
  }
  CHECK(good == 30);
}

TEST_CASE("compose: a handle to an unknown deployment answers 404 with a JSON error") {
  Composed c;
  auto known = c.get_ok("w1", "/compose/call/Upper?text=abc");
  REQUIRE(known);
  CHECK(json::parse(known->body).at("text") == "ABC");

  auto reply = http_get(c.cluster.http_ports.at("w2"), "/compose/call/Nope?text=x", 30);
  REQUIRE(reply);
  CHECK(reply->status == 404);
  auto body = json::parse(reply->body);
  CHECK(body.at("error") == "application compose has no deployment Nope");
  // The handle call carried the id of the client's request.
  CHECK_FALSE(body.at("request_id").get<std::string>().empty());
  CHECK(reply->head.find("X-Request-Id: " + body.at("request_id").get<std::string>()) !=
        std::string::npos);

  // Handle calls are counted by the proxy that routed them, like requests.
  auto metrics = http_get(c.cluster.admin_ports.at("w2"), "/-/metrics", 10);
  REQUIRE(metrics);
  CHECK(metrics->body.find("troupe_proxy_requests_total{application=\"compose\",code=\"404\"} 2") !=
        std::string::npos);
}
