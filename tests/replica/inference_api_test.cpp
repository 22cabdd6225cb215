// The tensor API of the Open Inference Protocol (include/troupe/inference.hpp)
// without a node: requests marked as the node's proxy marks them go through
// troupe::InferenceModel::handle() and handle_batch() of a small model built
// here, and every kind of bad input is answered before infer() runs.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <troupe/inference.hpp>

namespace {

using troupe::DataType;
using troupe::Json;

// sum = x[:, 0] + x[:, 1] (FP32 [-1, 2]); also echoes an INT64 and a BYTES
// input when given, and counts its calls.
class Adder : public troupe::InferenceModel {
 public:
  troupe::ModelMetadata metadata() const override {
    return {"test",
            {"1", "2"},
            {{"x", DataType::fp32, {-1, 2}}},
            {{"sum", DataType::fp32, {-1}}, {"rows", DataType::int64, {1}}}};
  }
  troupe::InferResponse infer(const troupe::InferRequest& request) override {
    ++single;
    return answer(request);
  }
  std::vector<troupe::InferResponse> infer_batch(
      const std::vector<troupe::InferRequest>& requests) override {
    ++batches;
    batch_sizes.push_back(requests.size());
    if (throw_in_batch)
      throw std::runtime_error("the accelerator fell over");
    std::vector<troupe::InferResponse> out;
    for (const auto& r : requests)
      out.push_back(answer(r));
    return out;
  }
  bool ready() const override { return is_ready; }

  int single = 0;
  int batches = 0;
  std::vector<size_t> batch_sizes;
  bool throw_in_batch = false;
  bool is_ready = true;

 private:
  static troupe::InferResponse answer(const troupe::InferRequest& request) {
    const troupe::Tensor& x = *request.input("x");
    if (x.shape[0] > 100)
      throw troupe::BadInput("at most 100 rows");
    troupe::Tensor sum("sum", DataType::fp32, {x.shape[0]});
    for (int64_t r = 0; r < x.shape[0]; ++r)
      sum.fp32.push_back(x.fp32[size_t(2 * r)] + x.fp32[size_t(2 * r + 1)]);
    troupe::Tensor rows("rows", DataType::int64, {1});
    rows.ints.push_back(x.shape[0]);
    troupe::InferResponse out;
    out.outputs = {sum, rows};
    return out;
  }
};

troupe::Request oip(const std::string& kind, const std::string& body = "",
                    const std::string& version = "") {
  troupe::Request r;
  r.method = kind == "infer" ? "POST" : "GET";
  r.path = "/v2/models/adder/infer";
  r.headers = {{troupe::kOipHeader, kind}, {troupe::kOipModelHeader, "adder"}};
  if (!version.empty())
    r.headers.emplace_back(troupe::kOipVersionHeader, version);
  r.body = body;
  return r;
}

std::string infer_body(const Json& data, const Json& shape = {2, 2},
                       const std::string& datatype = "FP32") {
  return Json{
      {"id", "call-7"},
      {"inputs", {{{"name", "x"}, {"datatype", datatype}, {"shape", shape}, {"data", data}}}}}
      .dump();
}

bool speaks_protocol(const troupe::Response& r) {
  for (const auto& [k, v] : r.headers) {
    if (k == troupe::kOipHeader)
      return true;
  }
  return false;
}

}  // namespace

TEST_CASE("inference model: infer answers named tensors with the model's name and the call's id") {
  Adder m;
  auto r = m.handle(oip("infer", infer_body({{1.5, 2}, {3, 4.25}}), "2"));
  REQUIRE(r.status == 200);
  CHECK(speaks_protocol(r));
  auto j = Json::parse(r.body);
  CHECK(j["model_name"] == "adder");
  CHECK(j["model_version"] == "2");
  CHECK(j["id"] == "call-7");
  REQUIRE(j["outputs"].size() == 2);
  CHECK(j["outputs"][0]["name"] == "sum");
  CHECK(j["outputs"][0]["datatype"] == "FP32");
  CHECK(j["outputs"][0]["shape"] == Json{2});
  CHECK(j["outputs"][0]["data"] == Json{3.5, 7.25});
  CHECK(j["outputs"][1]["data"] == Json{2});
  CHECK(m.single == 1);

  // Flat data is the same tensor; asking for one output keeps only it.
  auto flat = Json::parse(infer_body({1, 2, 3, 4}));
  flat["outputs"] = {{{"name", "rows"}}};
  auto only = Json::parse(m.handle(oip("infer", flat.dump())).body);
  REQUIRE(only["outputs"].size() == 1);
  CHECK(only["outputs"][0]["name"] == "rows");
  CHECK(only.contains("model_version") == false);
}

TEST_CASE("inference model: metadata and readiness") {
  Adder m;
  auto meta = Json::parse(m.handle(oip("metadata")).body);
  CHECK(meta["name"] == "adder");
  CHECK(meta["platform"] == "test");
  CHECK(meta["versions"] == Json{"1", "2"});
  CHECK(meta["inputs"] == Json{{{"name", "x"}, {"datatype", "FP32"}, {"shape", {-1, 2}}}});
  CHECK(meta["outputs"][1] == Json{{"name", "rows"}, {"datatype", "INT64"}, {"shape", {1}}});

  CHECK(Json::parse(m.handle(oip("ready")).body)["ready"] == true);
  m.is_ready = false;
  auto not_ready = m.handle(oip("ready"));
  CHECK(not_ready.status == 200);  // the node turns it into the transport's "not ready"
  CHECK(Json::parse(not_ready.body)["ready"] == false);

  auto unknown = m.handle(oip("metadata", "", "3"));
  CHECK(unknown.status == 404);
  CHECK(Json::parse(unknown.body)["error"] == "model 'adder' has no version '3'");
}

TEST_CASE("inference model: bad input is a 400 naming the problem and never reaches infer") {
  Adder m;
  struct Case {
    std::string body;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"{", "the body is not JSON"},
      {"[]", "the body is not a JSON object"},
      {"{}", "the body has no \"inputs\" list"},
      {infer_body({1, 2, 3}),
       "input 'x' has shape [2, 2], which holds 4 elements, and 3 elements "
       "of data"},
      {infer_body({1, 2, 3, 4}, {4}),
       "input 'x' has shape [4]; the model takes [-1, 2] (-1: any "
       "size)"},
      {infer_body({1, 2, 3, 4}, {2, 2}, "INT32"), "input 'x' is INT32; the model takes FP32"},
      {infer_body({1, "two", 3, 4}), "input 0 ('x'): a FP32 element is \"two\""},
      {infer_body({1, 2, 3, 4}, {2, 2}, "FLOAT"),
       "input 0 ('x') has datatype \"FLOAT\", which is not one of the protocol's (BOOL, "
       "UINT8..UINT64, INT8..INT64, FP16, FP32, FP64, BYTES)"},
      {infer_body({1, 2, 3, 4}, {2, -2}),
       "input 0 ('x') has a shape element that is not a size: -2"},
      {R"({"inputs": [{"name": "y", "datatype": "FP32", "shape": [1], "data": [1]}]})",
       "the model has no input 'y'"},
      {R"({"inputs": []})", "the request has no input 'x', which the model needs"},
      {R"({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]},
                      {"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]})",
       "input 'x' is given 2 times"},
      {R"({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}],
           "outputs": [{"name": "product"}]})",
       "the model has no output 'product'"},
      {R"({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2]}]})",
       "input 0 ('x') has no \"data\""},
  };
  for (const auto& c : cases) {
    CAPTURE(c.body);
    auto r = m.handle(oip("infer", c.body));
    CHECK(r.status == 400);
    CHECK(speaks_protocol(r));
    CHECK(Json::parse(r.body)["error"] == c.error);
  }
  CHECK(m.single == 0);
  // What only the model sees: its own BadInput, a 400 with its message.
  std::vector<float> many(202, 1.0f);
  auto r = m.handle(oip("infer", infer_body(many, {101, 2})));
  CHECK(r.status == 400);
  CHECK(Json::parse(r.body)["error"] == "at most 100 rows");
  // A version the model does not have is a 404.
  auto v = m.handle(oip("infer", infer_body({1, 2, 3, 4}), "9"));
  CHECK(v.status == 404);
}

TEST_CASE("inference model: integer ranges and BOOL and BYTES inputs are checked per datatype") {
  troupe::Tensor t("t", DataType::int8, {2});
  CHECK(troupe::oip::flatten(Json{1, 200}, t) == "a INT8 element is out of range: 200");
  troupe::Tensor u("u", DataType::uint16, {2});
  CHECK(troupe::oip::flatten(Json{1, -1}, u) == "a UINT16 element is -1");
  troupe::Tensor b("b", DataType::boolean, {2});
  CHECK(troupe::oip::flatten(Json{true, 1}, b) == "a BOOL element is 1");
  troupe::Tensor s("s", DataType::bytes, {2});
  CHECK(troupe::oip::flatten(Json{"a", "b"}, s).empty());
  CHECK(s.bytes == std::vector<std::string>{"a", "b"});
  troupe::Tensor big("i", DataType::int64, {1});
  CHECK(troupe::oip::flatten(Json{uint64_t(1) << 63}, big) ==
        "a INT64 element is out of range: 9223372036854775808");
}

TEST_CASE("inference model: a batch runs its inference calls together and answers each its own") {
  Adder m;
  std::vector<troupe::Request> batch = {
      oip("infer", infer_body({1, 2, 3, 4})),
      oip("infer", infer_body({1, 2, 3})),  // bad: answered alone, left out
      oip("metadata"),
      oip("infer", infer_body({10, 20, 30, 40, 50, 60}, {3, 2})),
  };
  troupe::Request plain;
  plain.method = "GET";
  plain.path = "/";
  batch.push_back(plain);
  auto out = m.handle_batch(batch);
  REQUIRE(out.size() == 5);
  CHECK(m.batches == 1);
  CHECK(m.batch_sizes == std::vector<size_t>{2});
  CHECK(Json::parse(out[0].body)["outputs"][0]["data"] == Json{3, 7});
  CHECK(out[1].status == 400);
  CHECK(Json::parse(out[2].body)["name"] == "adder");
  CHECK(Json::parse(out[3].body)["outputs"][0]["data"] == Json{30, 70, 110});
  // Not a protocol call: the class's own REST API, here the default 404.
  CHECK(out[4].status == 404);
  CHECK_FALSE(speaks_protocol(out[4]));

  // A batch that throws fails its inference calls only.
  m.throw_in_batch = true;
  auto failed = m.handle_batch({oip("infer", infer_body({1, 2, 3, 4})), oip("metadata")});
  CHECK(failed[0].status == 500);
  CHECK(Json::parse(failed[0].body)["error"] == "the model failed: the accelerator fell over");
  CHECK(failed[1].status == 200);
}

TEST_CASE("inference model: NaN and infinities travel as strings in JSON both ways") {
  troupe::Tensor t("t", DataType::fp32, {3});
  CHECK(troupe::oip::flatten(Json{"NaN", "Infinity", "-Infinity"}, t).empty());
  REQUIRE(t.fp32.size() == 3);
  CHECK(std::isnan(t.fp32[0]));
  CHECK(t.fp32[1] == std::numeric_limits<float>::infinity());
  CHECK(t.fp32[2] == -std::numeric_limits<float>::infinity());
  troupe::Tensor d("d", DataType::fp64, {1});
  CHECK(troupe::oip::flatten(Json{"nan"}, d) == "a FP64 element is \"nan\"");
  CHECK(troupe::oip::tensor_data(t) == Json{"NaN", "Infinity", "-Infinity"});

  // A model that doubles its input answers infinity for a huge value.
  Adder m;
  auto r = m.handle(oip("infer", infer_body({3e38, 3e38, "NaN", 1})));
  REQUIRE(r.status == 200);
  CHECK(Json::parse(r.body)["outputs"][0]["data"] == Json{"Infinity", "NaN"});
}
