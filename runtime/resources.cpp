#include "runtime/resources.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace troupe {

namespace {

bool valid_name(const std::string& name) {
  if (name.empty() || !(name[0] >= 'a' && name[0] <= 'z'))
    return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'))
      return false;
  }
  return true;
}

std::string format_amount(double value) {
  static const char* suffixes[] = {"", "K", "M", "G", "T"};
  int i = 0;
  double v = value;
  // Use a binary suffix only when it represents the value exactly.
  while (i < 4 && v >= 1024 && std::fmod(v, 1024) == 0) {
    v /= 1024;
    ++i;
  }
  std::ostringstream out;
  out.precision(15);
  out << v << suffixes[i];
  return out.str();
}

}  // namespace

double Resources::get(const std::string& name) const {
  auto it = amounts.find(name);
  return it == amounts.end() ? 0.0 : it->second;
}

bool Resources::fits(const Resources& need) const {
  for (const auto& [name, amount] : need.amounts) {
    // A tiny epsilon keeps sums of fractional CPUs (0.1 * 10) from failing.
    if (amount > get(name) + 1e-9)
      return false;
  }
  return true;
}

Resources Resources::minus(const Resources& other) const {
  Resources out = *this;
  for (const auto& [name, amount] : other.amounts) {
    double left = out.get(name) - amount;
    out.amounts[name] = left > 0 ? left : 0.0;
  }
  return out;
}

Resources Resources::plus(const Resources& other) const {
  Resources out = *this;
  for (const auto& [name, amount] : other.amounts)
    out.amounts[name] += amount;
  return out;
}

std::string Resources::to_string() const {
  std::string out;
  for (const auto& [name, amount] : amounts) {
    if (!out.empty())
      out += ',';
    out += name + '=' + format_amount(amount);
  }
  return out;
}

Result<Resources> parse_resources(const std::string& text) {
  Resources out;
  if (text.empty())
    return out;
  std::size_t start = 0;
  while (start <= text.size()) {
    auto end = text.find(',', start);
    if (end == std::string::npos)
      end = text.size();
    std::string entry = text.substr(start, end - start);
    auto eq = entry.find('=');
    if (eq == std::string::npos) {
      return Result<Resources>(errc::invalid_argument,
                               "resource entry '" + entry + "' is not of the form name=amount");
    }
    std::string name = entry.substr(0, eq);
    std::string amount = entry.substr(eq + 1);
    if (!valid_name(name)) {
      return Result<Resources>(errc::invalid_argument,
                               "resource name '" + name + "' must match [a-z][a-z0-9_]*");
    }
    if (out.amounts.count(name)) {
      return Result<Resources>(errc::invalid_argument, "resource '" + name + "' is given twice");
    }
    double factor = 1;
    if (!amount.empty()) {
      switch (amount.back()) {
        case 'K':
        case 'k':
          factor = 1024.0;
          break;
        case 'M':
        case 'm':
          factor = 1024.0 * 1024;
          break;
        case 'G':
        case 'g':
          factor = 1024.0 * 1024 * 1024;
          break;
        case 'T':
        case 't':
          factor = 1024.0 * 1024 * 1024 * 1024;
          break;
        default:
          break;
      }
      if (factor != 1)
        amount.pop_back();
    }
    char* parse_end = nullptr;
    double value = amount.empty() ? NAN : std::strtod(amount.c_str(), &parse_end);
    if (amount.empty() || parse_end != amount.c_str() + amount.size() || !std::isfinite(value) ||
        value < 0) {
      return Result<Resources>(errc::invalid_argument,
                               "resource '" + name + "' has amount '" + entry.substr(eq + 1) +
                                   "'; expected a non-negative number with optional K/M/G/T");
    }
    out.amounts[name] = value * factor;
    start = end + 1;
    if (end == text.size())
      break;
  }
  return out;
}

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024)
    return std::to_string(bytes) + " bytes";
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  char buf[32];
  if (value == static_cast<double>(static_cast<uint64_t>(value)))
    std::snprintf(buf, sizeof(buf), "%llu %s", static_cast<unsigned long long>(value), units[unit]);
  else
    std::snprintf(buf, sizeof(buf), "%.1f %s", value, units[unit]);
  return buf;
}

}  // namespace troupe
