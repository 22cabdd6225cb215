// Shadow traffic on a real cluster (issue 15 item 2): with shadow {Mirror:
// 0.5} the mirror receives about half of the application's requests as
// copies (counted by the mirror itself, and by the proxy's metric, which
// agree), while every client answer comes from the primary; a shadow whose
// handler sleeps 5 s does not change the client's latency, and the copies it
// has no room for are dropped and counted; bad shadows are refused by
// troupectl deploy with one line, and a shadow deployment cannot be deleted.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"

using namespace troupe::testing;
using nlohmann::json;

namespace {

// greet: Hello answers, Mirror (a Counter: it counts what it receives) gets
// copies. plain and slow: the same Hello, slow with a shadow that sleeps 5 s
// and has room for 2 copies.
std::string config(const std::string& greet_extra) {
  return R"(applications:
  - name: greet
    route_prefix: /greet
    import_path: libtroupe_examples.so:Hello
)" + greet_extra +
         R"(    deployments:
      - name: Hello
      - name: Mirror
        import_path: libtroupe_examples.so:Counter
  - name: plain
    route_prefix: /plain
    import_path: libtroupe_examples.so:Hello
  - name: slow
    route_prefix: /slow
    import_path: libtroupe_examples.so:Hello
    shadow: {Slow: 1}
    deployments:
      - name: Hello
      - name: Slow
        import_path: libtroupe_examples.so:Sleep
        max_ongoing_requests: 2
        user_config: {ms: 5000}
)";
}

struct ShadowCluster {
  Cluster cluster;
  uint16_t port = 0;
  uint16_t admin = 0;  // the head's admin listener

  ShadowCluster() {
    cluster.start();
    port = cluster.http_ports.at("head");
    admin = cluster.admin_ports.at("head");
  }

  RunResult deploy(const std::string& yaml, const std::string& name, bool wait = true) {
    std::vector<std::string> args = {"deploy", cluster.write(name, yaml)};
    if (wait)
      args.push_back("--wait");
    return cluster.ctl(args);
  }

  json status() {
    auto s = cluster.status();
    return s.is_object() ? s : json::object();
  }

  // troupe_proxy_shadow_requests_total for (app, deployment, outcome); 0
  // when absent, -1 when the metrics could not be read.
  long long shadow_metric(const std::string& app, const std::string& deployment,
                          const std::string& outcome) {
    auto r = http_get(admin, "/-/metrics", 5);
    if (!r || r->status != 200)
      return -1;
    const std::string line = "troupe_proxy_shadow_requests_total{application=\"" + app +
                             "\",deployment=\"" + deployment + "\",outcome=\"" + outcome + "\"} ";
    auto at = r->body.find(line);
    if (at == std::string::npos)
      return 0;
    return std::stoll(r->body.substr(at + line.size()));
  }

  // Requests this proxy has in flight on the replicas of (app, deployment);
  // -1 when unknown.
  long long in_flight(const std::string& app, const std::string& deployment) {
    auto r = http_get(admin, "/-/routes", 5);
    if (!r || r->status != 200)
      return -1;
    const json routes = json::parse(r->body);
    for (const auto& d : routes["deployments"]) {
      if (d["application"] == app && d["deployment"] == deployment) {
        long long n = 0;
        for (const auto& rep : d["replicas"])
          n += rep["in_flight"].get<long long>();
        return n;
      }
    }
    return -1;
  }
};

// One GET through the proxy: the answer's JSON body, or nullopt unless 200.
std::optional<json> get_json(uint16_t port, const std::string& target) {
  auto r = http_get(port, target, 10);
  if (!r || r->status != 200)
    return std::nullopt;
  auto body = json::parse(r->body, nullptr, false);
  if (!body.is_object())
    return std::nullopt;
  return body;
}

double p99_ms(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[static_cast<size_t>(0.99 * (samples.size() - 1))];
}

}  // namespace

TEST_CASE(
    "shadow traffic: copies with their probability - answers from the primary - a slow shadow "
    "costs the client nothing") {
  ShadowCluster t;
  auto deployed = t.deploy(config("    shadow: {Mirror: 0.5}\n"), "shadow.yaml");
  CAPTURE(deployed.err);
  REQUIRE(deployed.exit_code == 0);
  for (const char* prefix : {"/greet/", "/plain/", "/slow/"}) {
    CAPTURE(prefix);
    REQUIRE(wait_until([&] { return get_json(t.port, prefix).has_value(); }, 20s, 100ms));
  }
  // Shown by status, config and the proxy's routes.
  auto s = t.status();
  CHECK(s["applications"]["greet"]["shadow"] == json({{"Mirror", 0.5}}));
  auto shown = t.cluster.ctl({"status"});
  CHECK(shown.out.find("  shadow: Mirror=0.5") != std::string::npos);
  CHECK(t.cluster.ctl({"config"}).out.find("shadow: {Mirror: 0.5}") != std::string::npos);
  {
    auto r = http_get(t.admin, "/-/routes", 5);
    REQUIRE(r);
    bool found = false;
    const json routes = json::parse(r->body);
    for (const auto& route : routes["routes"]) {
      if (route["application"] == "greet") {
        CHECK(route["shadow"] == json({{"Mirror", 0.5}}));
        found = true;
      }
    }
    CHECK(found);
  }

  // Bad shadows: one line each, exit 1, nothing changes; the shadow cannot
  // be deleted.
  for (const auto& extra : std::vector<std::string>{
           "    shadow: {Mirror: 1.5}\n",
           "    shadow: {Nope: 0.5}\n",
           "    shadow: {Hello: 0.5}\n",
           "    traffic: {Hello: 0.5, Mirror: 0.5}\n    shadow: {Mirror: 0.5}\n",
       }) {
    CAPTURE(extra);
    auto r = t.deploy(config(extra), "bad.yaml", false);
    CHECK(r.exit_code == 1);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.find("shadow") != std::string::npos);
  }
  auto deleted = t.cluster.ctl({"delete", "greet/Mirror"});
  CHECK(deleted.exit_code == 1);
  CHECK(std::count(deleted.err.begin(), deleted.err.end(), '\n') == 1);
  CHECK(deleted.err.find("is a shadow of the application") != std::string::npos);
  CHECK(t.status()["applications"]["greet"]["shadow"] == json({{"Mirror", 0.5}}));

  MESSAGE("before: copies to the mirror answered ", t.shadow_metric("greet", "Mirror", "200"),
          ", dropped ", t.shadow_metric("greet", "Mirror", "dropped"));
  // 1,000 requests: every answer from Hello, about half copied to Mirror.
  const int n = 1000;
  int from_hello = 0;
  for (int i = 0; i < n; ++i) {
    auto a = get_json(t.port, "/greet/");
    from_hello += a && a->contains("greeting") && !a->contains("count") ? 1 : 0;
  }
  CHECK(from_hello == n);
  // Every copy ended (the mirror answers at once), then the metric is final.
  CHECK(wait_until([&] { return t.in_flight("greet", "Mirror") == 0; }, 10s, 50ms));
  const long long answered = t.shadow_metric("greet", "Mirror", "200");
  const long long dropped = t.shadow_metric("greet", "Mirror", "dropped");
  MESSAGE("copies to the mirror: answered ", answered, ", dropped ", dropped, " of ", n,
          " requests");
  CHECK(answered + dropped >= n / 2 - n / 20);  // 50 % +- 5 %
  CHECK(answered + dropped <= n / 2 + n / 20);
  // The mirror is fast and alone with the copies: it is rarely full. (On a
  // loaded machine its process may fall behind the primary's for a moment;
  // then the copies beyond its 5 slots are dropped, as they should be. Seen:
  // 0 to 69 of about 500.)
  CHECK(dropped <= n / 5);

  // What the mirror itself observed: give it the traffic (the shadow goes,
  // its replica stays, with its count) and ask it.
  auto switched = t.deploy(config("    traffic: {Mirror: 1}\n"), "switched.yaml");
  CAPTURE(switched.err);
  REQUIRE(switched.exit_code == 0);
  std::optional<long long> count;
  CHECK(wait_until(
      [&] {
        auto a = get_json(t.port, "/greet/");
        if (a && a->contains("count"))
          count = (*a)["count"].get<long long>();
        return count.has_value();
      },
      20s, 20ms));
  REQUIRE(count);
  // Requests sent while the switch was on its way were copied too: once
  // every copy ended, the proxy's count and the mirror's agree exactly (the
  // mirror's first own request is the last of its count).
  CHECK(wait_until([&] { return t.in_flight("greet", "Mirror") == 0; }, 10s, 50ms));
  const long long answered_now = t.shadow_metric("greet", "Mirror", "200");
  INFO("the mirror counted ", *count - 1, " copies, the proxy ", answered_now);
  CHECK(answered_now >= answered);
  CHECK(*count - 1 == answered_now);
  auto next = get_json(t.port, "/greet/");
  REQUIRE(next);
  CHECK((*next)["count"] == *count + 1);  // no shadow any more
  CHECK(t.shadow_metric("greet", "Mirror", "200") == answered_now);

  // The slow shadow: plain and slow alternate, the same number of requests
  // each. Every copy to slow's shadow sleeps 5 s; it has room for 2, the
  // rest are dropped. The client's p99 must not move: within 10 % of plain's,
  // with an absolute slack of 10 ms for a shared 2-core machine (the 5 s a
  // client would wait for the shadow is 500 times that).
  const int m = 300;
  std::vector<double> plain_ms, slow_ms;
  int slow_ok = 0;
  auto timed = [&](const std::string& target, std::vector<double>& into) {
    auto begin = std::chrono::steady_clock::now();
    auto a = get_json(t.port, target);
    into.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin)
            .count());
    return a;
  };
  // Alternating which goes first, so that neither pays more often for
  // what the request before it left behind.
  for (int i = 0; i < m; ++i) {
    if (i % 2)
      timed("/plain/", plain_ms);
    auto a = timed("/slow/", slow_ms);
    slow_ok += a && a->contains("greeting") ? 1 : 0;
    if (i % 2 == 0)
      timed("/plain/", plain_ms);
  }
  CHECK(slow_ok == m);
  const double plain_p99 = p99_ms(plain_ms);
  const double slow_p99 = p99_ms(slow_ms);
  MESSAGE("p99 without shadow ", plain_p99, " ms, with the slow shadow ", slow_p99, " ms; max ",
          *std::max_element(slow_ms.begin(), slow_ms.end()), " ms");
  CHECK(slow_p99 <= plain_p99 * 1.1 + 10);
  CHECK(*std::max_element(slow_ms.begin(), slow_ms.end()) < 1000);
  // Room for 2 copies at a time, each held 5 s: never more in flight, and
  // the others dropped and counted (a few seconds of requests leave room for
  // a handful of copies at most; 20 is generous).
  CHECK(t.in_flight("slow", "Slow") <= 2);
  const long long slow_dropped = t.shadow_metric("slow", "Slow", "dropped");
  MESSAGE("copies to the slow shadow dropped: ", slow_dropped, " of ", m);
  CHECK(slow_dropped >= m - 20);
  // The copies it took are answered after their 5 s, and counted.
  CHECK(wait_until([&] { return t.shadow_metric("slow", "Slow", "200") >= 2; }, 15s, 200ms));

  // A controller restart keeps the shadow: the new incarnation reads it from
  // its checkpoint, shows it and pushes it to the proxy in a full snapshot of
  // its own (a new epoch).
  auto routes_json = [&]() {
    auto r = http_get(t.admin, "/-/routes", 5);
    return r && r->status == 200 ? json::parse(r->body, nullptr, false) : json::object();
  };
  const uint64_t epoch = routes_json().value("epoch", uint64_t{0});
  auto killed = t.cluster.ctl({"kill", "controller"});
  REQUIRE(killed.exit_code == 0);
  CHECK(wait_until(
      [&] {
        auto st = t.status();
        return st.value("recovering", true) == false && st.contains("applications") &&
               st["applications"]["slow"].value("shadow", json()) == json({{"Slow", 1.0}});
      },
      30s, 100ms));
  CHECK(wait_until([&] { return routes_json().value("epoch", uint64_t{0}) != epoch; }, 20s, 100ms));
  const json routes = routes_json();
  bool slow_route = false;
  for (const auto& route : routes["routes"]) {
    if (route["application"] == "slow") {
      CHECK(route["shadow"] == json({{"Slow", 1.0}}));
      slow_route = true;
    }
    if (route["application"] == "greet")
      CHECK_FALSE(route.contains("shadow"));
  }
  CHECK(slow_route);
  const long long dropped_before = t.shadow_metric("slow", "Slow", "dropped");
  for (int i = 0; i < 20; ++i)
    CHECK(get_json(t.port, "/slow/").has_value());
  CHECK(t.shadow_metric("slow", "Slow", "dropped") + t.shadow_metric("slow", "Slow", "200") +
            t.in_flight("slow", "Slow") >=
        dropped_before + 20);  // still copied
}
