#include "runtime/resources.hpp"

#include <doctest/doctest.h>

using troupe::parse_resources;

TEST_CASE("parse_resources accepts names - numbers and binary suffixes") {
  auto r = parse_resources("cpu=4,mem=8G,gpu=0.5");
  REQUIRE(r.has_value());
  CHECK(r->get("cpu") == 4.0);
  CHECK(r->get("mem") == 8.0 * 1024 * 1024 * 1024);
  CHECK(r->get("gpu") == 0.5);
  CHECK(r->get("disk") == 0.0);
  CHECK(r->to_string() == "cpu=4,gpu=0.5,mem=8G");
  CHECK(parse_resources(r->to_string()).value() == r.value());
}

TEST_CASE("parse_resources of the empty string is the empty set") {
  auto r = parse_resources("");
  REQUIRE(r.has_value());
  CHECK(r->empty());
}

TEST_CASE("parse_resources rejects malformed entries and names the problem") {
  struct Case {
    const char* text;
    const char* fragment;
  };
  for (auto c : {Case{"cpu", "'cpu' is not of the form name=amount"},
                 Case{"cpu=", "resource 'cpu' has amount ''"},
                 Case{"cpu=-1", "resource 'cpu' has amount '-1'"},
                 Case{"cpu=abc", "resource 'cpu' has amount 'abc'"},
                 Case{"cpu=4X", "resource 'cpu' has amount '4X'"},
                 Case{"CPU=4", "resource name 'CPU'"},
                 Case{"cpu=1,cpu=2", "'cpu' is given twice"},
                 Case{"cpu=1,", "'' is not of the form"},
                 Case{"cpu=inf", "resource 'cpu' has amount 'inf'"}}) {
    CAPTURE(c.text);
    auto r = parse_resources(c.text);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.status().code() == troupe::errc::invalid_argument);
    CHECK(r.status().message().find(c.fragment) != std::string::npos);
  }
}

TEST_CASE("fits - minus and plus work element-wise") {
  auto node = parse_resources("cpu=4,mem=8G").value();
  auto need = parse_resources("cpu=1.5").value();
  CHECK(node.fits(need));
  auto left = node.minus(need).minus(need);
  CHECK(left.get("cpu") == doctest::Approx(1.0));
  CHECK_FALSE(left.fits(need));
  CHECK(left.plus(need).fits(need));
  CHECK_FALSE(node.fits(parse_resources("gpu=1").value()));
  CHECK(node.fits(parse_resources("").value()));
}
