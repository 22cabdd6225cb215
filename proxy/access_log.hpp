// The access log: a line per request a node's proxy answered (request id,
// method, path, status, duration, application/deployment, replica, node),
// switched by troupe-node --access-log on|errors|off (errors: status 400 and
// above). Written to <state-dir>/logs/access.log (rotated), or with the node's
// log lines when the node has no state directory; in JSON with
// --log-format json, one object per line.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <spdlog/logger.h>

#include "runtime/status.hpp"

namespace troupe::proxy {

enum class AccessLogMode { on, errors, off };

// "on", "errors" or "off"; anything else is an error naming the choices.
Result<AccessLogMode> parse_access_log_mode(const std::string& text);

struct AccessEntry {
  std::string_view request_id;
  std::string_view method;
  std::string_view path;  // without the query (it may carry secrets)
  int status = 0;
  double seconds = 0;
  std::string_view app;         // empty: no application (a /-/ path, no route)
  std::string_view deployment;
  std::string_view replica;     // the replica that answered or was tried last
};

// An io thread's access lines not yet written: AccessLog::add formats a line
// into it (the time's date and second are formatted once per second), and it
// goes to the file in one piece, under the sink's lock once per batch instead
// of once per line. Touched only by its own thread.
class AccessBatch {
 public:
  size_t lines() const;

 private:
  friend class AccessLog;
  std::string text_;  // lines, each ended by '\n'
  int64_t second_ = -1;    // the second `stamp_` shows (since the epoch)
  std::string stamp_;      // "YYYY-MM-DDTHH:MM:SS."
};

class AccessLog {
 public:
  // `file` empty: the lines go to the node's own log sinks (logger "access").
  // The error names the file that cannot be opened.
  static Result<std::shared_ptr<AccessLog>> open(AccessLogMode mode, const std::string& file,
                                                 const std::string& node, bool json);

  // Whether a request answered `status` gets a line.
  bool wants(int status) const {
    return mode_ == AccessLogMode::on || (mode_ == AccessLogMode::errors && status >= 400);
  }
  void write(const AccessEntry& entry);
  // The line write() makes (without the newline); for tests.
  std::string format(const AccessEntry& entry) const;
  ~AccessLog();
  AccessLog(const AccessLog&) = delete;
  AccessLog& operator=(const AccessLog&) = delete;

  // The data path's way (one batch per io thread): the line of `entry` at
  // `now` added to `batch`, which goes to the log's writer thread once it
  // holds kBatchBytes. Into the node's own log sinks (no file of its own)
  // the line is written at once.
  //
  // An io thread never writes the file itself: a write() can stall for
  // hundreds of milliseconds when the disk is busy (the kernel throttles a
  // writer of dirty pages; rotation removes a 64 MiB file), and every
  // request of that thread would wait. The writer thread takes the batches;
  // when it falls kQueueBytes behind, further batches are dropped and
  // counted (dropped_lines(); a warning in the node's log), as HAProxy's
  // logs over UDP would be, rather than stalling the requests.
  void add(const AccessEntry& entry, AccessBatch& batch,
           std::chrono::system_clock::time_point now = std::chrono::system_clock::now());
  // Hands what `batch` holds to the writer thread and has it flush the file
  // after writing it: each io thread's sweep (at least once a second).
  void pass_on(AccessBatch& batch);
  // Hands `batch` over and waits until every line handed over so far is in
  // the file, flushed: the proxy's stop (and tests).
  void flush(AccessBatch& batch);
  // Lines dropped because the writer thread was kQueueBytes behind.
  uint64_t dropped_lines() const;
  static constexpr size_t kBatchBytes = 64 << 10;
  static constexpr size_t kQueueBytes = 16 << 20;

 private:
  AccessLog(AccessLogMode mode, std::shared_ptr<spdlog::logger> logger, std::string node,
            bool json, bool own_file);
  // Appends the line of `e` (no newline) with the time `stamp` + `millis`.
  void append(std::string& out, const AccessEntry& e, const std::string& stamp,
              int millis) const;
  // Hands batch's text to the writer (`flush`: and has it flush the file).
  void hand_over(AccessBatch& batch, bool flush);
  struct Writer;
  AccessLogMode mode_;
  std::shared_ptr<spdlog::logger> logger_;
  std::string node_;
  bool json_;
  bool own_file_;  // lines carry their own timestamp (the file's sink adds none)
  std::unique_ptr<Writer> writer_;  // own_file_ only
};

}  // namespace troupe::proxy
