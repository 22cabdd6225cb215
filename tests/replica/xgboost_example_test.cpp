// The XGBoost example (examples/xgboost/) through the local test harness,
// loaded from the built plugin as troupe-node loads it: its answers equal
// what XGBoost predicts for the same rows from the same model file (computed
// here through another entry of the C API, a DMatrix), and every kind of bad
// input is a 400 that names the problem.
#include <xgboost/c_api.h>

#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include <troupe/testing.hpp>

#include "tests/support/xgboost_reference.hpp"

namespace {

const std::string kModel = TROUPE_TEST_XGBOOST_MODEL;

troupe::testing::App load(const troupe::Json& args = troupe::Json::object()) {
  return troupe::testing::App::from_config(
      troupe::Json{{"name", "xgboost"},
                   {"import_path", "libtroupe_xgboost.so:XGBoostModel"},
                   {"args", args},
                   {"deployments", {{{"name", "XGBoostModel"}}}}},
      {TROUPE_TEST_PLUGIN_DIR});
}

// XGBoost's own predictions of `rows` (n x 30, row-major) from kModel.
std::vector<float> reference(const std::vector<float>& rows, size_t n) {
  return troupe::testing::xgboost_reference(kModel, rows, n, 30);
}

}  // namespace

TEST_CASE("xgboost example: GET describes the model and POST predicts what XGBoost predicts") {
  auto app = load();
  auto info = troupe::Json::parse(app.get("/").body);
  CHECK(info["n_features"] == 30);
  CHECK(info["n_trees"] == 200);
  CHECK(info["model"] == kModel);

  std::mt19937 rng(5);
  std::uniform_real_distribution<float> value(-1.5f, 1.5f);
  constexpr size_t kRows = 64;
  std::vector<float> rows(kRows * 30);
  troupe::Json features = troupe::Json::array();
  for (size_t r = 0; r < kRows; ++r) {
    troupe::Json row = troupe::Json::array();
    for (size_t f = 0; f < 30; ++f) {
      rows[r * 30 + f] = value(rng);
      row.push_back(rows[r * 30 + f]);
    }
    features.push_back(row);
  }
  auto expected = reference(rows, kRows);
  auto answer = app.post("/", troupe::Json{{"features", features}}.dump());
  REQUIRE(answer.status == 200);
  auto predictions = troupe::Json::parse(answer.body)["predictions"];
  REQUIRE(predictions.size() == kRows);
  for (size_t r = 0; r < kRows; ++r)
    CHECK(predictions[r].get<float>() == expected[r]);
  // The predictions vary: a model that answers a constant would not pass.
  CHECK(*std::min_element(expected.begin(), expected.end()) <
        *std::max_element(expected.begin(), expected.end()) - 1.0f);
  CHECK(app.check_health("XGBoostModel").empty());
}

TEST_CASE("xgboost example: bad input is a 400 that names the problem") {
  auto app = load();
  const std::string row29 = troupe::Json(std::vector<float>(29, 0.5f)).dump();
  const std::string row30 = troupe::Json(std::vector<float>(30, 0.5f)).dump();
  std::string many = R"({"features": [)";
  for (int i = 0; i < 10000; ++i)
    many += (i ? "," : "") + row30;
  many += "]}";
  struct Case {
    std::string body, error;
  };
  const std::vector<Case> cases = {
      {"{not json", "the body is not JSON"},
      {R"({"rows": []})", R"(the body needs "features": a list of rows)"},
      {R"({"features": []})", R"("features" is empty)"},
      {R"({"features": [)" + row29 + "]}", "row 0 has 29 values; the model takes 30"},
      {R"({"features": [)" + row30 + ", 7]}", "row 1 has no list; the model takes 30"},
      {R"({"features": [[)" + std::string(R"("a",)") + row30.substr(1, row30.rfind(',') - 1) +
           "]]}",
       "row 0, feature 0 is not a number"},
      {many, R"("features" has 10000 rows; at most 1000 per request)"},
      // The shape of the body as a whole: trailing text, a list where the
      // object belongs, "features" that is not a list or not at the top.
      {R"({"features": [)" + row30 + "]} trailing", "the body is not JSON"},
      {R"({"features": [)" + row30 + ", [1, 2]", "the body is not JSON"},
      {"[" + row30 + "]", R"(the body needs "features": a list of rows)"},
      {R"({"features": 7})", R"(the body needs "features": a list of rows)"},
      {R"({"features": {"0": )" + row30 + "}}", R"(the body needs "features": a list of rows)"},
      {R"({"model": {"features": [)" + row30 + "]}}",
       R"(the body needs "features": a list of rows)"},
      {R"({"features": [)" + row30 + ", {\"a\": 1}]}", "row 1 has no list; the model takes 30"},
      {R"({"features": [[[1], )" + row30.substr(row30.find(',') + 1) + "]}",
       "row 0, feature 0 is not a number"},
      {R"({"features": [[1, 2, {"x": [3]}, )" + row30.substr(1) + "]}",
       "row 0 has 33 values; the model takes 30"},
      {R"({"features": [)" + row30 + ", [null" + row30.substr(row30.find(',')) + "]}",
       "row 1, feature 0 is not a number"},
      // The first row that is wrong is named; a row count over the limit
      // is named before any row.
      {R"({"features": [)" + row30 + "," + row29 + ", 7]}",
       "row 1 has 29 values; the model takes 30"},
      {many.substr(0, many.size() - 2) + ", 7]}",
       R"("features" has 10001 rows; at most 1000 per request)"},
      // A number the parser cannot hold (the example reads bodies with
      // simdjson: 64-bit integers and doubles), or one that is not JSON.
      {R"({"features": [[1e400, )" + row30.substr(row30.find(',') + 1) + "]}",
       "the body has a number that is not JSON or is beyond a 64-bit integer and a double"},
      {R"({"features": [[12345678901234567890123, )" + row30.substr(row30.find(',') + 1) + "]}",
       "the body has a number that is not JSON or is beyond a 64-bit integer and a double"},
      {R"({"features": [[01, )" + row30.substr(row30.find(',') + 1) + "]}",
       "the body has a number that is not JSON or is beyond a 64-bit integer and a double"},
      // A later "features" replaces an earlier one, as in a parsed document.
      {R"({"features": [)" + row29 + R"(], "features": [[true]]})",
       "row 0 has 1 values; the model takes 30"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.error);
    auto r = app.post("/", c.body);
    CHECK(r.status == 400);
    CHECK(troupe::Json::parse(r.body)["error"] == c.error);
  }
  // And it goes on answering; a later "features" that is good replaces a
  // bad one, and keys around it do not matter.
  auto ok = app.post("/", R"({"features": [)" + row30 + "]}");
  CHECK(ok.status == 200);
  auto replaced = app.post("/", R"({"id": [1, {"a": 2}], "features": [)" + row29 +
                                    R"(], "features": [)" + row30 + "," + row30 + "]}");
  REQUIRE(replaced.status == 200);
  CHECK(troupe::Json::parse(replaced.body)["predictions"].size() == 2);
}

TEST_CASE("xgboost example: a model file that is missing fails the start naming it") {
  CHECK_THROWS_WITH_AS(load({{"model_path", "/nonexistent/model.json"}}),
                       doctest::Contains("/nonexistent/model.json"), std::exception);
}

TEST_CASE("xgboost example: handle_batch predicts a batch in one call - bad requests get their "
          "own 400 and the others their predictions") {
  auto app = load();
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> value(-1.5f, 1.5f);
  // Three good requests of 1, 3 and 2 rows, between bad ones.
  const std::vector<size_t> sizes = {1, 3, 2};
  std::vector<float> rows;
  std::vector<troupe::Json> bodies;
  for (size_t n : sizes) {
    troupe::Json features = troupe::Json::array();
    for (size_t r = 0; r < n; ++r) {
      troupe::Json row = troupe::Json::array();
      for (size_t f = 0; f < 30; ++f) {
        rows.push_back(value(rng));
        row.push_back(rows.back());
      }
      features.push_back(row);
    }
    bodies.push_back(troupe::Json{{"features", features}});
  }
  const auto expected = reference(rows, rows.size() / 30);
  auto post = [](const std::string& body) { return troupe::testing::App::request("POST", "/", body); };
  troupe::Json too_many = troupe::Json::array();
  for (int r = 0; r < 10000; ++r)
    too_many.push_back(troupe::Json::array({1}));
  std::vector<troupe::Request> batch = {
      post(bodies[0].dump()),
      post("{not json"),
      post(bodies[1].dump()),
      post(R"({"features": [[1, 2, 3]]})"),
      post(R"({"features": []})"),
      post(troupe::Json{{"features", too_many}}.dump()),
      troupe::testing::App::request("GET", "/"),
      post(bodies[2].dump()),
  };
  auto answers = app.instance("XGBoostModel").handle_batch(batch);
  REQUIRE(answers.size() == batch.size());
  for (size_t i : {1, 3, 4, 5}) {
    CAPTURE(i);
    CHECK(answers[i].status == 400);
  }
  CHECK(answers[1].body.find("not JSON") != std::string::npos);
  CHECK(answers[3].body.find("row 0 has 3 values; the model takes 30") != std::string::npos);
  CHECK(answers[4].body.find("is empty") != std::string::npos);
  CHECK(answers[5].body.find("10000 rows; at most 1000") != std::string::npos);
  CHECK(troupe::Json::parse(answers[6].body)["n_trees"] == 200);
  // The good ones, in order: each gets the predictions of its own rows.
  size_t at = 0;
  const std::vector<size_t> good = {0, 2, 7};
  for (size_t k = 0; k < good.size(); ++k) {
    CAPTURE(k);
    REQUIRE(answers[good[k]].status == 200);
    auto predictions = troupe::Json::parse(answers[good[k]].body)["predictions"];
    REQUIRE(predictions.size() == sizes[k]);
    for (size_t r = 0; r < sizes[k]; ++r)
      CHECK(predictions[r].get<float>() == expected[at + r]);
    at += sizes[k];
  }
  // A batch of only bad requests runs no prediction and answers each.
  auto bad = app.instance("XGBoostModel").handle_batch({post("[]"), post("{}")});
  REQUIRE(bad.size() == 2);
  CHECK(bad[0].status == 400);
  CHECK(bad[1].status == 400);
}

TEST_CASE("xgboost example: args.nthread is checked") {
  CHECK_NOTHROW(load(troupe::Json{{"nthread", 1}}));
  CHECK_THROWS_WITH_AS(load(troupe::Json{{"nthread", "two"}}),
                       doctest::Contains("args.nthread: expected an integer from 0 to 1024"),
                       std::exception);
}
