// Trains the XGBoost example's model at build time: a regression of 200
// trees of depth 6 on 30 features, over a synthetic data set drawn from a
// fixed seed (the same model on every machine), written to the path given.
//
//   troupe-xgboost-train <model.json>
//
// The data: 4,000 rows of features uniform in [-1, 1]; the target a smooth
// function of a few features with interactions, plus a little noise, so the
// trees have something to learn.
#include <xgboost/c_api.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int kRows = 4000;
constexpr int kFeatures = 30;
constexpr int kTrees = 200;

bool ok(int rc, const char* what) {
  if (rc == 0)
    return true;
  std::fprintf(stderr, "troupe-xgboost-train: %s: %s\n", what, XGBGetLastError());
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: troupe-xgboost-train <model.json>\n");
    return 2;
  }
  std::mt19937 rng(20261207);
  std::uniform_real_distribution<float> feature(-1.0f, 1.0f);
  std::normal_distribution<float> noise(0.0f, 0.05f);
  std::vector<float> x(static_cast<size_t>(kRows) * kFeatures);
  std::vector<float> y(kRows);
  for (int r = 0; r < kRows; ++r) {
    float* row = &x[static_cast<size_t>(r) * kFeatures];
    for (int f = 0; f < kFeatures; ++f)
      row[f] = feature(rng);
    y[r] = 2.0f * row[0] + std::sin(3.0f * row[1]) + row[2] * row[3] +
           (row[4] > 0.2f ? 1.0f : -0.5f) + 0.5f * row[5] * row[5] + noise(rng);
  }
  DMatrixHandle train = nullptr;
  BoosterHandle booster = nullptr;
  bool good = ok(XGDMatrixCreateFromMat(x.data(), kRows, kFeatures, NAN, &train), "data") &&
              ok(XGDMatrixSetFloatInfo(train, "label", y.data(), kRows), "labels") &&
              ok(XGBoosterCreate(&train, 1, &booster), "booster");
  const char* params[][2] = {{"objective", "reg:squarederror"},
                             {"max_depth", "6"},
                             {"eta", "0.1"},
                             {"tree_method", "hist"},
                             {"seed", "7"},
                             {"nthread", "2"}};
  for (auto& [name, value] : params)
    good = good && ok(XGBoosterSetParam(booster, name, value), name);
  for (int i = 0; good && i < kTrees; ++i)
    good = ok(XGBoosterUpdateOneIter(booster, i, train), "training");
  good = good && ok(XGBoosterSaveModel(booster, argv[1]), "saving the model");
  if (booster)
    XGBoosterFree(booster);
  if (train)
    XGDMatrixFree(train);
  if (!good)
    return 1;
  std::printf("troupe-xgboost-train: %d trees over %d features in %s\n", kTrees, kFeatures,
              argv[1]);
  return 0;
}
