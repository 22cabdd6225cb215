#include "runtime/address.hpp"

#include <doctest/doctest.h>

using namespace troupe;

TEST_CASE("parse_endpoint accepts host:port and [v6]:port") {
  auto a = parse_endpoint("127.0.0.1:7300");
  REQUIRE(a.has_value());
  CHECK(a->host == "127.0.0.1");
  CHECK(a->port == 7300);
  CHECK(a->to_string() == "127.0.0.1:7300");
  auto b = parse_endpoint("[::1]:80");
  REQUIRE(b.has_value());
  CHECK(b->host == "::1");
  CHECK(b->to_string() == "[::1]:80");
  CHECK(parse_endpoint("head.example:1").has_value());
}

TEST_CASE("parse_endpoint names what is wrong") {
  struct Case {
    const char* text;
    const char* fragment;
  };
  for (auto c :
       {Case{"localhost", "missing ':PORT'"}, Case{":7300", "missing host"},
        Case{"h:", "port '' is not a number"}, Case{"h:x1", "port 'x1' is not a number"},
        Case{"h:0", "port 0 is outside 1-65535"}, Case{"h:65536", "port 65536 is outside 1-65535"},
        Case{"::1:80", "write IPv6 addresses as [ADDR]:PORT"},
        Case{"[::1]80", "expected [IPv6]:PORT"}}) {
    CAPTURE(c.text);
    auto r = parse_endpoint(c.text);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.status().message().find(c.fragment) != std::string::npos);
    CHECK(r.status().message().find(std::string("'") + c.text + "'") != std::string::npos);
  }
}

TEST_CASE("validate_node_id") {
  CHECK(validate_node_id("worker-1.a_b").is_ok());
  CHECK_FALSE(validate_node_id("").is_ok());
  CHECK_FALSE(validate_node_id("has space").is_ok());
  CHECK_FALSE(validate_node_id("a/b").is_ok());
  CHECK_FALSE(validate_node_id(std::string(65, 'a')).is_ok());
  CHECK(validate_node_id(std::string(64, 'a')).is_ok());
}

TEST_CASE("a node bound to every interface advertises the address of its route to the head") {
  CHECK(is_wildcard("0.0.0.0"));
  CHECK(is_wildcard("::"));
  CHECK(is_wildcard("[::]"));
  CHECK(is_wildcard(""));
  CHECK_FALSE(is_wildcard("127.0.0.1"));
  CHECK_FALSE(is_wildcard("10.0.0.5"));
  // A specific address is advertised as it is.
  CHECK(advertised_host("10.0.0.5", Endpoint{"127.0.0.1", 7000}) == "10.0.0.5");
  // The route to a head on loopback leaves from loopback.
  CHECK(advertised_host("0.0.0.0", Endpoint{"127.0.0.1", 7000}) == "127.0.0.1");
  CHECK(advertised_host("::", Endpoint{"127.0.0.1", 7000}) == "127.0.0.1");
  // (On hosts of their own: tools/chaos/scenarios/partition_head_bind_any.yaml.)
}
