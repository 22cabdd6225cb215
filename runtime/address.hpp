// HOST:PORT endpoints as given on command lines and in TROUPE_ADDRESS.
#pragma once

#include <cstdint>
#include <optional>
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

// Whether `host` means every interface ("0.0.0.0", "::", "[::]" or empty):
// fine to listen on, useless to give to others.
bool is_wildcard(const std::string& host);

// The address other hosts reach a node by that listens on `bind`: `bind`
// itself, unless it is a wildcard. Then the local address of this host's
// route towards `toward` (the head, for a worker; the kernel's routing
// decision, no packet is sent), or without one the first address of an
// interface that is up and not loopback; `bind` as the last resort.
std::string advertised_host(const std::string& bind, const std::optional<Endpoint>& toward);

// Node ids name nodes in logs, replica names and commands: 1-64 characters of
// [A-Za-z0-9._-].
Status validate_node_id(const std::string& id);

}  // namespace troupe
