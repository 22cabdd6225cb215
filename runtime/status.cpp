#include "runtime/status.hpp"

namespace troupe {

const char* to_string(errc code) {
  switch (code) {
    case errc::ok:
      return "ok";
    case errc::invalid_argument:
      return "invalid_argument";
    case errc::not_found:
      return "not_found";
    case errc::already_exists:
      return "already_exists";
    case errc::conflict:
      return "conflict";
    case errc::unavailable:
      return "unavailable";
    case errc::io_error:
      return "io_error";
    case errc::corrupt:
      return "corrupt";
    case errc::version_mismatch:
      return "version_mismatch";
    case errc::permission_denied:
      return "permission_denied";
    case errc::timeout:
      return "timeout";
    case errc::internal:
      return "internal";
    case errc::overloaded:
      return "overloaded";
    case errc::not_leader:
      return "not_leader";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok())
    return "ok";
  return std::string(troupe::to_string(code_)) + ": " + message_;
}

}  // namespace troupe
