#include "proxy/access_log.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>
#include <spdlog/sinks/rotating_file_sink.h>

#include "runtime/log.hpp"

namespace troupe::proxy {

namespace {

// Rotated at 64 MiB, three files kept.
constexpr size_t kFileBytes = 64 << 20;
constexpr size_t kFiles = 3;

std::string_view or_dash(std::string_view s) { return s.empty() ? std::string_view("-") : s; }

}  // namespace

Result<AccessLogMode> parse_access_log_mode(const std::string& text) {
  if (text == "on")
    return AccessLogMode::on;
  if (text == "errors")
    return AccessLogMode::errors;
  if (text == "off")
    return AccessLogMode::off;
  return Status(errc::invalid_argument,
                "--access-log '" + text + "' is not one of on, errors, off");
}

AccessLog::AccessLog(AccessLogMode mode, std::shared_ptr<spdlog::logger> logger, std::string node,
                     bool json, bool own_file)
    : mode_(mode), logger_(std::move(logger)), node_(std::move(node)), json_(json),
      own_file_(own_file) {}

Result<std::shared_ptr<AccessLog>> AccessLog::open(AccessLogMode mode, const std::string& file,
                                                   const std::string& node, bool json) {
  std::shared_ptr<spdlog::logger> logger;
  if (file.empty()) {
    logger = log::get("access");
  } else {
    try {
      auto sink = std::make_shared<spdlog::sinks::rotating_file_sink_mt>(file, kFileBytes, kFiles);
      sink->set_pattern("%v");
      logger = std::make_shared<spdlog::logger>("access", sink);
      logger->set_level(spdlog::level::info);
      // Flushed by the proxy's sweep (Proxy::Core), not per line.
      logger->flush_on(spdlog::level::off);
    } catch (const spdlog::spdlog_ex& e) {
      return Status(errc::io_error, "cannot open access log '" + file + "': " + e.what());
    }
  }
  return std::shared_ptr<AccessLog>(new AccessLog(mode, std::move(logger), node, json, !file.empty()));
}

std::string AccessLog::format(const AccessEntry& e) const {
  const std::string ts = log::utc_timestamp(std::chrono::system_clock::now());
  if (json_) {
    nlohmann::ordered_json j;
    j["ts"] = ts;
    j["node"] = node_;
    j["request_id"] = e.request_id;
    j["method"] = e.method;
    j["path"] = e.path;
    j["status"] = e.status;
    j["duration_ms"] = std::round(e.seconds * 1e6) / 1e3;
    j["application"] = e.app;
    j["deployment"] = e.deployment;
    j["replica"] = e.replica;
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  char duration[32];
  std::snprintf(duration, sizeof duration, "%.3fms", e.seconds * 1000);
  std::string line;
  line.reserve(160);
  line.append(ts).append(" ").append(or_dash(node_)).append(" ").append(or_dash(e.request_id));
  line.append(" ").append(or_dash(e.method)).append(" ").append(or_dash(e.path));
  line.append(" ").append(std::to_string(e.status)).append(" ").append(duration);
  line.append(" ");
  if (e.app.empty())
    line.append("-");
  else
    line.append(e.app).append("/").append(or_dash(e.deployment));
  line.append(" ").append(or_dash(e.replica));
  return line;
}

void AccessLog::write(const AccessEntry& entry) {
  if (own_file_) {
    logger_->info(format(entry));
    return;
  }
  // With the node's lines: their sinks add the time, level and node.
  auto line = format(entry);
  logger_->info(json_ ? line : line.substr(line.find(' ', line.find(' ') + 1) + 1));
}

void AccessLog::flush() { logger_->flush(); }

}  // namespace troupe::proxy
