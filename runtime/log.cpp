#include "runtime/log.hpp"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/rotating_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace troupe::log {

namespace {

std::mutex mutex;
std::vector<spdlog::sink_ptr> sinks;
spdlog::level::level_enum level = spdlog::level::info;
// What init() was given, for the formatter of a logger's own file (with_file).
Options configured;

// A logger of `component` on `to`, at the configured level (the mutex held).
std::shared_ptr<spdlog::logger> make_logger(const std::string& component,
                                            const std::vector<spdlog::sink_ptr>& to) {
  auto logger = std::make_shared<spdlog::logger>(component, to.begin(), to.end());
  logger->set_level(level);
  logger->flush_on(spdlog::level::info);
  return logger;
}

}  // namespace

namespace {

thread_local const std::string* current_request = nullptr;

// %R: "[request ID] " while the thread handles a request.
class RequestFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg&, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    if (!current_request || current_request->empty())
      return;
    static constexpr std::string_view kOpen = "[request ";
    dest.append(kOpen.data(), kOpen.data() + kOpen.size());
    dest.append(current_request->data(), current_request->data() + current_request->size());
    dest.push_back(']');
    dest.push_back(' ');
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<RequestFlag>();
  }
};

class JsonFormatter final : public spdlog::formatter {
 public:
  explicit JsonFormatter(std::string process) : process_(std::move(process)) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    auto level = spdlog::level::to_string_view(msg.level);
    nlohmann::ordered_json line;
    line["ts"] = utc_timestamp(msg.time);
    line["level"] = std::string(level.data(), level.size());
    if (!process_.empty())
      line["node"] = process_;
    line["component"] = std::string(msg.logger_name.data(), msg.logger_name.size());
    if (current_request && !current_request->empty())
      line["request_id"] = *current_request;
    line["msg"] = std::string(msg.payload.data(), msg.payload.size());
    auto text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    dest.append(text.data(), text.data() + text.size());
    dest.push_back('\n');
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>(process_);
  }

 private:
  std::string process_;
};

// The format of every sink: text (the pattern, with the request id) or JSON.
std::unique_ptr<spdlog::formatter> make_formatter(const Options& options) {
  if (options.format == "json")
    return std::make_unique<JsonFormatter>(options.process);
  std::string pattern = "%Y-%m-%dT%H:%M:%S.%e %^%-5l%$ ";
  if (!options.process.empty())
    pattern += "[" + options.process + "] ";
  pattern += "%n: %R%v";
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<RequestFlag>('R').set_pattern(pattern);
  return formatter;
}

}  // namespace

const std::string* set_request_id(const std::string* id) {
  const std::string* previous = current_request;
  current_request = id;
  return previous;
}

std::string utc_timestamp(std::chrono::system_clock::time_point t) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char ts[80];  // room for any int the format could print (no truncation warning)
  std::snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms % 1000));
  return ts;
}

Status init(const Options& options) {
  auto parsed = spdlog::level::from_str(options.level);
  // from_str maps unknown names to "off"; only "off" itself may mean off.
  if (parsed == spdlog::level::off && options.level != "off") {
    return Status(errc::invalid_argument,
                  "log level '" + options.level +
                      "' is not one of trace, debug, info, warn, error, critical, off");
  }
  if (options.format != "text" && options.format != "json") {
    return Status(errc::invalid_argument,
                  "log format '" + options.format + "' is not one of text, json");
  }
  std::vector<spdlog::sink_ptr> made;
  made.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  if (!options.file.empty()) {
    try {
      made.push_back(std::make_shared<spdlog::sinks::rotating_file_sink_mt>(options.file,
                                                                            16 * 1024 * 1024, 3));
    } catch (const spdlog::spdlog_ex& e) {
      return Status(errc::io_error, "cannot open log file '" + options.file + "': " + e.what());
    }
  }
  for (auto& sink : made)
    sink->set_formatter(make_formatter(options));
  std::lock_guard<std::mutex> guard(mutex);
  configured = options;
  sinks = std::move(made);
  level = parsed;
  spdlog::drop_all();
  return Status::ok();
}

std::shared_ptr<spdlog::logger> get(const std::string& component) {
  std::lock_guard<std::mutex> guard(mutex);
  if (auto existing = spdlog::get(component))
    return existing;
  if (sinks.empty())
    sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  auto logger = make_logger(component, sinks);
  spdlog::register_logger(logger);
  return logger;
}

Result<std::shared_ptr<spdlog::logger>> with_file(const std::string& component,
                                                  const std::string& path, size_t max_bytes) {
  std::lock_guard<std::mutex> guard(mutex);
  if (sinks.empty())
    sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  std::vector<spdlog::sink_ptr> all = sinks;
  try {
    auto own = std::make_shared<spdlog::sinks::rotating_file_sink_mt>(path, max_bytes, 1);
    own->set_formatter(make_formatter(configured));
    all.push_back(std::move(own));
  } catch (const spdlog::spdlog_ex& e) {
    return Status(errc::io_error, "cannot open log file '" + path + "': " + e.what());
  }
  return make_logger(component, all);
}

void shutdown() {
  std::lock_guard<std::mutex> guard(mutex);
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->flush(); });
  spdlog::drop_all();
  sinks.clear();
}

}  // namespace troupe::log
