// The controller's deployment libraries (issue 21): those troupectl uploads,
// each kept as "<state dir>/libraries/<sha256>.so" (runtime/libraries.hpp),
// and those of the head's plugin path, read where they are; both are served
// to the node agents, which fetch what they miss.
//
// The work runs on the controller's thread, so it is kept short: a
// plugin-path library is hashed once per build (remembered by path, size and
// modification time) and never copied; an upload's pieces are written
// without fsync and hashed as they arrive (its last piece costs what any
// piece costs), and a stored library is checked against its hash the first
// time this incarnation serves or names it (so one damaged by a crash is
// removed, and troupectl uploads it again). Those two whole-file hashes (a
// new build in the plugin path, a stored library after a restart) still run
// on the controller's thread, once each.
//
// On every deploy, `pin` gives each deployment the SHA-256 of its library's
// content (DeploymentSpec::library_sha256), which is part of its code
// identity: a rebuilt library rolls the replicas, an identical one changes
// nothing. Libraries no deployment names any more (neither of the target
// state nor of an application's last good declaration, which a rollback
// deploys again) are removed once they have gone unnamed for `retention_s`;
// a restarted controller finds the others on disk.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
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

  // Every library `app` pins is one the controller can serve (stored, or the
  // build in the head's plugin path it is pinned to): a rollback deploys a
  // declaration pinned earlier, whose plugin-path build may have been
  // rebuilt in place since. errc::not_found naming the deployment and the
  // library otherwise.
  Status check_available(const ApplicationSpec& app);

  // The size of a library the controller can serve (stored, or the build in
  // the head's plugin path that a deployment of `state` is pinned to); 0 when
  // there is none.
  uint64_t size_of(const std::string& sha256, const TargetState& state);
  // Up to libraries::kChunkBytes of it from `offset`.
  Result<std::string> read(const std::string& sha256, uint64_t offset, const TargetState& state);
  // The libraries the deployments of `state` pin that this controller cannot
  // serve (size_of() is 0): a new leader of highly available heads, whose
  // disk never had what was uploaded to another head, takes them back from
  // the nodes' caches (controller_actor.cpp).
  std::set<std::string> missing(const TargetState& state);

  // One piece of an upload (LibraryDir::append); the first piece must begin
  // with the header of an ELF shared object of this machine.
  Result<uint64_t> upload(const std::string& sha256, uint64_t total, uint64_t offset,
                          const std::string& piece);

  // Removes the libraries that `state` does not name (in its applications or
  // their last good declarations, TargetState::last_running) and that have gone
  // unnamed (and unwritten) for retention_s by `wall_now_s` (seconds since the
  // epoch), and pieces of uploads untouched that long. Returns their hashes.
  std::vector<std::string> collect(const TargetState& state, double wall_now_s);

 private:
  // The SHA-256 of a plugin-path file, remembered by (path, size, mtime).
  Result<std::string> hash_of(const std::string& path);
  // The stored file of `sha256` if it is there and whole (checked once per
  // incarnation); else the plugin-path file of that hash a deployment of
  // `state` names (looked up again when not remembered, as after a restart);
  // else "".
  std::string file_of(const std::string& sha256, const TargetState& state);

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
  // Stored libraries whose content this incarnation checked.
  std::set<std::string> verified_;
  // Stored libraries no deployment names, and since when (wall seconds).
  std::map<std::string, double> unnamed_since_;
};

}  // namespace troupe::controller
