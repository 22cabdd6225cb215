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

// The part of Ray Serve's http_options that troupe does not apply from a
// config: each node's proxy listens where `troupe-node --bind` and
// `--http-port` say (as Ray's `serve start --http-options`, fixed when the
// node starts). Recorded only as given, so that `troupectl deploy` can warn
// that they are ignored; absent: not in the file. The other http_options
// (request_timeout_s, keep_alive_timeout_s) are part of the declared state:
// DeployConfig::state.http.
struct HttpOptions {
  std::optional<std::string> host;
  std::optional<uint16_t> port;

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

// A one-line warning naming the http_options fields `http` gives that a
// deploy does not apply (host, port) and where the proxy's address is set
// instead; nullopt when it gives none. Given means written in the file, even
// with the value a node happens to use: troupe never compares them with a
// node's address, which is not known when the file is read.
std::optional<std::string> ignored_http_fields(const HttpOptions& http);

}  // namespace troupe::config
