// A small disk of a test's own: a tmpfs mounted on a directory (the suite
// runs as root), and a way to fill it up. Shared by the tests and the chaos
// tool's fill_disk fault.
#pragma once

#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace troupe::proc {

// A tmpfs of `size` ("16m") mounted on `path` (created), detached again on
// destruction (lazily: a process may still hold files on it).
struct Tmpfs {
  std::string path;
  std::string error;  // why the mount failed
  bool mounted = false;
  Tmpfs(std::string at, const std::string& size) : path(std::move(at)) {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    mounted = ::mount("tmpfs", path.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0;
    if (!mounted)
      error = std::strerror(errno);
  }
  ~Tmpfs() {
    if (mounted)
      ::umount2(path.c_str(), MNT_DETACH);
  }
  Tmpfs(const Tmpfs&) = delete;
  Tmpfs& operator=(const Tmpfs&) = delete;
};

// Writes `file` until the disk refuses more: the bytes written, and whether
// it ended with ENOSPC.
inline std::pair<size_t, bool> fill_disk(const std::string& file) {
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0)
    return {0, false};
  std::vector<char> block(64 * 1024, 'x');
  size_t total = 0;
  bool full = false;
  for (;;) {
    auto n = ::write(fd, block.data(), block.size());
    if (n > 0) {
      total += static_cast<size_t>(n);
      continue;
    }
    full = n < 0 && errno == ENOSPC;
    break;
  }
  ::close(fd);
  return {total, full};
}

}  // namespace troupe::proc
