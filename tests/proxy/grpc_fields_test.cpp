// What the gRPC ingress reads and writes besides HTTP/2 (proxy/grpc_fields.hpp):
// plain functions on bytes.
#include "proxy/grpc_fields.hpp"

#include <doctest/doctest.h>

#include <string>

using namespace troupe::proxy;

TEST_CASE("grpc fields: grpc-timeout in every unit - and what is not one is an error naming it") {
  CHECK(*grpc::parse_timeout("1H") == 3600);
  CHECK(*grpc::parse_timeout("2M") == 120);
  CHECK(*grpc::parse_timeout("30S") == 30);
  CHECK(*grpc::parse_timeout("250m") == doctest::Approx(0.25));
  CHECK(*grpc::parse_timeout("1500u") == doctest::Approx(0.0015));
  CHECK(*grpc::parse_timeout("99999999n") == doctest::Approx(0.099999999));
  CHECK(*grpc::parse_timeout("0S") == 0);
  for (const char* bad : {"", "S", "1", "1s", "-1S", "1.5S", "123456789S", " 1S", "1S ", "soon"}) {
    CAPTURE(bad);
    auto r = grpc::parse_timeout(bad);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.status().message().find("grpc-timeout") != std::string::npos);
  }
}

TEST_CASE("grpc fields: one message framed and unframed - every other body is refused naming why") {
  std::string body;
  grpc::frame("hello", body);
  CHECK(body == std::string("\0\0\0\0\5hello", 10));
  CHECK(*grpc::unframe(body) == "hello");
  std::string empty;
  grpc::frame("", empty);
  CHECK(empty == std::string(5, '\0'));
  CHECK(*grpc::unframe(empty) == "");
  std::string big(70000, 'x');
  std::string framed;
  grpc::frame(big, framed);
  CHECK(framed.substr(0, 5) == std::string("\0\0\1\x11\x70", 5));
  CHECK(*grpc::unframe(framed) == big);

  auto refused = [](const std::string& b, const char* why) {
    auto r = grpc::unframe(b);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.status().message().find(why) != std::string::npos);
  };
  refused("", "no message");
  refused(std::string("\0\0\0", 3), "cut short");
  refused(std::string("\0\0\0\0\5hel", 8), "3 of 5 bytes");
  refused(body + body, "more than one message");
  refused(std::string("\1\0\0\0\1x", 6), "compressed");
  refused(std::string("\7\0\0\0\1x", 6), "compressed flag 7");
}

TEST_CASE("grpc fields: HTTP statuses map to gRPC codes - names - and grpc-message's encoding") {
  CHECK(grpc::code_for_http(200) == grpc::Code::ok);
  CHECK(grpc::code_for_http(204) == grpc::Code::ok);
  CHECK(grpc::code_for_http(400) == grpc::Code::invalid_argument);
  CHECK(grpc::code_for_http(401) == grpc::Code::unauthenticated);
  CHECK(grpc::code_for_http(403) == grpc::Code::permission_denied);
  CHECK(grpc::code_for_http(404) == grpc::Code::not_found);
  CHECK(grpc::code_for_http(408) == grpc::Code::deadline_exceeded);
  CHECK(grpc::code_for_http(413) == grpc::Code::resource_exhausted);
  CHECK(grpc::code_for_http(429) == grpc::Code::resource_exhausted);
  CHECK(grpc::code_for_http(499) == grpc::Code::cancelled);
  CHECK(grpc::code_for_http(500) == grpc::Code::internal);
  CHECK(grpc::code_for_http(501) == grpc::Code::unimplemented);
  CHECK(grpc::code_for_http(502) == grpc::Code::unavailable);
  CHECK(grpc::code_for_http(503) == grpc::Code::unavailable);
  CHECK(grpc::code_for_http(504) == grpc::Code::deadline_exceeded);
  CHECK(grpc::code_for_http(418) == grpc::Code::unknown);
  CHECK(std::string(grpc::code_name(0)) == "OK");
  CHECK(std::string(grpc::code_name(14)) == "UNAVAILABLE");
  CHECK(std::string(grpc::code_name(16)) == "UNAUTHENTICATED");
  CHECK(std::string(grpc::code_name(17)) == "UNKNOWN");

  CHECK(grpc::own_code("0") == 0);
  CHECK(grpc::own_code("12") == 12);
  for (const char* bad : {"", "123", "-1", "1x", " 1"})
    CHECK(grpc::own_code(bad) == -1);

  CHECK(grpc::percent_encode("plain text: ok") == "plain text: ok");
  CHECK(grpc::percent_encode("100%\n\xc3\xa9") == "100%25%0A%C3%A9");
  CHECK(grpc::message_of(R"({"error":"no replica","x":1})") == "no replica");
  CHECK(grpc::message_of("not json") == "not json");
  CHECK(grpc::message_of(R"({"error":5})") == "{\"error\":5}");
  CHECK(grpc::message_of(std::string(5000, 'a')).size() == 1024);
}
