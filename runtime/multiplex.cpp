#include "runtime/multiplex.hpp"

namespace troupe::multiplex {

namespace {

bool iequals(const std::string& a, const char* b) {
  size_t i = 0;
  for (; i < a.size() && b[i] != '\0'; ++i) {
    char x = a[i] >= 'A' && a[i] <= 'Z' ? char(a[i] - 'A' + 'a') : a[i];
    char y = b[i] >= 'A' && b[i] <= 'Z' ? char(b[i] - 'A' + 'a') : b[i];
    if (x != y)
      return false;
  }
  return i == a.size() && b[i] == '\0';
}

}  // namespace

std::string model_id_of(const std::vector<std::pair<std::string, std::string>>& headers) {
  const std::string* alt = nullptr;
  for (const auto& [name, value] : headers) {
    if (iequals(name, kMultiplexedModelIdHeader))
      return value;
    if (!alt && iequals(name, kModelIdHeader))
      alt = &value;
  }
  return alt ? *alt : std::string();
}

std::string encode_held(const HeldModels& held) {
  std::string out = std::to_string(held.seq);
  out.push_back(' ');
  bool first = true;
  for (const auto& id : held.model_ids) {
    if (!first)
      out.push_back(',');
    first = false;
    for (char c : id) {
      if (c == '%')
        out += "%25";
      else if (c == ',')
        out += "%2C";
      else
        out.push_back(c);
    }
  }
  return out;
}

bool decode_held(const std::string& value, HeldModels& out) {
  auto space = value.find(' ');
  if (space == 0 || space == std::string::npos || space > 20)
    return false;
  uint64_t seq = 0;
  for (size_t i = 0; i < space; ++i) {
    if (value[i] < '0' || value[i] > '9')
      return false;
    seq = seq * 10 + static_cast<uint64_t>(value[i] - '0');
  }
  std::vector<std::string> ids;
  if (space + 1 < value.size()) {
    std::string id;
    for (size_t i = space + 1; i <= value.size(); ++i) {
      if (i == value.size() || value[i] == ',') {
        if (id.empty())
          return false;
        ids.push_back(std::move(id));
        id.clear();
      } else if (value[i] == '%') {
        if (value.compare(i, 3, "%25") == 0)
          id.push_back('%');
        else if (value.compare(i, 3, "%2C") == 0)
          id.push_back(',');
        else
          return false;
        i += 2;
      } else {
        id.push_back(value[i]);
      }
    }
  }
  out.seq = seq;
  out.model_ids = std::move(ids);
  return true;
}

}  // namespace troupe::multiplex
