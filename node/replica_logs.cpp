#include "node/replica_logs.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include <sys/stat.h>

namespace troupe::node {

namespace {

// The whole lines of `data` (from its first line start when `partial_head`),
// those containing `filter`.
std::vector<std::string> lines_of(const std::string& data, bool partial_head,
                                  const std::string& filter, size_t& consumed) {
  std::vector<std::string> out;
  size_t at = 0;
  if (partial_head) {
    auto nl = data.find('\n');
    at = nl == std::string::npos ? data.size() : nl + 1;
  }
  consumed = at;
  while (at < data.size()) {
    auto nl = data.find('\n', at);
    if (nl == std::string::npos)
      break;
    std::string line = data.substr(at, nl + 1 - at);
    if (filter.empty() || line.find(filter) != std::string::npos)
      out.push_back(std::move(line));
    at = nl + 1;
    consumed = at;
  }
  return out;
}

}  // namespace

Result<LogRead> read_log(const std::string& path, const std::string& filter, uint64_t offset,
                         uint32_t tail, size_t max_bytes, size_t window) {
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0) {
    if (errno == ENOENT)
      return Status(errc::not_found, "no log file " + path);
    return Status(errc::io_error, "cannot read " + path + ": " + std::strerror(errno));
  }
  const uint64_t size = static_cast<uint64_t>(sb.st_size);
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return Status(errc::io_error, "cannot open " + path);
  LogRead out;
  if (offset == kLogTail) {
    uint64_t from = size > window ? size - window : 0;
    std::string data(static_cast<size_t>(size - from), '\0');
    in.seekg(static_cast<std::streamoff>(from));
    in.read(data.data(), static_cast<std::streamsize>(data.size()));
    data.resize(static_cast<size_t>(in.gcount()));
    size_t consumed = 0;
    auto lines = lines_of(data, from > 0, filter, consumed);
    size_t first = lines.size() > tail ? lines.size() - tail : 0;
    for (size_t i = first; i < lines.size(); ++i)
      out.text += lines[i];
    out.next_offset = from + consumed;
    return out;
  }
  if (offset > size)
    offset = 0;  // rotated: the file started over
  std::string data(static_cast<size_t>(std::min<uint64_t>(size - offset, max_bytes)), '\0');
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  data.resize(static_cast<size_t>(in.gcount()));
  size_t consumed = 0;
  for (auto& line : lines_of(data, false, filter, consumed))
    out.text += line;
  out.next_offset = offset + consumed;
  return out;
}

}  // namespace troupe::node
