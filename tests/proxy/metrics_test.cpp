// Metrics: the Prometheus text exposition of the proxy's counters.
#include <doctest/doctest.h>

#include "proxy/metrics.hpp"

using namespace troupe::proxy;

TEST_CASE("proxy/metrics: requests by application and code plus histogram and gauges") {
  Metrics m;
  m.request_started();
  m.request_started();
  m.request_finished();
  m.observe("echo", 200, 0.0007);
  m.observe("echo", 200, 0.003);
  m.observe("echo", 503, 20);
  m.observe("", 404, 0.0001);
  m.retried("echo");
  CHECK(m.count("echo", 200) == 2);
  Router::DeploymentView d;
  d.app = "echo";
  d.deployment = "Echo";
  d.queued = 3;
  d.replicas = {{"r1", "head", 5, 2, true}};
  auto text = m.render({d});
  CHECK(text.find("troupe_proxy_requests_total{application=\"echo\",code=\"200\"} 2\n") !=
        std::string::npos);
  CHECK(text.find("troupe_proxy_requests_total{application=\"\",code=\"404\"} 1\n") !=
        std::string::npos);
  CHECK(text.find("troupe_proxy_request_duration_seconds_bucket{application=\"echo\",le=\"0.001\"} "
                  "1\n") != std::string::npos);
  CHECK(text.find("troupe_proxy_request_duration_seconds_bucket{application=\"echo\",le=\"0.005\"} "
                  "2\n") != std::string::npos);
  CHECK(text.find("troupe_proxy_request_duration_seconds_bucket{application=\"echo\",le=\"+Inf\"} "
                  "3\n") != std::string::npos);
  CHECK(text.find("troupe_proxy_request_duration_seconds_count{application=\"echo\"} 3\n") !=
        std::string::npos);
  CHECK(text.find("troupe_proxy_requests_in_flight 1\n") != std::string::npos);
  CHECK(text.find("troupe_proxy_retries_total{application=\"echo\"} 1\n") != std::string::npos);
  CHECK(text.find("troupe_proxy_queue_length{application=\"echo\",deployment=\"Echo\"} 3\n") !=
        std::string::npos);
  CHECK(text.find("troupe_proxy_replica_in_flight{application=\"echo\",deployment=\"Echo\","
                  "replica=\"r1\"} 2\n") != std::string::npos);
  CHECK(text.find("# TYPE troupe_proxy_request_duration_seconds histogram\n") != std::string::npos);
}

TEST_CASE("proxy/metrics: requests that crashed two replicas by application") {
  Metrics m;
  auto text = m.render({});
  CHECK(text.find("# TYPE troupe_proxy_requests_crashed_total counter\n") != std::string::npos);
  CHECK(text.find("troupe_proxy_requests_crashed_total{") == std::string::npos);
  m.crashed("echo");
  m.crashed("echo");
  m.crashed("a\"b");
  CHECK(m.crashes("echo") == 2);
  CHECK(m.crashes("other") == 0);
  text = m.render({});
  CHECK(text.find("troupe_proxy_requests_crashed_total{application=\"echo\"} 2\n") !=
        std::string::npos);
  CHECK(text.find("troupe_proxy_requests_crashed_total{application=\"a\\\"b\"} 1\n") !=
        std::string::npos);
}

TEST_CASE("proxy/metrics: shadow copies by application - deployment and outcome") {
  Metrics m;
  auto text = m.render({});
  CHECK(text.find("# TYPE troupe_proxy_shadow_requests_total counter\n") != std::string::npos);
  CHECK(text.find("troupe_proxy_shadow_requests_total{") == std::string::npos);
  m.shadow("greet", "Mirror", "200");
  m.shadow("greet", "Mirror", "200");
  m.shadow("greet", "Mirror", "dropped");
  m.shadow("greet", "Slow", "504");
  CHECK(m.shadow_count("greet", "Mirror", "200") == 2);
  CHECK(m.shadow_count("greet", "Mirror", "dropped") == 1);
  CHECK(m.shadow_count("greet", "Mirror", "500") == 0);
  text = m.render({});
  CHECK(text.find("troupe_proxy_shadow_requests_total{application=\"greet\",deployment=\"Mirror\","
                  "outcome=\"200\"} 2\n") != std::string::npos);
  CHECK(text.find("troupe_proxy_shadow_requests_total{application=\"greet\",deployment=\"Mirror\","
                  "outcome=\"dropped\"} 1\n") != std::string::npos);
  CHECK(text.find("troupe_proxy_shadow_requests_total{application=\"greet\",deployment=\"Slow\","
                  "outcome=\"504\"} 1\n") != std::string::npos);
  // Copies are not requests of the application.
  CHECK(m.count("greet", 200) == 0);
}

TEST_CASE("proxy/metrics: troupe_http_* by application - route - method and code - an unknown method is other") {
  Metrics m;
  m.observe_http("shop", "/shop", "GET", 200, 0.002);
  m.observe_http("shop", "/shop", "GET", 200, 0.004);
  m.observe_http("shop", "/shop", "POST", 503, 0.3);
  m.observe_http("", "", "BREW", 404, 0.0001);
  CHECK(m.http_count("shop", "/shop", "GET", 200) == 2);
  CHECK(m.http_count("shop", "/shop", "POST", 503) == 1);
  CHECK(m.http_count("", "", "other", 404) == 1);
  CHECK(m.http_count("", "", "BREW", 404) == 0);
  m.request_started();
  auto text = m.render({});
  CHECK(text.find("# TYPE troupe_http_requests_total counter") != std::string::npos);
  CHECK(text.find("troupe_http_requests_total{application=\"shop\",code=\"200\",method=\"GET\","
                  "route=\"/shop\"} 2") != std::string::npos);
  CHECK(text.find("troupe_http_requests_total{application=\"\",code=\"404\",method=\"other\","
                  "route=\"\"} 1") != std::string::npos);
  CHECK(text.find("troupe_http_request_duration_seconds_count{application=\"shop\","
                  "route=\"/shop\"} 3") != std::string::npos);
  CHECK(text.find("troupe_http_request_duration_seconds_bucket{application=\"shop\","
                  "route=\"/shop\",le=\"0.0025\"} 1") != std::string::npos);
  CHECK(text.find("troupe_http_requests_in_flight 1") != std::string::npos);
  CHECK(text.find("troupe_build_info{version=\"") != std::string::npos);
  // The hand-written ones follow, unchanged.
  CHECK(text.find("# TYPE troupe_proxy_requests_total counter") != std::string::npos);
}
