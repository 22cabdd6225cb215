#include "proxy/http_fields.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

namespace troupe::proxy {

Result<double> parse_request_timeout(boost::beast::string_view value) {
  const std::string text(value.data(), value.size());
  auto bad = [&] {
    return Status(errc::invalid_argument,
                  std::string(kRequestTimeoutHeader) + ": '" + text.substr(0, 64) +
                      "' is not a number of seconds greater than 0 and at most 86400");
  };
  if (text.empty() || text.size() > 32)
    return bad();
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || end != text.c_str() + text.size() || !std::isfinite(v) || !(v > 0) ||
      v > 86400)
    return bad();
  return v;
}

bool valid_request_id(boost::beast::string_view id) {
  if (id.empty() || id.size() > 128)
    return false;
  for (char ch : id) {
    if (ch <= 0x20 || ch >= 0x7f)
      return false;
  }
  return true;
}

}  // namespace troupe::proxy
