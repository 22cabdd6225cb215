// Control characters in names and paths a user gives: found, and written as
// \xNN in messages, so that no message carries them raw.
#pragma once

#include <string>

namespace troupe {

inline bool is_control_character(char c) {
  return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
}

inline bool has_control_character(const std::string& s) {
  for (char c : s) {
    if (is_control_character(c))
      return true;
  }
  return false;
}

// `s` with each control character written as \xNN.
inline std::string escape_control_characters(const std::string& s) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (is_control_character(c)) {
      const auto b = static_cast<unsigned char>(c);
      out += "\\x";
      out += hex[b >> 4];
      out += hex[b & 0xf];
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace troupe
