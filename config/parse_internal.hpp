// Internal to config/: the parser of config files, shared by its two parts.
// parse.cpp reads the document and its sections (the top level,
// http_options, applications, deployments, autoscaling_config, traffic,
// shadow); parse_values.cpp reads single values (field lists, strings,
// booleans, numbers, args and user_config as JSON, resources, isolation,
// memory_limit). Not part of the public interface (config.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "config/config.hpp"
#include "controller/core/model.hpp"
#include "replica/plugin/import_path.hpp"
#include "runtime/resources.hpp"
#include "runtime/status.hpp"

namespace troupe::config::detail {

using controller::ApplicationSpec;
using controller::AutoscalingConfig;
using controller::DeploymentConfig;
using controller::DeploymentSpec;
using controller::Isolation;
using Json = nlohmann::json;

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

// What a deployment of an application is read against: the application's own
// fields, read before its deployments.
struct ApplicationContext {
  // The application's name, for messages ("deployments[1] of application
  // 'default'").
  std::string name;
  // The application's import_path, parsed: its class_name is the name of the
  // ingress deployment, its library the default library of the others (a
  // deployment without import_path is library:name).
  ImportPath import;
  // The same import_path as written: the ingress's import_path, which the
  // ingress may repeat but not change.
  std::string import_text;
  // The application's args as JSON text, "" when it gives none: the
  // ingress's init_args unless the ingress gives args of its own (not both).
  std::string args;
  // Where the application's args are (the application's mapping when it gives
  // none), named when the ingress gives args too.
  YAML::Mark args_mark;
};

// The parser: walks the YAML tree, stops at the first problem.
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

  // Single values (parse_values.cpp).
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
  bool resources(const Field& f, Resources& out);
  bool isolation(const Field& f, Isolation& out);
  bool memory_limit(const Field& f, uint64_t& out);

  // The document and its sections (parse.cpp).
  bool check_text(const std::string& text);
  bool load_document(const std::string& text, YAML::Node& top);
  bool applications(const Field& f, controller::TargetState& state);
  bool http_options(const YAML::Node& node, HttpOptions& out, controller::HttpSettings& settings);
  bool application(const YAML::Node& node, size_t index, ApplicationSpec& out);
  bool deployments(const Field* f, const ApplicationContext& app, ApplicationSpec& out);
  bool deployment(const YAML::Node& node, size_t index, const ApplicationContext& app,
                  DeploymentSpec& out);
  bool deployment_config(const Fields& fields, const std::string& name, DeploymentConfig& out);
  bool autoscaling(const Field& f, const std::string& deployment_name, AutoscalingConfig& out);
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

}  // namespace troupe::config::detail
