#include "proxy/access_log.hpp"

#include <algorithm>
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

namespace {

// "YYYY-MM-DDTHH:MM:SS." of a second since the epoch: log::utc_timestamp's
// text without its "mmmZ".
std::string stamp_of(int64_t second) {
  auto text = log::utc_timestamp(std::chrono::system_clock::time_point(std::chrono::seconds(second)));
  return text.substr(0, text.size() - 4);
}

int64_t millis_since_epoch(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

void append_millis(std::string& out, int millis) {
  const char digits[4] = {char('0' + millis / 100), char('0' + millis / 10 % 10),
                          char('0' + millis % 10), 'Z'};
  out.append(digits, 4);
}

}  // namespace

void AccessLog::append(std::string& out, const AccessEntry& e, const std::string& stamp,
                       int millis) const {
  if (json_) {
    std::string ts = stamp;
    append_millis(ts, millis);
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
    out.append(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    return;
  }
  char duration[32];
  const int n = std::snprintf(duration, sizeof duration, " %.3fms ", e.seconds * 1000);
  char status[16];
  const int m = std::snprintf(status, sizeof status, " %d", e.status);
  out.append(stamp);
  append_millis(out, millis);
  out.append(" ").append(or_dash(node_)).append(" ").append(or_dash(e.request_id));
  out.append(" ").append(or_dash(e.method)).append(" ").append(or_dash(e.path));
  out.append(status, m).append(duration, n);
  if (e.app.empty())
    out.append("-");
  else
    out.append(e.app).append("/").append(or_dash(e.deployment));
  out.append(" ").append(or_dash(e.replica));
}

std::string AccessLog::format(const AccessEntry& e) const {
  const int64_t ms = millis_since_epoch(std::chrono::system_clock::now());
  std::string line;
  line.reserve(160);
  append(line, e, stamp_of(ms / 1000), static_cast<int>(ms % 1000));
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

size_t AccessBatch::lines() const { return std::count(text_.begin(), text_.end(), '\n'); }

void AccessLog::add(const AccessEntry& entry, AccessBatch& batch,
                    std::chrono::system_clock::time_point now) {
  if (!own_file_) {
    write(entry);
    return;
  }
  const int64_t ms = millis_since_epoch(now);
  const int64_t second = ms / 1000;
  if (second != batch.second_) {
    batch.second_ = second;
    batch.stamp_ = stamp_of(second);
  }
  append(batch.text_, entry, batch.stamp_, static_cast<int>(ms % 1000));
  batch.text_.push_back('\n');
  if (batch.text_.size() >= kBatchBytes)
    write_batch(batch);
}

void AccessLog::write_batch(AccessBatch& batch) {
  if (batch.text_.empty())
    return;
  // One message of many lines: the file's sink adds the last newline.
  logger_->info(std::string_view(batch.text_.data(), batch.text_.size() - 1));
  batch.text_.clear();
}

void AccessLog::flush(AccessBatch& batch) {
  write_batch(batch);
  logger_->flush();
}

}  // namespace troupe::proxy
