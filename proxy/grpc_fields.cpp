#include "proxy/grpc_fields.hpp"

#include <nlohmann/json.hpp>

namespace troupe::proxy::grpc {

const char* code_name(int code) {
  static const char* const names[] = {"OK",
                                      "CANCELLED",
                                      "UNKNOWN",
                                      "INVALID_ARGUMENT",
                                      "DEADLINE_EXCEEDED",
                                      "NOT_FOUND",
                                      "ALREADY_EXISTS",
                                      "PERMISSION_DENIED",
                                      "RESOURCE_EXHAUSTED",
                                      "FAILED_PRECONDITION",
                                      "ABORTED",
                                      "OUT_OF_RANGE",
                                      "UNIMPLEMENTED",
                                      "INTERNAL",
                                      "UNAVAILABLE",
                                      "DATA_LOSS",
                                      "UNAUTHENTICATED"};
  if (code < 0 || code > 16)
    return "UNKNOWN";
  return names[code];
}

Code code_for_http(int status) {
  if (status >= 200 && status < 300)
    return Code::ok;
  switch (status) {
    case 400:
      return Code::invalid_argument;
    case 401:
      return Code::unauthenticated;
    case 403:
      return Code::permission_denied;
    case 404:
      return Code::not_found;
    case 408:
    case 504:
      return Code::deadline_exceeded;
    case 409:
      return Code::aborted;
    case 412:
      return Code::failed_precondition;
    case 413:
    case 429:
      return Code::resource_exhausted;
    case 499:
      return Code::cancelled;
    case 500:
      return Code::internal;
    case 501:
      return Code::unimplemented;
    case 502:
    case 503:
      return Code::unavailable;
    default:
      return Code::unknown;
  }
}

int own_code(std::string_view value) {
  if (value.empty() || value.size() > 2)
    return -1;
  int code = 0;
  for (char ch : value) {
    if (ch < '0' || ch > '9')
      return -1;
    code = code * 10 + (ch - '0');
  }
  return code;
}

Result<double> parse_timeout(std::string_view value) {
  auto bad = [&] {
    return Status(errc::invalid_argument,
                  "grpc-timeout: '" + std::string(value.substr(0, 32)) +
                      "' is not 1 to 8 digits followed by a unit (H, M, S, m, u or n)");
  };
  if (value.size() < 2 || value.size() > 9)
    return bad();
  uint64_t n = 0;
  for (char ch : value.substr(0, value.size() - 1)) {
    if (ch < '0' || ch > '9')
      return bad();
    n = n * 10 + uint64_t(ch - '0');
  }
  double unit = 0;
  switch (value.back()) {
    case 'H':
      unit = 3600;
      break;
    case 'M':
      unit = 60;
      break;
    case 'S':
      unit = 1;
      break;
    case 'm':
      unit = 1e-3;
      break;
    case 'u':
      unit = 1e-6;
      break;
    case 'n':
      unit = 1e-9;
      break;
    default:
      return bad();
  }
  return double(n) * unit;
}

Result<std::string> unframe(std::string_view body) {
  if (body.empty())
    return Status(errc::invalid_argument, "the request carries no message");
  if (body.size() < 5)
    return Status(errc::invalid_argument, "the request's message is cut short: " +
                                              std::to_string(body.size()) + " bytes of its prefix");
  const auto* p = reinterpret_cast<const unsigned char*>(body.data());
  if (p[0] > 1)
    return Status(errc::invalid_argument,
                  "the request's message has a bad compressed flag " + std::to_string(p[0]));
  if (p[0] == 1)
    return Status(errc::invalid_argument,
                  "the request's message is compressed; this server accepts identity only "
                  "(grpc-accept-encoding)");
  const uint64_t length =
      (uint64_t(p[1]) << 24) | (uint64_t(p[2]) << 16) | (uint64_t(p[3]) << 8) | uint64_t(p[4]);
  if (body.size() - 5 < length)
    return Status(errc::invalid_argument,
                  "the request's message is cut short: " + std::to_string(body.size() - 5) +
                      " of " + std::to_string(length) + " bytes");
  if (body.size() - 5 > length)
    return Status(errc::invalid_argument,
                  "the request holds more than one message; only unary and server-streaming "
                  "methods are served");
  return std::string(body.substr(5));
}

void frame(std::string_view message, std::string& out) {
  const uint64_t n = message.size();
  const char prefix[5] = {0, char((n >> 24) & 0xff), char((n >> 16) & 0xff), char((n >> 8) & 0xff),
                          char(n & 0xff)};
  out.append(prefix, 5);
  out.append(message);
}

std::string percent_encode(std::string_view message) {
  static const char hex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(message.size());
  for (unsigned char ch : message) {
    if (ch >= 0x20 && ch <= 0x7e && ch != '%') {
      out.push_back(char(ch));
    } else {
      out.push_back('%');
      out.push_back(hex[ch >> 4]);
      out.push_back(hex[ch & 15]);
    }
  }
  return out;
}

std::string message_of(std::string_view body) {
  std::string text(body);
  auto parsed = nlohmann::json::parse(body, nullptr, false);
  if (!parsed.is_discarded() && parsed.is_object()) {
    auto it = parsed.find("error");
    if (it != parsed.end() && it->is_string())
      text = it->get<std::string>();
  }
  if (text.size() > 1024)
    text.resize(1024);
  return percent_encode(text);
}

}  // namespace troupe::proxy::grpc
