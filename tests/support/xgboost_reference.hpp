// XGBoost's own predictions from a model file, through a DMatrix (another
// entry of the C API than the example deployment's in-place prediction):
// what the tests of examples/xgboost/ compare its answers with.
#pragma once

#include <xgboost/c_api.h>

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

namespace troupe::testing {

// The predictions of `rows` (n rows of `features` values, row-major) by the
// model in `model_file`.
inline std::vector<float> xgboost_reference(const std::string& model_file,
                                            const std::vector<float>& rows, size_t n,
                                            size_t features) {
  BoosterHandle booster = nullptr;
  DMatrixHandle data = nullptr;
  REQUIRE(XGBoosterCreate(nullptr, 0, &booster) == 0);
  REQUIRE(XGBoosterLoadModel(booster, model_file.c_str()) == 0);
  REQUIRE(XGDMatrixCreateFromMat(rows.data(), n, features, NAN, &data) == 0);
  bst_ulong length = 0;
  const float* out = nullptr;
  REQUIRE(XGBoosterPredict(booster, data, 0, 0, 0, &length, &out) == 0);
  REQUIRE(length == n);
  std::vector<float> predictions(out, out + n);
  XGDMatrixFree(data);
  XGBoosterFree(booster);
  return predictions;
}

}  // namespace troupe::testing
