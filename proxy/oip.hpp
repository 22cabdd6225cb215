// The Open Inference Protocol (KServe v2) at the ingress (docs/inference.md):
// which REST paths and gRPC methods are the protocol's, and the conversion of
// its gRPC messages (schemas/grpc_predict_v2.proto) to and from the REST
// JSON bodies the deployment speaks (include/troupe/inference.hpp). Pure
// functions: the routing is Core's (proxy/oip_path.cpp).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "runtime/status.hpp"

namespace troupe::proxy::oip {

enum class Kind { server_metadata, live, ready, model_metadata, model_ready, infer };

// What the deployment's kOipHeader says for a call of this kind ("" for the
// server's own calls, which the node answers).
const char* call_name(Kind kind);

// A path of the protocol: "/v2" or under "/v2/".
bool is_rest_path(std::string_view path);

struct RestTarget {
  Kind kind = Kind::live;
  std::string model;    // model_* and infer
  std::string version;  // "": none named
};
// "/v2", "/v2/health/live", "/v2/health/ready" and
// "/v2/models/<m>[/versions/<v>][/ready|/infer]" (names percent-decoded);
// an error naming the path for any other path under /v2.
Result<RestTarget> parse_rest(std::string_view path);

// "/inference.GRPCInferenceService/": the service's methods.
inline constexpr std::string_view kServicePrefix = "/inference.GRPCInferenceService/";
bool is_grpc_method(std::string_view method);
// The kind of one of the service's methods; an error naming it otherwise.
Result<Kind> grpc_kind(std::string_view method);

// A gRPC call of a model: whose, and for infer the REST body it becomes.
struct GrpcCall {
  std::string model;
  std::string version;
  std::string json;  // infer: the REST inference body
  bool raw = false;  // infer: the inputs came as raw_input_contents
};
// Decodes the request message of a model_metadata, model_ready or infer
// call. An error (invalid_argument) names what is wrong: a malformed message,
// no model name, raw contents that do not fit their tensor, FP16 without raw
// contents, BYTES that are not UTF-8.
Result<GrpcCall> decode_call(Kind kind, std::string_view message);

// The deployment's REST answer (JSON) of a model call as the gRPC answer
// message; `raw`: outputs as raw_output_contents (as the request's inputs
// came), else typed contents. An error (internal) when the answer is not
// what the protocol says.
Result<std::string> encode_answer(Kind kind, std::string_view json, bool raw);

// protobuf's own log lines (about messages it cannot parse) to the node's
// log at the debug level rather than stderr: once, before calls come
// (oip_path.cpp).
void route_protobuf_log();

std::string live_message(bool live);
std::string ready_message(bool ready);  // ServerReady's and ModelReady's
std::string server_metadata_message(const std::string& name, const std::string& version);

}  // namespace troupe::proxy::oip
