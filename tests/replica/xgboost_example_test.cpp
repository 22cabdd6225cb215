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
  BoosterHandle booster = nullptr;
  DMatrixHandle data = nullptr;
  REQUIRE(XGBoosterCreate(nullptr, 0, &booster) == 0);
  REQUIRE(XGBoosterLoadModel(booster, kModel.c_str()) == 0);
  REQUIRE(XGDMatrixCreateFromMat(rows.data(), n, 30, NAN, &data) == 0);
  bst_ulong length = 0;
  const float* out = nullptr;
  REQUIRE(XGBoosterPredict(booster, data, 0, 0, 0, &length, &out) == 0);
  REQUIRE(length == n);
  std::vector<float> predictions(out, out + n);
  XGDMatrixFree(data);
  XGBoosterFree(booster);
  return predictions;
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
  };
  for (const auto& c : cases) {
    CAPTURE(c.error);
    auto r = app.post("/", c.body);
    CHECK(r.status == 400);
    CHECK(troupe::Json::parse(r.body)["error"] == c.error);
  }
  // And it goes on answering.
  auto ok = app.post("/", R"({"features": [)" + row30 + "]}");
  CHECK(ok.status == 200);
}

TEST_CASE("xgboost example: a model file that is missing fails the start naming it") {
  CHECK_THROWS_WITH_AS(load({{"model_path", "/nonexistent/model.json"}}),
                       doctest::Contains("/nonexistent/model.json"), std::exception);
}
