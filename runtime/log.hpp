// Leveled, per-component logging (spdlog) to stderr and, when a state
// directory is given, to a rotating file under it. CAF's own logging is
// compiled out in Debian's build, so connection and down events are logged by
// the components themselves.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <spdlog/logger.h>

#include "runtime/status.hpp"

namespace troupe::log {

struct Options {
  std::string level = "info";  // trace, debug, info, warn, error, critical, off
  std::string file;            // empty: stderr only
  std::string process;         // prefixed to every line, e.g. the node id
  // "text", or "json": one JSON object per line with ts (UTC, ISO 8601),
  // level, node (`process`), component and msg.
  std::string format = "text";
};

// Configures the sinks shared by every component logger. Call once in main
// before any actor starts; an invalid level or unwritable file is an error.
Status init(const Options& options);

// The logger of one component ("controller", "agent", "node", ...), created
// on first use with the sinks configured by init().
std::shared_ptr<spdlog::logger> get(const std::string& component);

// A logger of `component` that writes to the sinks configured by init()
// and also to a file of its own at `path` (kept to `max_bytes`, one older
// file beside it), in the same format: an in-process replica's lines, kept
// apart for `troupectl logs`. Not registered: each caller holds its own.
Result<std::shared_ptr<spdlog::logger>> with_file(const std::string& component,
                                                  const std::string& path, size_t max_bytes);

// A logger of `component` that writes to the sinks configured by init()
// and also to a file of its own at `path` (kept to `max_bytes`, one older
// file beside it), in the same format: an in-process replica's lines, kept
// apart for `troupectl logs`. Not registered: each caller holds its own.
Result<std::shared_ptr<spdlog::logger>> with_file(const std::string& component,
                                                  const std::string& path, size_t max_bytes);

// Flushes and drops every logger; call at the end of main.
void shutdown();

// The id of the request the calling thread handles ("" or null: none),
// written on every line the thread logs: "[request ID] " before the message
// in text, "request_id" in JSON. Returns the previous one, to restore
// (replica::RequestIdScope does both around a request).
const std::string* set_request_id(const std::string* id);

// `t` in UTC, ISO 8601 with milliseconds: 2026-12-01T23:00:00.000Z.
std::string utc_timestamp(std::chrono::system_clock::time_point t);

}  // namespace troupe::log
