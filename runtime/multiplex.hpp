// Model multiplexing on the wire (plain C++): which model a request is for,
// and how a replica's answer tells the proxy which models it holds now.
//
// A replica process answers a request that names a model with the internal
// header kHeldModelsHeader: its model list's sequence number and the ids it
// holds after serving the request. The proxy that sent the request updates
// its router at once (it learns a load or an eviction one answer later, not
// one controller round trip later) and strips the header before the client
// sees it. The controller's snapshots carry the same list with the same
// sequence number; a router keeps whichever is newer.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace troupe::multiplex {

// The request headers that name the model (include/troupe/deployment.hpp's
// kMultiplexedModelIdHeader and kModelIdHeader; runtime/ does not include
// the public header, a test checks they are equal).
constexpr const char* kMultiplexedModelIdHeader = "serve_multiplexed_model_id";
constexpr const char* kModelIdHeader = "X-Troupe-Model-Id";

// Internal: never reaches a client (the proxy strips it).
constexpr const char* kHeldModelsHeader = "X-Troupe-Held-Models";

// What a replica holds, numbered: `seq` grows with every change of the list
// (per replica; 0: nothing reported yet).
struct HeldModels {
  uint64_t seq = 0;
  std::vector<std::string> model_ids;
};

// The model a request is for: the value of the first header named
// serve_multiplexed_model_id, else of X-Troupe-Model-Id (ASCII
// case-insensitive), "" when neither is there. The same rule as
// troupe::Request::multiplexed_model_id().
std::string model_id_of(const std::vector<std::pair<std::string, std::string>>& headers);

// "<seq> <id>,<id>,..." with '%' and ',' in ids escaped as %25 and %2C.
std::string encode_held(const HeldModels& held);
// False when `value` is not what encode_held() writes.
bool decode_held(const std::string& value, HeldModels& out);

}  // namespace troupe::multiplex
