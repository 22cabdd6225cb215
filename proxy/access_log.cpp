#include "proxy/access_log.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>

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

// The thread that writes an access log file's batches, in the order they
// were handed over.
struct AccessLog::Writer {
  explicit Writer(std::shared_ptr<spdlog::logger> logger) : logger(std::move(logger)) {
    thread = std::thread([this] { run(); });
  }
  ~Writer() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    wake.notify_all();
    thread.join();
  }

  // False when the queue is kQueueBytes long already (`text` stays).
  bool push(std::string& text, bool flush) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!text.empty()) {
        if (queued_bytes + text.size() > kQueueBytes)
          return false;
        queued_bytes += text.size();
        queue.push_back(std::move(text));
        text.clear();
        ++handed;
      }
      flush_asked = flush_asked || flush;
    }
    wake.notify_one();
    return true;
  }

  // Until everything handed over so far is written and flushed.
  void sync() {
    std::unique_lock<std::mutex> lock(mutex);
    const uint64_t target = handed;
    flush_asked = true;
    wake.notify_one();
    done.wait(lock, [&] { return written >= target && !flush_asked && !busy; });
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      wake.wait(lock, [&] { return stopping || !queue.empty() || flush_asked; });
      std::deque<std::string> batches;
      batches.swap(queue);
      const bool flush = flush_asked || stopping;
      flush_asked = false;
      busy = true;
      lock.unlock();
      for (auto& text : batches) {
        // One message of many lines: the file's sink adds the last newline.
        logger->info(std::string_view(text.data(), text.size() - 1));
      }
      if (flush)
        logger->flush();
      lock.lock();
      busy = false;
      for (auto& text : batches)
        queued_bytes -= text.size();
      written += batches.size();
      done.notify_all();
      if (stopping && queue.empty())
        return;
    }
  }

  std::shared_ptr<spdlog::logger> logger;
  std::mutex mutex;
  std::condition_variable wake;  // work for the writer
  std::condition_variable done;  // the writer wrote
  std::deque<std::string> queue;
  size_t queued_bytes = 0;
  uint64_t handed = 0;   // batches handed over
  uint64_t written = 0;  // of them, written
  bool flush_asked = false;
  bool busy = false;
  bool stopping = false;
  std::thread thread;
  std::atomic<uint64_t> dropped{0};
  std::atomic<int64_t> warned_at{0};  // steady-clock seconds of the last warning
};

AccessLog::AccessLog(AccessLogMode mode, std::shared_ptr<spdlog::logger> logger, std::string node,
                     bool json, bool own_file)
    : mode_(mode), logger_(std::move(logger)), node_(std::move(node)), json_(json),
      own_file_(own_file) {
  if (own_file_)
    writer_ = std::make_unique<Writer>(logger_);
}

AccessLog::~AccessLog() = default;

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
  out.append(stamp);
  append_millis(out, millis);
  out.append(" ").append(or_dash(node_)).append(" ").append(or_dash(e.request_id));
  out.append(" ").append(or_dash(e.method)).append(" ").append(or_dash(e.path));
  // The status and the duration ("1.500ms") with integer conversions, not
  // printf's: this runs once per request on an io thread, and printf's
  // floating-point path was most of the line's cost in the node's profile.
  char num[32];
  num[0] = ' ';
  auto end = std::to_chars(num + 1, num + sizeof num, e.status).ptr;
  out.append(num, static_cast<size_t>(end - num));
  const int64_t micros = std::llround(std::max(0.0, e.seconds) * 1e6);
  end = std::to_chars(num + 1, num + sizeof num, micros / 1000).ptr;
  const int64_t frac = micros % 1000;
  const char tail[6] = {'.', char('0' + frac / 100), char('0' + frac / 10 % 10),
                        char('0' + frac % 10), 'm', 's'};
  out.append(num, static_cast<size_t>(end - num)).append(tail, 6).append(" ");
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
    hand_over(batch, false);
}

void AccessLog::hand_over(AccessBatch& batch, bool flush) {
  if (!writer_)
    return;
  if (writer_->push(batch.text_, flush)) {
    batch.text_.reserve(kBatchBytes + 1024);
    return;
  }
  const auto lines = static_cast<uint64_t>(batch.lines());
  batch.text_.clear();
  const uint64_t total = writer_->dropped.fetch_add(lines, std::memory_order_relaxed) + lines;
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  int64_t last = writer_->warned_at.load(std::memory_order_relaxed);
  if ((last == 0 || now - last >= 10) &&
      writer_->warned_at.compare_exchange_strong(last, now, std::memory_order_relaxed)) {
    log::get("proxy")->warn(
        "access log: the writer is {} MiB behind (the disk is slow); {} lines dropped so far",
        kQueueBytes >> 20, total);
  }
  if (flush)
    writer_->push(batch.text_, true);  // nothing to queue: the flush only
}

void AccessLog::pass_on(AccessBatch& batch) {
  hand_over(batch, true);
}

void AccessLog::flush(AccessBatch& batch) {
  if (!writer_) {
    logger_->flush();
    return;
  }
  hand_over(batch, true);
  writer_->sync();
}

uint64_t AccessLog::dropped_lines() const {
  return writer_ ? writer_->dropped.load(std::memory_order_relaxed) : 0;
}

}  // namespace troupe::proxy
