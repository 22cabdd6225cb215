// The YAML 1.2 core schema's plain scalars and the text helpers of messages
// and of the writer (scalars.hpp).
#include "config/scalars.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <regex>

namespace troupe::config::detail {

namespace {

const std::regex kIntDecimal("[-+]?[0-9]+");
const std::regex kIntOctal("0o[0-7]+");
const std::regex kIntHex("0x[0-9a-fA-F]+");
const std::regex kFloat("[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?");
const std::regex kInfinity("[-+]?\\.(inf|Inf|INF)");
const std::regex kNan("\\.(nan|NaN|NAN)");

}  // namespace

// ---------------------------------------------------------------------------
// Text helpers.

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty())
      out += ", ";
    out += item;
  }
  return out;
}

std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
    if (out.size() > 80) {
      out += "...";
      break;
    }
  }
  return out;
}

std::string in_quotes(const std::string& s) {
  return "'" + printable(s) + "'";
}

std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return in_quotes(node.Scalar());
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      break;
  }
  return "null";
}

std::string format_double(double v) {
  char buf[40];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {  // "30", not "3e+01"
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v)
      break;
  }
  return buf;
}

// ---------------------------------------------------------------------------
// Scalars: YAML 1.2 core schema resolution of plain scalars.

bool is_null_text(const std::string& s) {
  return s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL";
}

bool is_true_text(const std::string& s) {
  return s == "true" || s == "True" || s == "TRUE";
}

bool is_false_text(const std::string& s) {
  return s == "false" || s == "False" || s == "FALSE";
}

bool is_yaml11_bool_text(const std::string& s) {
  static const char* const words[] = {"y",  "Y",  "yes", "Yes", "YES", "n",   "N",   "no",
                                      "No", "NO", "on",  "On",  "ON",  "off", "Off", "OFF"};
  for (const char* w : words) {
    if (s == w)
      return true;
  }
  return false;
}

bool is_decimal_integer_text(const std::string& s) {
  return std::regex_match(s, kIntDecimal);
}

bool is_integer_text(const std::string& s) {
  return std::regex_match(s, kIntDecimal) || std::regex_match(s, kIntOctal) ||
         std::regex_match(s, kIntHex);
}

bool is_float_text(const std::string& s) {
  return std::regex_match(s, kFloat);
}

bool is_special_float_text(const std::string& s) {
  return std::regex_match(s, kInfinity) || std::regex_match(s, kNan);
}

bool needs_quotes(const std::string& s) {
  return is_null_text(s) || is_true_text(s) || is_false_text(s) || is_yaml11_bool_text(s) ||
         is_integer_text(s) || is_float_text(s) || is_special_float_text(s);
}

std::optional<long long> parse_integer(const std::string& s) {
  if (!std::regex_match(s, kIntDecimal))
    return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno == ERANGE || end != s.c_str() + s.size())
    return std::nullopt;
  return v;
}

std::optional<double> parse_number(const std::string& s) {
  if (!std::regex_match(s, kFloat))
    return std::nullopt;
  double v = std::strtod(s.c_str(), nullptr);
  if (!std::isfinite(v))
    return std::nullopt;
  return v;
}

}  // namespace troupe::config::detail
