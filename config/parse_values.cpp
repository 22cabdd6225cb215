// The parser's readers of single values: a mapping's fields, strings,
// booleans, integers, numbers and seconds, args and user_config as JSON,
// resources, isolation and memory_limit (parse_internal.hpp).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "config/parse_internal.hpp"
#include "config/scalars.hpp"
#include "controller/core/model.hpp"
#include "controller/core/validate.hpp"
#include "runtime/resources.hpp"

namespace troupe::config::detail {

namespace {

// Names a Ray Serve user may bring along whose troupe spelling differs too
// much for the edit distance to find it.
const std::map<std::string, std::string> kRenamed = {
    {"code_version", "version"},
    {"init_args", "args"},
    {"ray_actor_options", "resources"},
    {"max_concurrent_queries", "max_ongoing_requests"},
    {"target_num_ongoing_requests_per_replica", "target_ongoing_requests"},
    {"upscaling_factor", "upscale_smoothing_factor"},
    {"downscaling_factor", "downscale_smoothing_factor"},
};

constexpr int kMaxJsonDepth = 64;
// Values in all args and user_config of one file together. Aliases share
// nodes in YAML but are copied into JSON, so a few lines of nested aliases
// could otherwise expand to billions of values.
constexpr size_t kMaxJsonValues = 1000000;

// The valid field closest to `name`, or "" when none is close enough to be a
// plausible typo.
std::string nearest(const std::string& name, const std::vector<std::string>& valid) {
  auto renamed = kRenamed.find(name);
  if (renamed != kRenamed.end() &&
      std::find(valid.begin(), valid.end(), renamed->second) != valid.end()) {
    return renamed->second;
  }
  std::string best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const auto& candidate : valid) {
    size_t d = edit_distance(name, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  if (best_distance <= std::max<size_t>(2, name.size() / 3))
    return best;
  return "";
}

}  // namespace

bool Parser::read_fields(const YAML::Node& map, const std::vector<std::string>& valid,
                         const std::string& where, Fields& out) {
  std::map<std::string, YAML::Mark> seen;
  for (const auto& entry : map) {
    const YAML::Node& key = entry.first;
    if (!key.IsScalar()) {
      return fail(key.Mark(),
                  "field names " + where + " must be plain names, got " + describe(key));
    }
    const std::string name = key.Scalar();
    if (std::find(valid.begin(), valid.end(), name) == valid.end()) {
      std::string message = "unknown field " + in_quotes(name) + " " + where;
      std::string suggestion = nearest(name, valid);
      if (!suggestion.empty()) {
        message += "; did you mean " + in_quotes(suggestion) + "?";
      } else {
        message += "; valid fields: " + join(valid);
      }
      return fail(key.Mark(), message);
    }
    auto [it, inserted] = seen.emplace(name, key.Mark());
    if (!inserted) {
      return fail(key.Mark(), "duplicate field " + in_quotes(name) + " " + where + " (first at " +
                                  position_text(it->second) + ")");
    }
    out.add(name, Field{key, entry.second});
  }
  return true;
}

bool Parser::get_string(const Field& f, const std::string& label, std::string& out) {
  if (!f.value.IsScalar())
    return fail(mark_of(f), label + ": expected a string, got " + describe(f.value));
  out = f.value.Scalar();
  return true;
}

// true or false (also True/TRUE, False/FALSE); YAML 1.1's yes/no/on/off are
// refused by name, since a Ray config read by PyYAML would take them.
bool Parser::get_bool(const Field& f, const std::string& label, bool& out) {
  const std::string expected = label + ": expected true or false, got ";
  if (!f.value.IsScalar())
    return fail(mark_of(f), expected + describe(f.value));
  const std::string& text = f.value.Scalar();
  if (is_true_text(text)) {
    out = true;
  } else if (is_false_text(text)) {
    out = false;
  } else {
    return fail(mark_of(f), expected + in_quotes(text) +
                                (is_yaml11_bool_text(text) ? " (write true or false)" : ""));
  }
  return true;
}

bool Parser::get_integer(const Field& f, const std::string& label, const std::string& expected,
                         long long lo, long long hi, long long& out) {
  if (!f.value.IsScalar())
    return fail(mark_of(f), label + ": expected " + expected + ", got " + describe(f.value));
  const std::string& text = f.value.Scalar();
  auto v = parse_integer(text);
  if (!v) {
    if (is_decimal_integer_text(text)) {  // too many digits for 64 bits
      return fail(mark_of(f),
                  label + ": " + text + " must be " +
                      (text[0] == '-' ? ">= " + std::to_string(lo) : "<= " + std::to_string(hi)));
    }
    return fail(mark_of(f), label + ": expected " + expected + ", got " + in_quotes(text));
  }
  if (*v < lo)
    return fail(mark_of(f), label + ": " + text + " must be >= " + std::to_string(lo));
  if (*v > hi)
    return fail(mark_of(f), label + ": " + text + " must be <= " + std::to_string(hi));
  out = *v;
  return true;
}

bool Parser::get_number(const Field& f, const std::string& label, const std::string& expected,
                        const Bounds& bounds, double& out) {
  if (!f.value.IsScalar())
    return fail(mark_of(f), label + ": expected " + expected + ", got " + describe(f.value));
  const std::string& text = f.value.Scalar();
  auto v = parse_number(text);
  if (!v)
    return fail(mark_of(f), label + ": expected " + expected + ", got " + in_quotes(text));
  if (bounds.lo_inclusive ? *v < bounds.lo : *v <= bounds.lo) {
    return fail(mark_of(f), label + ": " + text + " must be " +
                                (bounds.lo_inclusive ? ">= " : "> ") + format_double(bounds.lo));
  }
  if (*v > bounds.hi)
    return fail(mark_of(f), label + ": " + text + " must be <= " + format_double(bounds.hi));
  out = *v;
  return true;
}

bool Parser::max_num_models(const Field* f, int32_t& out) {
  static const std::string kLabel = "max_num_models_per_replica";
  long long v = -1;
  if (f && !get_integer(*f, kLabel, "a positive integer (-1 for no limit)", -1,
                        controller::kMaxNumModelsPerReplica, v)) {
    return false;
  }
  if (v == 0)
    return fail(mark_of(*f), kLabel + ": 0 must be >= 1 (or -1 for no limit)");
  out = static_cast<int32_t>(v);
  return true;
}

bool Parser::get_seconds(const Fields& fields, const std::string& name, bool zero_ok, double& out) {
  const Field* f = fields.get(name);
  if (!f)
    return true;
  return get_number(*f, name, "a number of seconds", Bounds{0, zero_ok, controller::kMaxTimeoutS},
                    out);
}

bool Parser::get_optional_seconds(const Fields& fields, const std::string& name,
                                  std::optional<double>& out) {
  const Field* f = fields.given(name);
  if (!f)
    return true;
  double v = 0;
  if (!get_number(*f, name, "a number of seconds", Bounds{0, false, controller::kMaxTimeoutS}, v))
    return false;
  out = v;
  return true;
}

bool Parser::scalar_to_json(const YAML::Node& node, const std::string& label, Json& out) {
  const std::string& tag = node.Tag();
  const std::string& text = node.Scalar();
  // Quoted scalars carry the tag "!", !!str the full tag: both are strings.
  if (tag == "!" || tag == "tag:yaml.org,2002:str") {
    out = text;
    return true;
  }
  if (tag != "?" && tag != "") {
    return fail(node.Mark(), label + ": unsupported YAML tag " + in_quotes(tag) +
                                 "; write the value plain or quoted");
  }
  if (is_null_text(text)) {
    out = nullptr;
  } else if (is_true_text(text)) {
    out = true;
  } else if (is_false_text(text)) {
    out = false;
  } else if (is_integer_text(text)) {
    const bool negative = text[0] == '-';
    int base = 10;
    std::string digits = text;
    if (text.size() > 2 && text[0] == '0' && (text[1] == 'o' || text[1] == 'x')) {
      base = text[1] == 'o' ? 8 : 16;
      digits = text.substr(2);
    }
    errno = 0;
    if (negative) {
      long long v = std::strtoll(digits.c_str(), nullptr, base);
      if (errno == ERANGE)
        out = std::strtod(text.c_str(), nullptr);
      else
        out = v;
    } else {
      unsigned long long v = std::strtoull(digits.c_str(), nullptr, base);
      if (errno == ERANGE)
        out = std::strtod(text.c_str(), nullptr);
      else
        out = v;
    }
  } else if (is_float_text(text)) {
    double v = std::strtod(text.c_str(), nullptr);
    if (!std::isfinite(v))
      return fail(node.Mark(), label + ": " + text + " is too large for JSON");
    out = v;
  } else if (is_special_float_text(text)) {
    return fail(node.Mark(), label + ": " + text + " cannot be represented in JSON");
  } else {
    out = text;
  }
  return true;
}

bool Parser::to_json(const YAML::Node& node, const std::string& label, int depth, Json& out) {
  if (depth > kMaxJsonDepth) {
    return fail(node.Mark(),
                label + ": nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  if (++json_values_ > kMaxJsonValues) {
    return fail(node.Mark(), label + ": more than " + std::to_string(kMaxJsonValues) +
                                 " values in args and user_config (aliases expanding?)");
  }
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      out = nullptr;
      return true;
    case YAML::NodeType::Scalar:
      return scalar_to_json(node, label, out);
    case YAML::NodeType::Sequence:
      out = Json::array();
      for (const auto& item : node) {
        Json value;
        if (!to_json(item, label, depth + 1, value))
          return false;
        out.push_back(std::move(value));
      }
      return true;
    case YAML::NodeType::Map: {
      out = Json::object();
      std::map<std::string, YAML::Mark> seen;
      for (const auto& entry : node) {
        if (!entry.first.IsScalar()) {
          return fail(entry.first.Mark(),
                      label + ": keys must be strings or numbers, got " + describe(entry.first));
        }
        const std::string key = entry.first.Scalar();
        auto [it, inserted] = seen.emplace(key, entry.first.Mark());
        if (!inserted) {
          return fail(entry.first.Mark(), label + ": duplicate key " + in_quotes(key) +
                                              " (first at " + position_text(it->second) + ")");
        }
        Json value;
        if (!to_json(entry.second, label, depth + 1, value))
          return false;
        out[key] = std::move(value);
      }
      return true;
    }
  }
  return true;
}

bool Parser::get_json(const Field& f, const std::string& label, bool mapping_only,
                      std::string& out) {
  if (f.value.IsNull()) {  // `user_config: null` is the same as no user_config
    out.clear();
    return true;
  }
  if (mapping_only && !f.value.IsMap())
    return fail(mark_of(f), label + ": expected a mapping, got " + describe(f.value));
  Json json;
  if (!to_json(f.value, label, 0, json))
    return false;
  out = json.dump(-1, ' ', false, Json::error_handler_t::replace);
  return true;
}

bool Parser::resources(const Field& f, Resources& out) {
  if (f.value.IsNull())
    return true;
  if (!f.value.IsMap()) {
    return fail(mark_of(f),
                "resources: expected a mapping like {cpu: 1, mem: 512M}, got " + describe(f.value));
  }
  std::map<std::string, YAML::Mark> seen;
  for (const auto& entry : f.value) {
    const YAML::Node& key = entry.first;
    const YAML::Node& value = entry.second;
    if (!key.IsScalar())
      return fail(key.Mark(), "resources: expected resource names as keys, got " + describe(key));
    const std::string name = key.Scalar();
    if (name.find_first_of(",=") != std::string::npos)
      return fail(key.Mark(),
                  "resources: resource name " + in_quotes(name) + " must match [a-z][a-z0-9_]*");
    auto [it, inserted] = seen.emplace(name, key.Mark());
    if (!inserted) {
      return fail(key.Mark(), "resources: duplicate resource " + in_quotes(name) + " (first at " +
                                  position_text(it->second) + ")");
    }
    if (!value.IsScalar()) {
      return fail(value.IsNull() ? key.Mark() : value.Mark(),
                  "resources: " + name + ": expected an amount like 1, 0.5 or 512M, got " +
                      describe(value));
    }
    // One entry at a time through the same parser as --resources, so the two
    // spellings mean the same.
    auto one = parse_resources(name + "=" + value.Scalar());
    if (!one) {
      const bool bad_name = one.status().message().rfind("resource name", 0) == 0;
      return fail(bad_name ? key.Mark() : value.Mark(), "resources: " + one.status().message());
    }
    out.amounts[name] = one->get(name);
  }
  return true;
}

bool Parser::isolation(const Field& f, Isolation& out) {
  const std::string expected = "isolation: expected process or in_process, got ";
  if (!f.value.IsScalar())
    return fail(mark_of(f), expected + describe(f.value));
  auto parsed = controller::parse_isolation(f.value.Scalar());
  if (!parsed)
    return fail(mark_of(f), expected + in_quotes(f.value.Scalar()));
  out = *parsed;
  return true;
}

// A byte count: plain bytes ("536870912") or a number with a K/M/G/T suffix
// (powers of 1024), also spelled Ki/Mi/Gi/Ti and KiB/MiB/GiB/TiB. Suffixed
// amounts go through parse_resources, so "512M" means here what it means in
// `resources` and --resources.
bool Parser::memory_limit(const Field& f, uint64_t& out) {
  const std::string expected =
      "memory_limit: expected bytes or a size like 512M, 4G or 512MiB (K/M/G/T: powers of "
      "1024), got ";
  if (!f.value.IsScalar())
    return fail(mark_of(f), expected + describe(f.value));
  const std::string& text = f.value.Scalar();
  uint64_t bytes = 0;
  if (!text.empty() &&
      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    errno = 0;
    unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
    if (errno == ERANGE) {
      return fail(mark_of(f), "memory_limit: " + text + " must be <= " +
                                  std::to_string(std::numeric_limits<uint64_t>::max()));
    }
    bytes = v;
  } else {
    auto is_suffix = [](char c) { return c != '\0' && std::strchr("KMGTkmgt", c) != nullptr; };
    std::string amount = text;
    for (const char* tail : {"iB", "i"}) {
      const size_t n = std::strlen(tail);
      if (amount.size() > n + 1 && amount.compare(amount.size() - n, n, tail) == 0 &&
          is_suffix(amount[amount.size() - n - 1])) {
        amount.resize(amount.size() - n);
        break;
      }
    }
    // One amount only: no ',' or '=' may smuggle in a second entry.
    if (amount.empty() || !is_suffix(amount.back()) ||
        amount.find_first_of(",=") != std::string::npos) {
      return fail(mark_of(f), expected + in_quotes(text));
    }
    auto parsed = parse_resources("memory_limit=" + amount);
    if (!parsed)
      return fail(mark_of(f), expected + in_quotes(text));
    const double v = parsed->get("memory_limit");
    if (v != std::floor(v))
      return fail(mark_of(f), "memory_limit: " + text + " is not a whole number of bytes");
    if (v >= 18446744073709551616.0) {  // 2^64
      return fail(mark_of(f), "memory_limit: " + text + " must be <= " +
                                  std::to_string(std::numeric_limits<uint64_t>::max()));
    }
    bytes = static_cast<uint64_t>(v);
  }
  if (bytes != 0 && bytes < controller::kMinMemoryLimitBytes)
    return fail(mark_of(f), "memory_limit: " + text + " must be 0 (no limit) or >= 32M");
  out = bytes;
  return true;
}

}  // namespace troupe::config::detail
