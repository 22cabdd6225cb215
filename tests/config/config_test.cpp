#include <doctest/doctest.h>

#include "tools/troupectl/config.hpp"

TEST_CASE("config: placeholder") {
  CHECK(true);
}
