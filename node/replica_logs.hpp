// Reading a replica's log for `troupectl logs` (plain C++; the node agent
// serves it): the last lines of a file, or what was appended since an
// offset, in whole lines, optionally only the lines that contain a string
// (an in-process replica's lines in the node's own log).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/status.hpp"

namespace troupe::node {

// Read the last `tail` lines rather than from an offset.
constexpr uint64_t kLogTail = UINT64_MAX;

struct LogRead {
  std::string text;          // whole lines, each ending in '\n'
  uint64_t next_offset = 0;  // where the next read goes on
};

// `offset` kLogTail: the last `tail` lines (0: none, only the offset to
// follow from), looked for in the last `window` bytes. Else the whole lines
// appended from `offset` on, at most `max_bytes` of them (a file shorter
// than `offset` was rotated: read from its start). A line without its '\n'
// yet is left for the next read. `filter` non-empty: only lines containing
// it. A missing file is errc::not_found.
Result<LogRead> read_log(const std::string& path, const std::string& filter, uint64_t offset,
                         uint32_t tail, size_t max_bytes = 1 << 20, size_t window = 8 << 20);

}  // namespace troupe::node
