#include "replica/plugin/import_path.hpp"

#include <doctest/doctest.h>

namespace troupe {
namespace {

TEST_CASE("parse_import_path splits library and class") {
  auto parsed = parse_import_path("libfoo.so:Hello");
  REQUIRE(parsed);
  CHECK(parsed->library == "libfoo.so");
  CHECK(parsed->class_name == "Hello");

  auto nested = parse_import_path("models/libfoo.so:_Model2");
  REQUIRE(nested);
  CHECK(nested->library == "models/libfoo.so");
  CHECK(nested->class_name == "_Model2");
}

TEST_CASE("parse_import_path refuses malformed values and names them") {
  struct Case {
    const char* value;
    const char* reason;
  };
  const Case cases[] = {
      {"libfoo.so", "has no ':'"},
      {"", "has no ':'"},
      {":Hello", "empty library name"},
      {"libfoo.so:", "empty class name"},
      {"libfoo.so:ns::Hello", "class name 'ns::Hello' is not a C identifier"},
      {"libfoo.so:2Fast", "class name '2Fast' is not a C identifier"},
      {"libfoo.so:Hel-lo", "is not a C identifier"},
      {"libfoo.so: Hello", "is not a C identifier"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.value);
    auto parsed = parse_import_path(c.value);
    REQUIRE_FALSE(parsed);
    CHECK(parsed.status().code() == errc::invalid_argument);
    const std::string message = parsed.status().message();
    CHECK(message.find(std::string("import_path '") + c.value + "'") != std::string::npos);
    CHECK(message.find(c.reason) != std::string::npos);
  }
}

TEST_CASE("is_c_identifier") {
  CHECK(is_c_identifier("Echo"));
  CHECK(is_c_identifier("_x9"));
  CHECK_FALSE(is_c_identifier(""));
  CHECK_FALSE(is_c_identifier("9x"));
  CHECK_FALSE(is_c_identifier("a.b"));
}

}  // namespace
}  // namespace troupe
