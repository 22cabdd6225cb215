// The controller's deployment libraries (issue 21): those troupectl uploads
// and those it copies from the head's plugin path, each kept as
// "<state dir>/libraries/<sha256>.so" (runtime/libraries.hpp) and served to
// the node agents, which fetch what they miss.
//
// On every deploy, `pin` gives each deployment the SHA-256 of its library's
// content (DeploymentSpec::library_sha256), which is part of its code
// identity: a rebuilt library rolls the replicas, an identical one changes
// nothing. Libraries no deployment names any more are removed once they have
// gone unnamed for `retention_s`; a restarted controller finds the others on
// disk.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "controller/core/model.hpp"
#include "runtime/libraries.hpp"
#include "runtime/status.hpp"

namespace spdlog {
class logger;
}

namespace troupe::controller {

class LibraryStore {
 public:
  // `dir` empty: the controller keeps no libraries (no state dir): uploads are
  // refused, plugin-path libraries are not pinned.
  LibraryStore(std::string dir, std::vector<std::string> plugin_dirs, double retention_s,
               std::shared_ptr<spdlog::logger> log);

  bool enabled() const { return !dir_.dir().empty(); }

  // Pins every deployment of `app` (see above). Refused, naming the
  // deployment: a library given by its SHA-256 that was not uploaded, or a
  // path on the operator's machine without one (a config deployed by other
  // means than troupectl deploy).
  Status pin(ApplicationSpec& app);

  // The size of a stored library; 0 when there is none.
  uint64_t size_of(const std::string& sha256) const;
  // Up to libraries::kChunkBytes of a stored library from `offset`.
  Result<std::string> read(const std::string& sha256, uint64_t offset) const;
  // One piece of an upload (LibraryDir::append); the first piece must begin
  // with the header of an ELF shared object of this machine.
  Result<uint64_t> upload(const std::string& sha256, uint64_t total, uint64_t offset,
                          const std::string& piece);

  // Removes the libraries that `state` does not name and that have gone
  // unnamed (and unwritten) for retention_s by `wall_now_s` (seconds since the
  // epoch), and pieces of uploads untouched that long. Returns their hashes.
  std::vector<std::string> collect(const TargetState& state, double wall_now_s);

 private:
  // The SHA-256 of a plugin-path file, remembered by (path, size, mtime).
  Result<std::string> hash_of(const std::string& path);

  libraries::LibraryDir dir_;
  std::vector<std::string> plugin_dirs_;
  double retention_s_;
  std::shared_ptr<spdlog::logger> log_;
  struct Hashed {
    uint64_t size = 0;
    int64_t mtime_ns = 0;
    std::string sha256;
  };
  std::map<std::string, Hashed> hashed_;
  // Stored libraries no deployment names, and since when (wall seconds).
  std::map<std::string, double> unnamed_since_;
};

}  // namespace troupe::controller
