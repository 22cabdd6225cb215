// The config file of `troupectl deploy`: every example parses, exact values
// and defaults, multi-deployment applications, round trips through to_yaml,
// and one test per kind of bad input with its exact one-line message.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "config/config.hpp"
#include "controller/core/validate.hpp"
#include "tests/support/temp_dir.hpp"

using namespace troupe;
using namespace troupe::config;
using troupe::controller::ApplicationSpec;
using troupe::controller::AutoscalingConfig;
using troupe::controller::DeploymentConfig;
using troupe::controller::DeploymentSpec;
using Json = nlohmann::json;

namespace {

namespace fs = std::filesystem;

const char* const kFile = "deploy.yaml";

DeployConfig parse_ok(const std::string& yaml) {
  auto r = parse_config(yaml, kFile);
  INFO(r.status().to_string());
  REQUIRE(r.has_value());
  return *r;
}

std::string error_of(const std::string& yaml) {
  auto r = parse_config(yaml, kFile);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().code() == errc::invalid_argument);
  const std::string message = r.status().message();
  CHECK(message.find('\n') == std::string::npos);  // one line
  return message;
}

// One application whose single listed deployment is completed by `fields`
// (each line indented by 8 spaces). The first of them is on line 7, so a
// field's key is at 7:9 and its value at column 9 + len(key) + 2.
std::string with_fields(const std::string& fields) {
  return "applications:\n"
         "  - name: greeter\n"
         "    route_prefix: /greet\n"
         "    import_path: libtroupe_examples.so:Hello\n"
         "    deployments:\n"
         "      - name: Hello\n" +
         fields;
}

const ApplicationSpec& only_app(const DeployConfig& c) {
  REQUIRE(c.state.applications.size() == 1);
  return c.state.applications.begin()->second;
}

// The deployment of that name; fails the test when there is none.
const DeploymentSpec& deployment(const ApplicationSpec& app, const std::string& name) {
  for (const auto& d : app.deployments) {
    if (d.name == name)
      return d;
  }
  FAIL("no deployment " << name);
  throw 0;  // not reached
}

void check_round_trip(const DeployConfig& c) {
  const std::string yaml = to_yaml(c);
  INFO(yaml);
  auto again = parse_config(yaml, "printed.yaml");
  INFO(again.status().to_string());
  REQUIRE(again.has_value());
  CHECK(*again == c);
  CHECK(to_yaml(*again) == yaml);  // printing is a fixpoint
}

// The sample of the config reference (docs/config.md), without num_replicas:
// it has an autoscaling_config, and the two exclude each other.
const char* const kFullSample =
    R"(http_options: {host: 127.0.0.1, port: 8000, request_timeout_s: 30}
target_capacity: 100        # optional, 0-100
applications:
  - name: greeter
    route_prefix: /greet
    import_path: libtroupe_examples.so:Hello
    args: {}
    deployments:
      - name: Hello
        max_ongoing_requests: 5
        max_queued_requests: 100
        user_config: {greeting: hi}
        health_check_period_s: 10
        health_check_timeout_s: 30
        graceful_shutdown_wait_loop_s: 2
        graceful_shutdown_timeout_s: 20
        resources: {cpu: 1}
        max_replicas_per_node: 2
        autoscaling_config: {min_replicas: 1, max_replicas: 10, target_ongoing_requests: 2}
)";

}  // namespace

// ---------------------------------------------------------------------------
// Good input.

TEST_CASE("config: every examples/*.yaml parses - passes validate and round-trips") {
  std::set<std::string> seen;
  for (const auto& entry : fs::directory_iterator(fs::path(TROUPE_SOURCE_DIR) / "examples")) {
    if (entry.path().extension() != ".yaml")
      continue;
    CAPTURE(entry.path().string());
    auto r = load_config_file(entry.path().string());
    INFO(r.status().to_string());
    REQUIRE(r.has_value());
    CHECK(r->http == HttpOptions{});  // no host or port: a deploy would warn
    CHECK(r->state.http.request_timeout_s == 30.0);
    CHECK(r->state.generation == 0);
    CHECK_FALSE(r->state.target_capacity.has_value());
    // One application per example file; demo.yaml (what `./troupe up`
    // deploys) declares several at once.
    if (entry.path().filename() != "demo.yaml")
      REQUIRE(r->state.applications.size() == 1);
    for (const auto& [name, app] : r->state.applications) {
      CAPTURE(name);
      // One deployment, the ingress; compose.yaml has two more (composition).
      REQUIRE(app.deployments.size() == (name == "compose" ? 3u : 1u));
      CHECK(app.deployments[0].name == app.ingress);
      // The XGBoost and gRPC examples are libraries of their own
      // (examples/xgboost/, examples/grpc/).
      const std::string library = name == "xgboost"        ? "libtroupe_xgboost.so:"
                                  : name == "grpc-greeter" ? "libtroupe_grpc_example.so:"
                                                           : "libtroupe_examples.so:";
      for (const auto& d : app.deployments) {
        CHECK(d.import_path == library + d.name);
        if (name == "xgboost") {
          // It batches, so its replicas admit at least a batch's worth.
          CHECK(d.config.max_batch_size > 1u);
          CHECK(d.config.max_ongoing_requests >= d.config.max_batch_size);
        } else {
          CHECK(d.config.max_ongoing_requests == 5);
          CHECK(d.config.max_batch_size == 1u);
        }
      }
    }
    CHECK(controller::validate(r->state).is_ok());
    check_round_trip(*r);
    seen.insert(entry.path().filename().string());
  }
  CHECK(seen.size() >= 7);
  CHECK(seen.count("hello.yaml") == 1);
}

TEST_CASE("config: examples/hello.yaml gives exactly its declared state") {
  auto r = load_config_file(std::string(TROUPE_SOURCE_DIR) + "/examples/hello.yaml");
  REQUIRE(r.has_value());
  const ApplicationSpec& app = only_app(*r);
  ApplicationSpec want;
  want.name = "greeter";
  want.route_prefix = "/greet";
  want.ingress = "Hello";
  DeploymentSpec hello;
  hello.name = "Hello";
  hello.import_path = "libtroupe_examples.so:Hello";
  hello.init_args = "{}";
  hello.config.num_replicas = 3;
  hello.config.max_ongoing_requests = 5;
  hello.config.user_config = R"({"greeting":"hi"})";
  want.deployments = {hello};
  CHECK(app == want);
  CHECK(r->state.applications.begin()->first == "greeter");
}

TEST_CASE("config: the full sample parses with exact values") {
  DeployConfig c = parse_ok(kFullSample);
  CHECK(c.http.host == "127.0.0.1");
  CHECK(c.http.port == 8000);
  // The timeouts are part of the declared state (signed and checkpointed
  // with it); host and port only recorded as given.
  CHECK(c.state.http.request_timeout_s == 30.0);
  CHECK_FALSE(c.state.http.keep_alive_timeout_s.has_value());
  CHECK(c.state.target_capacity == 100.0);
  CHECK(c.state.generation == 0);
  const ApplicationSpec& app = only_app(c);
  CHECK(app.name == "greeter");
  CHECK(app.route_prefix == "/greet");
  CHECK(app.ingress == "Hello");
  REQUIRE(app.deployments.size() == 1);
  const DeploymentSpec& d = app.deployments[0];
  CHECK(d.name == "Hello");
  CHECK(d.import_path == "libtroupe_examples.so:Hello");
  CHECK(d.init_args == "{}");
  CHECK(d.code_version == "");
  const DeploymentConfig& k = d.config;
  CHECK(k.num_replicas == 1);  // unused with autoscaling; the default
  CHECK(k.max_ongoing_requests == 5);
  CHECK(k.max_queued_requests == 100);
  CHECK(k.user_config == R"({"greeting":"hi"})");
  CHECK(k.health_check_period_s == 10.0);
  CHECK(k.health_check_timeout_s == 30.0);
  CHECK(k.graceful_shutdown_wait_loop_s == 2.0);
  CHECK(k.graceful_shutdown_timeout_s == 20.0);
  CHECK(k.resources.amounts == std::map<std::string, double>{{"cpu", 1.0}});
  CHECK(k.max_replicas_per_node == 2);
  AutoscalingConfig a;
  a.min_replicas = 1;
  a.max_replicas = 10;
  a.target_ongoing_requests = 2.0;
  CHECK(k.autoscaling_config == a);
}

TEST_CASE("config: fields left out take Ray Serve's defaults") {
  DeployConfig c = parse_ok("applications:\n  - import_path: libx.so:Api\n");
  CHECK(c.http == HttpOptions{});
  CHECK_FALSE(c.http.host.has_value());  // not given: nothing to warn about
  CHECK_FALSE(c.http.port.has_value());
  CHECK_FALSE(config::ignored_http_fields(c.http).has_value());
  // No timeouts declared: each proxy uses its node's --request-timeout and
  // --proxy-idle-timeout.
  CHECK(c.state.http == controller::HttpSettings{});
  CHECK_FALSE(c.state.target_capacity.has_value());
  const ApplicationSpec& app = only_app(c);
  CHECK(app.name == "default");
  CHECK(app.route_prefix == "/");
  CHECK(app.ingress == "Api");
  REQUIRE(app.deployments.size() == 1);
  const DeploymentSpec& d = app.deployments[0];
  CHECK(d.name == "Api");
  CHECK(d.import_path == "libx.so:Api");
  CHECK(d.init_args == "");  // no args: the replica gets an empty object
  CHECK(d.code_version == "");
  CHECK(d.config == DeploymentConfig{});
  CHECK(d.config.num_replicas == 1);
  CHECK(d.config.max_ongoing_requests == 5);
  CHECK(d.config.max_queued_requests == -1);
  CHECK(d.config.health_check_period_s == 10.0);
  CHECK(d.config.health_check_timeout_s == 30.0);
  CHECK(d.config.graceful_shutdown_wait_loop_s == 2.0);
  CHECK(d.config.graceful_shutdown_timeout_s == 20.0);
  CHECK(d.config.max_replicas_per_node == 0);
  CHECK(d.config.resources.empty());
  CHECK(d.config.user_config == "");
  CHECK_FALSE(d.config.autoscaling_config.has_value());
}

TEST_CASE(
    "config: http_options - the timeouts are declared state - host and port are only recorded") {
  DeployConfig c = parse_ok(
      "http_options: {request_timeout_s: 1.5, keep_alive_timeout_s: 75}\napplications: []\n");
  CHECK(c.state.http.request_timeout_s == 1.5);
  CHECK(c.state.http.keep_alive_timeout_s == 75.0);
  CHECK(c.http == HttpOptions{});
  CHECK_FALSE(config::ignored_http_fields(c.http).has_value());
  CHECK(to_yaml(c) ==
        "http_options: {request_timeout_s: 1.5, keep_alive_timeout_s: 75}\napplications: []\n");

  // Given means written, even with the value a node may well use: the file
  // cannot know where each node's proxy listens.
  c = parse_ok("http_options: {port: 8000}\napplications: []\n");
  CHECK(c.http.port == 8000);
  CHECK_FALSE(c.http.host.has_value());
  CHECK(c.state.http == controller::HttpSettings{});
  CHECK(config::ignored_http_fields(c.http) ==
        "http_options: port is ignored: each node's proxy listens where troupe-node --bind and "
        "--http-port say");
  c = parse_ok("http_options: {host: 0.0.0.0}\napplications: []\n");
  CHECK(config::ignored_http_fields(c.http) ==
        "http_options: host is ignored: each node's proxy listens where troupe-node --bind and "
        "--http-port say");
  c = parse_ok(
      "http_options: {host: 127.0.0.1, port: 9000, keep_alive_timeout_s: null}\n"
      "applications: []\n");
  CHECK_FALSE(c.state.http.keep_alive_timeout_s.has_value());
  CHECK(config::ignored_http_fields(c.http) ==
        "http_options: host and port are ignored: each node's proxy listens where troupe-node "
        "--bind and --http-port say");
  CHECK(error_of("http_options: {keep_alive_timeout_s: 0}\napplications: []\n") ==
        "deploy.yaml:1:38: keep_alive_timeout_s: 0 must be > 0");
}

TEST_CASE("config: an empty autoscaling_config is Ray Serve's default autoscaling") {
  DeployConfig c = parse_ok(with_fields("        autoscaling_config: {}\n"));
  const auto& a = only_app(c).deployments[0].config.autoscaling_config;
  REQUIRE(a.has_value());
  CHECK(*a == AutoscalingConfig{});
  CHECK(a->min_replicas == 1);
  CHECK(a->max_replicas == 1);
  CHECK_FALSE(a->initial_replicas.has_value());
  CHECK(a->target_ongoing_requests == 2.0);
  CHECK(a->metrics_interval_s == 10.0);
  CHECK(a->look_back_period_s == 30.0);
  CHECK(a->smoothing_factor == 1.0);
  CHECK(a->upscale_delay_s == 30.0);
  CHECK(a->downscale_delay_s == 600.0);
}

TEST_CASE("config: null means absent for optional fields") {
  DeployConfig c = parse_ok(
      "http_options: {request_timeout_s: null}\n"
      "target_capacity: ~\n" +
      with_fields("        user_config: null\n"
                  "        args:\n"
                  "        autoscaling_config: null\n"
                  "        num_replicas: 2\n"));
  CHECK_FALSE(c.state.http.request_timeout_s.has_value());
  CHECK_FALSE(c.state.target_capacity.has_value());
  const DeploymentSpec& d = only_app(c).deployments[0];
  CHECK(d.config.user_config == "");
  CHECK(d.init_args == "");
  CHECK_FALSE(d.config.autoscaling_config.has_value());
  CHECK(d.config.num_replicas == 2);
}

TEST_CASE("config: an empty deployments list is the ingress with defaults") {
  DeployConfig listed =
      parse_ok("applications:\n  - import_path: libx.so:Api\n    deployments: []\n");
  DeployConfig omitted = parse_ok("applications:\n  - import_path: libx.so:Api\n");
  CHECK(listed == omitted);
}

TEST_CASE("config: quoted numbers are numbers in typed fields - strings in user_config") {
  DeployConfig c =
      parse_ok(with_fields("        num_replicas: \"4\"\n"
                           "        health_check_period_s: '2.5'\n"
                           "        user_config: {n: \"4\"}\n"));
  const DeploymentSpec& d = only_app(c).deployments[0];
  CHECK(d.config.num_replicas == 4);
  CHECK(d.config.health_check_period_s == 2.5);
  CHECK(d.config.user_config == R"({"n":"4"})");
}

TEST_CASE("config: a multi-deployment application") {
  DeployConfig c = parse_ok(R"(applications:
  - name: shop
    route_prefix: /shop
    import_path: libshop.so:Frontend
    args: {catalog: main}
    deployments:
      - name: Ranker
        num_replicas: 4
      - name: Frontend
        num_replicas: 2
        version: v7
      - name: Embedder
        import_path: libml.so:SentenceEmbedder
        args: {model: mini, dims: 384}
        resources: {cpu: 2, gpu: 1, mem: 512M}
)");
  const ApplicationSpec& app = only_app(c);
  CHECK(app.ingress == "Frontend");
  REQUIRE(app.deployments.size() == 3);
  // Listed order is kept.
  const DeploymentSpec& ranker = app.deployments[0];
  CHECK(ranker.name == "Ranker");
  CHECK(ranker.import_path == "libshop.so:Ranker");  // same library, named class
  CHECK(ranker.init_args == "");                     // args are the ingress's
  CHECK(ranker.config.num_replicas == 4);
  const DeploymentSpec& frontend = app.deployments[1];
  CHECK(frontend.name == "Frontend");
  CHECK(frontend.import_path == "libshop.so:Frontend");
  CHECK(frontend.init_args == R"({"catalog":"main"})");
  CHECK(frontend.code_version == "v7");
  CHECK(frontend.config.num_replicas == 2);
  const DeploymentSpec& embedder = app.deployments[2];
  CHECK(embedder.import_path == "libml.so:SentenceEmbedder");
  CHECK(embedder.init_args == R"({"dims":384,"model":"mini"})");
  CHECK(embedder.config.resources.amounts ==
        std::map<std::string, double>{{"cpu", 2.0}, {"gpu", 1.0}, {"mem", 512.0 * 1024 * 1024}});
  check_round_trip(c);
}

TEST_CASE("config: an ingress that is not listed runs with defaults - first") {
  DeployConfig c = parse_ok(R"(applications:
  - name: shop
    route_prefix: /shop
    import_path: libshop.so:Frontend
    args: {a: 1}
    deployments:
      - name: Ranker
        num_replicas: 4
)");
  const ApplicationSpec& app = only_app(c);
  REQUIRE(app.deployments.size() == 2);
  CHECK(app.deployments[0].name == "Frontend");
  CHECK(app.deployments[0].import_path == "libshop.so:Frontend");
  CHECK(app.deployments[0].init_args == R"({"a":1})");
  CHECK(app.deployments[0].config == DeploymentConfig{});
  CHECK(app.deployments[1].name == "Ranker");
  check_round_trip(c);
}

TEST_CASE("config: args of the ingress may sit on its deployment instead") {
  DeployConfig c = parse_ok(with_fields("        args: {greeting: yo}\n"));
  CHECK(only_app(c).deployments[0].init_args == R"({"greeting":"yo"})");
  // Printed back at the application, where Ray Serve has them.
  CHECK(to_yaml(c).find("    args: {greeting: yo}\n") != std::string::npos);
  check_round_trip(c);
}

TEST_CASE("config: user_config and args become JSON with YAML 1.2 scalar types") {
  DeployConfig c = parse_ok(with_fields(R"(        user_config:
          int: 42
          neg: -7
          hex: 0x1F
          float: 2.5
          exp: 1e3
          yes_is_text: yes
          t: true
          n: ~
          quoted_number: "42"
          single: 'true'
          tagged: !!str 3.0
          text: hello world
          list: [1, two, {three: 3}]
          empty_map: {}
          empty_list: []
          7: numeric key
)"));
  CHECK(only_app(c).deployments[0].config.user_config ==
        R"({"7":"numeric key","empty_list":[],"empty_map":{},"exp":1000.0,"float":2.5,)"
        R"("hex":31,"int":42,"list":[1,"two",{"three":3}],"n":null,"neg":-7,)"
        R"("quoted_number":"42","single":"true","t":true,"tagged":"3.0","text":"hello world",)"
        R"("yes_is_text":"yes"})");
  DeployConfig scalar = parse_ok(with_fields("        user_config: 5\n"));
  CHECK(only_app(scalar).deployments[0].config.user_config == "5");
  check_round_trip(c);
  check_round_trip(scalar);
}

TEST_CASE("config: anchors and aliases share values between deployments") {
  DeployConfig c =
      parse_ok(with_fields("        user_config: &common {region: eu, retries: 3}\n"
                           "      - name: Other\n"
                           "        user_config: *common\n"));
  const ApplicationSpec& app = only_app(c);
  CHECK(deployment(app, "Hello").config.user_config == R"({"region":"eu","retries":3})");
  CHECK(deployment(app, "Other").config.user_config == R"({"region":"eu","retries":3})");
}

TEST_CASE("config error: aliases that expand beyond a million values") {
  std::string yaml =
      with_fields("        user_config:\n          l0: &l0 [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]\n");
  for (int i = 1; i <= 6; ++i) {
    std::string prev = "*l" + std::to_string(i - 1);
    yaml += "          l" + std::to_string(i) + ": &l" + std::to_string(i) + " [" + prev;
    for (int k = 1; k < 10; ++k)
      yaml += ", " + prev;
    yaml += "]\n";
  }
  // The position is of a value in l0's list: an alias keeps its anchor's marks.
  CHECK(error_of(yaml) ==
        "deploy.yaml:8:47: user_config: more than 1000000 values in args and user_config "
        "(aliases expanding?)");
}

TEST_CASE("config: resources as numbers or with K/M/G/T suffixes") {
  DeployConfig c =
      parse_ok(with_fields("        resources: {cpu: 0.5, mem: 2G, disk: '1536', cache: 4k}\n"));
  CHECK(only_app(c).deployments[0].config.resources.amounts ==
        std::map<std::string, double>{
            {"cpu", 0.5}, {"mem", 2.0 * 1024 * 1024 * 1024}, {"disk", 1536.0}, {"cache", 4096.0}});
  CHECK(to_yaml(c).find("resources: {cache: 4K, cpu: 0.5, disk: 1536, mem: 2G}") !=
        std::string::npos);
  check_round_trip(c);
}

TEST_CASE("config: isolation and memory_limit - defaults - sizes - printing") {
  const DeploymentConfig defaults = only_app(parse_ok(with_fields(""))).deployments[0].config;
  CHECK(defaults.isolation == controller::Isolation::process);
  CHECK(defaults.memory_limit_bytes == 0u);

  const uint64_t mib = 1024 * 1024;
  const std::map<std::string, uint64_t> sizes = {
      {"0", 0},
      {"536870912", 512 * mib},
      {"\"536870912\"", 512 * mib},
      {"32768K", 32 * mib},
      {"32768Ki", 32 * mib},
      {"32768KiB", 32 * mib},
      {"512M", 512 * mib},
      {"512Mi", 512 * mib},
      {"512MiB", 512 * mib},
      {"'512M'", 512 * mib},
      {"0.5G", 512 * mib},
      {"2G", 2048 * mib},
      {"2Gi", 2048 * mib},
      {"2GiB", 2048 * mib},
      {"1T", 1024 * 1024 * mib},
      {"1Ti", 1024 * 1024 * mib},
      {"1TiB", 1024 * 1024 * mib},
      {"18446744073709551615", 18446744073709551615ULL},
  };
  for (const auto& [text, bytes] : sizes) {
    CAPTURE(text);
    DeployConfig c = parse_ok(with_fields("        memory_limit: " + text + "\n"));
    CHECK(only_app(c).deployments[0].config.memory_limit_bytes == bytes);
    check_round_trip(c);
  }

  DeployConfig c = parse_ok(with_fields("        isolation: in_process\n"));
  CHECK(only_app(c).deployments[0].config.isolation == controller::Isolation::in_process);
  CHECK(only_app(c).deployments[0].config.memory_limit_bytes == 0u);
  CHECK(to_yaml(c).find("        isolation: in_process\n") != std::string::npos);
  check_round_trip(c);

  c = parse_ok(with_fields("        isolation: process\n        memory_limit: 512MiB\n"));
  CHECK(only_app(c).deployments[0].config.isolation == controller::Isolation::process);
  CHECK(only_app(c).deployments[0].config.memory_limit_bytes == 512 * mib);
  // Defaults are not printed; the limit with the largest exact suffix.
  CHECK(to_yaml(c) ==
        "applications:\n"
        "  - name: greeter\n"
        "    route_prefix: /greet\n"
        "    import_path: libtroupe_examples.so:Hello\n"
        "    deployments:\n"
        "      - name: Hello\n"
        "        num_replicas: 1\n"
        "        memory_limit: 512M\n");
  check_round_trip(c);
  CHECK(to_yaml(parse_ok(with_fields("        isolation: process\n        memory_limit: 0\n")))
            .find("isolation") == std::string::npos);
}

TEST_CASE("config: to_yaml prints only what differs from the defaults") {
  DeployConfig c = parse_ok(R"(http_options: {port: 9000}
applications:
  - name: greeter
    route_prefix: /greet
    import_path: libtroupe_examples.so:Hello
    deployments:
      - name: Hello
        num_replicas: 1
        max_ongoing_requests: 5
        health_check_period_s: 2.5
        autoscaling_config: null
)");
  CHECK(to_yaml(c) ==
        "http_options: {port: 9000}\n"
        "applications:\n"
        "  - name: greeter\n"
        "    route_prefix: /greet\n"
        "    import_path: libtroupe_examples.so:Hello\n"
        "    deployments:\n"
        "      - name: Hello\n"
        "        num_replicas: 1\n"
        "        health_check_period_s: 2.5\n");
  CHECK(to_yaml(DeployConfig{}) == "applications: []\n");
  CHECK(parse_ok("applications: []\n") == DeployConfig{});
}

TEST_CASE("config: round trip of a rich config") {
  DeployConfig c = parse_ok(
      R"(http_options: {host: 0.0.0.0, port: 8080, request_timeout_s: 12.5, keep_alive_timeout_s: 60}
target_capacity: 37.5
applications:
  - name: shop
    route_prefix: /shop
    import_path: libshop.so:Frontend
    args: {catalog: main, pages: [1, 2, 3], ratio: 0.1, big: 12345678901234567890, none: null}
    deployments:
      - name: Frontend
        version: "1.0"
        num_replicas: 0
        max_ongoing_requests: 100
        max_queued_requests: 0
        user_config: {text: "line one\nline two", unicode: "é ☃", looks_like: ["123", "true", "null", "", "-1.5", "off"], colon: "a: b", nested: {deep: [[1], [2.25]]}}
        health_check_period_s: 0.1
        health_check_timeout_s: 86400
        graceful_shutdown_wait_loop_s: 0.333
        graceful_shutdown_timeout_s: 1e-3
        resources: {cpu: 0.25, mem: 1536M, gpu: 1}
        max_replicas_per_node: 3
        max_batch_size: 16
        batch_wait_timeout_s: 0.05
      - name: Ranker
        args: {k: 10}
        user_config: "just text"
        autoscaling_config:
          min_replicas: 0
          max_replicas: 50
          initial_replicas: 5
          target_ongoing_requests: 1.5
          metrics_interval_s: 1
          look_back_period_s: 5
          smoothing_factor: 0.5
          upscale_smoothing_factor: 2
          downscale_smoothing_factor: 0.25
          upscale_delay_s: 0
          downscale_delay_s: 120
      - name: Embedder
        import_path: libml.so:Embedder
        user_config: []
        max_ongoing_requests: 8
        max_batch_size: 8
        batch_wait_timeout_s: auto
  - name: "123"
    route_prefix: /
    import_path: "libnum.so:N"
    deployments:
      - name: "N"
        version: "true"
)");
  REQUIRE(c.state.applications.size() == 2);
  const ApplicationSpec& shop = c.state.applications.at("shop");
  CHECK(deployment(shop, "Frontend").code_version == "1.0");
  CHECK(deployment(shop, "Frontend").config.num_replicas == 0);
  CHECK(deployment(shop, "Ranker").config.user_config == R"("just text")");
  CHECK(deployment(shop, "Embedder").config.user_config == "[]");
  CHECK(deployment(shop, "Frontend").config.max_batch_size == 16u);
  CHECK(deployment(shop, "Frontend").config.batch_wait_timeout_s == 0.05);
  CHECK(deployment(shop, "Embedder").config.batch_wait_auto);
  CHECK(c.state.applications.at("123").deployments[0].code_version == "true");
  check_round_trip(c);
}

TEST_CASE("config: round trip of a state built in code") {
  DeployConfig c;
  c.state.http.request_timeout_s = 1.0 / 3;
  c.state.http.keep_alive_timeout_s = 0.1 + 0.2;  // not a short decimal
  c.state.target_capacity = 0.0;
  ApplicationSpec app;
  app.name = "calc";
  app.route_prefix = "/calc";
  app.ingress = "Calc";
  DeploymentSpec d;
  d.name = "Calc";
  d.import_path = "libcalc.so:Calc";
  d.init_args = R"({"pi":3.141592653589793})";
  d.code_version = "null";
  d.config.user_config = R"({"x":1e+300,"y":-0.0})";
  d.config.health_check_timeout_s = 2.0 / 3;
  d.config.resources.amounts = {{"cpu", 1.0 / 7}, {"mem", 3.0 * 1024 * 1024 * 1024 * 1024}};
  AutoscalingConfig a;
  a.max_replicas = 3;
  a.upscale_delay_s = 1e-9;
  d.config.autoscaling_config = a;
  DeploymentSpec helper = d;
  helper.name = "Helper";
  helper.import_path = "libcalc.so:Helper";
  helper.init_args = "";
  helper.code_version = "";
  helper.config = DeploymentConfig{};
  helper.config.num_replicas = 7;
  helper.config.user_config =
      Json::object({{"strings",
                     {" lead", "trail ", "#hash", "- dash", "key: val", "[x", "'q'", "\"dq\"",
                      "a\tb", "\x01", "", "~", "0o17", "0x1F", ".inf", "1e3", "NULL", "yes"}},
                    {"", 0},
                    {"null", nullptr},
                    {"max", 18446744073709551615ULL},
                    {"min", -9223372036854775807LL - 1}})
          .dump();
  app.deployments = {helper, d};
  c.state.applications.emplace(app.name, app);
  REQUIRE(controller::validate(c.state).is_ok());
  check_round_trip(c);
}

TEST_CASE(
    "config: an uploaded library prints with the SHA-256 deployed - the comment reads back as "
    "nothing") {
  DeployConfig c;
  ApplicationSpec app;
  app.name = "up";
  app.route_prefix = "/up";
  app.ingress = "Model";
  DeploymentSpec d;
  d.name = "Model";
  d.import_path = "./build/libmodels.so:Model";
  d.library_sha256 = std::string(64, 'a');
  DeploymentSpec other = d;
  other.name = "Helper";
  other.import_path = "./build/libmodels.so:Helper";  // the app's library and its own name
  other.library_sha256 = std::string(64, 'b');
  DeploymentSpec plain = d;
  plain.name = "Plain";
  plain.import_path = "libtroupe_examples.so:Plain";
  plain.library_sha256.clear();  // from a plugin dir: no note
  app.deployments = {d, other, plain};
  c.state.applications.emplace(app.name, app);
  std::string text = to_yaml(c);
  CAPTURE(text);
  const std::string note = "# uploaded: the library deployed has SHA-256 ";
  CHECK(text.find(note + std::string(64, 'a') +
                  "; its path is relative to the directory of the "
                  "config it was deployed from") != std::string::npos);
  CHECK(text.find(note + std::string(64, 'b')) != std::string::npos);
  CHECK(text.find("import_path: ./build/libmodels.so:Helper") != std::string::npos);
  size_t notes = 0;
  for (size_t at = text.find(note); at != std::string::npos; at = text.find(note, at + 1))
    ++notes;
  CHECK(notes == 2);
  auto back = parse_config(text, "printed.yaml");
  REQUIRE_MESSAGE(back, back.status().to_string());
  const auto& deps = back->state.applications.at("up").deployments;
  REQUIRE(deps.size() == 3);
  CHECK(deps[0].import_path == "./build/libmodels.so:Model");
  CHECK(deps[1].import_path == "./build/libmodels.so:Helper");
  CHECK(deps[2].import_path == "libtroupe_examples.so:Plain");
}

TEST_CASE("config: round trip of isolation and memory limits built in code") {
  DeployConfig c;
  ApplicationSpec app;
  app.name = "mem";
  app.route_prefix = "/mem";
  app.ingress = "Big";
  DeploymentSpec d;
  d.name = "Big";
  d.import_path = "libmem.so:Big";
  app.deployments.push_back(d);
  // Exact with a suffix, not a whole number of KiB, and so large that a
  // suffixed number would no longer be exact as a double.
  for (uint64_t bytes :
       {uint64_t{3} << 40, (uint64_t{64} << 20) + 1, (uint64_t{1} << 63) + 1024, ~uint64_t{0}}) {
    CAPTURE(bytes);
    app.deployments[0].config.memory_limit_bytes = bytes;
    c.state.applications[app.name] = app;
    REQUIRE(controller::validate(c.state).is_ok());
    check_round_trip(c);
  }
  app.deployments[0].config.memory_limit_bytes = 0;
  app.deployments[0].config.isolation = controller::Isolation::in_process;
  c.state.applications[app.name] = app;
  check_round_trip(c);
}

TEST_CASE("config: load_config_file names an unreadable path") {
  auto r = load_config_file("/nonexistent/troupe/deploy.yaml");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().code() == errc::io_error);
  CHECK(r.status().message() ==
        "cannot read config file '/nonexistent/troupe/deploy.yaml': No such file or directory");
  auto dir = load_config_file(TROUPE_SOURCE_DIR);
  REQUIRE_FALSE(dir.has_value());
  CHECK(dir.status().message() ==
        "cannot read config file '" + std::string(TROUPE_SOURCE_DIR) + "': it is a directory");
}

TEST_CASE("config: load_config_file prefixes errors with the path") {
  troupe::testing::TempDir dir("troupe-config-test");
  const fs::path path = dir / "bad.yaml";
  {
    std::ofstream out(path);
    out << "applications:\n  - import_path: nocolon\n";
  }
  auto r = load_config_file(path.string());
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().message() ==
        path.string() +
            ":2:18: import_path 'nocolon' has no ':'; expected '<library>:<ClassName>', e.g. "
            "'libfoo.so:Hello'");
}

// ---------------------------------------------------------------------------
// Bad input: one test per kind, each naming the problem and where it is.

TEST_CASE("config error: YAML syntax error with line and column") {
  CHECK(error_of("applications:\n  - name: [a, b\n    route_prefix: /x\n") ==
        "deploy.yaml:3:17: YAML syntax error: end of sequence flow not found");
  CHECK(error_of("applications:\n\t- name: a\n") ==
        "deploy.yaml:2:2: YAML syntax error: illegal block entry");
}

TEST_CASE("config error: an empty file") {
  CHECK(error_of("") == "deploy.yaml is empty: expected a mapping with 'applications'");
  CHECK(error_of("# nothing but a comment\n\n") ==
        "deploy.yaml is empty: expected a mapping with 'applications'");
}

TEST_CASE("config error: not a mapping - no applications - two documents") {
  CHECK(error_of("- a\n- b\n") ==
        "deploy.yaml:1:1: expected a mapping with 'applications' at the top level, got a "
        "sequence");
  CHECK(error_of("http_options: {port: 80}\n") ==
        "deploy.yaml:1:1: missing field 'applications' at the top level (use 'applications: "
        "[]' to declare none)");
  CHECK(error_of("applications: {name: x}\n") ==
        "deploy.yaml:1:15: applications: expected a sequence of applications, got a mapping");
  CHECK(error_of("applications: []\n---\napplications: []\n") ==
        "deploy.yaml:3:1: a second YAML document ('---'): expected exactly one");
}

TEST_CASE("config error: text that is not UTF-8 - a stray character after the document") {
  // Found by tests/fuzz/config_fuzz.cpp: invalid UTF-8 was accepted and
  // printed back replaced (to_yaml did not give the config back), and a
  // stray ',' made yaml-cpp 0.7's LoadAll loop for ever.
  CHECK(error_of("applications:\n  - name: \"a\xff\"\n") ==
        "deploy.yaml:2:13: not UTF-8 text (byte 0xff)");
  CHECK(error_of("\xc3\x28") == "deploy.yaml:1:1: not UTF-8 text (byte 0xc3)");
  CHECK(error_of("applications: []\n# caf\xc3\xa9 \xed\xa0\x80\n") ==
        "deploy.yaml:2:9: not UTF-8 text (byte 0xed)");  // a surrogate
  CHECK(
      error_of("applications: []\nx: a\x04"
               "b\n") ==
      "deploy.yaml:2:5: character U+0004 is not allowed in YAML text (escape it in double quotes)");
  CHECK(
      error_of("applications: []\n# \xc2\x9b\n") ==
      "deploy.yaml:2:3: character U+009B is not allowed in YAML text (escape it in double quotes)");
  CHECK(error_of(",\n") ==
        "deploy.yaml:1:1: more after the first YAML document: expected exactly one");
  std::ifstream in(
      std::string(TROUPE_SOURCE_DIR) + "/tests/fuzz/corpus/config/regression-loadall-loop.yaml",
      std::ios::binary);
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  CHECK(error_of(text.str()) ==
        "deploy.yaml:4:5: more after the first YAML document: expected exactly one");
}

TEST_CASE("config error: an import path with a control character") {
  // Found by tests/fuzz/config_fuzz.cpp: "\x01\x00" in an import path was
  // accepted, and to_yaml printed the NUL back replaced.
  CHECK(error_of("applications:\n  - name: a\n    route_prefix: /a\n"
                 "    import_path: \"liba\\x01\\0.so:A\"\n") ==
        "deploy.yaml:4:18: import_path 'liba\\x01\\x00.so:A' contains a control character");
}

TEST_CASE("config: a key of 1024 characters and more prints back as an explicit key") {
  // Found by tests/fuzz/config_fuzz.cpp: to_yaml wrote a long key of args as
  // an implicit key in a flow mapping, which YAML limits to 1024 characters,
  // so the printed config did not parse.
  const std::string key(1500, 'k');
  const std::string text =
      "applications:\n  - name: a\n    route_prefix: /a\n"
      "    import_path: liba.so:A\n    args:\n"
      "      ? \"" +
      key +
      "\\x04\"\n"
      "      : - 1\n"
      "        - ? " +
      key +
      "\n"
      "          : 2\n"
      "      short: 3\n";
  auto parsed = parse_config(text, "deploy.yaml");
  REQUIRE_MESSAGE(parsed.has_value(), parsed.status().message());
  const std::string printed = to_yaml(*parsed);
  CHECK(printed.find("? ") != std::string::npos);
  auto again = parse_config(printed, "printed.yaml");
  REQUIRE_MESSAGE(again.has_value(), again.status().message());
  CHECK(*again == *parsed);
  CHECK(to_yaml(*again) == printed);
}

TEST_CASE("config error: unknown field - with the nearest valid name") {
  CHECK(error_of(with_fields("        num_replica: 3\n")) ==
        "deploy.yaml:7:9: unknown field 'num_replica' in deployment 'Hello'; did you mean "
        "'num_replicas'?");
  CHECK(error_of("aplications: []\n") ==
        "deploy.yaml:1:1: unknown field 'aplications' at the top level; did you mean "
        "'applications'?");
  CHECK(error_of("http_options: {prot: 80}\napplications: []\n") ==
        "deploy.yaml:1:16: unknown field 'prot' in http_options; did you mean 'port'?");
  CHECK(error_of("applications:\n  - name: a\n    route_prefx: /a\n") ==
        "deploy.yaml:3:5: unknown field 'route_prefx' in application 'a'; did you mean "
        "'route_prefix'?");
  CHECK(error_of(with_fields("        autoscaling_config: {max_replica: 3}\n")) ==
        "deploy.yaml:7:30: unknown field 'max_replica' in autoscaling_config of deployment "
        "'Hello'; did you mean 'max_replicas'?");
  // Ray Serve spellings that troupe names differently.
  CHECK(error_of(with_fields("        code_version: v2\n")) ==
        "deploy.yaml:7:9: unknown field 'code_version' in deployment 'Hello'; did you mean "
        "'version'?");
  CHECK(error_of(with_fields("        autoscaling_config:\n"
                             "          target_num_ongoing_requests_per_replica: 3\n")) ==
        "deploy.yaml:8:11: unknown field 'target_num_ongoing_requests_per_replica' in "
        "autoscaling_config of deployment 'Hello'; did you mean 'target_ongoing_requests'?");
  CHECK(error_of(with_fields("        max_concurrent_queries: 5\n")) ==
        "deploy.yaml:7:9: unknown field 'max_concurrent_queries' in deployment 'Hello'; did "
        "you mean 'max_ongoing_requests'?");
}

TEST_CASE("config error: unknown field far from any valid one lists the valid ones") {
  CHECK(error_of("applications:\n  - name: a\n    runtime_env: {}\n") ==
        "deploy.yaml:3:5: unknown field 'runtime_env' in application 'a'; valid fields: name, "
        "route_prefix, import_path, args, traffic, traffic_key_header, shadow, open_inference, "
        "deployments");
}

namespace {

// An application with deployments Hello (the ingress) and Canary, and
// `extra` as further application fields (4 spaces in), from line 4 on.
std::string split_app(const std::string& extra) {
  return "applications:\n"
         "  - name: greet\n"
         "    import_path: libtroupe_examples.so:Hello\n" +
         extra +
         "    deployments:\n"
         "      - name: Hello\n"
         "      - name: Canary\n"
         "        import_path: libtroupe_examples.so:Hello\n"
         "  - name: other\n"
         "    route_prefix: /other\n"
         "    import_path: libtroupe_examples.so:Echo\n";
}

}  // namespace

TEST_CASE("config: a traffic split and its key header are read and printed back") {
  auto r = parse_config(
      split_app("    traffic: {Hello: 0.9, Canary: 0.1}\n    traffic_key_header: X-User\n"), kFile);
  REQUIRE_MESSAGE(r.has_value(), r.status().to_string());
  const auto& app = r->state.applications.at("greet");
  CHECK(app.traffic == std::map<std::string, double>{{"Hello", 0.9}, {"Canary", 0.1}});
  CHECK(app.traffic_key_header == "X-User");
  const std::string yaml = to_yaml(*r);
  CHECK(yaml.find("traffic: {Canary: 0.1, Hello: 0.9}") != std::string::npos);
  CHECK(yaml.find("traffic_key_header: X-User") != std::string::npos);
  CHECK(parse_config(yaml, kFile).value() == *r);
  // Within the seed's tolerance of 1 (np.isclose: 1e-08 + 1e-05).
  CHECK(parse_config(split_app("    traffic: {Hello: 0.300000001, Canary: 0.7}\n"), kFile)
            .has_value());
  CHECK(parse_config(split_app("    traffic: {Hello: 0.66666, Canary: 0.33333}\n"), kFile)
            .has_value());
  // Without a split: nothing printed.
  auto plain = parse_config(split_app(""), kFile);
  REQUIRE(plain.has_value());
  CHECK(plain->state.applications.at("greet").traffic.empty());
  CHECK(to_yaml(*plain).find("traffic") == std::string::npos);
}

TEST_CASE("config error: every kind of bad traffic split - naming the field and its position") {
  CHECK(error_of(split_app("    traffic: {Hello: 0.8, Canary: 0.1}\n")) ==
        "deploy.yaml:4:14: traffic of application 'greet': the weights sum to 0.9; they must "
        "sum to 1");
  CHECK(error_of(split_app("    traffic: {Hello: 0.66665, Canary: 0.33333}\n")) ==
        "deploy.yaml:4:14: traffic of application 'greet': the weights sum to 0.99998; they "
        "must sum to 1");
  CHECK(error_of(split_app("    traffic: {Hello: 1.5, Canary: -0.5}\n")) ==
        "deploy.yaml:4:22: traffic: Hello: 1.5 must be <= 1");
  CHECK(error_of(split_app("    traffic: {Hello: 1, Canary: -0.5}\n")) ==
        "deploy.yaml:4:33: traffic: Canary: -0.5 must be >= 0");
  CHECK(error_of(split_app("    traffic: {Hello: 0.5, Canary: half}\n")) ==
        "deploy.yaml:4:35: traffic: Canary: expected a weight from 0 to 1, got 'half'");
  CHECK(error_of(split_app("    traffic: {Hello: 0.5, Echo: 0.5}\n")) ==
        "deploy.yaml:4:27: traffic of application 'greet': 'Echo' is not a deployment of the "
        "application (it has Hello, Canary)");
  CHECK(error_of(split_app("    traffic: {}\n")) ==
        "deploy.yaml:4:14: traffic of application 'greet': must name at least one deployment "
        "(omit it to send everything to the ingress)");
  CHECK(error_of(split_app("    traffic: [Hello, Canary]\n")) ==
        "deploy.yaml:4:14: traffic of application 'greet': expected a mapping of deployment "
        "names to weights like {Hello: 0.9, Canary: 0.1}, got a sequence");
  CHECK(error_of(split_app("    traffic: {Hello: 0.5, Hello: 0.5}\n")) ==
        "deploy.yaml:4:27: traffic of application 'greet': duplicate deployment 'Hello' (first "
        "at line 4, column 15)");
  CHECK(error_of(split_app("    traffic_key_header: X-User\n")) ==
        "deploy.yaml:4:25: traffic_key_header of application 'greet' needs a traffic split "
        "(give 'traffic' too)");
  CHECK(error_of(split_app("    traffic: {Hello: 1}\n    traffic_key_header: \"X User\"\n")) ==
        "deploy.yaml:5:25: traffic_key_header 'X User' of application 'greet' must be an HTTP "
        "header name");
}

TEST_CASE("config: shadow traffic is read and printed back") {
  auto r = parse_config(split_app("    shadow: {Canary: 0.5}\n"), kFile);
  REQUIRE_MESSAGE(r.has_value(), r.status().to_string());
  const auto& app = r->state.applications.at("greet");
  CHECK(app.shadow == std::map<std::string, double>{{"Canary", 0.5}});
  CHECK(app.traffic.empty());
  const std::string yaml = to_yaml(*r);
  CHECK(yaml.find("shadow: {Canary: 0.5}") != std::string::npos);
  CHECK(parse_config(yaml, kFile).value() == *r);
  // Beside a split, on a deployment without weight (here the ingress), and
  // at the bounds.
  auto both = parse_config(split_app("    traffic: {Canary: 1}\n    shadow: {Hello: 1}\n"), kFile);
  REQUIRE_MESSAGE(both.has_value(), both.status().to_string());
  CHECK(both->state.applications.at("greet").shadow == std::map<std::string, double>{{"Hello", 1}});
  CHECK(parse_config(split_app("    shadow: {Canary: 0}\n"), kFile).has_value());
  // Without: nothing printed.
  auto plain = parse_config(split_app(""), kFile);
  REQUIRE(plain.has_value());
  CHECK(plain->state.applications.at("greet").shadow.empty());
  CHECK(to_yaml(*plain).find("shadow") == std::string::npos);
}

TEST_CASE("config: open_inference - default false - true or false only - printed when true") {
  auto plain = parse_ok(split_app(""));
  CHECK_FALSE(plain.state.applications.at("greet").open_inference);
  CHECK_FALSE(plain.state.applications.at("other").open_inference);
  CHECK(to_yaml(plain).find("open_inference") == std::string::npos);

  DeployConfig c = parse_ok(split_app("    open_inference: true\n"));
  CHECK(c.state.applications.at("greet").open_inference);
  CHECK_FALSE(c.state.applications.at("other").open_inference);
  const std::string yaml = to_yaml(c);
  CHECK(yaml.find("    open_inference: true\n") != std::string::npos);
  CHECK(yaml.find("open_inference") == yaml.rfind("open_inference"));  // greet's only
  check_round_trip(c);
  // With a traffic split and a shadow too, and without a route_prefix.
  DeployConfig all = parse_ok(split_app(
      "    traffic: {Hello: 1}\n    traffic_key_header: X-User\n    open_inference: true\n"));
  CHECK(all.state.applications.at("greet").open_inference);
  CHECK(all.state.applications.at("greet").route_prefix == "/");
  check_round_trip(all);
  // false is the default: nothing printed.
  DeployConfig off = parse_ok(split_app("    open_inference: False\n"));
  CHECK_FALSE(off.state.applications.at("greet").open_inference);
  CHECK(off == plain);
  CHECK(to_yaml(off).find("open_inference") == std::string::npos);

  CHECK(error_of(split_app("    open_inference: yes\n")) ==
        "deploy.yaml:4:21: open_inference: expected true or false, got 'yes' (write true or "
        "false)");
  CHECK(error_of(split_app("    open_inference: 1\n")) ==
        "deploy.yaml:4:21: open_inference: expected true or false, got '1'");
  CHECK(error_of(split_app("    open_inference: {v2: true}\n"))
            .find("deploy.yaml:4:21: open_inference: expected true or false, got ") == 0);
  CHECK(error_of(split_app("    open_inference:\n"))
            .find("open_inference: expected true or "
                  "false") != std::string::npos);
  CHECK(error_of(split_app("    open_inferense: true\n")) ==
        "deploy.yaml:4:5: unknown field 'open_inferense' in application 'greet'; did you mean "
        "'open_inference'?");
}

TEST_CASE("config error: every kind of bad shadow - naming the field") {
  CHECK(error_of(split_app("    shadow: {Canary: 1.5}\n")) ==
        "deploy.yaml:4:22: shadow: Canary: 1.5 must be <= 1");
  CHECK(error_of(split_app("    shadow: {Canary: -0.5}\n")) ==
        "deploy.yaml:4:22: shadow: Canary: -0.5 must be >= 0");
  CHECK(error_of(split_app("    shadow: {Canary: half}\n")) ==
        "deploy.yaml:4:22: shadow: Canary: expected a probability from 0 to 1, got 'half'");
  CHECK(error_of(split_app("    shadow: {Echo: 0.5}\n")) ==
        "deploy.yaml:4:14: shadow of application 'greet': 'Echo' is not a deployment of the "
        "application (it has Hello, Canary)");
  CHECK(
      error_of(split_app("    shadow: [Canary]\n"))
          .find("deploy.yaml:4:13: shadow of application 'greet': expected a mapping of deployment "
                "names to probabilities like {Mirror: 0.5}") == 0);
  CHECK(error_of(split_app("    shadow: {Canary: 0.5, Canary: 0.5}\n")) ==
        "deploy.yaml:4:27: shadow of application 'greet': duplicate deployment 'Canary' (first "
        "at line 4, column 14)");
  // The ingress without a split, and a deployment that carries weight:
  // the controller's rules, checked on the whole file.
  CHECK(error_of(split_app("    shadow: {Hello: 0.5}\n")) ==
        "deploy.yaml: applications[greet].shadow[Hello]: \"Hello\" is the ingress, which "
        "receives the application's requests (there is no traffic split); a shadow cannot also "
        "receive real traffic");
  CHECK(
      error_of(split_app("    traffic: {Hello: 0.9, Canary: 0.1}\n    shadow: {Canary: 0.5}\n")) ==
      "deploy.yaml: applications[greet].shadow[Canary]: \"Canary\" carries traffic "
      "(applications[greet].traffic[Canary] = 0.1); a shadow cannot also receive real traffic");
}

TEST_CASE("config error: a field given twice") {
  CHECK(error_of(with_fields("        num_replicas: 3\n        num_replicas: 4\n")) ==
        "deploy.yaml:8:9: duplicate field 'num_replicas' in deployment 'Hello' (first at line "
        "7, column 9)");
  CHECK(error_of(with_fields("        user_config: {a: 1, a: 2}\n")) ==
        "deploy.yaml:7:29: user_config: duplicate key 'a' (first at line 7, column 23)");
}

TEST_CASE("config error: wrong type") {
  CHECK(error_of(with_fields("        num_replicas: three\n")) ==
        "deploy.yaml:7:23: num_replicas: expected a non-negative integer, got 'three'");
  CHECK(error_of(with_fields("        num_replicas: 2.5\n")) ==
        "deploy.yaml:7:23: num_replicas: expected a non-negative integer, got '2.5'");
  CHECK(error_of(with_fields("        health_check_period_s: [1]\n")) ==
        "deploy.yaml:7:32: health_check_period_s: expected a number of seconds, got a "
        "sequence");
  CHECK(error_of(with_fields("        max_ongoing_requests:\n")) ==
        "deploy.yaml:7:9: max_ongoing_requests: expected a positive integer, got null");
  CHECK(error_of(with_fields("        version: {major: 1}\n")) ==
        "deploy.yaml:7:18: version: expected a string, got a mapping");
  CHECK(error_of(with_fields("        args: [1, 2]\n")) ==
        "deploy.yaml:7:15: args: expected a mapping, got a sequence");
  CHECK(error_of(with_fields("        autoscaling_config: 3\n")) ==
        "deploy.yaml:7:29: autoscaling_config: expected a mapping, got '3'");
  CHECK(error_of("http_options: {port: http}\napplications: []\n") ==
        "deploy.yaml:1:22: port: expected a port number (1-65535), got 'http'");
  CHECK(error_of("target_capacity: full\napplications: []\n") ==
        "deploy.yaml:1:18: target_capacity: expected a number from 0 to 100, got 'full'");
  CHECK(error_of("applications:\n  - just-a-string\n") ==
        "deploy.yaml:2:5: applications[0]: expected a mapping, got 'just-a-string'");
  CHECK(error_of(with_fields("        resources: {cpu: lots}\n")) ==
        "deploy.yaml:7:26: resources: resource 'cpu' has amount 'lots'; expected a "
        "non-negative number with optional K/M/G/T");
  CHECK(error_of(with_fields("        resources: {CPU: 1}\n")) ==
        "deploy.yaml:7:21: resources: resource name 'CPU' must match [a-z][a-z0-9_]*");
  CHECK(error_of(with_fields("        user_config: {limit: .inf}\n")) ==
        "deploy.yaml:7:30: user_config: .inf cannot be represented in JSON");
}

TEST_CASE("config error: isolation other than process or in_process") {
  CHECK(error_of(with_fields("        isolation: thread\n")) ==
        "deploy.yaml:7:20: isolation: expected process or in_process, got 'thread'");
  CHECK(error_of(with_fields("        isolation: Process\n")) ==
        "deploy.yaml:7:20: isolation: expected process or in_process, got 'Process'");
  CHECK(error_of(with_fields("        isolation: in-process\n")) ==
        "deploy.yaml:7:20: isolation: expected process or in_process, got 'in-process'");
  CHECK(error_of(with_fields("        isolation: [process]\n")) ==
        "deploy.yaml:7:20: isolation: expected process or in_process, got a sequence");
  CHECK(error_of(with_fields("        isolation:\n")) ==
        "deploy.yaml:7:9: isolation: expected process or in_process, got null");
  CHECK(error_of(with_fields("        isolaton: process\n")) ==
        "deploy.yaml:7:9: unknown field 'isolaton' in deployment 'Hello'; did you mean "
        "'isolation'?");
}

TEST_CASE("config error: memory_limit not a size - too small - or with in_process") {
  const std::string expected =
      "memory_limit: expected bytes or a size like 512M, 4G or 512MiB (K/M/G/T: powers of 1024), "
      "got ";
  CHECK(error_of(with_fields("        memory_limit: lots\n")) ==
        "deploy.yaml:7:23: " + expected + "'lots'");
  CHECK(error_of(with_fields("        memory_limit: 512MB\n")) ==
        "deploy.yaml:7:23: " + expected + "'512MB'");
  CHECK(error_of(with_fields("        memory_limit: -1G\n")) ==
        "deploy.yaml:7:23: " + expected + "'-1G'");
  CHECK(error_of(with_fields("        memory_limit: 1.5\n")) ==
        "deploy.yaml:7:23: " + expected + "'1.5'");
  CHECK(error_of(with_fields("        memory_limit: 64G,cpu=1M\n")) ==
        "deploy.yaml:7:23: " + expected + "'64G,cpu=1M'");
  CHECK(error_of(with_fields("        memory_limit: {size: 1G}\n")) ==
        "deploy.yaml:7:23: " + expected + "a mapping");
  CHECK(error_of(with_fields("        memory_limit:\n")) ==
        "deploy.yaml:7:9: " + expected + "null");
  CHECK(error_of(with_fields("        memory_limit: 1.3K\n")) ==
        "deploy.yaml:7:23: memory_limit: 1.3K is not a whole number of bytes");
  CHECK(error_of(with_fields("        memory_limit: 99999999999999999999\n")) ==
        "deploy.yaml:7:23: memory_limit: 99999999999999999999 must be <= 18446744073709551615");
  CHECK(error_of(with_fields("        memory_limit: 16777216T\n")) ==
        "deploy.yaml:7:23: memory_limit: 16777216T must be <= 18446744073709551615");
  CHECK(error_of(with_fields("        memory_limit: 16M\n")) ==
        "deploy.yaml:7:23: memory_limit: 16M must be 0 (no limit) or >= 32M");
  CHECK(error_of(with_fields("        memory_limit: 33554431\n")) ==
        "deploy.yaml:7:23: memory_limit: 33554431 must be 0 (no limit) or >= 32M");
  CHECK(error_of(with_fields("        isolation: in_process\n        memory_limit: 512M\n")) ==
        "deploy.yaml:8:23: memory_limit of deployment 'Hello' needs isolation: process (it is "
        "enforced on the replica process; this deployment has isolation: in_process)");
  // The order of the two fields does not matter.
  CHECK(error_of(with_fields("        memory_limit: 512M\n        isolation: in_process\n")) ==
        "deploy.yaml:7:23: memory_limit of deployment 'Hello' needs isolation: process (it is "
        "enforced on the replica process; this deployment has isolation: in_process)");
}

TEST_CASE("config error: negative values") {
  CHECK(error_of(with_fields("        num_replicas: -1\n")) ==
        "deploy.yaml:7:23: num_replicas: -1 must be >= 0");
  CHECK(error_of(with_fields("        max_queued_requests: -2\n")) ==
        "deploy.yaml:7:30: max_queued_requests: -2 must be >= -1");
  CHECK(error_of(with_fields("        graceful_shutdown_timeout_s: -5\n")) ==
        "deploy.yaml:7:38: graceful_shutdown_timeout_s: -5 must be > 0");
  CHECK(error_of(with_fields("        autoscaling_config: {upscale_delay_s: -1}\n")) ==
        "deploy.yaml:7:47: upscale_delay_s: -1 must be >= 0");
  CHECK(error_of(with_fields("        resources: {mem: -1G}\n")) ==
        "deploy.yaml:7:26: resources: resource 'mem' has amount '-1G'; expected a "
        "non-negative number with optional K/M/G/T");
}

TEST_CASE("config error: zero timeouts") {
  CHECK(error_of(with_fields("        health_check_timeout_s: 0\n")) ==
        "deploy.yaml:7:33: health_check_timeout_s: 0 must be > 0");
  CHECK(error_of("http_options: {request_timeout_s: 0}\napplications: []\n") ==
        "deploy.yaml:1:35: request_timeout_s: 0 must be > 0");
  CHECK(error_of(with_fields("        autoscaling_config: {metrics_interval_s: 0.0}\n")) ==
        "deploy.yaml:7:50: metrics_interval_s: 0.0 must be > 0");
}

TEST_CASE("config error: min_replicas above max_replicas") {
  CHECK(error_of(with_fields("        autoscaling_config: {min_replicas: 5, max_replicas: 2}\n")) ==
        "deploy.yaml:7:44: min_replicas (5) must be <= max_replicas (2)");
  CHECK(error_of(
            with_fields("        autoscaling_config: {max_replicas: 4, initial_replicas: 9}\n")) ==
        "deploy.yaml:7:65: initial_replicas (9) must be within [min_replicas, max_replicas] = "
        "[1, 4]");
  CHECK(error_of(with_fields("        autoscaling_config: {max_replicas: 0}\n")) ==
        "deploy.yaml:7:44: max_replicas: 0 must be >= 1");
}

TEST_CASE("config error: target_capacity outside 0-100") {
  CHECK(error_of("target_capacity: 150\napplications: []\n") ==
        "deploy.yaml:1:18: target_capacity: 150 must be <= 100");
  CHECK(error_of("target_capacity: -0.5\napplications: []\n") ==
        "deploy.yaml:1:18: target_capacity: -0.5 must be >= 0");
}

TEST_CASE("config error: absurd values - with the controller's limits") {
  CHECK(error_of(with_fields("        num_replicas: 200000\n")) ==
        "deploy.yaml:7:23: num_replicas: 200000 must be <= 100000");
  CHECK(error_of(with_fields("        num_replicas: 99999999999999999999999\n")) ==
        "deploy.yaml:7:23: num_replicas: 99999999999999999999999 must be <= 100000");
  CHECK(error_of(with_fields("        max_ongoing_requests: 0\n")) ==
        "deploy.yaml:7:31: max_ongoing_requests: 0 must be >= 1");
  CHECK(error_of(with_fields("        health_check_period_s: 1e6\n")) ==
        "deploy.yaml:7:32: health_check_period_s: 1e6 must be <= 86400");
  CHECK(error_of("http_options: {port: 70000}\napplications: []\n") ==
        "deploy.yaml:1:22: port: 70000 must be <= 65535");
}

TEST_CASE("config error: duplicate application names") {
  CHECK(error_of(R"(applications:
  - name: a
    route_prefix: /a
    import_path: liba.so:A
  - name: a
    route_prefix: /b
    import_path: liba.so:A
)") == "deploy.yaml:5:5: duplicate application name 'a' (first at line 2, column 5)");
}

TEST_CASE("config error: duplicate deployment names") {
  CHECK(error_of(with_fields("        num_replicas: 2\n"
                             "      - name: Hello\n")) ==
        "deploy.yaml:8:9: duplicate deployment name 'Hello' in application 'greeter' (first at "
        "line 6, column 9)");
}

TEST_CASE("config error: invalid names") {
  CHECK(error_of("applications:\n  - name: my app\n    import_path: liba.so:A\n") ==
        "deploy.yaml:2:11: application name 'my app' must be 1-100 characters without '#', "
        "'/', spaces or control characters");
  CHECK(error_of(with_fields("      - name: a/b\n")) ==
        "deploy.yaml:7:15: deployment name 'a/b' must be 1-100 characters without '#', '/', "
        "spaces or control characters");
  CHECK(error_of(with_fields("      - num_replicas: 2\n")) ==
        "deploy.yaml:7:9: missing field 'name' in deployments[1] of application 'greeter'");
}

TEST_CASE("config error: route_prefix must start with '/'") {
  CHECK(
      error_of("applications:\n  - name: a\n    route_prefix: greet\n    import_path: l.so:A\n") ==
      "deploy.yaml:3:19: route_prefix 'greet' of application 'a' must start with '/'");
}

TEST_CASE("config error: two applications with the same route_prefix") {
  CHECK(error_of(R"(applications:
  - name: a
    route_prefix: /api
    import_path: liba.so:A
  - name: b
    route_prefix: /api
    import_path: libb.so:B
)") == "deploy.yaml:6:19: route_prefix '/api' of application 'b' is already used by "
       "application 'a'");
  // Both left out: both get Ray Serve's default "/".
  CHECK(error_of("applications:\n  - {name: a, import_path: l.so:A}\n"
                 "  - {name: b, import_path: l.so:B}\n") ==
        "deploy.yaml:3:5: route_prefix '/' of application 'b' is already used by application "
        "'a'");
}

TEST_CASE("config error: import_path not of the form lib:Class") {
  CHECK(error_of("applications:\n  - name: a\n    import_path: libhello.so\n") ==
        "deploy.yaml:3:18: import_path 'libhello.so' has no ':'; expected "
        "'<library>:<ClassName>', e.g. 'libfoo.so:Hello'");
  CHECK(error_of("applications:\n  - name: a\n    import_path: libhello.so:ns::Hello\n") ==
        "deploy.yaml:3:18: import_path 'libhello.so:ns::Hello': class name 'ns::Hello' is not a C "
        "identifier (letters, digits and '_', not starting with a digit)");
  CHECK(error_of("applications:\n  - name: a\n    route_prefix: /a\n") ==
        "deploy.yaml:2:5: missing field 'import_path' in application 'a'");
  CHECK(error_of(with_fields("      - name: my-model\n")) ==
        "deploy.yaml:7:15: deployment 'my-model' has no import_path and its name is no class "
        "name (import_path 'libtroupe_examples.so:my-model': class name 'my-model' is not a C "
        "identifier (letters, digits and '_', not starting with a digit)); give an "
        "import_path");
  CHECK(error_of(with_fields("        import_path: libother.so:Hello\n")) ==
        "deploy.yaml:7:22: import_path of ingress deployment 'Hello' must be the application's "
        "('libtroupe_examples.so:Hello') or be left out");
}

TEST_CASE("config error: num_replicas together with autoscaling_config") {
  // The sample as first drafted, with both.
  std::string sample = kFullSample;
  sample.replace(sample.find("        max_ongoing_requests"), 0, "        num_replicas: 3\n");
  CHECK(error_of(sample) ==
        "deploy.yaml:10:23: num_replicas and autoscaling_config of deployment 'Hello' are "
        "mutually exclusive: give a fixed num_replicas or autoscaling_config, not both");
  CHECK(error_of(with_fields("        num_replicas: auto\n")) ==
        "deploy.yaml:7:23: num_replicas: 'auto' is not supported; give an autoscaling_config "
        "instead");
}

TEST_CASE("config error: args of the ingress given twice") {
  CHECK(error_of(R"(applications:
  - name: greeter
    import_path: libtroupe_examples.so:Hello
    args: {a: 1}
    deployments:
      - name: Hello
        args: {a: 2}
)") == "deploy.yaml:7:15: args of ingress deployment 'Hello' are given twice: here and at "
       "line 4, column 11 in the application; keep one");
}

TEST_CASE("config: stuck_after_s - default 0 (derived) - seconds - printed when set") {
  const DeploymentConfig defaults = only_app(parse_ok(with_fields(""))).deployments[0].config;
  CHECK(defaults.stuck_after_s == 0);
  CHECK(to_yaml(parse_ok(with_fields(""))).find("stuck_after_s") == std::string::npos);

  DeployConfig c = parse_ok(with_fields("        stuck_after_s: 4.5\n"));
  CHECK(only_app(c).deployments[0].config.stuck_after_s == 4.5);
  CHECK(to_yaml(c).find("        stuck_after_s: 4.5\n") != std::string::npos);
  check_round_trip(c);

  CHECK(only_app(parse_ok(with_fields("        stuck_after_s: 0\n")))
            .deployments[0]
            .config.stuck_after_s == 0);
  CHECK(error_of(with_fields("        stuck_after_s: -1\n")).find("stuck_after_s") !=
        std::string::npos);
  CHECK(error_of(with_fields("        stuck_after_s: soon\n")) ==
        "deploy.yaml:7:24: stuck_after_s: expected a number of seconds, got 'soon'");
}

TEST_CASE(
    "config: force_stop_unhealthy_replicas - default false - true or false only - printed when "
    "set") {
  const DeploymentConfig defaults = only_app(parse_ok(with_fields(""))).deployments[0].config;
  CHECK_FALSE(defaults.force_stop_unhealthy_replicas);
  CHECK(to_yaml(parse_ok(with_fields(""))).find("force_stop") == std::string::npos);

  DeployConfig c = parse_ok(with_fields("        force_stop_unhealthy_replicas: true\n"));
  CHECK(only_app(c).deployments[0].config.force_stop_unhealthy_replicas);
  CHECK(to_yaml(c).find("        force_stop_unhealthy_replicas: true\n") != std::string::npos);
  check_round_trip(c);
  CHECK_FALSE(only_app(parse_ok(with_fields("        force_stop_unhealthy_replicas: False\n")))
                  .deployments[0]
                  .config.force_stop_unhealthy_replicas);
  CHECK(error_of(with_fields("        force_stop_unhealthy_replicas: yes\n")) ==
        "deploy.yaml:7:40: force_stop_unhealthy_replicas: expected true or false, got 'yes' "
        "(write true or false)");
  CHECK(error_of(with_fields("        force_stop_unhealthy_replicas: 1\n")) ==
        "deploy.yaml:7:40: force_stop_unhealthy_replicas: expected true or false, got '1'");
}

TEST_CASE(
    "config: max_num_models_per_replica - default -1 (no limit) - at least 1 - printed when set") {
  const DeploymentConfig defaults = only_app(parse_ok(with_fields(""))).deployments[0].config;
  CHECK(defaults.max_num_models_per_replica == -1);
  CHECK(to_yaml(parse_ok(with_fields(""))).find("max_num_models") == std::string::npos);

  DeployConfig c = parse_ok(with_fields("        max_num_models_per_replica: 2\n"));
  CHECK(only_app(c).deployments[0].config.max_num_models_per_replica == 2);
  CHECK(to_yaml(c).find("        max_num_models_per_replica: 2\n") != std::string::npos);
  check_round_trip(c);
  CHECK(only_app(parse_ok(with_fields("        max_num_models_per_replica: -1\n")))
            .deployments[0]
            .config.max_num_models_per_replica == -1);
  CHECK(only_app(parse_ok(with_fields("        max_num_models_per_replica:\n")))
            .deployments[0]
            .config.max_num_models_per_replica == -1);

  CHECK(error_of(with_fields("        max_num_models_per_replica: 0\n")) ==
        "deploy.yaml:7:37: max_num_models_per_replica: 0 must be >= 1 (or -1 for no limit)");
  CHECK(error_of(with_fields("        max_num_models_per_replica: -2\n")) ==
        "deploy.yaml:7:37: max_num_models_per_replica: -2 must be >= -1");
  CHECK(error_of(with_fields("        max_num_models_per_replica: many\n")) ==
        "deploy.yaml:7:37: max_num_models_per_replica: expected a positive integer (-1 for no "
        "limit), got 'many'");
  CHECK(error_of(with_fields("        max_num_models_per_replica: 2.5\n"))
            .find("max_num_models_per_replica: expected a positive integer") != std::string::npos);
  CHECK(error_of(with_fields("        max_num_models_per_replica: 1000001\n")) ==
        "deploy.yaml:7:37: max_num_models_per_replica: 1000001 must be <= 1000000");
  CHECK(error_of(with_fields("        max_models_per_replica: 2\n"))
            .find("did you mean 'max_num_models_per_replica'") != std::string::npos);
}

TEST_CASE("config: max_batch_size - default 1 (off) - 1 to 10000 - printed when set") {
  const DeploymentConfig defaults = only_app(parse_ok(with_fields(""))).deployments[0].config;
  CHECK(defaults.max_batch_size == 1u);
  CHECK(defaults.batch_wait_timeout_s == 0.01);
  CHECK_FALSE(defaults.batch_wait_auto);
  CHECK(to_yaml(parse_ok(with_fields(""))).find("batch") == std::string::npos);

  DeployConfig c =
      parse_ok(with_fields("        max_ongoing_requests: 32\n        max_batch_size: 32\n"));
  CHECK(only_app(c).deployments[0].config.max_batch_size == 32u);
  CHECK(to_yaml(c).find("        max_batch_size: 32\n") != std::string::npos);
  check_round_trip(c);
  DeployConfig one = parse_ok(with_fields("        max_batch_size: 1\n"));
  CHECK(only_app(one).deployments[0].config.max_batch_size == 1u);
  CHECK(to_yaml(one).find("max_batch_size") == std::string::npos);
  CHECK(only_app(parse_ok(with_fields("        max_ongoing_requests: 10000\n"
                                      "        max_batch_size: 10000\n")))
            .deployments[0]
            .config.max_batch_size == 10000u);

  CHECK(error_of(with_fields("        max_batch_size: 0\n")) ==
        "deploy.yaml:7:25: max_batch_size: 0 must be >= 1");
  CHECK(error_of(with_fields("        max_batch_size: -1\n")) ==
        "deploy.yaml:7:25: max_batch_size: -1 must be >= 1");
  CHECK(error_of(with_fields("        max_batch_size: 10001\n")) ==
        "deploy.yaml:7:25: max_batch_size: 10001 must be <= 10000");
  CHECK(error_of(with_fields("        max_batch_size: fast\n")) ==
        "deploy.yaml:7:25: max_batch_size: expected a positive integer (1 to 10000), got 'fast'");
  CHECK(error_of(with_fields("        max_batch_size: 2.5\n")) ==
        "deploy.yaml:7:25: max_batch_size: expected a positive integer (1 to 10000), got '2.5'");
  CHECK(error_of(with_fields("        max_batch_size: [8]\n")) ==
        "deploy.yaml:7:25: max_batch_size: expected a positive integer (1 to 10000), got a "
        "sequence");
  CHECK(error_of(with_fields("        max_batch_size:\n")) ==
        "deploy.yaml:7:9: max_batch_size: expected a positive integer (1 to 10000), got null");
  CHECK(error_of(with_fields("        max_batchsize: 8\n")).find("did you mean 'max_batch_size'") !=
        std::string::npos);
  CHECK(error_of(with_fields("        batch_wait_timeout: 1\n"))
            .find("did you mean 'batch_wait_timeout_s'") != std::string::npos);
}

TEST_CASE("config: batch_wait_timeout_s - seconds from 0 to 3600 or auto - printed when set") {
  DeployConfig c = parse_ok(with_fields("        batch_wait_timeout_s: 0.05\n"));
  CHECK(only_app(c).deployments[0].config.batch_wait_timeout_s == 0.05);
  CHECK_FALSE(only_app(c).deployments[0].config.batch_wait_auto);
  CHECK(to_yaml(c).find("        batch_wait_timeout_s: 0.05\n") != std::string::npos);
  check_round_trip(c);
  for (const auto& value :
       std::map<std::string, double>{{"0", 0}, {"1", 1}, {"0.5", 0.5}, {"3600", 3600}}) {
    CAPTURE(value.first);
    DeployConfig v = parse_ok(with_fields("        batch_wait_timeout_s: " + value.first + "\n"));
    CHECK(only_app(v).deployments[0].config.batch_wait_timeout_s == value.second);
    check_round_trip(v);
  }
  // The default written out is the default: not printed.
  CHECK(to_yaml(parse_ok(with_fields("        batch_wait_timeout_s: 0.01\n")))
            .find("batch_wait_timeout_s") == std::string::npos);

  CHECK(error_of(with_fields("        batch_wait_timeout_s: -0.5\n")) ==
        "deploy.yaml:7:31: batch_wait_timeout_s: -0.5 must be >= 0");
  CHECK(error_of(with_fields("        batch_wait_timeout_s: 3601\n")) ==
        "deploy.yaml:7:31: batch_wait_timeout_s: 3601 must be <= 3600");
  CHECK(error_of(with_fields("        batch_wait_timeout_s: fast\n")) ==
        "deploy.yaml:7:31: batch_wait_timeout_s: expected a number of seconds from 0 to 3600, or "
        "auto, got 'fast'");
  CHECK(error_of(with_fields("        batch_wait_timeout_s: .nan\n")) ==
        "deploy.yaml:7:31: batch_wait_timeout_s: expected a number of seconds from 0 to 3600, or "
        "auto, got '.nan'");
  CHECK(error_of(with_fields("        batch_wait_timeout_s: Auto\n")) ==
        "deploy.yaml:7:31: batch_wait_timeout_s: expected a number of seconds from 0 to 3600, or "
        "auto, got 'Auto'");
  CHECK(error_of(with_fields("        batch_wait_timeout_s: [0.01]\n")) ==
        "deploy.yaml:7:31: batch_wait_timeout_s: expected a number of seconds from 0 to 3600, or "
        "auto, got a sequence");
  CHECK(error_of(with_fields("        batch_wait_timeout_s:\n")) ==
        "deploy.yaml:7:9: batch_wait_timeout_s: expected a number of seconds from 0 to 3600, or "
        "auto, got null");
}

TEST_CASE("config: batch_wait_timeout_s auto - sets batch_wait_auto - printed as auto") {
  DeployConfig c =
      parse_ok(with_fields("        max_ongoing_requests: 64\n"
                           "        max_batch_size: 64\n"
                           "        batch_wait_timeout_s: auto\n"));
  const DeploymentConfig& d = only_app(c).deployments[0].config;
  CHECK(d.batch_wait_auto);
  CHECK(d.batch_wait_timeout_s == 0.01);  // kept at its default, unused
  CHECK(d.max_batch_size == 64u);
  CHECK(to_yaml(c).find("        max_batch_size: 64\n        batch_wait_timeout_s: auto\n") !=
        std::string::npos);
  check_round_trip(c);
  // Quoted, it is the same word.
  CHECK(only_app(parse_ok(with_fields("        batch_wait_timeout_s: \"auto\"\n")))
            .deployments[0]
            .config.batch_wait_auto);
}

TEST_CASE("config error: max_ongoing_requests below max_batch_size") {
  CHECK(error_of(with_fields("        max_ongoing_requests: 5\n        max_batch_size: 32\n")) ==
        "deploy.yaml:7:31: max_ongoing_requests (5) is below max_batch_size (32): a replica "
        "holds at most max_ongoing_requests requests, so its batches could never fill; raise "
        "max_ongoing_requests to at least 32");
  // max_ongoing_requests left at its default (5): at max_batch_size.
  CHECK(error_of(with_fields("        max_batch_size: 6\n")) ==
        "deploy.yaml:7:25: max_ongoing_requests (5) is below max_batch_size (6): a replica holds "
        "at most max_ongoing_requests requests, so its batches could never fill; raise "
        "max_ongoing_requests to at least 6");
  CHECK(only_app(parse_ok(with_fields("        max_ongoing_requests: 32\n"
                                      "        max_batch_size: 32\n")))
            .deployments[0]
            .config.max_batch_size == 32u);
  CHECK(only_app(parse_ok(with_fields("        max_batch_size: 5\n")))
            .deployments[0]
            .config.max_batch_size == 5u);
  CHECK(only_app(parse_ok(with_fields("        max_ongoing_requests: 1\n"
                                      "        max_batch_size: 1\n")))
            .deployments[0]
            .config.max_ongoing_requests == 1u);
}

TEST_CASE("config: round trip of batching fields built in code") {
  DeployConfig c;
  ApplicationSpec app;
  app.name = "batch";
  app.route_prefix = "/batch";
  app.ingress = "Embed";
  DeploymentSpec d;
  d.name = "Embed";
  d.import_path = "libml.so:Embed";
  d.config.max_ongoing_requests = 10000;
  app.deployments.push_back(d);
  struct Case {
    uint32_t size;
    double wait;
    bool automatic;
  };
  for (const Case& k : {Case{2, 0.01, false}, Case{10000, 0, false}, Case{16, 3600, false},
                        Case{16, 1.0 / 3, false}, Case{1, 0.25, false}, Case{1, 0.01, true},
                        Case{128, 0.01, true}}) {
    CAPTURE(k.size);
    CAPTURE(k.wait);
    CAPTURE(k.automatic);
    DeploymentConfig& config = app.deployments[0].config;
    config.max_batch_size = k.size;
    config.batch_wait_timeout_s = k.wait;
    config.batch_wait_auto = k.automatic;
    c.state.applications[app.name] = app;
    REQUIRE(controller::validate(c.state).is_ok());
    check_round_trip(c);
  }
}
