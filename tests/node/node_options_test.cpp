#include "node/node_options.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <vector>

#include "tests/support/temp_dir.hpp"

using namespace troupe;

namespace {

Result<NodeOptions> parse(std::vector<const char*> args) {
  args.insert(args.begin(), "troupe-node");
  return parse_node_options(static_cast<int>(args.size()), args.data());
}

}  // namespace

TEST_CASE("a head with defaults") {
  auto o = parse({"--head", "--state-dir", "/tmp/x"});
  REQUIRE(o.has_value());
  CHECK(o->head);
  CHECK_FALSE(o->join.has_value());
  CHECK(o->port == 7300);
  CHECK(o->bind == "127.0.0.1");
  CHECK(o->http_port == 8000);
  CHECK(o->admin_bind == "127.0.0.1");
  CHECK(o->admin_port == 8265);
  CHECK(o->node_timeout_s == 5.0);
  CHECK(o->unreachable_share == 0.5);
  CHECK(o->unreachable_min_nodes == 2u);
  CHECK(o->unreachable_timeout_s == 60.0);
  CHECK(o->drain_delay_s == 3.0);
  CHECK(o->dashboard);
  auto off = parse({"--head", "--state-dir", "/tmp/x", "--no-dashboard"});
  REQUIRE(off.has_value());
  CHECK_FALSE(off->dashboard);
  CHECK(o->resources.get("cpu") >= 1.0);
  CHECK(o->resources.get("mem") > 0.0);
}

TEST_CASE("a worker with every option") {
  auto o = parse({"--join",
                  "10.0.0.1:7400",
                  "--node-id",
                  "w1",
                  "--resources",
                  "cpu=8,mem=16G",
                  "--http-port",
                  "8100",
                  "--node-timeout",
                  "3",
                  "--heartbeat-interval",
                  "0.5",
                  "--unreachable-share",
                  "0.6",
                  "--unreachable-min-nodes",
                  "3",
                  "--unreachable-timeout",
                  "120",
                  "--basp-heartbeat-interval",
                  "0.25",
                  "--basp-connection-timeout",
                  "4",
                  "--shutdown-grace",
                  "2",
                  "--drain-delay",
                  "0.5",
                  "--peer-port",
                  "7401",
                  "--log-level",
                  "debug",
                  "--log-format",
                  "json",
                  "--access-log",
                  "errors",
                  "--state-dir",
                  "/tmp/w"});
  REQUIRE(o.has_value());
  CHECK_FALSE(o->head);
  REQUIRE(o->join.has_value());
  CHECK(o->join->host == "10.0.0.1");
  CHECK(o->join->port == 7400);
  CHECK(o->node_id == "w1");
  CHECK(o->resources.get("cpu") == 8.0);
  CHECK(o->resources.get("mem") == 16.0 * 1024 * 1024 * 1024);
  CHECK(o->http_port == 8100);
  CHECK(o->unreachable_share == 0.6);
  CHECK(o->unreachable_min_nodes == 3u);
  CHECK(o->unreachable_timeout_s == 120.0);
  CHECK(o->node_timeout_s == 3.0);
  CHECK(o->heartbeat_interval_s == 0.5);
  CHECK(o->basp_heartbeat_interval_s == 0.25);
  CHECK(o->basp_connection_timeout_s == 4.0);
  CHECK(o->shutdown_grace_s == 2.0);
  CHECK(o->drain_delay_s == 0.5);
  CHECK(o->peer_port == 7401);
  CHECK(o->log_level == "debug");
  CHECK(o->log_format == "json");
  CHECK(o->access_log == "errors");
  // The head candidates of a highly available cluster.
  auto list = parse({"--join", "10.0.0.1:7400,10.0.0.2:7400"});
  REQUIRE(list.has_value());
  REQUIRE(list->heads.size() == 2);
  CHECK(list->heads[1].to_string() == "10.0.0.2:7400");
  CHECK(list->join->to_string() == "10.0.0.1:7400");
  // By default a worker's peer listener takes any free port.
  auto plain = parse({"--join", "10.0.0.1:7400"});
  REQUIRE(plain.has_value());
  CHECK(plain->peer_port == 0);
  CHECK(plain->log_format == "text");
  CHECK(plain->access_log == "on");
  CHECK(plain->advertise.empty());
  auto nat = parse({"--join", "10.0.0.1:7400", "--advertise", "203.0.113.7"});
  REQUIRE(nat.has_value());
  CHECK(nat->advertise == "203.0.113.7");
}

TEST_CASE("a head candidate names its etcd members and itself") {
  auto o = parse({"--head", "--state-dir", "/tmp/x", "--ha-etcd",
                  "10.0.0.1:2379,http://10.0.0.2:2379", "--ha-name", "head-a"});
  REQUIRE_MESSAGE(o.has_value(), o.status().to_string());
  CHECK(o->ha_etcd == std::vector<std::string>{"http://10.0.0.1:2379", "http://10.0.0.2:2379"});
  CHECK(o->ha_name == "head-a");
  CHECK(o->ha_prefix == "/troupe");
  CHECK(o->ha_lease_ttl_s == 2.0);
  auto longer = parse({"--head", "--state-dir", "/tmp/x", "--ha-etcd", "e:2379", "--ha-name", "h",
                       "--ha-lease-ttl", "5"});
  REQUIRE(longer.has_value());
  CHECK(longer->ha_lease_ttl_s == 5.0);
  auto single = parse({"--head", "--state-dir", "/tmp/x"});
  REQUIRE(single.has_value());
  CHECK(single->ha_etcd.empty());
  CHECK(single->ha_name.empty());
}

TEST_CASE("--help is not an error") {
  auto o = parse({"--help"});
  REQUIRE(o.has_value());
  CHECK(o->show_help);
  CHECK(o->help_text.find("--join") != std::string::npos);
}

TEST_CASE("bad options are refused with a message naming them") {
  struct Case {
    std::vector<const char*> args;
    const char* fragment;
  };
  std::vector<Case> cases = {
      {{"--head", "--state-dir", "d", "--frob"}, "--frob"},
      {{}, "give either --head or --join"},
      {{"--head"}, "--head needs --state-dir"},
      {{"--head", "--join", "h:1", "--state-dir", "d"}, "excludes"},
      {{"--join", "h:1", "--port", "7300"}, "excludes"},
      {{"--head", "--state-dir", "d", "--peer-port", "7401"}, "excludes"},
      {{"--join", "h:1", "--peer-port", "70000"}, "--peer-port"},
      {{"--join", "nohost"}, "--join: address 'nohost'"},
      {{"--join", "h:1,nohost"}, "--join: 'nohost': address 'nohost' is not HOST:PORT"},
      {{"--join", "h:1,h:1"}, "--join: h:1 is given twice"},
      {{"--join", "h:1", "--resources", "cpu"}, "--resources: resource entry 'cpu'"},
      {{"--join", "h:1", "--node-id", "a b"}, "--node-id: node id 'a b'"},
      {{"--join", "h:1", "--http-port", "0"}, "--http-port 0"},
      {{"--join", "h:1", "--http-port", "70000"}, "--http-port"},
      {{"--join", "h:1", "--node-timeout", "-1"}, "--node-timeout"},
      {{"--join", "h:1", "--heartbeat-interval", "9"}, "shorter than --node-timeout"},
      {{"--head", "--state-dir", "d", "--unreachable-share", "1.5"},
       "--unreachable-share must be between 0 and 1"},
      {{"--head", "--state-dir", "d", "--unreachable-min-nodes", "0"},
       "--unreachable-min-nodes must be at least 1"},
      {{"--head", "--state-dir", "d", "--unreachable-timeout", "4"},
       "--unreachable-timeout must be longer than --node-timeout"},
      {{"--head", "--state-dir", "d", "--port", "0"}, "--port 0"},
      {{"--join", "h:1", "--drain-delay", "-1"}, "--drain-delay must be between 0 and 86400"},
      {{"--join", "h:1", "--advertise", "0.0.0.0"}, "--advertise 0.0.0.0 is not an address"},
      {{"--join", "h:1", "--log-format", "xml"}, "--log-format 'xml' is not one of text, json"},
      {{"--join", "h:1", "--access-log", "yes"},
       "--access-log 'yes' is not one of on, errors, off"},
      {{"--join", "h:1", "--ha-etcd", "e:2379"}, "--ha-etcd is for head candidates: give --head"},
      {{"--head", "--state-dir", "d", "--ha-etcd", "e:2379"}, "--ha-etcd needs --ha-name NAME"},
      {{"--head", "--state-dir", "d", "--ha-name", "h1"}, "--ha-name needs --ha-etcd"},
      {{"--head", "--state-dir", "d", "--ha-etcd", "e:2379,nohost", "--ha-name", "h1"},
       "--ha-etcd: etcd endpoint 'nohost' is not host:port"},
      {{"--head", "--state-dir", "d", "--ha-etcd", "e:2379", "--ha-name", "a b"}, "--ha-name: "},
      {{"--head", "--state-dir", "d", "--ha-etcd", "e:2379", "--ha-name", "h1", "--ha-prefix",
        "troupe"},
       "--ha-prefix 'troupe' must start with /"},
      {{"--head", "--state-dir", "d", "--ha-etcd", "e:2379", "--ha-name", "h1", "--ha-lease-ttl",
        "0.5"},
       "--ha-lease-ttl must be a whole number of seconds between 1 and 60"},
      {{"--head", "--state-dir", "d", "--ha-etcd", "e:2379", "--ha-name", "h1", "--ha-lease-ttl",
        "120"},
       "--ha-lease-ttl must be a whole number"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.fragment);
    auto o = parse(c.args);
    REQUIRE_FALSE(o.has_value());
    CHECK(o.status().code() == errc::invalid_argument);
    CAPTURE(o.status().message());
    CHECK(o.status().message().find(c.fragment) != std::string::npos);
  }
}

TEST_CASE("a non-loopback bind without TLS is refused unless --insecure") {
  auto refused = parse({"--join", "h:1", "--bind", "0.0.0.0"});
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.status().message().find("--bind 0.0.0.0 is not a loopback address") !=
        std::string::npos);
  CHECK(refused.status().message().find("--insecure") != std::string::npos);
  auto allowed = parse({"--join", "h:1", "--bind", "0.0.0.0", "--insecure"});
  REQUIRE(allowed.has_value());
  CHECK(allowed->insecure);
  CHECK(parse({"--join", "h:1", "--bind", "127.0.0.2"}).has_value());
  CHECK(parse({"--join", "h:1", "--bind", "localhost"}).has_value());
  CHECK(is_loopback("::1"));
  CHECK_FALSE(is_loopback("10.0.0.1"));
}

TEST_CASE("the admin listener stays on loopback unless --insecure or --tls-dir") {
  auto o = parse({"--join", "h:1", "--admin-port", "9100", "--admin-bind", "127.0.0.2"});
  REQUIRE(o.has_value());
  CHECK(o->admin_port == 9100);
  CHECK(o->admin_bind == "127.0.0.2");
  // Off loopback: the cluster's state to whoever reaches it.
  auto refused = parse({"--join", "h:1", "--admin-bind", "0.0.0.0"});
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.status().message().find("--admin-bind 0.0.0.0 is not a loopback address") !=
        std::string::npos);
  CHECK(refused.status().message().find("--insecure") != std::string::npos);
  auto insecure = parse({"--join", "h:1", "--admin-bind", "0.0.0.0", "--insecure"});
  REQUIRE(insecure.has_value());
  CHECK(insecure->admin_bind == "0.0.0.0");
  // With TLS it speaks HTTPS with client certificates of the cluster
  // (node_main.cpp, proxy/admin.cpp): allowed without --insecure.
  auto tls = parse({"--join", "h:1", "--admin-bind", "10.0.0.5", "--tls-dir", "/x"});
  REQUIRE(tls.has_value());
  CHECK(tls->admin_bind == "10.0.0.5");
}

TEST_CASE("the default plugin path is found from where troupe-node is") {
  namespace fs = std::filesystem;
  troupe::testing::TempDir tmp;
  const fs::path root = tmp.path();
  const std::string node = (root / "bin" / "troupe-node").string();
  // Neither layout: the install's, which holds nothing.
  CHECK(default_plugin_dir(node) == (root / "lib/troupe/plugins").string());
  // A build tree: build/bin/troupe-node next to build/plugins.
  fs::create_directories(root / "plugins");
  CHECK(default_plugin_dir(node) == (root / "plugins").string());
  // An install prefix: <prefix>/lib/troupe/plugins comes first.
  fs::create_directories(root / "lib/troupe/plugins");
  CHECK(default_plugin_dir(node) == (root / "lib/troupe/plugins").string());
}
