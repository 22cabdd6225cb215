// What the gRPC ingress reads and writes besides HTTP/2 itself (plain C++, no
// sockets: unit-tested and fuzzed): the length-prefixed messages of a call,
// the grpc-timeout header, the status codes and the HTTP statuses of the
// proxy and of deployments mapped onto them, and grpc-message's
// percent-encoding. See docs/grpc.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/status.hpp"

namespace troupe::proxy::grpc {

// The metadata key that names a call's application (Ray Serve's).
inline constexpr const char* kApplicationKey = "application";

// The status codes of gRPC (grpc/status.h), by their numbers.
enum class Code : int {
  ok = 0,
  cancelled = 1,
  unknown = 2,
  invalid_argument = 3,
  deadline_exceeded = 4,
  not_found = 5,
  already_exists = 6,
  permission_denied = 7,
  resource_exhausted = 8,
  failed_precondition = 9,
  aborted = 10,
  out_of_range = 11,
  unimplemented = 12,
  internal = 13,
  unavailable = 14,
  data_loss = 15,
  unauthenticated = 16,
};

// "OK", "CANCELLED", ... ("UNKNOWN" for a number outside 0-16).
const char* code_name(int code);

// The code of an answer whose HTTP status is `status` (the proxy's own
// answers and a deployment's): 2xx OK, 400 INVALID_ARGUMENT, 401
// UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 NOT_FOUND, 408 and 504
// DEADLINE_EXCEEDED, 409 ABORTED, 412 FAILED_PRECONDITION, 413 and 429
// RESOURCE_EXHAUSTED, 499 CANCELLED, 501 UNIMPLEMENTED, 502 and 503
// UNAVAILABLE, 500 INTERNAL, anything else UNKNOWN.
Code code_for_http(int status);

// The code an answer names itself in its grpc-status header's `value` (a
// number of 1 or 2 digits), or -1 when the value is not one.
int own_code(std::string_view value);

// The value of a grpc-timeout header ("1H", "5M", "30S", "100m", "250u",
// "10n": at most 8 digits and a unit) in seconds; anything else is an error
// naming the header and the value.
Result<double> parse_timeout(std::string_view value);

// The one message of a unary or server-streaming call's request body (its
// DATA): a 5-byte prefix (compressed flag, big-endian length) and the bytes.
// An error (INVALID_ARGUMENT's message) when the body is empty, cut short,
// holds more than one message, or the message is compressed (this ingress
// accepts identity only: grpc-accept-encoding says so).
Result<std::string> unframe(std::string_view body);

// `message` with its 5-byte prefix (uncompressed), appended to `out`.
void frame(std::string_view message, std::string& out);

// grpc-message's encoding: bytes outside printable ASCII, and '%', as %XX.
std::string percent_encode(std::string_view message);

// The text for grpc-message of an error answer's body: the "error" field of
// a JSON object (the proxy's answers and the runtime's), else the body
// itself; at most 1024 bytes, percent-encoded.
std::string message_of(std::string_view body);

}  // namespace troupe::proxy::grpc
