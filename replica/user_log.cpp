#include "replica/user_log.hpp"

#include <spdlog/logger.h>

#include "runtime/log.hpp"

namespace troupe::replica {

namespace {

class UserLog final : public LogSink {
 public:
  UserLog(std::string replica_id, std::shared_ptr<spdlog::logger> log)
      : replica_id_(std::move(replica_id)), log_(std::move(log)) {}

  void write(LogLevel level, const std::string& message) override {
    log_->log(to_spdlog(level), "{}: {}", replica_id_, message);
  }

 private:
  static spdlog::level::level_enum to_spdlog(LogLevel level) {
    switch (level) {
      case LogLevel::debug:
        return spdlog::level::debug;
      case LogLevel::info:
        return spdlog::level::info;
      case LogLevel::warn:
        return spdlog::level::warn;
      case LogLevel::error:
        return spdlog::level::err;
    }
    return spdlog::level::info;
  }

  const std::string replica_id_;
  const std::shared_ptr<spdlog::logger> log_;
};

}  // namespace

std::shared_ptr<LogSink> make_user_log(const std::string& replica_id, const std::string& file) {
  if (file.empty())
    return std::make_shared<UserLog>(replica_id, log::get("user"));
  auto own = log::with_file("user", file, kUserLogMaxBytes);
  if (!own) {
    log::get("replica")->warn("replica {}: its lines go to the node's log only: {}", replica_id,
                              own.status().message());
    return std::make_shared<UserLog>(replica_id, log::get("user"));
  }
  return std::make_shared<UserLog>(replica_id, std::move(*own));
}

}  // namespace troupe::replica
