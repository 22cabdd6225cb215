// The config file of `troupectl deploy`: YAML modelled on Ray Serve's config
// file, read into the controller's TargetState plus the HTTP options, and
// printed back by `troupectl config`. Field reference, defaults and the error
// format: docs/config.md.
//
// Errors are one line, errc::invalid_argument, prefixed with the position of
// the offending YAML node (1-based) when it has one:
//   deploy.yaml:12:23: num_replicas: expected a non-negative integer, got 'three'
//   deploy.yaml:14:9: unknown field 'num_replica' in deployment 'Hello'; did you mean
//   'num_replicas'?
// The first problem found is reported; nothing is returned with it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "controller/core/model.hpp"
#include "runtime/status.hpp"

namespace troupe::config {

// Ray Serve's http_options. Kept apart from the target state: the proxy reads
// them, the controller does not checkpoint them.
struct HttpOptions {
  // Loopback by default, so nothing is exposed unless asked for (Ray's config
  // schema says 0.0.0.0; its `serve run` default is 127.0.0.1).
  std::string host = "127.0.0.1";
  uint16_t port = 8000;
  // End-to-end deadline of one HTTP request; none by default (Ray's too).
  std::optional<double> request_timeout_s;
  // Idle time before the proxy closes a keep-alive connection (Ray: 5).
  double keep_alive_timeout_s = 5.0;

  friend bool operator==(const HttpOptions& a, const HttpOptions& b);
  friend bool operator!=(const HttpOptions& a, const HttpOptions& b) { return !(a == b); }
};

struct DeployConfig {
  HttpOptions http;
  // Applications keyed by name; generation is always 0 (the controller
  // assigns generations).
  controller::TargetState state;

  friend bool operator==(const DeployConfig& a, const DeployConfig& b);
  friend bool operator!=(const DeployConfig& a, const DeployConfig& b) { return !(a == b); }
};

// Parses a config file's text. `file_name` only prefixes error messages.
// After its own checks it runs controller::validate on the state, so a
// config that parses is one the controller accepts.
Result<DeployConfig> parse_config(const std::string& yaml_text, const std::string& file_name);

// Reads and parses the file at `path`; errc::io_error naming the path when it
// cannot be read.
Result<DeployConfig> load_config_file(const std::string& path);

// The declared state as a config file in the same format; only fields whose
// value differs from the default are written (num_replicas always, unless
// autoscaling_config is set). parse_config(to_yaml(x)) == x for every x that
// parse_config returns; docs/config.md states the exact conditions.
std::string to_yaml(const DeployConfig& config);

}  // namespace troupe::config
