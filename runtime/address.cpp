#include "runtime/address.hpp"

#include <cstdlib>

namespace troupe {

std::string Endpoint::to_string() const {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<Endpoint> parse_endpoint(const std::string& text) {
  auto fail = [&](const std::string& why) {
    return Result<Endpoint>(errc::invalid_argument,
                            "address '" + text + "' is not HOST:PORT: " + why);
  };
  std::string host;
  std::string port;
  if (!text.empty() && text[0] == '[') {
    auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return fail("expected [IPv6]:PORT");
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string::npos)
      return fail("missing ':PORT'");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string::npos)
      return fail("write IPv6 addresses as [ADDR]:PORT");
  }
  if (host.empty())
    return fail("missing host");
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos) {
    return fail("port '" + port + "' is not a number");
  }
  long value = std::strtol(port.c_str(), nullptr, 10);
  if (value < 1 || value > 65535)
    return fail("port " + port + " is outside 1-65535");
  return Endpoint{host, static_cast<uint16_t>(value)};
}

Status validate_node_id(const std::string& id) {
  if (id.empty() || id.size() > 64) {
    return Status(errc::invalid_argument, "node id '" + id + "' must have 1-64 characters");
  }
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) {
      return Status(errc::invalid_argument,
                    "node id '" + id + "' may contain only letters, digits, '.', '_' and '-'");
    }
  }
  return Status::ok();
}

}  // namespace troupe
