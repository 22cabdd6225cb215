// troupectl's argument values: APP, APP/DEPLOYMENT, counts, NAME=W weights. Each
// malformed value is refused with one line naming the argument and quoting
// the value.
#include <doctest/doctest.h>

#include "tools/troupectl/args.hpp"

using namespace troupe;
using namespace troupe::ctl;

TEST_CASE("troupectl args: an application name") {
  CHECK(parse_app_name("greet", "APP").value() == "greet");
  for (const char* bad : {"", "a/b", "a#b", "a b"}) {
    CAPTURE(bad);
    auto r = parse_app_name(bad, "APP");
    REQUIRE_FALSE(r.has_value());
    CHECK(r.status().code() == errc::invalid_argument);
    CHECK(r.status().message() ==
          "APP: \"" + std::string(bad) + "\" is not a valid application name");
  }
}

TEST_CASE("troupectl args: APP/DEPLOYMENT") {
  auto ok = parse_deployment_ref("greet/Canary", "APP/DEPLOYMENT");
  REQUIRE(ok.has_value());
  CHECK(ok->app == "greet");
  CHECK(ok->deployment == "Canary");

  struct Bad {
    const char* text;
    const char* message;
  };
  for (const Bad& b : {
           Bad{"greet", "APP/DEPLOYMENT: \"greet\" must name an application and one of its "
                        "deployments as APP/DEPLOYMENT"},
           Bad{"/Canary", "APP/DEPLOYMENT: \"/Canary\": the application name \"\" is not a "
                          "valid name"},
           Bad{"greet/", "APP/DEPLOYMENT: \"greet/\": the deployment name \"\" is not a valid "
                         "name"},
           Bad{"a/b/c", "APP/DEPLOYMENT: \"a/b/c\": the deployment name \"b/c\" is not a valid "
                        "name"},
       }) {
    CAPTURE(b.text);
    auto r = parse_deployment_ref(b.text, "APP/DEPLOYMENT");
    REQUIRE_FALSE(r.has_value());
    CHECK(r.status().code() == errc::invalid_argument);
    CHECK(r.status().message() == b.message);
  }
}

TEST_CASE("troupectl args: counts are whole numbers within bounds") {
  CHECK(parse_count("0", "N", 10).value() == 0);
  CHECK(parse_count("10", "N", 10).value() == 10);
  CHECK(parse_count("18446744073709551615", "--if-generation", UINT64_MAX).value() ==
        UINT64_MAX);
  for (const char* bad : {"", "-1", "+3", "3.0", "0x3", "three", "11", " 3",
                          "18446744073709551616", "99999999999999999999999"}) {
    CAPTURE(bad);
    auto r = parse_count(bad, "N", 10);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.status().code() == errc::invalid_argument);
    CHECK(r.status().message() ==
          "N: \"" + std::string(bad) + "\" must be a whole number from 0 to 10");
  }
}

TEST_CASE("troupectl args: NAME=W weights") {
  auto ok = parse_weights({"Hello=0.8", "Canary=.2", "Mirror=0"});
  REQUIRE(ok.has_value());
  CHECK(*ok == std::map<std::string, double>{{"Hello", 0.8}, {"Canary", 0.2}, {"Mirror", 0.0}});
  // Negative weights and sums are the controller's rules (validate):
  // parsed here, refused there.
  CHECK(parse_weights({"Hello=-0.5"}).value().at("Hello") == -0.5);

  struct Bad {
    std::vector<std::string> items;
    const char* message;
  };
  for (const Bad& b : {
           Bad{{}, "NAME=W: give at least one deployment and its weight, e.g. Hello=0.9 "
                   "Canary=0.1"},
           Bad{{"Hello"}, "NAME=W: \"Hello\" must be a deployment name, '=' and a weight"},
           Bad{{"=0.5"}, "NAME=W: \"=0.5\": \"\" is not a valid deployment name"},
           Bad{{"Hello="}, "NAME=W: \"Hello=\": the weight \"\" must be a number (e.g. 0.25)"},
           Bad{{"Hello=half"},
               "NAME=W: \"Hello=half\": the weight \"half\" must be a number (e.g. 0.25)"},
           Bad{{"Hello=0.5x"},
               "NAME=W: \"Hello=0.5x\": the weight \"0.5x\" must be a number (e.g. 0.25)"},
           Bad{{"Hello=nan"},
               "NAME=W: \"Hello=nan\": the weight \"nan\" must be a number (e.g. 0.25)"},
           Bad{{"Hello=inf"},
               "NAME=W: \"Hello=inf\": the weight \"inf\" must be a number (e.g. 0.25)"},
           Bad{{"Hello=0.5", "Hello=0.5"}, "NAME=W: \"Hello\" is given more than once"},
       }) {
    auto r = parse_weights(b.items);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.status().code() == errc::invalid_argument);
    CHECK(r.status().message() == b.message);
  }
}
