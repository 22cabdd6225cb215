// The writer: a DeployConfig as a config file (to_yaml), only the fields
// whose value differs from the default, so that parse_config reads it back
// as the same config.
#include <cmath>
#include <cstdint>
#include <string>

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "config/config.hpp"
#include "config/scalars.hpp"
#include "controller/core/model.hpp"

namespace troupe::config {

namespace {

using controller::ApplicationSpec;
using controller::AutoscalingConfig;
using controller::DeploymentConfig;
using controller::DeploymentSpec;
using detail::format_double;
using detail::needs_quotes;
using Json = nlohmann::json;

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

// After the import path of a library troupectl uploaded: which bytes were
// deployed (the path is as the deploy's config file gave it, relative to
// that file's directory, so it may name nothing, or another file, where
// this output is read).
void emit_upload_note(YAML::Emitter& out, const DeploymentSpec& spec) {
  if (spec.library_sha256.empty())
    return;
  out << YAML::Comment(
      "uploaded: the library deployed has SHA-256 " + spec.library_sha256 +
      "; its path is relative to the directory of the config it was deployed from");
}

void emit_deployment(YAML::Emitter& out, const DeploymentSpec& spec, const std::string& library,
                     bool is_ingress) {
  const DeploymentConfig d;
  const DeploymentConfig& c = spec.config;
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value;
  emit_string(out, spec.name);
  if (!is_ingress) {
    if (spec.import_path != library + ":" + spec.name || !spec.library_sha256.empty()) {
      out << YAML::Key << "import_path" << YAML::Value;
      emit_string(out, spec.import_path);
      emit_upload_note(out, spec);
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
  if (c.max_batch_size != d.max_batch_size)
    out << YAML::Key << "max_batch_size" << YAML::Value << std::to_string(c.max_batch_size);
  if (c.batch_wait_auto)
    out << YAML::Key << "batch_wait_timeout_s" << YAML::Value << "auto";
  else if (c.batch_wait_timeout_s != d.batch_wait_timeout_s)
    emit_number(out, "batch_wait_timeout_s", c.batch_wait_timeout_s);
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
  if (ingress)
    emit_upload_note(out, *ingress);
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
  if (app.open_inference)
    out << YAML::Key << "open_inference" << YAML::Value << true;
  out << YAML::Key << "deployments" << YAML::Value << YAML::BeginSeq;
  for (const auto& d : app.deployments)
    emit_deployment(out, d, library, &d == ingress);
  out << YAML::EndSeq;
  out << YAML::EndMap;
}

}  // namespace

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
