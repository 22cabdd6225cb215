// HOST:PORT endpoints as given on command lines and in TROUPE_ADDRESS.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/status.hpp"

namespace troupe {

struct Endpoint {
  std::string host;
  uint16_t port = 0;
  std::string to_string() const;
};

// Accepts "host:port" and "[v6addr]:port"; the port must be 1-65535.
Result<Endpoint> parse_endpoint(const std::string& text);

// Node ids name nodes in logs, replica names and commands: 1-64 characters of
// [A-Za-z0-9._-].
Status validate_node_id(const std::string& id);

}  // namespace troupe
