// The public types' comparisons, the warning about ignored http_options and
// reading a config file (config.hpp). The parser is parse.cpp and
// parse_values.cpp, the writer emit.cpp, the scalar rules scalars.cpp.
#include "config/config.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>

namespace troupe::config {

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

}  // namespace troupe::config
