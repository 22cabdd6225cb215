// Small helpers shared by the example deployments (not part of the API).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include <troupe/deployment.hpp>

namespace troupe_examples {

// Upper bound for ?ms= and user_config ms, so a typo cannot park a request
// thread for days.
constexpr int64_t kMaxMs = 3'600'000;

// obj[key] as an integer in [0, kMaxMs], `fallback` when obj is not an object
// or has no such key. Throws std::invalid_argument naming `what` otherwise.
inline int64_t ms_field(const troupe::Json& obj, const char* key, int64_t fallback,
                        const std::string& what) {
  if (!obj.is_object() || !obj.contains(key))
    return fallback;
  const auto& value = obj.at(key);
  if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > kMaxMs) {
    throw std::invalid_argument(what + "." + key + " must be an integer in [0, " +
                                std::to_string(kMaxMs) + "], got " + value.dump());
  }
  return value.get<int64_t>();
}

// Parses a decimal query value. Returns -1 when it is not an integer in
// [0, max].
inline int64_t parse_bounded(const std::string& text, int64_t max) {
  if (text.empty() || text.size() > 10)
    return -1;
  int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9')
      return -1;
    value = value * 10 + (c - '0');
  }
  return value <= max ? value : -1;
}

// Parses a ?ms= value. Returns -1 when it is not an integer in [0, kMaxMs].
inline int64_t parse_ms(const std::string& text) {
  return parse_bounded(text, kMaxMs);
}

inline troupe::Response bad_ms(const std::string& text) {
  return troupe::Response::json({{"error", "ms must be an integer in [0, " +
                                               std::to_string(kMaxMs) + "], got '" + text + "'"}},
                                400);
}

}  // namespace troupe_examples
