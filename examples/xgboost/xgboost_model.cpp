// XGBoostModel: serves a gradient-boosted model through XGBoost's C API
// (Debian's libxgboost-dev). The build trains one (train.cpp) into
// <build>/examples/xgboost/model.json; `args.model_path` names another.
// `args.nthread` sets the threads of one prediction (XGBoost's nthread;
// its default is every core, which several replicas on one machine share).
//
//   POST {"features": [[f0, ..., f29], ...]}  ->  {"predictions": [p0, ...]}
//   GET                                        ->  {"model": path, "n_features": 30, "n_trees":
//   200}
//
// Bad input is a 400 that names the problem: malformed JSON, no "features",
// an empty list, a row of the wrong length, a value that is not a number, or
// more than kMaxRows rows. The model is loaded once, in the constructor; a
// file that is missing or not a model fails the replica's start with
// XGBoost's message. Prediction uses XGBoost's in-place prediction, which is
// safe from several request threads at once. With max_batch_size above 1
// (examples/xgboost.yaml sets 32 and `batch_wait_timeout_s: auto`) the
// replica calls handle_batch(), which predicts the rows of all the
// requests of a batch with one call. The health check predicts a
// row the constructor predicted, and fails when the answer changed.
//
// It is also a troupe::InferenceModel (include/troupe/inference.hpp): with
// `open_inference: true` on its application every node serves it by the Open
// Inference Protocol, over REST and gRPC:
//
//   POST /v2/models/xgboost/infer
//     {"inputs": [{"name": "features", "datatype": "FP32", "shape": [2, 30], "data": [...]}]}
//   -> {"model_name": "xgboost", "outputs": [{"name": "predictions", "datatype": "FP32",
//                                             "shape": [2], "data": [p0, p1]}]}
//
// The rows of the inference calls of a batch go through the model in one
// call too (infer_batch).
#include <simdjson.h>
#include <xgboost/c_api.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <troupe/inference.hpp>

#ifndef TROUPE_XGBOOST_DEFAULT_MODEL
#define TROUPE_XGBOOST_DEFAULT_MODEL ""
#endif

namespace {

constexpr size_t kMaxRows = 1000;
// Bodies up to this size are parsed by a parser the thread keeps (about 25
// rows). simdjson's buffers are about 15 bytes per byte of the largest body
// parsed, and a replica may run requests on as many threads as
// max_ongoing_requests: this keeps at most about 120 KiB per thread.
constexpr size_t kKeptBodyBytes = 8 << 10;

void check(int rc, const std::string& what) {
  if (rc != 0)
    throw std::runtime_error(what + ": " + XGBGetLastError());
}

// The elements of a list (simdjson's own count stops at 0xFFFFFF).
size_t size_of(simdjson::dom::array a) {
  size_t n = a.size();
  if (n == 0xFFFFFF) {
    n = 0;
    for (auto it = a.begin(); it != a.end(); ++it)
      ++n;
  }
  return n;
}

troupe::Response bad_request(const std::string& message) {
  return troupe::Response::json({{"error", message}}, 400);
}

}  // namespace

class XGBoostModel : public troupe::InferenceModel {
 public:
  XGBoostModel(const troupe::Json& args, const troupe::ReplicaContext& /*ctx*/)
      : path_(args.is_object() ? args.value("model_path", std::string(TROUPE_XGBOOST_DEFAULT_MODEL))
                               : std::string(TROUPE_XGBOOST_DEFAULT_MODEL)) {
    if (path_.empty())
      throw std::runtime_error("args.model_path: no model file named");
    check(XGBoosterCreate(nullptr, 0, &booster_), "creating a booster");
    try {
      check(XGBoosterLoadModel(booster_, path_.c_str()), "loading " + path_);
      // args.nthread: the threads of one prediction (XGBoost's nthread);
      // absent or 0: XGBoost's default, every core of the machine.
      if (args.is_object() && args.contains("nthread")) {
        const auto& n = args["nthread"];
        if (!n.is_number_integer() || n.get<long>() < 0 || n.get<long>() > 1024)
          throw std::runtime_error("args.nthread: expected an integer from 0 to 1024, got " +
                                   n.dump());
        check(XGBoosterSetParam(booster_, "nthread", std::to_string(n.get<long>()).c_str()),
              "setting nthread");
      }
      bst_ulong features = 0;
      check(XGBoosterGetNumFeature(booster_, &features), "reading the model's feature count");
      int rounds = 0;
      check(XGBoosterBoostedRounds(booster_, &rounds), "reading the model's tree count");
      n_features_ = static_cast<size_t>(features);
      n_trees_ = rounds;
      metadata_ = {"xgboost",
                   {"1"},
                   {{"features", troupe::DataType::fp32, {-1, int64_t(n_features_)}}},
                   {{"predictions", troupe::DataType::fp32, {-1}}}};
      probe_.assign(n_features_, 0.25f);
      probe_answer_ = predict(probe_, 1).at(0);
    } catch (...) {
      XGBoosterFree(booster_);
      throw;
    }
  }
  ~XGBoostModel() override { XGBoosterFree(booster_); }

  troupe::ModelMetadata metadata() const override { return metadata_; }

  troupe::InferResponse infer(const troupe::InferRequest& request) override {
    return std::move(infer_batch({request}).front());
  }

  // One matrix for the rows of every call (their shapes are checked against
  // metadata() before: [rows, n_features] with as many values).
  std::vector<troupe::InferResponse> infer_batch(
      const std::vector<troupe::InferRequest>& requests) override {
    std::vector<float> rows;
    size_t total = 0;
    for (const auto& r : requests) {
      const troupe::Tensor& x = *r.input("features");
      const auto n = static_cast<size_t>(x.shape[0]);
      if (n == 0)
        throw troupe::BadInput("input 'features' has no rows");
      if (n > kMaxRows)
        throw troupe::BadInput("input 'features' has " + std::to_string(n) + " rows; at most " +
                               std::to_string(kMaxRows) + " per request");
      rows.insert(rows.end(), x.fp32.begin(), x.fp32.end());
      total += n;
    }
    const std::vector<float> predictions = predict(rows, total);
    std::vector<troupe::InferResponse> out;
    size_t at = 0;
    for (const auto& r : requests) {
      const int64_t n = r.input("features")->shape[0];
      troupe::Tensor p("predictions", troupe::DataType::fp32, {n});
      p.fp32.assign(predictions.begin() + static_cast<long>(at),
                    predictions.begin() + static_cast<long>(at) + n);
      at += static_cast<size_t>(n);
      troupe::InferResponse answer;
      answer.outputs.push_back(std::move(p));
      out.push_back(std::move(answer));
    }
    return out;
  }

  // The application's own REST API (at its route_prefix).
  troupe::Response handle_http(const troupe::Request& request) override {
    if (request.method == "GET")
      return troupe::Response::json(
          {{"model", path_}, {"n_features", n_features_}, {"n_trees", n_trees_}});
    if (request.method != "POST")
      return troupe::Response::json({{"error", "use GET or POST"}}, 405);
    std::vector<float> rows;
    size_t n = 0;
    if (auto problem = parse(request.body, rows, n); !problem.empty())
      return bad_request(problem);
    return troupe::Response::json({{"predictions", predict(rows, n)}});
  }

  // The requests of a batch go through the model as one matrix: one call
  // into XGBoost for all their rows, which is what batching buys (the
  // per-call cost of a prediction is paid once). A request with bad input
  // gets its own 400 and stays out of the matrix; the others are answered.
  std::vector<troupe::Response> handle_http_batch(
      const std::vector<troupe::Request>& requests) override {
    std::vector<troupe::Response> out(requests.size());
    std::vector<float> rows;
    // Per request taking part: its index and how many rows it brought.
    std::vector<std::pair<size_t, size_t>> parts;
    for (size_t i = 0; i < requests.size(); ++i) {
      const auto& request = requests[i];
      if (request.method != "POST") {
        out[i] = handle_http(request);
        continue;
      }
      std::vector<float> mine;
      size_t n = 0;
      if (auto problem = parse(request.body, mine, n); !problem.empty()) {
        out[i] = bad_request(problem);
        continue;
      }
      rows.insert(rows.end(), mine.begin(), mine.end());
      parts.emplace_back(i, n);
    }
    size_t total = 0;
    for (const auto& part : parts)
      total += part.second;
    if (total == 0)
      return out;
    const std::vector<float> predictions = predict(rows, total);
    size_t at = 0;
    for (const auto& [index, n] : parts) {
      out[index] = troupe::Response::json(
          {{"predictions", std::vector<float>(predictions.begin() + static_cast<long>(at),
                                              predictions.begin() + static_cast<long>(at + n))}});
      at += n;
    }
    return out;
  }

  void check_health() override {
    float now = predict(probe_, 1).at(0);
    if (now != probe_answer_)
      throw std::runtime_error("the model answers " + std::to_string(now) + " for its probe row, " +
                               std::to_string(probe_answer_) + " when it was loaded");
  }

 private:
  // Reads {"features": [[...], ...]} into `rows` (row-major); "" when it is
  // well formed, else what is wrong with it. simdjson (Debian's
  // libsimdjson-dev) validates the whole body and reads its numbers: on this
  // path nlohmann's DOM was a fifth of the replica's time under batching
  // (docs/benchmarks.md). A key given twice counts as its last value, as in
  // a parsed document.
  std::string parse(const std::string& body, std::vector<float>& rows, size_t& n) const {
    // One parser per thread keeps its buffers between requests; a body over
    // kKeptBodyBytes gets a parser of its own, so that a large request does
    // not leave its memory with the thread.
    thread_local simdjson::dom::parser kept;
    std::optional<simdjson::dom::parser> own;
    simdjson::dom::parser& parser = body.size() > kKeptBodyBytes ? own.emplace() : kept;
    simdjson::dom::element doc;
    const auto error = parser.parse(body).get(doc);
    // simdjson reads every number as a 64-bit integer or a double: one
    // beyond both (1e400, a 25-digit integer) is refused with the number
    // syntax it cannot tell apart from.
    if (error == simdjson::NUMBER_ERROR)
      return "the body has a number that is not JSON or is beyond a 64-bit integer and a double";
    if (error != simdjson::SUCCESS)
      return "the body is not JSON";
    simdjson::dom::object top;
    simdjson::dom::array features;
    bool found = false;
    if (doc.get(top) == simdjson::SUCCESS)
      for (auto field : top)
        if (field.key == "features")
          found = field.value.get(features) == simdjson::SUCCESS;
    if (!found)
      return R"(the body needs "features": a list of rows)";
    const size_t count = size_of(features);
    if (count == 0)
      return R"("features" is empty)";
    if (count > kMaxRows)
      return R"("features" has )" + std::to_string(count) + " rows; at most " +
             std::to_string(kMaxRows) + " per request";
    rows.reserve(count * n_features_);
    size_t r = 0;
    for (simdjson::dom::element value : features) {
      simdjson::dom::array row;
      const bool is_row = value.get(row) == simdjson::SUCCESS;
      if (!is_row || size_of(row) != n_features_)
        return "row " + std::to_string(r) + " has " +
               (is_row ? std::to_string(size_of(row)) + " values" : std::string("no list")) +
               "; the model takes " + std::to_string(n_features_);
      size_t f = 0;
      for (simdjson::dom::element x : row) {
        switch (x.type()) {
          case simdjson::dom::element_type::DOUBLE:
            rows.push_back(static_cast<float>(double(x)));
            break;
          case simdjson::dom::element_type::INT64:
            rows.push_back(static_cast<float>(int64_t(x)));
            break;
          case simdjson::dom::element_type::UINT64:
            rows.push_back(static_cast<float>(uint64_t(x)));
            break;
          default:
            return "row " + std::to_string(r) + ", feature " + std::to_string(f) +
                   " is not a number";
        }
        ++f;
      }
      ++r;
    }
    n = count;
    return "";
  }

  // One prediction per row of `rows` (n rows of n_features_).
  std::vector<float> predict(const std::vector<float>& rows, size_t n) const {
    const troupe::Json array = {
        {"data", {reinterpret_cast<std::uintptr_t>(rows.data()), true}},
        {"shape", {n, n_features_}},
        {"typestr", "<f4"},
        {"version", 3}};
    static const std::string kConfig =
        R"({"type": 0, "training": false, "iteration_begin": 0, "iteration_end": 0, "strict_shape": false, "cache_id": 0, "missing": NaN})";
    const bst_ulong* shape = nullptr;
    bst_ulong dims = 0;
    const float* out = nullptr;
    check(XGBoosterPredictFromDense(booster_, array.dump().c_str(), kConfig.c_str(), nullptr,
                                    &shape, &dims, &out),
          "predicting");
    return std::vector<float>(out, out + n);
  }

  const std::string path_;
  BoosterHandle booster_ = nullptr;
  size_t n_features_ = 0;
  int n_trees_ = 0;
  troupe::ModelMetadata metadata_;
  std::vector<float> probe_;
  float probe_answer_ = 0;
};

TROUPE_DEPLOYMENT(XGBoostModel)
