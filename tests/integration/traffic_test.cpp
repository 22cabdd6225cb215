// The weighted traffic split on a real 2-node cluster (issue 15, acceptance
// 1): the share each deployment gets through both proxies, a change of the
// weights with `troupectl traffic` reaching every proxy within 2 s, sticky
// routing by a key header, and the weights surviving a controller restart.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <map>
#include <optional>

#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"

using namespace troupe::testing;
using nlohmann::json;

namespace {

// Hello and Canary run the same class; their greeting tells them apart.
const char* kGreet = R"(applications:
  - name: greet
    route_prefix: /greet
    import_path: libtroupe_examples.so:Hello
    traffic: {Hello: 0.8, Canary: 0.2}
    traffic_key_header: X-User
    deployments:
      - name: Hello
        num_replicas: 2
        user_config: {greeting: stable}
      - name: Canary
        import_path: libtroupe_examples.so:Hello
        num_replicas: 1
        user_config: {greeting: canary}
)";

struct TrafficCluster {
  Cluster cluster;
  std::vector<uint16_t> proxies;
  std::vector<uint16_t> admins;  // the same nodes' admin ports

  TrafficCluster() {
    cluster.start({"w1"});
    proxies = {cluster.http_ports.at("head"), cluster.http_ports.at("w1")};
    admins = {cluster.admin_ports.at("head"), cluster.admin_ports.at("w1")};
  }

  json status() {
    auto s = cluster.status();
    return s.is_object() ? s : json::object();
  }
};

// The greeting of one answer of /greet/ through `port` ("stable" or
// "canary"); nullopt when there was no 200 answer.
std::optional<std::string> greeting(uint16_t port, const std::string& user = "") {
  std::vector<std::pair<std::string, std::string>> headers;
  if (!user.empty())
    headers.emplace_back("X-User", user);
  auto r = http_request(port, "GET", "/greet/", "", 10, headers);
  if (!r || r->status != 200)
    return std::nullopt;
  auto body = json::parse(r->body, nullptr, false);
  if (!body.is_object() || !body.contains("greeting"))
    return std::nullopt;
  return body["greeting"].get<std::string>();
}

}  // namespace

TEST_CASE("traffic split: 0.8/0.2 through the proxies - troupectl traffic within 2 s - sticky key - kept on restart") {
  TrafficCluster t;
  t.cluster.deploy_yaml("greet.yaml", kGreet, 60s);
  // Both deployments serve through both proxies (the split can pick either).
  for (uint16_t port : t.proxies) {
    CAPTURE(port);
    REQUIRE(wait_until(
        [&] {
          auto a = greeting(port, "probe-stable");  // pinned by its key
          return a.has_value();
        },
        20s, 100ms));
  }

  // 2,000 requests through both proxies: the canary gets 20 % +- 3 %.
  std::map<std::string, int> answers;
  for (int i = 0; i < 2000; ++i) {
    auto g = greeting(t.proxies[i % 2]);
    ++answers[g.value_or("failed")];
  }
  INFO("canary ", answers["canary"], ", stable ", answers["stable"], ", failed ",
       answers["failed"]);
  CHECK(answers["failed"] == 0);
  CHECK(answers["stable"] + answers["canary"] == 2000);
  CHECK(answers["canary"] >= 340);  // 17 %
  CHECK(answers["canary"] <= 460);  // 23 %

  // The key header: one user stays on one deployment, on every proxy.
  int users_on_canary = 0;
  for (int u = 0; u < 40; ++u) {
    const std::string user = "user-" + std::to_string(u);
    auto first = greeting(t.proxies[0], user);
    REQUIRE(first.has_value());
    users_on_canary += *first == "canary" ? 1 : 0;
    for (int i = 0; i < 5; ++i)
      CHECK(greeting(t.proxies[i % 2], user) == first);
  }
  // Not all users on one side: the key picks by the weights.
  INFO("users on the canary: ", users_on_canary, " of 40");
  CHECK(users_on_canary > 0);
  CHECK(users_on_canary < 40);

  // troupectl traffic: every request goes to the canary within 2 s of the
  // command's answer, on both proxies.
  auto changed = t.cluster.ctl({"traffic", "greet", "Hello=0", "Canary=1"});
  CAPTURE(changed.err);
  REQUIRE(changed.exit_code == 0);
  CHECK(changed.out.find("traffic of greet: Canary=1, Hello=0 (generation ") == 0);
  const auto switched_at = std::chrono::steady_clock::now();
  for (uint16_t port : t.proxies) {
    CAPTURE(port);
    // Ten canary answers in a row: the proxy holds the new weights.
    CHECK(wait_until(
        [&] {
          for (int i = 0; i < 10; ++i) {
            if (greeting(port) != std::optional<std::string>("canary"))
              return false;
          }
          return true;
        },
        2s, 20ms));
  }
  CHECK(std::chrono::steady_clock::now() - switched_at < 2500ms);
  int not_canary = 0;
  for (int i = 0; i < 200; ++i)
    not_canary += greeting(t.proxies[i % 2], i % 3 ? "" : "user-" + std::to_string(i)) ==
                          std::optional<std::string>("canary")
                      ? 0
                      : 1;
  CHECK(not_canary == 0);
  // Shown by status and config.
  auto s = t.status();
  CHECK(s["applications"]["greet"]["traffic"] == json({{"Canary", 1.0}, {"Hello", 0.0}}));
  CHECK(s["applications"]["greet"]["traffic_key_header"] == "X-User");
  auto config = t.cluster.ctl({"config"});
  CHECK(config.out.find("traffic: {Canary: 1, Hello: 0}") != std::string::npos);

  // Refused: the weights stay as they are.
  for (const auto& bad : std::vector<std::vector<std::string>>{
           {"traffic", "greet", "Hello=0.5", "Canary=0.4"},
           {"traffic", "greet", "Hello=1.5", "Canary=-0.5"},
           {"traffic", "greet", "Nope=1"},
           {"traffic", "nope", "Hello=1"},
           {"traffic", "greet", "Hello"},
           {"delete", "greet/Canary"},
       }) {
    CAPTURE(bad);
    auto r = t.cluster.ctl(bad);
    CHECK(r.exit_code == 1);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
  CHECK(t.status()["applications"]["greet"]["traffic"] == json({{"Canary", 1.0}, {"Hello", 0.0}}));

  // A controller restart keeps the weights: the new incarnation reads them
  // from its checkpoint, shows them, and pushes them to the proxies in a
  // full snapshot of its own (a new epoch).
  auto routes_epoch = [&](uint16_t port) -> uint64_t {
    auto r = http_get(port, "/-/routes", 5);
    if (!r || r->status != 200)
      return 0;
    return json::parse(r->body).value("epoch", uint64_t{0});
  };
  std::vector<uint64_t> epochs;
  for (uint16_t port : t.admins)
    epochs.push_back(routes_epoch(port));
  auto killed = t.cluster.ctl({"kill", "controller"});
  REQUIRE(killed.exit_code == 0);
  CHECK(wait_until(
      [&] {
        auto st = t.status();
        return st.value("recovering", true) == false && st.contains("applications") &&
               st["applications"]["greet"].value("traffic", json()) ==
                   json({{"Canary", 1.0}, {"Hello", 0.0}});
      },
      30s, 100ms));
  for (size_t i = 0; i < t.proxies.size(); ++i) {
    CAPTURE(t.proxies[i]);
    CHECK(wait_until([&] { return routes_epoch(t.admins[i]) != epochs[i]; }, 20s, 100ms));
    auto r = http_get(t.admins[i], "/-/routes", 5);
    REQUIRE(r);
    auto routes = json::parse(r->body)["routes"];
    REQUIRE(routes.size() == 1);
    CHECK(routes[0]["traffic"] == json({{"Canary", 1.0}}));
  }
  for (int i = 0; i < 50; ++i)
    CHECK(greeting(t.proxies[i % 2]) == std::optional<std::string>("canary"));
}
