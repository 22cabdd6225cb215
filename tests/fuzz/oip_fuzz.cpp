// The Open Inference Protocol's untrusted input (docs/inference.md): a gRPC
// ModelInferRequest as the node converts it (proxy/oip.hpp), the REST body a
// replica parses and checks (include/troupe/inference.hpp), REST paths, and
// answers converted back to gRPC messages. The first byte picks which; the
// rest is the input. Never a crash; and whatever a model built on the tensor
// API answers with 200 converts to a gRPC message.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <google/protobuf/stubs/logging.h>
#include <troupe/inference.hpp>

#include "proxy/oip.hpp"

namespace oip = troupe::proxy::oip;
using troupe::DataType;

namespace {

// y = 2 * x (FP32, any shape of rank 2), plus the row count as INT64 and the
// tags (BYTES, any length) back when given.
class Doubler : public troupe::InferenceModel {
 public:
  troupe::ModelMetadata metadata() const override {
    return {"fuzz",
            {"1"},
            {{"x", DataType::fp32, {-1, -1}}},
            {{"y", DataType::fp32, {-1, -1}}, {"rows", DataType::int64, {1}}}};
  }
  troupe::InferResponse infer(const troupe::InferRequest& request) override {
    const troupe::Tensor& x = *request.input("x");
    troupe::Tensor y("y", DataType::fp32, x.shape);
    for (float v : x.fp32)
      y.fp32.push_back(2 * v);
    troupe::Tensor rows("rows", DataType::int64, {1});
    rows.ints.push_back(x.shape[0]);
    troupe::InferResponse out;
    out.outputs = {y, rows};
    return out;
  }
};

troupe::Request call(const std::string& body) {
  troupe::Request r;
  r.method = "POST";
  r.path = "/v2/models/fuzz/infer";
  r.headers = {{troupe::kOipHeader, "infer"}, {troupe::kOipModelHeader, "fuzz"}};
  r.body = body;
  return r;
}

// The model's answer to `body`; a 200 must convert to a gRPC message.
void answer(Doubler& model, const std::string& body, bool raw) {
  troupe::Response r = model.handle(call(body));
  auto batch = model.handle_batch({call(body), call(body)});
  if (batch.size() != 2 || batch[0].status != r.status) {
    std::fprintf(stderr, "a batch answered differently from one call\n");
    std::abort();
  }
  if (r.status != 200)
    return;
  if (!oip::encode_answer(oip::Kind::infer, r.body, raw)) {
    std::fprintf(stderr, "the model's answer did not convert: %s\n", r.body.c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // protobuf's lines about messages it cannot parse: the node sends them to
  // its debug log (oip::route_protobuf_log); here, nowhere.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  const std::string input(reinterpret_cast<const char*>(data) + 1, size - 1);
  Doubler model;
  switch (data[0] % 5) {
    case 0: {  // a ModelInferRequest, as the gRPC port gets it
      auto decoded = oip::decode_call(oip::Kind::infer, input);
      if (decoded)
        answer(model, decoded->json, decoded->raw);
      break;
    }
    case 1:  // a REST inference body
      answer(model, input, false);
      break;
    case 2:  // a REST path
      (void)oip::parse_rest("/v2" + input);
      break;
    case 3:  // an answer of some model
      (void)oip::encode_answer(oip::Kind::infer, input, size % 2);
      (void)oip::encode_answer(oip::Kind::model_metadata, input, false);
      (void)oip::encode_answer(oip::Kind::model_ready, input, false);
      break;
    default:  // ModelReady / ModelMetadata requests
      (void)oip::decode_call(oip::Kind::model_ready, input);
      (void)oip::decode_call(oip::Kind::model_metadata, input);
      break;
  }
  return 0;
}
