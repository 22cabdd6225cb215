#include "runtime/multiplex.hpp"

#include <doctest/doctest.h>

using namespace troupe::multiplex;

TEST_CASE(
    "multiplex: the model id comes from serve_multiplexed_model_id - else X-Troupe-Model-Id - any "
    "case") {
  CHECK(model_id_of({}).empty());
  CHECK(model_id_of({{"Accept", "*/*"}}).empty());
  CHECK(model_id_of({{"serve_multiplexed_model_id", "m1"}}) == "m1");
  CHECK(model_id_of({{"SERVE_MULTIPLEXED_MODEL_ID", "m1"}}) == "m1");
  CHECK(model_id_of({{"x-troupe-model-id", "m2"}}) == "m2");
  // Ray's header wins, wherever it is.
  CHECK(model_id_of({{"X-Troupe-Model-Id", "m2"}, {"Serve_Multiplexed_Model_Id", "m1"}}) == "m1");
  CHECK(model_id_of({{"serve_multiplexed_model_id_x", "m1"}}).empty());
}

TEST_CASE("multiplex: the held-models header round-trips - ids with commas and percent signs") {
  for (const auto& held : std::vector<HeldModels>{{1, {}},
                                                  {7, {"m1"}},
                                                  {42, {"a,b", "50%", "%2C", "with space"}},
                                                  {18446744073709551615ULL, {"x", "y"}}}) {
    auto text = encode_held(held);
    CAPTURE(text);
    HeldModels back;
    REQUIRE(decode_held(text, back));
    CHECK(back.seq == held.seq);
    CHECK(back.model_ids == held.model_ids);
  }
  CHECK(encode_held({3, {"a", "b,c"}}) == "3 a,b%2Cc");
  HeldModels out;
  for (const char* bad :
       {"", "3", " a", "x a", "3 a,,b", "3 a%zz", "3 ,a", "123456789012345678901 a"}) {
    CAPTURE(bad);
    CHECK_FALSE(decode_held(bad, out));
  }
}
