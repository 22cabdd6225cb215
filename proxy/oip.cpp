#include "proxy/oip.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include <troupe/inference.hpp>

#include "grpc_predict_v2.pb.h"

namespace troupe::proxy::oip {

namespace {

using nlohmann::json;

Status bad(std::string message) {
  return Status(errc::invalid_argument, std::move(message));
}

// "%XX" escapes decoded; false for a malformed one.
bool percent_decode(std::string_view in, std::string& out) {
  out.clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out += in[i];
      continue;
    }
    if (i + 2 >= in.size() || !std::isxdigit(static_cast<unsigned char>(in[i + 1])) ||
        !std::isxdigit(static_cast<unsigned char>(in[i + 2])))
      return false;
    out += char(std::stoi(std::string(in.substr(i + 1, 2)), nullptr, 16));
    i += 2;
  }
  return true;
}

// The path's segments after "/v2" (empty ones dropped: "/v2/" is "/v2").
std::vector<std::string_view> segments(std::string_view path) {
  std::vector<std::string_view> out;
  path.remove_prefix(3);
  size_t pos = 0;
  while (pos < path.size()) {
    size_t end = path.find('/', pos);
    if (end == std::string_view::npos)
      end = path.size();
    if (end > pos)
      out.push_back(path.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

// Bytes of one element of a datatype in raw contents; 0 for BYTES (each
// element carries its own length) and -1 for a name that is not a datatype.
int element_size(const std::string& datatype) {
  if (datatype == "BOOL" || datatype == "UINT8" || datatype == "INT8")
    return 1;
  if (datatype == "UINT16" || datatype == "INT16" || datatype == "FP16")
    return 2;
  if (datatype == "UINT32" || datatype == "INT32" || datatype == "FP32")
    return 4;
  if (datatype == "UINT64" || datatype == "INT64" || datatype == "FP64")
    return 8;
  if (datatype == "BYTES")
    return 0;
  return -1;
}

template <class T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // the machine is little-endian, like the protocol
  return v;
}

template <class T>
void store(std::string& out, T v) {
  char b[sizeof v];
  std::memcpy(b, &v, sizeof v);
  out.append(b, sizeof v);
}

float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t bits = 0;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while (!(man & 0x400));
      bits = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  uint16_t sign = uint16_t((x >> 16) & 0x8000);
  int32_t exp = int32_t((x >> 23) & 0xff) - 127 + 15;
  uint32_t man = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff)  // inf or nan
    return uint16_t(sign | 0x7c00 | (man ? 0x200 : 0));
  if (exp >= 31)
    return uint16_t(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10)
      return sign;
    man |= 0x800000;
    uint32_t shift = uint32_t(14 - exp);
    uint32_t half = man >> shift;
    uint32_t rest = man & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rest > mid || (rest == mid && (half & 1)))
      ++half;
    return uint16_t(sign | half);
  }
  uint32_t half = uint32_t(sign) | uint32_t(exp) << 10 | man >> 13;
  uint32_t rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1)))
    ++half;  // may carry into the exponent, which is right
  return uint16_t(half);
}

using troupe::oip::float_json;  // NaN and infinities as strings (inference.hpp)

// The value of a float element of an answer: a number, or "NaN",
// "Infinity" or "-Infinity".
bool float_of(const json& e, double& out) {
  if (!e.is_number())
    return troupe::oip::non_finite(e, out);
  out = e.get<double>();
  return true;
}

// The elements of raw contents as a JSON list; an error naming the input.
Result<json> raw_elements(const std::string& name, const std::string& datatype, int64_t elements,
                          const std::string& raw) {
  int size = element_size(datatype);
  json out = json::array();
  if (size == 0) {  // BYTES: length-prefixed elements
    size_t pos = 0;
    while (pos < raw.size()) {
      if (raw.size() - pos < 4)
        return bad("input '" + name + "': its raw contents end inside an element's length");
      uint32_t n = load<uint32_t>(raw.data() + pos);
      pos += 4;
      if (raw.size() - pos < n)
        return bad("input '" + name + "': its raw contents end inside an element");
      out.push_back(raw.substr(pos, n));
      pos += n;
    }
    if (int64_t(out.size()) != elements)
      return bad("input '" + name + "' has " + std::to_string(out.size()) +
                 " BYTES elements in its raw contents; its shape holds " +
                 std::to_string(elements));
    return out;
  }
  if (elements < 0 || uint64_t(raw.size()) != uint64_t(elements) * uint64_t(size))
    return bad("input '" + name + "' has " + std::to_string(raw.size()) +
               " bytes of raw contents; its shape and datatype " + datatype + " make " +
               std::to_string(elements * size));
  const char* p = raw.data();
  for (int64_t i = 0; i < elements; ++i, p += size) {
    if (datatype == "BOOL")
      out.push_back(*p != 0);
    else if (datatype == "UINT8")
      out.push_back(load<uint8_t>(p));
    else if (datatype == "INT8")
      out.push_back(load<int8_t>(p));
    else if (datatype == "UINT16")
      out.push_back(load<uint16_t>(p));
    else if (datatype == "INT16")
      out.push_back(load<int16_t>(p));
    else if (datatype == "FP16")
      out.push_back(float_json(half_to_float(load<uint16_t>(p))));
    else if (datatype == "UINT32")
      out.push_back(load<uint32_t>(p));
    else if (datatype == "INT32")
      out.push_back(load<int32_t>(p));
    else if (datatype == "FP32")
      out.push_back(float_json(load<float>(p)));
    else if (datatype == "UINT64")
      out.push_back(load<uint64_t>(p));
    else if (datatype == "INT64")
      out.push_back(load<int64_t>(p));
    else
      out.push_back(float_json(load<double>(p)));
  }
  return out;
}

// The elements of typed contents, from the field of the datatype.
Result<json> typed_elements(const std::string& name, const std::string& datatype,
                            const inference::InferTensorContents& c) {
  auto list = [](const auto& field) {
    json out = json::array();
    for (const auto& v : field)
      out.push_back(v);
    return out;
  };
  if (datatype == "BOOL")
    return list(c.bool_contents());
  if (datatype == "INT8" || datatype == "INT16" || datatype == "INT32")
    return list(c.int_contents());
  if (datatype == "INT64")
    return list(c.int64_contents());
  if (datatype == "UINT8" || datatype == "UINT16" || datatype == "UINT32")
    return list(c.uint_contents());
  if (datatype == "UINT64")
    return list(c.uint64_contents());
  auto floats = [](const auto& field) {
    json out = json::array();
    for (double v : field)
      out.push_back(float_json(v));
    return out;
  };
  if (datatype == "FP32")
    return floats(c.fp32_contents());
  if (datatype == "FP64")
    return floats(c.fp64_contents());
  if (datatype == "BYTES")
    return list(c.bytes_contents());
  if (datatype == "FP16")
    return bad("input '" + name + "' is FP16, which only raw_input_contents can carry");
  return bad("input '" + name + "' has datatype '" + datatype +
             "', which is not one of the protocol's");
}

json parameters_json(const google::protobuf::Map<std::string, inference::InferParameter>& map) {
  json out = json::object();
  for (const auto& [key, p] : map) {
    switch (p.parameter_choice_case()) {
      case inference::InferParameter::kBoolParam:
        out[key] = p.bool_param();
        break;
      case inference::InferParameter::kInt64Param:
        out[key] = p.int64_param();
        break;
      case inference::InferParameter::kStringParam:
        out[key] = p.string_param();
        break;
      case inference::InferParameter::kDoubleParam:
        out[key] = p.double_param();
        break;
      case inference::InferParameter::kUint64Param:
        out[key] = p.uint64_param();
        break;
      default:
        break;
    }
  }
  return out;
}

void parameters_message(const json& j,
                        google::protobuf::Map<std::string, inference::InferParameter>& map) {
  if (!j.is_object())
    return;
  for (const auto& [key, v] : j.items()) {
    inference::InferParameter p;
    if (v.is_boolean())
      p.set_bool_param(v.get<bool>());
    else if (v.is_number_unsigned())
      p.set_uint64_param(v.get<uint64_t>());
    else if (v.is_number_integer())
      p.set_int64_param(v.get<int64_t>());
    else if (v.is_number_float())
      p.set_double_param(v.get<double>());
    else if (v.is_string())
      p.set_string_param(v.get<std::string>());
    else
      p.set_string_param(v.dump());
    map[key] = std::move(p);
  }
}

Status not_an_answer(const std::string& what) {
  return Status(errc::internal, "the model's answer is not the protocol's: " + what);
}

// One output's elements (a JSON list, nested or flat) into raw bytes or typed
// contents.
Status output_elements(const std::string& name, const std::string& datatype, const json& data,
                       std::string* raw, inference::InferTensorContents* typed) {
  std::vector<const json*> flat;
  std::vector<const json*> todo{&data};
  // Depth first, in order: a stack of the lists still to walk.
  std::vector<std::pair<const json*, size_t>> stack;
  stack.emplace_back(&data, 0);
  if (!data.is_array()) {
    flat.push_back(&data);
    stack.clear();
  }
  while (!stack.empty()) {
    auto& [list, at] = stack.back();
    if (at == list->size()) {
      stack.pop_back();
      continue;
    }
    const json* e = &(*list)[at++];
    if (e->is_array())
      stack.emplace_back(e, 0);
    else
      flat.push_back(e);
  }
  int size = element_size(datatype);
  if (size < 0)
    return not_an_answer("output '" + name + "' has datatype '" + datatype + "'");
  const bool fp = datatype.rfind("FP", 0) == 0;
  for (const json* e : flat) {
    double f = 0;
    bool ok = datatype == "BOOL"               ? e->is_boolean()
              : datatype == "BYTES"            ? e->is_string()
              : fp                             ? float_of(*e, f)
              : datatype.rfind("UINT", 0) == 0 ? e->is_number_unsigned()
                                               : e->is_number_integer();
    if (!ok)
      return not_an_answer("output '" + name + "' (" + datatype + ") has the element " + e->dump());
    if (datatype == "BOOL") {
      raw ? store<uint8_t>(*raw, e->get<bool>()) : typed->add_bool_contents(e->get<bool>());
    } else if (datatype == "BYTES") {
      const auto& s = e->get_ref<const std::string&>();
      if (raw) {
        store<uint32_t>(*raw, uint32_t(s.size()));
        raw->append(s);
      } else {
        typed->add_bytes_contents(s);
      }
    } else if (datatype == "FP16") {
      if (!raw)
        return Status(errc::internal, "FP16 outputs go as raw contents");
      store<uint16_t>(*raw, float_to_half(float(f)));
    } else if (datatype == "FP32") {
      raw ? store<float>(*raw, float(f)) : typed->add_fp32_contents(float(f));
    } else if (datatype == "FP64") {
      raw ? store<double>(*raw, f) : typed->add_fp64_contents(f);
    } else if (datatype == "INT64") {
      raw ? store<int64_t>(*raw, e->get<int64_t>()) : typed->add_int64_contents(e->get<int64_t>());
    } else if (datatype == "UINT64") {
      raw ? store<uint64_t>(*raw, e->get<uint64_t>())
          : typed->add_uint64_contents(e->get<uint64_t>());
    } else if (datatype.rfind("UINT", 0) == 0) {
      uint32_t v = e->get<uint32_t>();
      if (!raw)
        typed->add_uint_contents(v);
      else if (size == 1)
        store<uint8_t>(*raw, uint8_t(v));
      else if (size == 2)
        store<uint16_t>(*raw, uint16_t(v));
      else
        store<uint32_t>(*raw, v);
    } else {
      int32_t v = e->get<int32_t>();
      if (!raw)
        typed->add_int_contents(v);
      else if (size == 1)
        store<int8_t>(*raw, int8_t(v));
      else if (size == 2)
        store<int16_t>(*raw, int16_t(v));
      else
        store<int32_t>(*raw, v);
    }
  }
  return Status();
}

std::string serialized(const google::protobuf::MessageLite& m) {
  std::string out;
  m.SerializeToString(&out);
  return out;
}

}  // namespace

const char* call_name(Kind kind) {
  switch (kind) {
    case Kind::model_metadata:
      return "metadata";
    case Kind::model_ready:
      return "ready";
    case Kind::infer:
      return "infer";
    default:
      return "";
  }
}

bool is_rest_path(std::string_view path) {
  return path.size() >= 3 && path.substr(0, 3) == "/v2" && (path.size() == 3 || path[3] == '/');
}

Result<RestTarget> parse_rest(std::string_view path) {
  auto unknown = [&] {
    return Status(errc::not_found, "'" + std::string(path.substr(0, 256)) +
                                       "' is not a path of the Open Inference Protocol");
  };
  auto parts = segments(path);
  RestTarget t;
  if (parts.empty()) {
    t.kind = Kind::server_metadata;
    return t;
  }
  if (parts[0] == "health") {
    if (parts.size() == 2 && parts[1] == "live") {
      t.kind = Kind::live;
      return t;
    }
    if (parts.size() == 2 && parts[1] == "ready") {
      t.kind = Kind::ready;
      return t;
    }
    return unknown();
  }
  if (parts[0] != "models" || parts.size() < 2)
    return unknown();
  if (!percent_decode(parts[1], t.model) || t.model.empty())
    return Status(errc::invalid_argument, "the model name in '" + std::string(path.substr(0, 256)) +
                                              "' has a malformed %-escape");
  size_t at = 2;
  if (parts.size() >= 4 && parts[2] == "versions") {
    if (!percent_decode(parts[3], t.version) || t.version.empty())
      return Status(errc::invalid_argument, "the version in '" + std::string(path.substr(0, 256)) +
                                                "' has a malformed %-escape");
    at = 4;
  }
  if (parts.size() == at) {
    t.kind = Kind::model_metadata;
  } else if (parts.size() == at + 1 && parts[at] == "ready") {
    t.kind = Kind::model_ready;
  } else if (parts.size() == at + 1 && parts[at] == "infer") {
    t.kind = Kind::infer;
  } else {
    return unknown();
  }
  return t;
}

bool is_grpc_method(std::string_view method) {
  return method.substr(0, kServicePrefix.size()) == kServicePrefix;
}

Result<Kind> grpc_kind(std::string_view method) {
  std::string_view name = method.substr(kServicePrefix.size());
  if (name == "ServerLive")
    return Kind::live;
  if (name == "ServerReady")
    return Kind::ready;
  if (name == "ServerMetadata")
    return Kind::server_metadata;
  if (name == "ModelMetadata")
    return Kind::model_metadata;
  if (name == "ModelReady")
    return Kind::model_ready;
  if (name == "ModelInfer")
    return Kind::infer;
  return Status(errc::not_found, "inference.GRPCInferenceService has no method '" +
                                     std::string(name.substr(0, 128)) + "'");
}

Result<GrpcCall> decode_call(Kind kind, std::string_view message) {
  GrpcCall call;
  if (kind == Kind::model_metadata || kind == Kind::model_ready) {
    // Both requests are {name = 1, version = 2}.
    inference::ModelMetadataRequest r;
    if (!r.ParseFromArray(message.data(), int(message.size())))
      return bad(
          "the request is not a " +
          std::string(kind == Kind::model_ready ? "ModelReadyRequest" : "ModelMetadataRequest") +
          " message");
    if (r.name().empty())
      return bad("the request names no model (its 'name' is empty)");
    call.model = r.name();
    call.version = r.version();
    return call;
  }
  inference::ModelInferRequest r;
  if (!r.ParseFromArray(message.data(), int(message.size())))
    return bad("the request is not a ModelInferRequest message");
  if (r.model_name().empty())
    return bad("the request names no model (its 'model_name' is empty)");
  call.model = r.model_name();
  call.version = r.model_version();
  call.raw = r.raw_input_contents_size() > 0;
  if (call.raw && r.raw_input_contents_size() != r.inputs_size())
    return bad("the request has " + std::to_string(r.raw_input_contents_size()) +
               " raw_input_contents for " + std::to_string(r.inputs_size()) +
               " inputs; give one per input, or none");
  json body = json::object();
  if (!r.id().empty())
    body["id"] = r.id();
  if (r.parameters_size() > 0)
    body["parameters"] = parameters_json(r.parameters());
  json inputs = json::array();
  for (int i = 0; i < r.inputs_size(); ++i) {
    const auto& in = r.inputs(i);
    json shape = json::array();
    int64_t elements = 1;
    for (int64_t d : in.shape()) {
      if (d < 0)
        return bad("input '" + in.name() + "' has a negative dimension");
      shape.push_back(d);
      elements = d > 0 && elements > INT64_MAX / d ? -1 : elements * d;
    }
    Result<json> data = json::array();
    if (call.raw) {
      if (in.has_contents() && in.contents().ByteSizeLong() > 0)
        return bad("input '" + in.name() +
                   "' has contents while the request has raw_input_contents; use one or the "
                   "other");
      data = raw_elements(in.name(), in.datatype(), elements, r.raw_input_contents(i));
    } else {
      data = typed_elements(in.name(), in.datatype(), in.contents());
    }
    if (!data)
      return data.status();
    json tensor = {{"name", in.name()},
                   {"datatype", in.datatype()},
                   {"shape", std::move(shape)},
                   {"data", std::move(*data)}};
    if (in.parameters_size() > 0)
      tensor["parameters"] = parameters_json(in.parameters());
    inputs.push_back(std::move(tensor));
  }
  body["inputs"] = std::move(inputs);
  if (r.outputs_size() > 0) {
    json outputs = json::array();
    for (const auto& o : r.outputs())
      outputs.push_back({{"name", o.name()}});
    body["outputs"] = std::move(outputs);
  }
  try {
    call.json = body.dump();
  } catch (const json::type_error&) {
    return bad(
        "a BYTES element or a name is not UTF-8 text: troupe hands tensors to the model as "
        "JSON, which carries text only");
  }
  return call;
}

Result<std::string> encode_answer(Kind kind, std::string_view text, bool raw) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return not_an_answer("not a JSON object");
  try {
    if (kind == Kind::model_ready) {
      return ready_message(j.value("ready", false));
    }
    if (kind == Kind::model_metadata) {
      inference::ModelMetadataResponse m;
      m.set_name(j.value("name", ""));
      m.set_platform(j.value("platform", ""));
      for (const auto& v : j.value("versions", json::array()))
        m.add_versions(v.get<std::string>());
      auto specs = [&](const char* key, auto add) {
        for (const auto& s : j.value(key, json::array())) {
          auto* t = add();
          t->set_name(s.at("name").get<std::string>());
          t->set_datatype(s.at("datatype").get<std::string>());
          for (const auto& d : s.at("shape"))
            t->add_shape(d.get<int64_t>());
        }
      };
      specs("inputs", [&] { return m.add_inputs(); });
      specs("outputs", [&] { return m.add_outputs(); });
      return serialized(m);
    }
    inference::ModelInferResponse m;
    m.set_model_name(j.value("model_name", ""));
    m.set_model_version(j.value("model_version", ""));
    m.set_id(j.value("id", ""));
    if (j.contains("parameters"))
      parameters_message(j["parameters"], *m.mutable_parameters());
    if (!j.contains("outputs") || !j["outputs"].is_array())
      return not_an_answer("no \"outputs\" list");
    // FP16 has no typed contents: an answer with an FP16 output goes raw.
    bool all_raw = raw;
    for (const auto& o : j["outputs"])
      all_raw = all_raw || o.value("datatype", "") == "FP16";
    for (const auto& o : j["outputs"]) {
      auto* t = m.add_outputs();
      t->set_name(o.at("name").get<std::string>());
      t->set_datatype(o.at("datatype").get<std::string>());
      for (const auto& d : o.at("shape"))
        t->add_shape(d.get<int64_t>());
      if (o.contains("parameters"))
        parameters_message(o["parameters"], *t->mutable_parameters());
      std::string bytes;
      if (auto st =
              output_elements(t->name(), t->datatype(), o.at("data"), all_raw ? &bytes : nullptr,
                              all_raw ? nullptr : t->mutable_contents());
          !st)
        return st;
      if (all_raw)
        m.add_raw_output_contents(std::move(bytes));
    }
    return serialized(m);
  } catch (const json::exception& e) {
    return not_an_answer(e.what());
  }
}

std::string live_message(bool live) {
  inference::ServerLiveResponse m;
  m.set_live(live);
  return serialized(m);
}

std::string ready_message(bool ready) {
  inference::ModelReadyResponse m;
  m.set_ready(ready);
  return serialized(m);
}

std::string server_metadata_message(const std::string& name, const std::string& version) {
  inference::ServerMetadataResponse m;
  m.set_name(name);
  m.set_version(version);
  return serialized(m);
}

}  // namespace troupe::proxy::oip
