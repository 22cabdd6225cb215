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
