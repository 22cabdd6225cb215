// The Open Inference Protocol (KServe v2) for a deployment: implement
// inference once, on tensors, and every node serves it over REST (the HTTP
// ingress) and gRPC (`inference.GRPCInferenceService` on the gRPC port).
//
//   class Adder : public troupe::InferenceModel {
//    public:
//     explicit Adder(const troupe::Json&) {}
//     troupe::ModelMetadata metadata() const override {
//       return {"cpp", {"1"}, {{"x", troupe::DataType::fp32, {-1, 2}}},
//               {{"sum", troupe::DataType::fp32, {-1}}}};
//     }
//     troupe::InferResponse infer(const troupe::InferRequest& request) override {
//       const troupe::Tensor& x = *request.input("x");  // checked against metadata()
//       troupe::Tensor sum("sum", troupe::DataType::fp32, {x.shape[0]});
//       for (int64_t r = 0; r < x.shape[0]; ++r)
//         sum.fp32.push_back(x.fp32[2 * r] + x.fp32[2 * r + 1]);
//       return troupe::InferResponse{{sum}};
//     }
//   };
//   TROUPE_DEPLOYMENT(Adder)
//
// and in the config, on the application (whose name is the model's name):
//
//   - name: adder
//     open_inference: true
//
// Before infer() runs, the request is checked against metadata(): every
// input it declares is there once, with its datatype, a shape that fits
// (-1 matches any size) and as many elements as the shape says; no input it
// does not declare; requested outputs it declares; a version it lists. A
// request that fails gets a 400 (INVALID_ARGUMENT) or, for a version, a 404
// (NOT_FOUND) naming the problem, and never reaches infer(). infer() may
// throw troupe::BadInput for what only it can see (a 400 with its message);
// any other exception is a 500.
//
// Batching: with `max_batch_size` above 1 the runtime hands the inference
// calls of a batch to infer_batch() at once; its default calls infer() per
// request; a model overrides it to run the rows of all the requests as one
// matrix (examples/xgboost/xgboost_model.cpp).
//
// Requests that are not Open Inference calls (those to the application's own
// route_prefix) go to handle_http(), whose default is a 404.
//
// Everything here is inline: it adds nothing to the deployment ABI
// (kDeploymentAbiVersion). docs/inference.md describes the protocol's
// endpoints and how troupe serves them.
#pragma once

#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <troupe/deployment.hpp>

namespace troupe {

// The protocol's tensor datatypes.
enum class DataType {
  boolean,
  uint8,
  uint16,
  uint32,
  uint64,
  int8,
  int16,
  int32,
  int64,
  fp16,
  fp32,
  fp64,
  bytes
};

// "BOOL", "UINT8", ..., "FP32", "BYTES": the protocol's names.
inline const char* datatype_name(DataType t) {
  static const char* const names[] = {"BOOL", "UINT8", "UINT16", "UINT32", "UINT64",
                                      "INT8", "INT16", "INT32",  "INT64",  "FP16",
                                      "FP32", "FP64",  "BYTES"};
  return names[static_cast<int>(t)];
}

inline std::optional<DataType> parse_datatype(std::string_view name) {
  for (int i = 0; i <= static_cast<int>(DataType::bytes); ++i) {
    if (name == datatype_name(static_cast<DataType>(i)))
      return static_cast<DataType>(i);
  }
  return std::nullopt;
}

// A request the model cannot take: answered 400 (REST) or INVALID_ARGUMENT
// (gRPC) with the message.
class BadInput : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A named tensor: its elements flattened in row-major order, in the one
// member its datatype uses (like the protocol's InferTensorContents):
//   BOOL -> booleans; INT8..INT64 -> ints; UINT8..UINT64 -> uints;
//   FP16 and FP32 -> fp32; FP64 -> fp64; BYTES -> bytes.
struct Tensor {
  std::string name;
  DataType datatype = DataType::fp32;
  std::vector<int64_t> shape;
  std::vector<bool> booleans;
  std::vector<int64_t> ints;
  std::vector<uint64_t> uints;
  std::vector<float> fp32;
  std::vector<double> fp64;
  std::vector<std::string> bytes;

  Tensor() = default;
  Tensor(std::string n, DataType t, std::vector<int64_t> s)
      : name(std::move(n)), datatype(t), shape(std::move(s)) {}

  // How many elements the shape holds (1 for a scalar: shape []).
  int64_t elements() const {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return n;
  }
  // How many elements the member of its datatype holds.
  size_t stored() const {
    switch (datatype) {
      case DataType::boolean:
        return booleans.size();
      case DataType::int8:
      case DataType::int16:
      case DataType::int32:
      case DataType::int64:
        return ints.size();
      case DataType::uint8:
      case DataType::uint16:
      case DataType::uint32:
      case DataType::uint64:
        return uints.size();
      case DataType::fp16:
      case DataType::fp32:
        return fp32.size();
      case DataType::fp64:
        return fp64.size();
      case DataType::bytes:
        return bytes.size();
    }
    return 0;
  }
};

// An input or output as the model declares it: shape -1 for any size.
struct TensorSpec {
  std::string name;
  DataType datatype = DataType::fp32;
  std::vector<int64_t> shape;
};

// What GET /v2/models/<name> (and ModelMetadata) answers; the name is the
// application's.
struct ModelMetadata {
  std::string platform;               // e.g. "xgboost"
  std::vector<std::string> versions;  // empty: the model has no versions
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
};

struct InferRequest {
  std::string model_name;
  std::string model_version;  // "": any
  std::string id;             // the client's, echoed in the answer
  Json parameters = Json::object();
  std::vector<Tensor> inputs;
  // The outputs asked for by name; empty: all of them. The runtime keeps
  // only these in the answer.
  std::vector<std::string> outputs;

  // The input named `name`; null when there is none.
  const Tensor* input(std::string_view name) const {
    for (const auto& t : inputs) {
      if (t.name == name)
        return &t;
    }
    return nullptr;
  }
};

struct InferResponse {
  std::vector<Tensor> outputs;
  Json parameters = Json::object();
  // Filled in by the runtime from the request when left empty.
  std::string model_name;
  std::string model_version;
  std::string id;
};

// The headers by which the node's proxy marks an Open Inference call to the
// application's ingress deployment (it drops clients' own): the call's kind
// ("infer", "metadata" or "ready"), the model and the version it names.
// The deployment's answers carry kOipHeader too, which tells the proxy that
// the class speaks the protocol.
inline constexpr const char* kOipHeader = "troupe-oip";
inline constexpr const char* kOipModelHeader = "troupe-oip-model";
inline constexpr const char* kOipVersionHeader = "troupe-oip-version";

namespace oip {

// JSON has no NaN or infinities: in a tensor's data they are the strings
// "NaN", "Infinity" and "-Infinity" (a model may well take or give them:
// XGBoost reads NaN as a missing value).
inline bool non_finite(const Json& j, double& out) {
  if (!j.is_string())
    return false;
  const auto& s = j.get_ref<const std::string&>();
  if (s == "NaN")
    out = std::numeric_limits<double>::quiet_NaN();
  else if (s == "Infinity")
    out = std::numeric_limits<double>::infinity();
  else if (s == "-Infinity")
    out = -std::numeric_limits<double>::infinity();
  else
    return false;
  return true;
}

// A float element as JSON: a number, or one of those strings.
inline Json float_json(double v) {
  if (std::isfinite(v))
    return v;
  return std::isnan(v) ? "NaN" : v > 0 ? "Infinity" : "-Infinity";
}

template <class T>
Json float_data(const std::vector<T>& values) {
  Json out = Json::array();
  for (T v : values)
    out.push_back(float_json(v));
  return out;
}

inline Response error(int status, const std::string& message) {
  Response r = Response::json({{"error", message}}, status);
  r.headers.emplace_back(kOipHeader, "1");
  return r;
}

inline Response answer(const Json& body, int status = 200) {
  Response r = Response::json(body, status);
  r.headers.emplace_back(kOipHeader, "1");
  return r;
}

// `data` (nested lists or flat) appended to `out` in row-major order;
// "" when every element fits the datatype, else what is wrong.
inline std::string flatten(const Json& data, Tensor& out) {
  if (data.is_array()) {
    for (const auto& d : data) {
      if (auto problem = flatten(d, out); !problem.empty())
        return problem;
    }
    return "";
  }
  switch (out.datatype) {
    case DataType::boolean:
      if (!data.is_boolean())
        return "a BOOL element is " + data.dump();
      out.booleans.push_back(data.get<bool>());
      return "";
    case DataType::int8:
    case DataType::int16:
    case DataType::int32:
    case DataType::int64: {
      if (!data.is_number_integer())
        return std::string("a ") + datatype_name(out.datatype) + " element is " + data.dump();
      if (data.is_number_unsigned() && data.get<uint64_t>() > uint64_t(INT64_MAX))
        return std::string("a ") + datatype_name(out.datatype) +
               " element is out of range: " + data.dump();
      int64_t v = data.get<int64_t>();
      int bits = out.datatype == DataType::int8    ? 8
                 : out.datatype == DataType::int16 ? 16
                 : out.datatype == DataType::int32 ? 32
                                                   : 64;
      if (bits < 64 && (v < -(int64_t(1) << (bits - 1)) || v >= (int64_t(1) << (bits - 1))))
        return std::string("a ") + datatype_name(out.datatype) +
               " element is out of range: " + data.dump();
      out.ints.push_back(v);
      return "";
    }
    case DataType::uint8:
    case DataType::uint16:
    case DataType::uint32:
    case DataType::uint64: {
      if (!data.is_number_integer() || (!data.is_number_unsigned() && data.get<int64_t>() < 0))
        return std::string("a ") + datatype_name(out.datatype) + " element is " + data.dump();
      uint64_t v = data.get<uint64_t>();
      int bits = out.datatype == DataType::uint8    ? 8
                 : out.datatype == DataType::uint16 ? 16
                 : out.datatype == DataType::uint32 ? 32
                                                    : 64;
      if (bits < 64 && v >= (uint64_t(1) << bits))
        return std::string("a ") + datatype_name(out.datatype) +
               " element is out of range: " + data.dump();
      out.uints.push_back(v);
      return "";
    }
    case DataType::fp16:
    case DataType::fp32: {
      double special = 0;
      if (non_finite(data, special)) {
        out.fp32.push_back(static_cast<float>(special));
        return "";
      }
      if (!data.is_number())
        return std::string("a ") + datatype_name(out.datatype) + " element is " + data.dump();
      out.fp32.push_back(data.get<float>());
      return "";
    }
    case DataType::fp64: {
      double special = 0;
      if (non_finite(data, special)) {
        out.fp64.push_back(special);
        return "";
      }
      if (!data.is_number())
        return "a FP64 element is " + data.dump();
      out.fp64.push_back(data.get<double>());
      return "";
    }
    case DataType::bytes:
      if (!data.is_string())
        return "a BYTES element is " + data.dump();
      out.bytes.push_back(data.get<std::string>());
      return "";
  }
  return "";
}

inline Json tensor_data(const Tensor& t) {
  switch (t.datatype) {
    case DataType::boolean:
      return Json(t.booleans);
    case DataType::int8:
    case DataType::int16:
    case DataType::int32:
    case DataType::int64:
      return Json(t.ints);
    case DataType::uint8:
    case DataType::uint16:
    case DataType::uint32:
    case DataType::uint64:
      return Json(t.uints);
    case DataType::fp16:
    case DataType::fp32:
      return float_data(t.fp32);
    case DataType::fp64:
      return float_data(t.fp64);
    case DataType::bytes:
      return Json(t.bytes);
  }
  return Json::array();
}

// One tensor of a REST body ({"name", "shape", "datatype", "data"}); throws
// BadInput naming `where` and the problem.
inline Tensor parse_tensor(const Json& j, const std::string& where) {
  if (!j.is_object())
    throw BadInput(where + " is not an object");
  if (!j.contains("name") || !j["name"].is_string())
    throw BadInput(where + " has no \"name\"");
  Tensor t;
  t.name = j["name"].get<std::string>();
  const std::string self = where + " ('" + t.name + "')";
  if (!j.contains("datatype") || !j["datatype"].is_string())
    throw BadInput(self + " has no \"datatype\"");
  auto type = parse_datatype(j["datatype"].get<std::string>());
  if (!type)
    throw BadInput(self + " has datatype " + j["datatype"].dump() +
                   ", which is not one of the protocol's (BOOL, UINT8..UINT64, INT8..INT64, "
                   "FP16, FP32, FP64, BYTES)");
  t.datatype = *type;
  if (!j.contains("shape") || !j["shape"].is_array())
    throw BadInput(self + " has no \"shape\" list");
  for (const auto& d : j["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      throw BadInput(self + " has a shape element that is not a size: " + d.dump());
    t.shape.push_back(d.get<int64_t>());
  }
  if (!j.contains("data"))
    throw BadInput(self + " has no \"data\"");
  if (auto problem = flatten(j["data"], t); !problem.empty())
    throw BadInput(self + ": " + problem);
  return t;
}

// A REST inference body into `request` (model name and version from the
// path); throws BadInput.
inline InferRequest parse_infer(const std::string& body) {
  Json doc = Json::parse(body, nullptr, false);
  if (doc.is_discarded())
    throw BadInput("the body is not JSON");
  if (!doc.is_object())
    throw BadInput("the body is not a JSON object");
  InferRequest r;
  if (doc.contains("id")) {
    if (!doc["id"].is_string())
      throw BadInput("\"id\" is not a string");
    r.id = doc["id"].get<std::string>();
  }
  if (doc.contains("parameters")) {
    if (!doc["parameters"].is_object())
      throw BadInput("\"parameters\" is not an object");
    r.parameters = doc["parameters"];
  }
  if (!doc.contains("inputs") || !doc["inputs"].is_array())
    throw BadInput("the body has no \"inputs\" list");
  const auto& inputs = doc["inputs"];
  for (size_t i = 0; i < inputs.size(); ++i)
    r.inputs.push_back(parse_tensor(inputs[i], "input " + std::to_string(i)));
  if (doc.contains("outputs")) {
    if (!doc["outputs"].is_array())
      throw BadInput("\"outputs\" is not a list");
    for (const auto& o : doc["outputs"]) {
      if (!o.is_object() || !o.contains("name") || !o["name"].is_string())
        throw BadInput("an entry of \"outputs\" has no \"name\"");
      r.outputs.push_back(o["name"].get<std::string>());
    }
  }
  return r;
}

inline std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Throws BadInput when `request` does not fit `meta` (see the top of this
// file); checks element counts against shapes.
inline void check_request(const InferRequest& request, const ModelMetadata& meta) {
  for (const auto& t : request.inputs) {
    const TensorSpec* spec = nullptr;
    for (const auto& s : meta.inputs) {
      if (s.name == t.name)
        spec = &s;
    }
    if (!spec)
      throw BadInput("the model has no input '" + t.name + "'");
    int seen = 0;
    for (const auto& other : request.inputs)
      seen += other.name == t.name;
    if (seen > 1)
      throw BadInput("input '" + t.name + "' is given " + std::to_string(seen) + " times");
    if (t.datatype != spec->datatype)
      throw BadInput("input '" + t.name + "' is " + datatype_name(t.datatype) +
                     "; the model takes " + datatype_name(spec->datatype));
    bool fits = t.shape.size() == spec->shape.size();
    for (size_t d = 0; fits && d < t.shape.size(); ++d)
      fits = spec->shape[d] < 0 || spec->shape[d] == t.shape[d];
    if (!fits)
      throw BadInput("input '" + t.name + "' has shape " + shape_text(t.shape) +
                     "; the model takes " + shape_text(spec->shape) + " (-1: any size)");
    if (int64_t(t.stored()) != t.elements())
      throw BadInput("input '" + t.name + "' has shape " + shape_text(t.shape) + ", which holds " +
                     std::to_string(t.elements()) + " elements, and " + std::to_string(t.stored()) +
                     " elements of data");
  }
  for (const auto& s : meta.inputs) {
    if (!request.input(s.name))
      throw BadInput("the request has no input '" + s.name + "', which the model needs");
  }
  for (const auto& o : request.outputs) {
    bool known = false;
    for (const auto& s : meta.outputs)
      known = known || s.name == o;
    if (!known)
      throw BadInput("the model has no output '" + o + "'");
  }
}

inline Json metadata_json(const std::string& name, const ModelMetadata& meta) {
  auto specs = [](const std::vector<TensorSpec>& list) {
    Json out = Json::array();
    for (const auto& s : list)
      out.push_back(
          {{"name", s.name}, {"datatype", datatype_name(s.datatype)}, {"shape", s.shape}});
    return out;
  };
  return {{"name", name},
          {"versions", meta.versions},
          {"platform", meta.platform},
          {"inputs", specs(meta.inputs)},
          {"outputs", specs(meta.outputs)}};
}

// The REST answer of an inference, keeping only the outputs asked for.
inline Json response_json(const InferRequest& request, InferResponse response) {
  Json outputs = Json::array();
  for (const auto& t : response.outputs) {
    bool wanted = request.outputs.empty();
    for (const auto& o : request.outputs)
      wanted = wanted || o == t.name;
    if (!wanted)
      continue;
    if (int64_t(t.stored()) != t.elements())
      throw std::logic_error("output '" + t.name + "' has shape " + shape_text(t.shape) + " and " +
                             std::to_string(t.stored()) + " elements of data");
    outputs.push_back({{"name", t.name},
                       {"datatype", datatype_name(t.datatype)},
                       {"shape", t.shape},
                       {"data", tensor_data(t)}});
  }
  Json out = {
      {"model_name", response.model_name.empty() ? request.model_name : response.model_name},
      {"outputs", std::move(outputs)}};
  std::string version =
      response.model_version.empty() ? request.model_version : response.model_version;
  if (!version.empty())
    out["model_version"] = version;
  std::string id = response.id.empty() ? request.id : response.id;
  if (!id.empty())
    out["id"] = id;
  if (!response.parameters.empty())
    out["parameters"] = response.parameters;
  return out;
}

}  // namespace oip

class InferenceModel : public Deployment {
 public:
  // The model's inputs and outputs; called for every inference call (keep it
  // cheap: build it once, in the constructor).
  virtual ModelMetadata metadata() const = 0;
  // One inference: the request fits metadata() (checked before).
  virtual InferResponse infer(const InferRequest& request) = 0;
  // The inference calls of one batch (max_batch_size above 1), in order;
  // one answer each. Default: infer() for each.
  virtual std::vector<InferResponse> infer_batch(const std::vector<InferRequest>& requests) {
    std::vector<InferResponse> out;
    out.reserve(requests.size());
    for (const auto& r : requests)
      out.push_back(infer(r));
    return out;
  }
  // Whether the model takes inference calls now (ModelReady); the node
  // answers "not ready" on its own while the application has no replica
  // that passed its health check.
  virtual bool ready() const { return true; }
  // Requests that are not Open Inference calls: those to the application's
  // route_prefix. Default: 404.
  virtual Response handle_http(const Request& request) {
    return Response::json({{"error",
                            "this model is served by the Open Inference Protocol: "
                            "/v2/models/<application>/infer; '" +
                                request.path + "' is not"}},
                          404);
  }

  // The requests of a batch that are not Open Inference calls. Default:
  // handle_http() for each.
  virtual std::vector<Response> handle_http_batch(const std::vector<Request>& requests) {
    std::vector<Response> out;
    out.reserve(requests.size());
    for (const auto& r : requests)
      out.push_back(handle_http(r));
    return out;
  }

  Response handle(const Request& request) final {
    const std::string kind = request.header(kOipHeader);
    if (kind.empty())
      return handle_http(request);
    const ModelMetadata meta = metadata();
    const std::string model = request.header(kOipModelHeader);
    const std::string version = request.header(kOipVersionHeader);
    if (!version.empty() && !has_version(meta, version))
      return oip::error(404, "model '" + model + "' has no version '" + version + "'");
    if (kind == "metadata")
      return oip::answer(oip::metadata_json(model, meta));
    if (kind == "ready") {
      bool now = ready();
      // 200 either way: the node answers the transport's "not ready" (a
      // 4xx over REST, `ready: false` over gRPC).
      return oip::answer({{"name", model}, {"ready", now}});
    }
    if (kind != "infer")
      return oip::error(400, "unknown Open Inference call '" + kind + "'");
    InferRequest call;
    if (auto bad = prepare(request, meta, call))
      return std::move(*bad);
    try {
      return oip::answer(oip::response_json(call, infer(call)));
    } catch (const BadInput& e) {
      return oip::error(400, e.what());
    } catch (const std::exception& e) {
      return oip::error(500, std::string("the model failed: ") + e.what());
    }
  }

  // Inference calls of a batch go to infer_batch() together (each bad one
  // gets its own 400 and stays out), other requests to handle_http_batch(),
  // the protocol's other calls one by one.
  std::vector<Response> handle_batch(const std::vector<Request>& requests) final {
    bool any = false;
    for (const auto& r : requests)
      any = any || !r.header(kOipHeader).empty();
    if (!any)
      return handle_http_batch(requests);
    std::vector<Response> out(requests.size());
    std::vector<InferRequest> calls;
    std::vector<size_t> index;
    std::vector<Request> plain;
    std::vector<size_t> plain_index;
    ModelMetadata meta;
    bool have_meta = false;
    for (size_t i = 0; i < requests.size(); ++i) {
      const std::string kind = requests[i].header(kOipHeader);
      if (kind.empty()) {
        plain.push_back(requests[i]);
        plain_index.push_back(i);
        continue;
      }
      if (kind != "infer") {
        out[i] = handle(requests[i]);
        continue;
      }
      if (!have_meta) {
        meta = metadata();
        have_meta = true;
      }
      const std::string version = requests[i].header(kOipVersionHeader);
      if (!version.empty() && !has_version(meta, version)) {
        out[i] = oip::error(404, "model '" + requests[i].header(kOipModelHeader) +
                                     "' has no version '" + version + "'");
        continue;
      }
      InferRequest call;
      if (auto bad = prepare(requests[i], meta, call)) {
        out[i] = std::move(*bad);
        continue;
      }
      calls.push_back(std::move(call));
      index.push_back(i);
    }
    if (!plain.empty()) {
      std::vector<Response> answers = handle_http_batch(plain);
      if (answers.size() != plain.size())
        throw std::logic_error("handle_http_batch() gave " + std::to_string(answers.size()) +
                               " answers to " + std::to_string(plain.size()) + " requests");
      for (size_t k = 0; k < plain.size(); ++k)
        out[plain_index[k]] = std::move(answers[k]);
    }
    if (calls.empty())
      return out;
    try {
      std::vector<InferResponse> answers = infer_batch(calls);
      if (answers.size() != calls.size())
        throw std::logic_error("infer_batch() gave " + std::to_string(answers.size()) +
                               " answers to " + std::to_string(calls.size()) + " requests");
      for (size_t k = 0; k < calls.size(); ++k)
        out[index[k]] = oip::answer(oip::response_json(calls[k], std::move(answers[k])));
    } catch (const BadInput& e) {
      for (size_t i : index)
        out[i] = oip::error(400, e.what());
    } catch (const std::exception& e) {
      for (size_t i : index)
        out[i] = oip::error(500, std::string("the model failed: ") + e.what());
    }
    return out;
  }

 private:
  static bool has_version(const ModelMetadata& meta, const std::string& version) {
    for (const auto& v : meta.versions) {
      if (v == version)
        return true;
    }
    return false;
  }

  // Parses and checks an inference call; the error answer when it is bad.
  static std::optional<Response> prepare(const Request& request, const ModelMetadata& meta,
                                         InferRequest& call) {
    try {
      call = oip::parse_infer(request.body);
      call.model_name = request.header(kOipModelHeader);
      call.model_version = request.header(kOipVersionHeader);
      oip::check_request(call, meta);
    } catch (const BadInput& e) {
      return oip::error(400, e.what());
    }
    return std::nullopt;
  }
};

}  // namespace troupe
