// Request headers the proxy reads itself, checked before anything is routed
// (plain C++ and Beast's string_view, no CAF: the HTTP fuzzer links it).
#pragma once

#include <string>

#include <boost/beast/core/string.hpp>

#include "runtime/status.hpp"

namespace troupe::proxy {

// An X-Request-Id the proxy keeps: printable, at most 128 bytes.
bool valid_request_id(boost::beast::string_view id);
// A request's X-Request-Id when the proxy keeps it, else "" (the caller
// makes one): the ingress's and the admin listener's rule.
template <class Message>
std::string kept_request_id(const Message& m) {
  auto it = m.find("X-Request-Id");
  return it != m.end() && valid_request_id(it->value()) ? std::string(it->value()) : std::string();
}

// The header by which a client asks for a shorter deadline than the
// application's request_timeout_s (never a longer one).
inline constexpr const char* kRequestTimeoutHeader = "X-Request-Timeout-Seconds";
// Its value: a decimal number of seconds, > 0 and at most 86400; anything
// else is an error naming the header and the value (answered 400).
Result<double> parse_request_timeout(boost::beast::string_view value);

}  // namespace troupe::proxy
