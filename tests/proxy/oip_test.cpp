// The Open Inference Protocol at the ingress (proxy/oip.hpp): which paths and
// methods are the protocol's, and its gRPC messages to and from the REST
// bodies a deployment speaks, with messages built by protobuf's generated
// code from the repository's schemas/grpc_predict_v2.proto.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "grpc_predict_v2.pb.h"
#include "proxy/oip.hpp"

using nlohmann::json;
using troupe::errc;
namespace oip = troupe::proxy::oip;

namespace {

template <class T>
std::string bytes_of(std::initializer_list<T> values) {
  std::string out;
  for (T v : values) {
    char b[sizeof v];
    std::memcpy(b, &v, sizeof v);
    out.append(b, sizeof v);
  }
  return out;
}

std::string serialized(const google::protobuf::MessageLite& m) {
  std::string out;
  m.SerializeToString(&out);
  return out;
}

}  // namespace

TEST_CASE("oip: REST paths are parsed into the server's and the models' calls") {
  CHECK(oip::is_rest_path("/v2"));
  CHECK(oip::is_rest_path("/v2/models/m"));
  CHECK_FALSE(oip::is_rest_path("/v20"));
  CHECK_FALSE(oip::is_rest_path("/echo/v2"));

  CHECK(oip::parse_rest("/v2")->kind == oip::Kind::server_metadata);
  CHECK(oip::parse_rest("/v2/health/live")->kind == oip::Kind::live);
  CHECK(oip::parse_rest("/v2/health/ready")->kind == oip::Kind::ready);
  auto meta = oip::parse_rest("/v2/models/xgboost");
  CHECK(meta->kind == oip::Kind::model_metadata);
  CHECK(meta->model == "xgboost");
  CHECK(meta->version.empty());
  auto ready = oip::parse_rest("/v2/models/my%20model/versions/3/ready");
  CHECK(ready->kind == oip::Kind::model_ready);
  CHECK(ready->model == "my model");
  CHECK(ready->version == "3");
  auto infer = oip::parse_rest("/v2/models/m/infer");
  CHECK(infer->kind == oip::Kind::infer);
  CHECK(infer->model == "m");

  auto other = oip::parse_rest("/v2/models/m/explain");
  REQUIRE_FALSE(other);
  CHECK(other.status().code() == errc::not_found);
  CHECK(other.status().message() ==
        "'/v2/models/m/explain' is not a path of the Open Inference Protocol");
  CHECK(oip::parse_rest("/v2/repository/index").status().code() == errc::not_found);
  CHECK(oip::parse_rest("/v2/health").status().code() == errc::not_found);
  CHECK(oip::parse_rest("/v2/models/m%2/infer").status().code() == errc::invalid_argument);
}

TEST_CASE("oip: the gRPC service's methods by name") {
  CHECK(oip::is_grpc_method("/inference.GRPCInferenceService/ModelInfer"));
  CHECK_FALSE(oip::is_grpc_method("/greeter.Greeter/SayHello"));
  CHECK(*oip::grpc_kind("/inference.GRPCInferenceService/ServerLive") == oip::Kind::live);
  CHECK(*oip::grpc_kind("/inference.GRPCInferenceService/ModelReady") == oip::Kind::model_ready);
  auto unknown = oip::grpc_kind("/inference.GRPCInferenceService/RepositoryIndex");
  REQUIRE_FALSE(unknown);
  CHECK(unknown.status().message() ==
        "inference.GRPCInferenceService has no method 'RepositoryIndex'");
}

TEST_CASE("oip: a ModelInferRequest with typed contents becomes the REST body") {
  inference::ModelInferRequest r;
  r.set_model_name("xgboost");
  r.set_model_version("1");
  r.set_id("abc");
  (*r.mutable_parameters())["priority"].set_int64_param(3);
  auto* x = r.add_inputs();
  x->set_name("features");
  x->set_datatype("FP32");
  x->add_shape(1);
  x->add_shape(2);
  x->mutable_contents()->add_fp32_contents(0.5f);
  x->mutable_contents()->add_fp32_contents(-1.25f);
  auto* t = r.add_inputs();
  t->set_name("tags");
  t->set_datatype("BYTES");
  t->add_shape(1);
  t->mutable_contents()->add_bytes_contents("red");
  r.add_outputs()->set_name("predictions");

  auto call = oip::decode_call(oip::Kind::infer, serialized(r));
  REQUIRE(call);
  CHECK(call->model == "xgboost");
  CHECK(call->version == "1");
  CHECK_FALSE(call->raw);
  auto body = json::parse(call->json);
  CHECK(body["id"] == "abc");
  CHECK(body["parameters"] == json{{"priority", 3}});
  CHECK(
      body["inputs"][0] ==
      json{{"name", "features"}, {"datatype", "FP32"}, {"shape", {1, 2}}, {"data", {0.5, -1.25}}});
  CHECK(body["inputs"][1]["data"] == json{"red"});
  CHECK(body["outputs"] == json{{{"name", "predictions"}}});
}

TEST_CASE("oip: raw_input_contents are decoded by datatype and must fit their shape") {
  inference::ModelInferRequest r;
  r.set_model_name("m");
  auto add = [&](const char* name, const char* type, std::initializer_list<int64_t> shape,
                 std::string raw) {
    auto* in = r.add_inputs();
    in->set_name(name);
    in->set_datatype(type);
    for (int64_t d : shape)
      in->add_shape(d);
    r.add_raw_input_contents(std::move(raw));
  };
  add("f", "FP32", {2}, bytes_of<float>({1.5f, -2.0f}));
  add("i", "INT16", {3}, bytes_of<int16_t>({-7, 0, 300}));
  add("u", "UINT64", {1}, bytes_of<uint64_t>({uint64_t(1) << 60}));
  add("h", "FP16", {2}, bytes_of<uint16_t>({0x3c00, 0xc100}));  // 1.0, -2.5
  add("b", "BOOL", {2}, std::string("\x01\x00", 2));
  add("s", "BYTES", {2}, std::string("\x02\x00\x00\x00hi\x00\x00\x00\x00", 10));
  auto call = oip::decode_call(oip::Kind::infer, serialized(r));
  REQUIRE(call);
  CHECK(call->raw);
  auto in = json::parse(call->json)["inputs"];
  CHECK(in[0]["data"] == json{1.5, -2.0});
  CHECK(in[1]["data"] == json{-7, 0, 300});
  CHECK(in[2]["data"] == json{uint64_t(1) << 60});
  CHECK(in[3]["data"] == json{1.0, -2.5});
  CHECK(in[4]["data"] == json{true, false});
  CHECK(in[5]["data"] == json{"hi", ""});

  // Bytes that do not fit the shape, raw contents for some inputs only,
  // raw and typed contents together, FP16 without raw contents.
  inference::ModelInferRequest short_raw;
  short_raw.set_model_name("m");
  auto* f = short_raw.add_inputs();
  f->set_name("f");
  f->set_datatype("FP32");
  f->add_shape(3);
  short_raw.add_raw_input_contents(bytes_of<float>({1, 2}));
  CHECK(oip::decode_call(oip::Kind::infer, serialized(short_raw)).status().message() ==
        "input 'f' has 8 bytes of raw contents; its shape and datatype FP32 make 12");
  short_raw.add_inputs()->set_name("g");
  CHECK(oip::decode_call(oip::Kind::infer, serialized(short_raw)).status().message() ==
        "the request has 1 raw_input_contents for 2 inputs; give one per input, or none");

  inference::ModelInferRequest both;
  both.set_model_name("m");
  auto* g = both.add_inputs();
  g->set_name("g");
  g->set_datatype("FP32");
  g->add_shape(1);
  g->mutable_contents()->add_fp32_contents(1);
  both.add_raw_input_contents(bytes_of<float>({1}));
  CHECK(oip::decode_call(oip::Kind::infer, serialized(both)).status().message() ==
        "input 'g' has contents while the request has raw_input_contents; use one or the other");

  inference::ModelInferRequest half;
  half.set_model_name("m");
  auto* h = half.add_inputs();
  h->set_name("h");
  h->set_datatype("FP16");
  h->add_shape(1);
  CHECK(oip::decode_call(oip::Kind::infer, serialized(half)).status().message() ==
        "input 'h' is FP16, which only raw_input_contents can carry");
}

TEST_CASE("oip: malformed messages and unnamed models are refused with what is wrong") {
  auto garbage = oip::decode_call(oip::Kind::infer, std::string("\xff\xff\xff", 3));
  REQUIRE_FALSE(garbage);
  CHECK(garbage.status().code() == errc::invalid_argument);
  CHECK(garbage.status().message() == "the request is not a ModelInferRequest message");
  CHECK(oip::decode_call(oip::Kind::model_ready, std::string("\x0a\x05xy", 3)).status().message() ==
        "the request is not a ModelReadyRequest message");
  CHECK(oip::decode_call(oip::Kind::infer, "").status().message() ==
        "the request names no model (its 'model_name' is empty)");
  inference::ModelReadyRequest ready;
  ready.set_name("xgboost");
  ready.set_version("1");
  auto call = oip::decode_call(oip::Kind::model_ready, serialized(ready));
  REQUIRE(call);
  CHECK(call->model == "xgboost");
  CHECK(call->version == "1");

  inference::ModelInferRequest text;
  text.set_model_name("m");
  auto* s = text.add_inputs();
  s->set_name("s");
  s->set_datatype("BYTES");
  s->add_shape(1);
  s->mutable_contents()->add_bytes_contents(std::string("\xc3\x28", 2));
  CHECK(oip::decode_call(oip::Kind::infer, serialized(text))
            .status()
            .message()
            .find("is not UTF-8 text") != std::string::npos);
}

TEST_CASE("oip: the model's REST answers become gRPC messages - raw when the inputs were") {
  const std::string answer = R"({"model_name": "m", "model_version": "1", "id": "abc",
      "parameters": {"took_ms": 2.5},
      "outputs": [{"name": "p", "datatype": "FP32", "shape": [2], "data": [0.25, -1]},
                  {"name": "n", "datatype": "INT8", "shape": [1, 1], "data": [[-3]]}]})";
  auto typed = oip::encode_answer(oip::Kind::infer, answer, false);
  REQUIRE(typed);
  inference::ModelInferResponse t;
  REQUIRE(t.ParseFromString(*typed));
  CHECK(t.model_name() == "m");
  CHECK(t.model_version() == "1");
  CHECK(t.id() == "abc");
  CHECK(t.parameters().at("took_ms").double_param() == 2.5);
  REQUIRE(t.outputs_size() == 2);
  CHECK(t.outputs(0).shape_size() == 1);
  REQUIRE(t.outputs(0).contents().fp32_contents_size() == 2);
  CHECK(t.outputs(0).contents().fp32_contents(1) == -1.0f);
  CHECK(t.outputs(1).contents().int_contents(0) == -3);
  CHECK(t.raw_output_contents_size() == 0);

  auto raw = oip::encode_answer(oip::Kind::infer, answer, true);
  inference::ModelInferResponse r;
  REQUIRE(r.ParseFromString(*raw));
  REQUIRE(r.raw_output_contents_size() == 2);
  CHECK(r.raw_output_contents(0) == bytes_of<float>({0.25f, -1.0f}));
  CHECK(r.raw_output_contents(1) == bytes_of<int8_t>({-3}));
  CHECK(r.outputs(0).contents().fp32_contents_size() == 0);

  // FP16 has no typed contents: such an answer goes raw.
  auto half = oip::encode_answer(
      oip::Kind::infer,
      R"({"model_name": "m", "outputs": [{"name": "h", "datatype": "FP16", "shape": [2], "data": [1.0, -2.5]}]})",
      false);
  inference::ModelInferResponse h;
  REQUIRE(h.ParseFromString(*half));
  CHECK(h.raw_output_contents(0) == bytes_of<uint16_t>({0x3c00, 0xc100}));

  auto meta = oip::encode_answer(oip::Kind::model_metadata,
                                 R"({"name": "m", "versions": ["1"], "platform": "xgboost",
          "inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 30]}],
          "outputs": [{"name": "predictions", "datatype": "FP32", "shape": [-1]}]})",
                                 false);
  inference::ModelMetadataResponse m;
  REQUIRE(m.ParseFromString(*meta));
  CHECK(m.platform() == "xgboost");
  CHECK(m.inputs(0).shape(0) == -1);
  CHECK(m.inputs(0).shape(1) == 30);
  CHECK(m.outputs(0).name() == "predictions");

  auto broken = oip::encode_answer(
      oip::Kind::infer,
      R"({"outputs": [{"name": "p", "datatype": "FP32", "shape": [1], "data": ["x"]}]})", false);
  REQUIRE_FALSE(broken);
  CHECK(broken.status().code() == errc::internal);
  CHECK(broken.status().message() ==
        "the model's answer is not the protocol's: output 'p' (FP32) has the element \"x\"");
  CHECK(oip::encode_answer(oip::Kind::infer, "[1]", false).status().code() == errc::internal);
}

TEST_CASE("oip: the server's own messages") {
  inference::ServerLiveResponse live;
  REQUIRE(live.ParseFromString(oip::live_message(true)));
  CHECK(live.live());
  inference::ServerReadyResponse ready;
  REQUIRE(ready.ParseFromString(oip::ready_message(false)));
  CHECK_FALSE(ready.ready());
  inference::ServerMetadataResponse meta;
  REQUIRE(meta.ParseFromString(oip::server_metadata_message("troupe", "0.1.0")));
  CHECK(meta.name() == "troupe");
  CHECK(meta.version() == "0.1.0");
  CHECK(meta.extensions_size() == 0);
}

TEST_CASE("oip: NaN and infinities cross between messages and JSON as strings") {
  inference::ModelInferRequest r;
  r.set_model_name("m");
  auto* x = r.add_inputs();
  x->set_name("x");
  x->set_datatype("FP32");
  x->add_shape(3);
  r.add_raw_input_contents(bytes_of<float>(
      {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 1.5f}));
  auto call = oip::decode_call(oip::Kind::infer, serialized(r));
  REQUIRE(call);
  CHECK(json::parse(call->json)["inputs"][0]["data"] == json{"NaN", "Infinity", 1.5});

  auto answer = oip::encode_answer(
      oip::Kind::infer,
      R"({"outputs": [{"name": "p", "datatype": "FP64", "shape": [3], "data": ["-Infinity", "NaN", 2]}]})",
      false);
  REQUIRE(answer);
  inference::ModelInferResponse m;
  REQUIRE(m.ParseFromString(*answer));
  REQUIRE(m.outputs(0).contents().fp64_contents_size() == 3);
  CHECK(m.outputs(0).contents().fp64_contents(0) == -std::numeric_limits<double>::infinity());
  CHECK(std::isnan(m.outputs(0).contents().fp64_contents(1)));
  CHECK(oip::encode_answer(
            oip::Kind::infer,
            R"({"outputs": [{"name": "p", "datatype": "FP32", "shape": [1], "data": ["inf"]}]})",
            false)
            .status()
            .message() ==
        "the model's answer is not the protocol's: output 'p' (FP32) has the element \"inf\"");
}
