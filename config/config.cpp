#include "config/config.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <utility>
#include <vector>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "controller/core/validate.hpp"
#include "replica/plugin/import_path.hpp"
#include "runtime/resources.hpp"

namespace troupe::config {

using controller::ApplicationSpec;
using controller::AutoscalingConfig;
using controller::DeploymentConfig;
using controller::DeploymentSpec;
using controller::Isolation;
using controller::TargetState;
using Json = nlohmann::json;

bool operator==(const HttpOptions& a, const HttpOptions& b) {
  return a.host == b.host && a.port == b.port;
}

std::optional<std::string> ignored_http_fields(const HttpOptions& http) {
  if (!http.host && !http.port)
    return std::nullopt;
  std::string fields = http.host && http.port ? "host and port are"
                       : http.host            ? "host is"
                                              : "port is";
  return "http_options: " + fields +
         " ignored: each node's proxy listens where troupe-node --bind and --http-port say";
}

bool operator==(const DeployConfig& a, const DeployConfig& b) {
  return a.http == b.http && a.state == b.state;
}

namespace {

// ---------------------------------------------------------------------------
// Field names. Order is the order to_yaml writes them in.

const std::vector<std::string> kTopFields = {"http_options", "target_capacity", "applications"};
const std::vector<std::string> kHttpFields = {"host", "port", "request_timeout_s",
                                              "keep_alive_timeout_s"};
const std::vector<std::string> kAppFields = {"name",   "route_prefix", "import_path",
                                             "args",   "traffic",      "traffic_key_header",
                                             "shadow", "deployments"};
const std::vector<std::string> kDeploymentFields = {"name",
                                                    "import_path",
                                                    "args",
                                                    "version",
                                                    "num_replicas",
                                                    "max_ongoing_requests",
                                                    "max_queued_requests",
                                                    "user_config",
                                                    "autoscaling_config",
                                                    "health_check_period_s",
                                                    "health_check_timeout_s",
                                                    "graceful_shutdown_wait_loop_s",
                                                    "graceful_shutdown_timeout_s",
                                                    "resources",
                                                    "max_replicas_per_node",
                                                    "isolation",
                                                    "memory_limit",
                                                    "stuck_after_s",
                                                    "max_num_models_per_replica",
                                                    "force_stop_unhealthy_replicas"};
const std::vector<std::string> kAutoscalingFields = {"min_replicas",
                                                     "max_replicas",
                                                     "initial_replicas",
                                                     "target_ongoing_requests",
                                                     "metrics_interval_s",
                                                     "look_back_period_s",
                                                     "smoothing_factor",
                                                     "upscale_smoothing_factor",
                                                     "downscale_smoothing_factor",
                                                     "upscale_delay_s",
                                                     "downscale_delay_s"};

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

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty())
      out += ", ";
    out += item;
  }
  return out;
}

// A user's text inside a one-line message: control characters escaped, long
// values shortened.
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

// What a node holds, for "got ..." in messages.
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

// The shortest decimal text that reads back as exactly `v`.
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

const std::regex kIntDecimal("[-+]?[0-9]+");
const std::regex kIntOctal("0o[0-7]+");
const std::regex kIntHex("0x[0-9a-fA-F]+");
const std::regex kFloat("[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?");
const std::regex kInfinity("[-+]?\\.(inf|Inf|INF)");
const std::regex kNan("\\.(nan|NaN|NAN)");

bool is_null_text(const std::string& s) {
  return s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL";
}
bool is_true_text(const std::string& s) {
  return s == "true" || s == "True" || s == "TRUE";
}
bool is_false_text(const std::string& s) {
  return s == "false" || s == "False" || s == "FALSE";
}
// Booleans of YAML 1.1 (PyYAML, yaml-cpp's as<bool>): never written plain.
bool is_yaml11_bool_text(const std::string& s) {
  static const char* const words[] = {"y",  "Y",  "yes", "Yes", "YES", "n",   "N",   "no",
                                      "No", "NO", "on",  "On",  "ON",  "off", "Off", "OFF"};
  for (const char* w : words) {
    if (s == w)
      return true;
  }
  return false;
}

// True when a plain (unquoted) scalar with this text would be read as
// something other than a string; such strings are written double-quoted.
bool needs_quotes(const std::string& s) {
  return is_null_text(s) || is_true_text(s) || is_false_text(s) || is_yaml11_bool_text(s) ||
         std::regex_match(s, kIntDecimal) || std::regex_match(s, kIntOctal) ||
         std::regex_match(s, kIntHex) || std::regex_match(s, kFloat) ||
         std::regex_match(s, kInfinity) || std::regex_match(s, kNan);
}

// Integer text as written in the config ("3", "-1", "+7"); nullopt when it is
// not a decimal integer or does not fit 64 bits.
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

// ---------------------------------------------------------------------------
// The parser: walks the YAML tree, stops at the first problem.

struct Field {
  YAML::Node key;
  YAML::Node value;
};

class Fields {
 public:
  void add(const std::string& name, Field field) { fields_.emplace(name, std::move(field)); }
  const Field* get(const std::string& name) const {
    auto it = fields_.find(name);
    return it == fields_.end() ? nullptr : &it->second;
  }
  // Present and not null.
  const Field* given(const std::string& name) const {
    const Field* f = get(name);
    return f && !f->value.IsNull() ? f : nullptr;
  }

 private:
  std::map<std::string, Field> fields_;
};

struct Bounds {
  double lo;
  bool lo_inclusive;
  double hi;  // inclusive; infinity for none
};

class Parser {
 public:
  explicit Parser(std::string file) : file_(std::move(file)) {}

  Result<DeployConfig> run(const std::string& text);

 private:
  // Records the first problem; always returns false so callers can
  // `return fail(...)`.
  bool fail(const YAML::Mark& mark, const std::string& message) {
    if (error_.is_ok()) {
      std::string where = file_;
      if (!mark.is_null())
        where += ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
      error_ = Status(errc::invalid_argument, where + ": " + message);
    }
    return false;
  }
  // Where a field's value is, or its key when the value is empty.
  static YAML::Mark mark_of(const Field& f) {
    if (f.value.IsNull() || f.value.Mark().is_null())
      return f.key.Mark();
    return f.value.Mark();
  }
  static std::string position_text(const YAML::Mark& m) {
    return "line " + std::to_string(m.line + 1) + ", column " + std::to_string(m.column + 1);
  }

  bool read_fields(const YAML::Node& map, const std::vector<std::string>& valid,
                   const std::string& where, Fields& out);
  bool get_string(const Field& f, const std::string& label, std::string& out);
  bool get_bool(const Field& f, const std::string& label, bool& out);
  bool get_integer(const Field& f, const std::string& label, const std::string& expected,
                   long long lo, long long hi, long long& out);
  template <class T>
  bool get_int_as(const Field* f, const std::string& label, const std::string& expected,
                  long long lo, long long hi, T& out) {
    if (!f)
      return true;
    long long v = 0;
    if (!get_integer(*f, label, expected, lo, hi, v))
      return false;
    out = static_cast<T>(v);
    return true;
  }
  bool get_number(const Field& f, const std::string& label, const std::string& expected,
                  const Bounds& bounds, double& out);
  bool get_seconds(const Fields& fields, const std::string& name, bool zero_ok, double& out);
  // max_num_models_per_replica: -1 (no limit) or 1 to kMaxNumModelsPerReplica.
  bool max_num_models(const Field* f, int32_t& out);
  bool get_optional_seconds(const Fields& fields, const std::string& name,
                            std::optional<double>& out);
  bool get_json(const Field& f, const std::string& label, bool mapping_only, std::string& out);
  bool to_json(const YAML::Node& node, const std::string& label, int depth, Json& out);
  bool scalar_to_json(const YAML::Node& node, const std::string& label, Json& out);

  bool http_options(const YAML::Node& node, HttpOptions& out, controller::HttpSettings& settings);
  bool application(const YAML::Node& node, size_t index, ApplicationSpec& out);
  bool deployment(const YAML::Node& node, size_t index, const std::string& app_name,
                  const ImportPath& app_import, const std::string& app_import_text,
                  const std::string& app_args, const YAML::Mark& app_args_mark,
                  DeploymentSpec& out);
  bool autoscaling(const Field& f, const std::string& deployment_name, AutoscalingConfig& out);
  bool resources(const Field& f, Resources& out);
  bool isolation(const Field& f, Isolation& out);
  bool memory_limit(const Field& f, uint64_t& out);
  bool traffic(const Field& f, const ApplicationSpec& app, std::map<std::string, double>& out);
  bool shadow(const Field& f, const ApplicationSpec& app, std::map<std::string, double>& out);
  bool deployment_shares(const Field& f, const ApplicationSpec& app, const std::string& field,
                         const std::string& self, const std::string& what,
                         const std::string& example, std::map<std::string, double>& out);

  std::string file_;
  Status error_;
  DeployConfig config_;
  size_t json_values_ = 0;
};

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
    if (std::regex_match(text, kIntDecimal)) {  // too many digits for 64 bits
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
  } else if (std::regex_match(text, kIntDecimal) || std::regex_match(text, kIntOctal) ||
             std::regex_match(text, kIntHex)) {
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
  } else if (std::regex_match(text, kFloat)) {
    double v = std::strtod(text.c_str(), nullptr);
    if (!std::isfinite(v))
      return fail(node.Mark(), label + ": " + text + " is too large for JSON");
    out = v;
  } else if (std::regex_match(text, kInfinity) || std::regex_match(text, kNan)) {
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

bool Parser::http_options(const YAML::Node& node, HttpOptions& out,
                          controller::HttpSettings& settings) {
  if (!node.IsMap())
    return fail(node.Mark(), "http_options: expected a mapping, got " + describe(node));
  Fields fields;
  if (!read_fields(node, kHttpFields, "in http_options", fields))
    return false;
  if (const Field* f = fields.get("host")) {
    std::string host;
    if (!get_string(*f, "host", host))
      return false;
    if (host.empty() || host.find_first_of(" \t\r\n") != std::string::npos)
      return fail(mark_of(*f), "host: " + in_quotes(host) + " is not a host name or address");
    out.host = host;
  }
  if (const Field* f = fields.get("port")) {
    uint16_t port = 0;
    if (!get_int_as(f, "port", "a port number (1-65535)", 1, 65535, port))
      return false;
    out.port = port;
  }
  if (!get_optional_seconds(fields, "request_timeout_s", settings.request_timeout_s))
    return false;
  return get_optional_seconds(fields, "keep_alive_timeout_s", settings.keep_alive_timeout_s);
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

bool Parser::autoscaling(const Field& f, const std::string& deployment_name,
                         AutoscalingConfig& out) {
  if (!f.value.IsMap()) {
    return fail(mark_of(f), "autoscaling_config: expected a mapping, got " + describe(f.value));
  }
  Fields fields;
  if (!read_fields(f.value, kAutoscalingFields,
                   "in autoscaling_config of deployment " + in_quotes(deployment_name), fields)) {
    return false;
  }
  const long long max_replicas = controller::kMaxReplicas;
  const std::string count = "a non-negative integer";
  if (!get_int_as(fields.get("min_replicas"), "min_replicas", count, 0, max_replicas,
                  out.min_replicas) ||
      !get_int_as(fields.get("max_replicas"), "max_replicas", "a positive integer", 1, max_replicas,
                  out.max_replicas)) {
    return false;
  }
  if (const Field* initial = fields.given("initial_replicas")) {
    uint32_t v = 0;
    if (!get_int_as(initial, "initial_replicas", count, 0, max_replicas, v))
      return false;
    out.initial_replicas = v;
  }
  if (out.min_replicas > out.max_replicas) {
    const Field* at = fields.get("min_replicas");
    return fail(at ? mark_of(*at) : f.value.Mark(),
                "min_replicas (" + std::to_string(out.min_replicas) +
                    ") must be <= max_replicas (" + std::to_string(out.max_replicas) + ")");
  }
  if (out.initial_replicas &&
      (*out.initial_replicas < out.min_replicas || *out.initial_replicas > out.max_replicas)) {
    return fail(mark_of(*fields.get("initial_replicas")),
                "initial_replicas (" + std::to_string(*out.initial_replicas) +
                    ") must be within [min_replicas, max_replicas] = [" +
                    std::to_string(out.min_replicas) + ", " + std::to_string(out.max_replicas) +
                    "]");
  }
  const Bounds positive{0, false, std::numeric_limits<double>::infinity()};
  auto positive_number = [&](const std::string& name, double& target) {
    const Field* field = fields.get(name);
    return !field || get_number(*field, name, "a positive number", positive, target);
  };
  auto optional_positive = [&](const std::string& name, std::optional<double>& target) {
    const Field* field = fields.given(name);
    if (!field)
      return true;
    double v = 0;
    if (!get_number(*field, name, "a positive number", positive, v))
      return false;
    target = v;
    return true;
  };
  return positive_number("target_ongoing_requests", out.target_ongoing_requests) &&
         get_seconds(fields, "metrics_interval_s", false, out.metrics_interval_s) &&
         get_seconds(fields, "look_back_period_s", false, out.look_back_period_s) &&
         positive_number("smoothing_factor", out.smoothing_factor) &&
         optional_positive("upscale_smoothing_factor", out.upscale_smoothing_factor) &&
         optional_positive("downscale_smoothing_factor", out.downscale_smoothing_factor) &&
         get_seconds(fields, "upscale_delay_s", true, out.upscale_delay_s) &&
         get_seconds(fields, "downscale_delay_s", true, out.downscale_delay_s);
}

// The value of a mapping's `name` key when it is a scalar, else "".
std::string peek_name(const YAML::Node& map) {
  for (const auto& entry : map) {
    if (entry.first.IsScalar() && entry.first.Scalar() == "name" && entry.second.IsScalar())
      return entry.second.Scalar();
  }
  return "";
}

const char* const kNameRule =
    "must be 1-100 characters without '#', '/', spaces or control "
    "characters";

bool Parser::deployment(const YAML::Node& node, size_t index, const std::string& app_name,
                        const ImportPath& app_import, const std::string& app_import_text,
                        const std::string& app_args, const YAML::Mark& app_args_mark,
                        DeploymentSpec& out) {
  const std::string position =
      "deployments[" + std::to_string(index) + "] of application " + in_quotes(app_name);
  if (!node.IsMap())
    return fail(node.Mark(), position + ": expected a mapping, got " + describe(node));
  const std::string peeked = peek_name(node);
  const std::string where =
      peeked.empty() ? "in " + position : "in deployment " + in_quotes(peeked);
  Fields fields;
  if (!read_fields(node, kDeploymentFields, where, fields))
    return false;

  const Field* name = fields.get("name");
  if (!name)
    return fail(node.Mark(), "missing field 'name' " + where);
  if (!get_string(*name, "name", out.name))
    return false;
  if (!controller::valid_name(out.name)) {
    return fail(mark_of(*name), "deployment name " + in_quotes(out.name) + " " + kNameRule);
  }
  const bool is_ingress = out.name == app_import.class_name;
  const std::string self = "deployment " + in_quotes(out.name);

  if (const Field* f = fields.get("import_path")) {
    if (!get_string(*f, "import_path", out.import_path))
      return false;
    auto parsed = parse_import_path(out.import_path);
    if (!parsed)
      return fail(mark_of(*f), parsed.status().message());
    if (is_ingress && out.import_path != app_import_text) {
      return fail(mark_of(*f), "import_path of ingress " + self + " must be the application's (" +
                                   in_quotes(app_import_text) + ") or be left out");
    }
  } else if (is_ingress) {
    out.import_path = app_import_text;
  } else {
    out.import_path = app_import.library + ":" + out.name;
    auto parsed = parse_import_path(out.import_path);
    if (!parsed) {
      return fail(mark_of(*name), self + " has no import_path and its name is no class name (" +
                                      parsed.status().message() + "); give an import_path");
    }
  }

  if (const Field* f = fields.get("args")) {
    if (is_ingress && !app_args.empty() && !f->value.IsNull()) {
      return fail(mark_of(*f), "args of ingress " + self + " are given twice: here and at " +
                                   position_text(app_args_mark) + " in the application; keep one");
    }
    if (!get_json(*f, "args", true, out.init_args))
      return false;
  }
  if (is_ingress && out.init_args.empty())
    out.init_args = app_args;

  if (const Field* f = fields.get("version")) {
    if (!get_string(*f, "version", out.code_version))
      return false;
  }

  DeploymentConfig& c = out.config;
  const long long max_replicas = controller::kMaxReplicas;
  const Field* num_replicas = fields.get("num_replicas");
  if (num_replicas) {
    if (num_replicas->value.IsScalar() && num_replicas->value.Scalar() == "auto") {
      return fail(mark_of(*num_replicas),
                  "num_replicas: 'auto' is not supported; give an autoscaling_config instead");
    }
    if (!get_int_as(num_replicas, "num_replicas", "a non-negative integer", 0, max_replicas,
                    c.num_replicas)) {
      return false;
    }
  }
  if (const Field* f = fields.given("autoscaling_config")) {
    if (num_replicas) {
      return fail(mark_of(*num_replicas),
                  "num_replicas and autoscaling_config of " + self +
                      " are mutually exclusive: give a fixed num_replicas or autoscaling_config, "
                      "not both");
    }
    AutoscalingConfig a;
    if (!autoscaling(*f, out.name, a))
      return false;
    c.autoscaling_config = a;
  }
  if (!get_int_as(fields.get("max_ongoing_requests"), "max_ongoing_requests", "a positive integer",
                  1, controller::kMaxOngoingRequests, c.max_ongoing_requests) ||
      !get_int_as(fields.get("max_queued_requests"), "max_queued_requests",
                  "an integer (-1 for no limit)", -1, std::numeric_limits<int32_t>::max(),
                  c.max_queued_requests) ||
      !get_int_as(fields.get("max_replicas_per_node"), "max_replicas_per_node",
                  "a non-negative integer (0 for no limit)", 0, max_replicas,
                  c.max_replicas_per_node) ||
      !max_num_models(fields.given("max_num_models_per_replica"), c.max_num_models_per_replica)) {
    return false;
  }
  if (const Field* f = fields.get("user_config")) {
    if (!get_json(*f, "user_config", false, c.user_config))
      return false;
  }
  if (!get_seconds(fields, "health_check_period_s", false, c.health_check_period_s) ||
      !get_seconds(fields, "health_check_timeout_s", false, c.health_check_timeout_s) ||
      !get_seconds(fields, "graceful_shutdown_wait_loop_s", false,
                   c.graceful_shutdown_wait_loop_s) ||
      !get_seconds(fields, "graceful_shutdown_timeout_s", false, c.graceful_shutdown_timeout_s) ||
      !get_seconds(fields, "stuck_after_s", true, c.stuck_after_s)) {
    return false;
  }
  if (const Field* f = fields.get("resources")) {
    if (!resources(*f, c.resources))
      return false;
  }
  if (const Field* f = fields.get("force_stop_unhealthy_replicas")) {
    if (!get_bool(*f, "force_stop_unhealthy_replicas", c.force_stop_unhealthy_replicas))
      return false;
  }
  if (const Field* f = fields.get("isolation")) {
    if (!isolation(*f, c.isolation))
      return false;
  }
  if (const Field* f = fields.get("memory_limit")) {
    if (!memory_limit(*f, c.memory_limit_bytes))
      return false;
    if (c.memory_limit_bytes != 0 && c.isolation == Isolation::in_process) {
      return fail(mark_of(*f), "memory_limit of " + self +
                                   " needs isolation: process (it is enforced on the replica "
                                   "process; this deployment has isolation: in_process)");
    }
  }
  return true;
}

// A mapping of the application's deployment names to numbers in [0, 1]
// (`field` of `self`: the weights of a traffic split, the probabilities of
// shadows), each name once and one of the deployments. `example` ("weights
// like {...}") shows the expected shape in the error for a value that is not
// a mapping.
bool Parser::deployment_shares(const Field& f, const ApplicationSpec& app, const std::string& field,
                               const std::string& self, const std::string& what,
                               const std::string& example, std::map<std::string, double>& out) {
  if (!f.value.IsMap()) {
    return fail(mark_of(f), self + ": expected a mapping of deployment names to " + example +
                                ", got " + describe(f.value));
  }
  std::map<std::string, YAML::Mark> seen;
  for (const auto& entry : f.value) {
    const YAML::Node& key = entry.first;
    if (!key.IsScalar())
      return fail(key.Mark(), self + ": expected deployment names as keys, got " + describe(key));
    const std::string name = key.Scalar();
    auto [it, inserted] = seen.emplace(name, key.Mark());
    if (!inserted) {
      return fail(key.Mark(), self + ": duplicate deployment " + in_quotes(name) + " (first at " +
                                  position_text(it->second) + ")");
    }
    bool known = std::any_of(app.deployments.begin(), app.deployments.end(),
                             [&](const DeploymentSpec& d) { return d.name == name; });
    if (!known) {
      std::string names;
      for (const auto& d : app.deployments)
        names += (names.empty() ? "" : ", ") + d.name;
      return fail(key.Mark(), self + ": " + in_quotes(name) +
                                  " is not a deployment of the application (it has " + names + ")");
    }
    double v = 0;
    if (!get_number(Field{key, entry.second}, field + ": " + name, "a " + what + " from 0 to 1",
                    Bounds{0, true, 1}, v))
      return false;
    out[name] = v;
  }
  return true;
}

// After the deployments: every name must be one of them, the weights sum
// to 1.
bool Parser::traffic(const Field& f, const ApplicationSpec& app,
                     std::map<std::string, double>& out) {
  const std::string self = "traffic of application " + in_quotes(app.name);
  if (f.value.IsMap() && f.value.size() == 0) {
    return fail(mark_of(f), self +
                                ": must name at least one deployment (omit it to send "
                                "everything to the ingress)");
  }
  if (!deployment_shares(f, app, "traffic", self, "weight",
                         "weights like {Hello: 0.9, Canary: 0.1}", out))
    return false;
  double sum = 0;
  for (const auto& [name, w] : out)
    sum += w;
  if (!controller::traffic_sum_is_one(sum)) {
    return fail(mark_of(f),
                self + ": the weights sum to " + format_double(sum) + "; they must sum to 1");
  }
  return true;
}

// After the deployments: every name must be one of them, each probability in
// [0, 1]. That a shadow receives no real traffic is the controller's rule
// (controller::validate, run on the whole config at the end).
bool Parser::shadow(const Field& f, const ApplicationSpec& app,
                    std::map<std::string, double>& out) {
  const std::string self = "shadow of application " + in_quotes(app.name);
  return deployment_shares(f, app, "shadow", self, "probability",
                           "probabilities like {Mirror: 0.5}", out);
}

bool Parser::application(const YAML::Node& node, size_t index, ApplicationSpec& out) {
  const std::string position = "applications[" + std::to_string(index) + "]";
  if (!node.IsMap())
    return fail(node.Mark(), position + ": expected a mapping, got " + describe(node));
  const std::string peeked = peek_name(node);
  const std::string where =
      "in application " + in_quotes(peeked.empty() ? std::string("default") : peeked);
  Fields fields;
  if (!read_fields(node, kAppFields, where, fields))
    return false;

  out.name = "default";  // Ray Serve's default application name
  if (const Field* f = fields.get("name")) {
    if (!get_string(*f, "name", out.name))
      return false;
    if (!controller::valid_name(out.name))
      return fail(mark_of(*f), "application name " + in_quotes(out.name) + " " + kNameRule);
  }
  const std::string self = "application " + in_quotes(out.name);

  out.route_prefix = "/";  // Ray Serve's default
  if (const Field* f = fields.get("route_prefix")) {
    if (!get_string(*f, "route_prefix", out.route_prefix))
      return false;
    if (out.route_prefix.empty() || out.route_prefix[0] != '/') {
      return fail(mark_of(*f), "route_prefix " + in_quotes(out.route_prefix) + " of " + self +
                                   " must start with '/'");
    }
  }

  const Field* import = fields.get("import_path");
  if (!import)
    return fail(node.Mark(), "missing field 'import_path' " + where);
  std::string import_text;
  if (!get_string(*import, "import_path", import_text))
    return false;
  auto parsed_import = parse_import_path(import_text);
  if (!parsed_import)
    return fail(mark_of(*import), parsed_import.status().message());
  out.ingress = parsed_import->class_name;

  std::string app_args;
  YAML::Mark app_args_mark = node.Mark();
  if (const Field* f = fields.get("args")) {
    if (!get_json(*f, "args", true, app_args))
      return false;
    app_args_mark = mark_of(*f);
  }

  std::map<std::string, YAML::Mark> seen;
  if (const Field* f = fields.get("deployments")) {
    if (!f->value.IsSequence()) {
      return fail(mark_of(*f),
                  "deployments: expected a sequence of deployments, got " + describe(f->value));
    }
    size_t i = 0;
    for (const auto& item : f->value) {
      DeploymentSpec d;
      if (!deployment(item, i++, out.name, *parsed_import, import_text, app_args, app_args_mark,
                      d)) {
        return false;
      }
      auto [it, inserted] = seen.emplace(d.name, item.Mark());
      if (!inserted) {
        return fail(item.Mark(), "duplicate deployment name " + in_quotes(d.name) + " in " + self +
                                     " (first at " + position_text(it->second) + ")");
      }
      out.deployments.push_back(std::move(d));
    }
  }
  if (!seen.count(out.ingress)) {
    // The ingress is not listed: it runs with the defaults.
    DeploymentSpec ingress;
    ingress.name = out.ingress;
    ingress.import_path = import_text;
    ingress.init_args = app_args;
    out.deployments.insert(out.deployments.begin(), std::move(ingress));
  }
  if (const Field* f = fields.given("traffic")) {
    if (!traffic(*f, out, out.traffic))
      return false;
  }
  if (const Field* f = fields.given("traffic_key_header")) {
    if (!get_string(*f, "traffic_key_header", out.traffic_key_header))
      return false;
    if (!controller::valid_header_name(out.traffic_key_header)) {
      return fail(mark_of(*f), "traffic_key_header " + in_quotes(out.traffic_key_header) + " of " +
                                   self + " must be an HTTP header name");
    }
    if (out.traffic.empty()) {
      return fail(mark_of(*f),
                  "traffic_key_header of " + self + " needs a traffic split (give 'traffic' too)");
    }
  }
  if (const Field* f = fields.given("shadow")) {
    if (!shadow(*f, out, out.shadow))
      return false;
  }
  return true;
}

// The first character of the text that YAML does not allow: a byte that is
// not part of well-formed UTF-8 (no overlong forms, surrogates or code points
// past U+10FFFF), or a character outside YAML's printable set (the C0 and C1
// controls but tab, LF, CR and NEL; DEL; U+FFFE, U+FFFF). yaml-cpp checks
// neither, and its emitter replaces bad bytes, so such text would not print
// back as it was read.
struct BadText {
  size_t at = std::string::npos;
  bool utf8 = true;   // false: not UTF-8 at `at`
  uint32_t code = 0;  // else the character
};

BadText first_bad_character(const std::string& text) {
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    unsigned char c = b[i];
    size_t len = 1;
    uint32_t cp = c;
    if (c >= 0x80) {
      if ((c & 0xE0) == 0xC0) {
        len = 2;
        cp = c & 0x1F;
      } else if ((c & 0xF0) == 0xE0) {
        len = 3;
        cp = c & 0x0F;
      } else if ((c & 0xF8) == 0xF0) {
        len = 4;
        cp = c & 0x07;
      } else {
        return {i, false, 0};
      }
      if (i + len > n)
        return {i, false, 0};
      for (size_t k = 1; k < len; ++k) {
        if ((b[i + k] & 0xC0) != 0x80)
          return {i, false, 0};
        cp = (cp << 6) | (b[i + k] & 0x3F);
      }
      static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return {i, false, 0};
    }
    const bool printable = cp == 0x09 || cp == 0x0A || cp == 0x0D || (cp >= 0x20 && cp <= 0x7E) ||
                           cp == 0x85 || (cp >= 0xA0 && cp <= 0xD7FF) ||
                           (cp >= 0xE000 && cp <= 0xFFFD) || cp >= 0x10000;
    if (!printable)
      return {i, true, cp};
    i += len;
  }
  return {};
}

// Where a document starts, and where its first node is (the parser's
// events; nothing is kept).
class DocumentMarks : public YAML::EventHandler {
 public:
  std::optional<YAML::Mark> start;
  std::optional<YAML::Mark> node;
  void OnDocumentStart(const YAML::Mark& m) override {
    if (!start)
      start = m;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t) override { first(m); }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { first(m); }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                const std::string&) override {
    first(m);
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    first(m);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    first(m);
  }
  void OnMapEnd() override {}

 private:
  void first(const YAML::Mark& m) {
    if (!node)
      node = m;
  }
};

Result<DeployConfig> Parser::run(const std::string& text) {
  // One document: Load reads the first, and the parser is asked for at most
  // one more. (Not LoadAll: in yaml-cpp 0.7, Debian 12's, it loops for ever,
  // allocating, on some malformed input such as a stray ',' after a
  // document, whose parser keeps handing out an empty document without
  // consuming the token; found by tests/fuzz/config_fuzz.cpp.)
  if (BadText bad = first_bad_character(text); bad.at != std::string::npos) {
    // (text[bad.at] is not a newline: rfind finds the one before it, if any.)
    size_t line_start = text.rfind('\n', bad.at);
    line_start = line_start == std::string::npos ? 0 : line_start + 1;
    YAML::Mark at;
    at.pos = static_cast<int>(bad.at);
    at.line = static_cast<int>(std::count(text.begin(), text.begin() + bad.at, '\n'));
    at.column = static_cast<int>(bad.at - line_start);
    char what[96];
    if (!bad.utf8) {
      std::snprintf(what, sizeof(what), "not UTF-8 text (byte 0x%02x)",
                    static_cast<unsigned char>(text[bad.at]));
    } else {
      std::snprintf(what, sizeof(what),
                    "character U+%04X is not allowed in YAML text (escape it in double quotes)",
                    bad.code);
    }
    fail(at, what);
    return error_;
  }
  YAML::Node top;
  std::optional<DocumentMarks> second;
  try {
    top = YAML::Load(text);
    std::istringstream in(text);
    YAML::Parser parser(in);
    DocumentMarks first;
    if (parser.HandleNextDocument(first)) {
      DocumentMarks next;
      if (parser.HandleNextDocument(next))
        second = next;
    }
  } catch (const YAML::ParserException& e) {
    fail(e.mark, "YAML syntax error: " + e.msg);
    return error_;
  }
  if (second) {
    const YAML::Mark start = second->start.value_or(YAML::Mark());
    const bool separator =
        start.pos >= 0 && text.compare(static_cast<size_t>(start.pos), 3, "---") == 0;
    fail(second->node.value_or(start),
         separator ? "a second YAML document ('---'): expected exactly one"
                   : "more after the first YAML document: expected exactly one");
    return error_;
  }
  if (top.IsNull()) {
    return Status(errc::invalid_argument,
                  file_ + " is empty: expected a mapping with 'applications'");
  }
  if (!top.IsMap()) {
    fail(top.Mark(),
         "expected a mapping with 'applications' at the top level, got " + describe(top));
    return error_;
  }
  Fields fields;
  if (!read_fields(top, kTopFields, "at the top level", fields))
    return error_;

  DeployConfig& config = config_;
  if (const Field* f = fields.given("http_options")) {
    if (!http_options(f->value, config.http, config.state.http))
      return error_;
  }
  if (const Field* f = fields.given("target_capacity")) {
    double v = 0;
    if (!get_number(*f, "target_capacity", "a number from 0 to 100", Bounds{0, true, 100}, v))
      return error_;
    config.state.target_capacity = v;
  }
  const Field* apps = fields.get("applications");
  if (!apps) {
    fail(top.Mark(),
         "missing field 'applications' at the top level (use 'applications: []' "
         "to declare none)");
    return error_;
  }
  if (!apps->value.IsSequence()) {
    fail(mark_of(*apps),
         "applications: expected a sequence of applications, got " + describe(apps->value));
    return error_;
  }
  std::map<std::string, YAML::Mark> names;
  std::map<std::string, std::string> prefixes;  // route_prefix -> application
  size_t index = 0;
  for (const auto& item : apps->value) {
    ApplicationSpec app;
    if (!application(item, index++, app))
      return error_;
    auto [it, inserted] = names.emplace(app.name, item.Mark());
    if (!inserted) {
      fail(item.Mark(), "duplicate application name " + in_quotes(app.name) + " (first at " +
                            position_text(it->second) + ")");
      return error_;
    }
    auto [prefix, fresh] = prefixes.emplace(app.route_prefix, app.name);
    if (!fresh) {
      YAML::Mark at = item.Mark();
      for (const auto& entry : item) {
        if (entry.first.IsScalar() && entry.first.Scalar() == "route_prefix")
          at = entry.second.Mark();
      }
      fail(at, "route_prefix " + in_quotes(app.route_prefix) + " of application " +
                   in_quotes(app.name) + " is already used by application " +
                   in_quotes(prefix->second));
      return error_;
    }
    config.state.applications.emplace(app.name, std::move(app));
  }

  // The controller's own rules, so that a config that parses is one the
  // controller accepts; anything caught only here has no position.
  Status valid = controller::validate(config.state);
  if (!valid)
    return Status(errc::invalid_argument, file_ + ": " + valid.message());
  return std::move(config);
}

// ---------------------------------------------------------------------------
// Writing.

void emit_string(YAML::Emitter& out, const std::string& s) {
  if (needs_quotes(s))
    out << YAML::DoubleQuoted;
  out << s;
}

// YAML limits an implicit key to 1024 characters: a longer one must be an
// explicit key ("? key"), which yaml-cpp writes (and reads back) in block
// style only. A key this long (escaped, a byte can take 4 characters) makes
// the whole value it is in block style.
constexpr size_t kLongKey = 200;

bool has_long_key(const Json& j) {
  if (j.is_object()) {
    for (const auto& [key, value] : j.items()) {
      if (key.size() > kLongKey || has_long_key(value))
        return true;
    }
  } else if (j.is_array()) {
    for (const auto& item : j) {
      if (has_long_key(item))
        return true;
    }
  }
  return false;
}

void emit_json(YAML::Emitter& out, const Json& j, bool block) {
  switch (j.type()) {
    case Json::value_t::null:
      out << YAML::Null;
      break;
    case Json::value_t::boolean:
      out << (j.get<bool>() ? "true" : "false");
      break;
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float:
      out << j.dump();  // JSON's number syntax reads back as the same YAML number
      break;
    case Json::value_t::string:
      emit_string(out, j.get_ref<const std::string&>());
      break;
    case Json::value_t::array:
      out << (block ? YAML::Block : YAML::Flow) << YAML::BeginSeq;
      for (const auto& item : j)
        emit_json(out, item, block);
      out << YAML::EndSeq;
      break;
    case Json::value_t::object:
      out << (block ? YAML::Block : YAML::Flow) << YAML::BeginMap;
      for (const auto& [key, value] : j.items()) {
        const bool long_key = key.size() > kLongKey;
        if (long_key)
          out << YAML::LongKey;
        out << YAML::Key;
        emit_string(out, key);
        out << YAML::Value;
        emit_json(out, value, block);
        if (long_key)
          out << YAML::Auto;  // LongKey outlives its key in yaml-cpp's emitter
      }
      out << YAML::EndMap;
      if (block)
        out << YAML::Auto;  // and its map
      break;
    default:  // binary, discarded: never produced by parsing
      out << YAML::Null;
      break;
  }
}

// JSON text as YAML; text that is not JSON (not from parse_config) as a string.
void emit_json_text(YAML::Emitter& out, const std::string& text) {
  Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded()) {
    emit_string(out, text);
  } else {
    emit_json(out, j, has_long_key(j));
  }
}

void emit_number(YAML::Emitter& out, const char* key, double value) {
  out << YAML::Key << key << YAML::Value << format_double(value);
}

// Resource amounts with a binary suffix when it is exact ("512M"), as
// parse_resources reads them.
std::string format_amount(double value) {
  static const char* const suffixes[] = {"", "K", "M", "G", "T"};
  int i = 0;
  double v = value;
  while (i < 4 && v >= 1024 && std::fmod(v, 1024) == 0) {
    v /= 1024;
    ++i;
  }
  return format_double(v) + suffixes[i];
}

// A byte count with a binary suffix when it is exact ("512M"), as
// Parser::memory_limit reads it: suffixed amounts are read as doubles, so a
// suffix is used only while the number before it stays below 2^53.
std::string format_bytes(uint64_t bytes) {
  static const char* const suffixes[] = {"", "K", "M", "G", "T"};
  uint64_t value = bytes;
  int i = 0;
  while (i < 4 && value >= 1024 && value % 1024 == 0) {
    value /= 1024;
    ++i;
  }
  if (i > 0 && value >= (uint64_t{1} << 53))
    return std::to_string(bytes);
  return std::to_string(value) + suffixes[i];
}

void emit_autoscaling(YAML::Emitter& out, const AutoscalingConfig& a) {
  const AutoscalingConfig d;
  // On one line when short, as Ray Serve's examples write it.
  const int fields =
      (a.min_replicas != d.min_replicas) + (a.max_replicas != d.max_replicas) +
      a.initial_replicas.has_value() + (a.target_ongoing_requests != d.target_ongoing_requests) +
      (a.metrics_interval_s != d.metrics_interval_s) +
      (a.look_back_period_s != d.look_back_period_s) + (a.smoothing_factor != d.smoothing_factor) +
      a.upscale_smoothing_factor.has_value() + a.downscale_smoothing_factor.has_value() +
      (a.upscale_delay_s != d.upscale_delay_s) + (a.downscale_delay_s != d.downscale_delay_s);
  out << YAML::Key << "autoscaling_config" << YAML::Value;
  if (fields <= 3)
    out << YAML::Flow;
  out << YAML::BeginMap;
  if (a.min_replicas != d.min_replicas)
    out << YAML::Key << "min_replicas" << YAML::Value << std::to_string(a.min_replicas);
  if (a.max_replicas != d.max_replicas)
    out << YAML::Key << "max_replicas" << YAML::Value << std::to_string(a.max_replicas);
  if (a.initial_replicas) {
    out << YAML::Key << "initial_replicas" << YAML::Value << std::to_string(*a.initial_replicas);
  }
  if (a.target_ongoing_requests != d.target_ongoing_requests)
    emit_number(out, "target_ongoing_requests", a.target_ongoing_requests);
  if (a.metrics_interval_s != d.metrics_interval_s)
    emit_number(out, "metrics_interval_s", a.metrics_interval_s);
  if (a.look_back_period_s != d.look_back_period_s)
    emit_number(out, "look_back_period_s", a.look_back_period_s);
  if (a.smoothing_factor != d.smoothing_factor)
    emit_number(out, "smoothing_factor", a.smoothing_factor);
  if (a.upscale_smoothing_factor)
    emit_number(out, "upscale_smoothing_factor", *a.upscale_smoothing_factor);
  if (a.downscale_smoothing_factor)
    emit_number(out, "downscale_smoothing_factor", *a.downscale_smoothing_factor);
  if (a.upscale_delay_s != d.upscale_delay_s)
    emit_number(out, "upscale_delay_s", a.upscale_delay_s);
  if (a.downscale_delay_s != d.downscale_delay_s)
    emit_number(out, "downscale_delay_s", a.downscale_delay_s);
  out << YAML::EndMap;
}

void emit_deployment(YAML::Emitter& out, const DeploymentSpec& spec, const std::string& library,
                     bool is_ingress) {
  const DeploymentConfig d;
  const DeploymentConfig& c = spec.config;
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value;
  emit_string(out, spec.name);
  if (!is_ingress) {
    if (spec.import_path != library + ":" + spec.name) {
      out << YAML::Key << "import_path" << YAML::Value;
      emit_string(out, spec.import_path);
    }
    if (!spec.init_args.empty()) {
      out << YAML::Key << "args" << YAML::Value;
      emit_json_text(out, spec.init_args);
    }
  }
  if (!spec.code_version.empty()) {
    out << YAML::Key << "version" << YAML::Value;
    emit_string(out, spec.code_version);
  }
  if (!c.autoscaling_config)
    out << YAML::Key << "num_replicas" << YAML::Value << std::to_string(c.num_replicas);
  if (c.max_ongoing_requests != d.max_ongoing_requests) {
    out << YAML::Key << "max_ongoing_requests" << YAML::Value
        << std::to_string(c.max_ongoing_requests);
  }
  if (c.max_queued_requests != d.max_queued_requests) {
    out << YAML::Key << "max_queued_requests" << YAML::Value
        << std::to_string(c.max_queued_requests);
  }
  if (!c.user_config.empty()) {
    out << YAML::Key << "user_config" << YAML::Value;
    emit_json_text(out, c.user_config);
  }
  if (c.autoscaling_config)
    emit_autoscaling(out, *c.autoscaling_config);
  if (c.health_check_period_s != d.health_check_period_s)
    emit_number(out, "health_check_period_s", c.health_check_period_s);
  if (c.health_check_timeout_s != d.health_check_timeout_s)
    emit_number(out, "health_check_timeout_s", c.health_check_timeout_s);
  if (c.graceful_shutdown_wait_loop_s != d.graceful_shutdown_wait_loop_s)
    emit_number(out, "graceful_shutdown_wait_loop_s", c.graceful_shutdown_wait_loop_s);
  if (c.graceful_shutdown_timeout_s != d.graceful_shutdown_timeout_s)
    emit_number(out, "graceful_shutdown_timeout_s", c.graceful_shutdown_timeout_s);
  if (!c.resources.empty()) {
    out << YAML::Key << "resources" << YAML::Value << YAML::Flow << YAML::BeginMap;
    for (const auto& [name, amount] : c.resources.amounts)
      out << YAML::Key << name << YAML::Value << format_amount(amount);
    out << YAML::EndMap;
  }
  if (c.max_replicas_per_node != d.max_replicas_per_node) {
    out << YAML::Key << "max_replicas_per_node" << YAML::Value
        << std::to_string(c.max_replicas_per_node);
  }
  if (c.isolation != d.isolation)
    out << YAML::Key << "isolation" << YAML::Value << controller::to_string(c.isolation);
  if (c.memory_limit_bytes != d.memory_limit_bytes)
    out << YAML::Key << "memory_limit" << YAML::Value << format_bytes(c.memory_limit_bytes);
  if (c.stuck_after_s != d.stuck_after_s)
    emit_number(out, "stuck_after_s", c.stuck_after_s);
  if (c.max_num_models_per_replica != d.max_num_models_per_replica) {
    out << YAML::Key << "max_num_models_per_replica" << YAML::Value
        << std::to_string(c.max_num_models_per_replica);
  }
  if (c.force_stop_unhealthy_replicas != d.force_stop_unhealthy_replicas) {
    out << YAML::Key << "force_stop_unhealthy_replicas" << YAML::Value
        << c.force_stop_unhealthy_replicas;
  }
  out << YAML::EndMap;
}

void emit_application(YAML::Emitter& out, const ApplicationSpec& app) {
  const DeploymentSpec* ingress = nullptr;
  for (const auto& d : app.deployments) {
    if (d.name == app.ingress)
      ingress = &d;
  }
  const std::string import_text = ingress ? ingress->import_path : app.ingress;
  const std::string library = import_text.substr(0, import_text.find(':'));
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value;
  emit_string(out, app.name);
  out << YAML::Key << "route_prefix" << YAML::Value;
  emit_string(out, app.route_prefix);
  out << YAML::Key << "import_path" << YAML::Value;
  emit_string(out, import_text);
  if (ingress && !ingress->init_args.empty()) {
    out << YAML::Key << "args" << YAML::Value;
    emit_json_text(out, ingress->init_args);
  }
  if (!app.traffic.empty()) {
    out << YAML::Key << "traffic" << YAML::Value << YAML::Flow << YAML::BeginMap;
    for (const auto& [name, weight] : app.traffic) {
      out << YAML::Key;
      emit_string(out, name);
      out << YAML::Value << format_double(weight);
    }
    out << YAML::EndMap;
  }
  if (!app.traffic_key_header.empty()) {
    out << YAML::Key << "traffic_key_header" << YAML::Value;
    emit_string(out, app.traffic_key_header);
  }
  if (!app.shadow.empty()) {
    out << YAML::Key << "shadow" << YAML::Value << YAML::Flow << YAML::BeginMap;
    for (const auto& [name, probability] : app.shadow) {
      out << YAML::Key;
      emit_string(out, name);
      out << YAML::Value << format_double(probability);
    }
    out << YAML::EndMap;
  }
  out << YAML::Key << "deployments" << YAML::Value << YAML::BeginSeq;
  for (const auto& d : app.deployments)
    emit_deployment(out, d, library, &d == ingress);
  out << YAML::EndSeq;
  out << YAML::EndMap;
}

}  // namespace

Result<DeployConfig> parse_config(const std::string& yaml_text, const std::string& file_name) {
  try {
    return Parser(file_name).run(yaml_text);
  } catch (const std::exception& e) {
    // yaml-cpp and nlohmann throw only on faults once the text has parsed.
    return Status(errc::internal, file_name + ": " + e.what());
  }
}

Result<DeployConfig> load_config_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return Status(errc::io_error, "cannot read config file '" + path + "': it is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status(errc::io_error,
                  "cannot read config file '" + path + "': " + std::strerror(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad())
    return Status(errc::io_error, "cannot read config file '" + path + "': read failed");
  return parse_config(text.str(), path);
}

std::string to_yaml(const DeployConfig& config) {
  YAML::Emitter out;
  out.SetNullFormat(YAML::LowerNull);  // JSON's spelling
  out << YAML::BeginMap;
  const HttpOptions& h = config.http;
  const controller::HttpSettings& settings = config.state.http;
  if (h != HttpOptions{} || settings != controller::HttpSettings{}) {
    out << YAML::Key << "http_options" << YAML::Value << YAML::Flow << YAML::BeginMap;
    if (h.host) {
      out << YAML::Key << "host" << YAML::Value;
      emit_string(out, *h.host);
    }
    if (h.port)
      out << YAML::Key << "port" << YAML::Value << std::to_string(*h.port);
    if (settings.request_timeout_s)
      emit_number(out, "request_timeout_s", *settings.request_timeout_s);
    if (settings.keep_alive_timeout_s)
      emit_number(out, "keep_alive_timeout_s", *settings.keep_alive_timeout_s);
    out << YAML::EndMap;
  }
  if (config.state.target_capacity)
    emit_number(out, "target_capacity", *config.state.target_capacity);
  out << YAML::Key << "applications" << YAML::Value;
  if (config.state.applications.empty()) {
    out << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
  } else {
    out << YAML::BeginSeq;
    for (const auto& [name, app] : config.state.applications)
      emit_application(out, app);
    out << YAML::EndSeq;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace troupe::config
