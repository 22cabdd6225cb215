#include "runtime/log.hpp"

#include <mutex>
#include <vector>

#include <spdlog/sinks/rotating_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace troupe::log {

namespace {

std::mutex mutex;
std::vector<spdlog::sink_ptr> sinks;
spdlog::level::level_enum level = spdlog::level::info;

}  // namespace

Status init(const Options& options) {
  auto parsed = spdlog::level::from_str(options.level);
  // from_str maps unknown names to "off"; only "off" itself may mean off.
  if (parsed == spdlog::level::off && options.level != "off") {
    return Status(errc::invalid_argument,
                  "log level '" + options.level +
                      "' is not one of trace, debug, info, warn, error, critical, off");
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
  std::string pattern = "%Y-%m-%dT%H:%M:%S.%e %^%-5l%$ ";
  if (!options.process.empty())
    pattern += "[" + options.process + "] ";
  pattern += "%n: %v";
  for (auto& sink : made)
    sink->set_pattern(pattern);
  std::lock_guard<std::mutex> guard(mutex);
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
  auto logger = std::make_shared<spdlog::logger>(component, sinks.begin(), sinks.end());
  logger->set_level(level);
  logger->flush_on(spdlog::level::info);
  spdlog::register_logger(logger);
  return logger;
}

void shutdown() {
  std::lock_guard<std::mutex> guard(mutex);
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->flush(); });
  spdlog::drop_all();
  sinks.clear();
}

}  // namespace troupe::log
