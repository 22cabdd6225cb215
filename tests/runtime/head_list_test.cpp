// The heads a worker or troupectl tries (runtime/head_list.hpp).
#include <doctest/doctest.h>

#include "runtime/head_list.hpp"

using namespace troupe;

namespace {

std::vector<std::string> as_text(const std::vector<Endpoint>& eps) {
  std::vector<std::string> out;
  for (const auto& ep : eps)
    out.push_back(ep.to_string());
  return out;
}

}  // namespace

TEST_CASE("head list: a comma-separated list of HOST:PORT - bad ones named") {
  auto three = parse_endpoints("a:7300,10.0.0.2:7301,[::1]:7302");
  REQUIRE(three.has_value());
  CHECK(as_text(*three) == std::vector<std::string>{"a:7300", "10.0.0.2:7301", "[::1]:7302"});
  CHECK(to_string(*three) == "a:7300,10.0.0.2:7301,[::1]:7302");
  auto one = parse_endpoints("127.0.0.1:7300");
  REQUIRE(one.has_value());
  CHECK(one->size() == 1);
  auto bad = parse_endpoints("a:7300,b");
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.status().message().find("'b'") != std::string::npos);
  auto empty = parse_endpoints("a:7300,,b:1");
  REQUIRE_FALSE(empty.has_value());
  CHECK(empty.status().message().find("''") != std::string::npos);
  auto twice = parse_endpoints("a:7300,a:7300");
  REQUIRE_FALSE(twice.has_value());
  CHECK(twice.status().message() == "a:7300 is given twice");
}

TEST_CASE("head list: a follower's answer names the leader - and is read back") {
  auto msg = not_leader_message("h2", "10.0.0.2:7301");
  CHECK(msg == "this head does not lead: the leader is h2 at 10.0.0.2:7301");
  auto ep = named_leader("the controller at a:1 refused the handshake: " + msg);
  REQUIRE(ep.has_value());
  CHECK(ep->to_string() == "10.0.0.2:7301");
  CHECK_FALSE(named_leader("no leader yet (cannot reach etcd)").has_value());
  CHECK_FALSE(named_leader("this head does not lead: the leader is h2 at nowhere").has_value());
}

TEST_CASE("head list: round robin on failures - a named leader is tried next - added if unknown") {
  auto eps = parse_endpoints("a:1,b:2,c:3");
  REQUIRE(eps.has_value());
  HeadList heads(*eps);
  CHECK(heads.current().to_string() == "a:1");
  heads.failed();
  CHECK(heads.current().to_string() == "b:2");
  heads.failed("no leader yet");
  CHECK(heads.current().to_string() == "c:3");
  heads.failed();
  CHECK(heads.current().to_string() == "a:1");
  // A follower names c: straight there, not via b.
  heads.failed(not_leader_message("hc", "c:3"));
  CHECK(heads.current().to_string() == "c:3");
  // A leader outside the list (a candidate added later): tried, and kept.
  heads.failed(not_leader_message("hd", "d:4"));
  CHECK(heads.current().to_string() == "d:4");
  CHECK(heads.heads().size() == 4);
  heads.failed();
  CHECK(heads.current().to_string() == "a:1");
}
