#include "controller/shell/library_store.hpp"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <set>
#include <system_error>

namespace troupe::controller {

namespace fs = std::filesystem;

LibraryStore::LibraryStore(std::string dir, std::vector<std::string> plugin_dirs,
                           double retention_s, std::shared_ptr<spdlog::logger> log)
    : dir_(std::move(dir), false),
      plugin_dirs_(std::move(plugin_dirs)),
      retention_s_(retention_s),
      log_(std::move(log)) {}

Result<std::string> LibraryStore::hash_of(const std::string& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec)
    return {errc::io_error, "cannot read " + path + ": " + ec.message()};
  const auto mtime = fs::last_write_time(path, ec);
  if (ec)
    return {errc::io_error, "cannot read " + path + ": " + ec.message()};
  const int64_t mtime_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(mtime.time_since_epoch()).count();
  auto it = hashed_.find(path);
  if (it != hashed_.end() && it->second.size == size && it->second.mtime_ns == mtime_ns)
    return it->second.sha256;
  auto sha = libraries::sha256_file(path);
  if (!sha)
    return sha.status();
  hashed_[path] = Hashed{size, mtime_ns, *sha};
  return sha;
}

Status LibraryStore::pin(ApplicationSpec& app) {
  for (auto& d : app.deployments) {
    const std::string who = "application '" + app.name + "' deployment '" + d.name + "'";
    const std::string library = d.import_path.substr(0, d.import_path.find(':'));
    if (!d.library_sha256.empty()) {
      if (!enabled()) {
        return {errc::invalid_argument,
                who + ": library '" + library +
                    "' was uploaded, but this controller keeps no libraries (it runs without "
                    "a state dir)"};
      }
      if (file_of(d.library_sha256, TargetState{}).empty()) {
        return {errc::invalid_argument,
                who + ": library '" + library + "' (SHA-256 " + d.library_sha256 +
                    ") was not uploaded to the controller; deploy the config with troupectl "
                    "deploy, which uploads it"};
      }
      continue;
    }
    if (libraries::split_pinned(library)) {
      return {errc::invalid_argument, who + ": library '" + library +
                                          "': a name ending in '@' and 64 hex digits is "
                                          "reserved for libraries pinned by their SHA-256"};
    }
    if (libraries::is_local_path(library)) {
      return {errc::invalid_argument,
              who + ": library '" + library +
                  "' is a path on the operator's machine; deploy the config with troupectl "
                  "deploy, which uploads it"};
    }
    if (plugin_dirs_.empty())
      continue;
    auto path = libraries::locate(plugin_dirs_, library);
    if (!path) {
      // Only the workers have it: they load it by name, as before.
      log_->debug("{}: library '{}' is not in the head's plugin path ({}); not pinned", who,
                  library, path.status().message());
      continue;
    }
    auto sha = hash_of(*path);
    if (!sha) {
      return {errc::io_error, who + ": cannot hash library '" + library + "': " +
                                  sha.status().message()};
    }
    d.library_sha256 = *sha;
  }
  return Status::ok();
}

std::string LibraryStore::file_of(const std::string& sha256, const TargetState& state) {
  if (!libraries::is_sha256(sha256))
    return {};
  if (enabled() && dir_.size_of(sha256)) {
    if (verified_.count(sha256))
      return dir_.path_of(sha256);
    auto whole = dir_.verify(sha256);
    if (whole && *whole) {
      verified_.insert(sha256);
      return dir_.path_of(sha256);
    }
    log_->error("stored library {}: {}", sha256,
                whole ? std::string("gone") : whole.status().message());
  }
  for (const auto& [path, h] : hashed_) {
    if (h.sha256 != sha256)
      continue;
    auto now = hash_of(path);  // the same build still there?
    if (now && *now == sha256)
      return path;
  }
  // Not remembered (a restarted controller): the plugin-path libraries the
  // deployments pinned to this hash name.
  for (const auto& [name, app] : state.applications) {
    for (const auto& d : app.deployments) {
      if (d.library_sha256 != sha256)
        continue;
      const std::string library = d.import_path.substr(0, d.import_path.find(':'));
      if (libraries::is_local_path(library))
        continue;
      auto path = libraries::locate(plugin_dirs_, library);
      if (!path)
        continue;
      auto now = hash_of(*path);
      if (now && *now == sha256)
        return *path;
    }
  }
  return {};
}

Status LibraryStore::check_available(const ApplicationSpec& app) {
  TargetState named;  // where file_of() finds plugin-path builds by their pins
  named.applications.emplace(app.name, app);
  for (const auto& d : app.deployments) {
    if (d.library_sha256.empty() || !file_of(d.library_sha256, named).empty())
      continue;
    const std::string library = d.import_path.substr(0, d.import_path.find(':'));
    return {errc::not_found,
            "application '" + app.name + "' deployment '" + d.name + "': library '" + library +
                "' (SHA-256 " + d.library_sha256 +
                ") is no longer held by the controller (a build in the plugin path replaced "
                "since, or a stored library that was damaged); deploy a config instead"};
  }
  return Status::ok();
}

uint64_t LibraryStore::size_of(const std::string& sha256, const TargetState& state) {
  const std::string file = file_of(sha256, state);
  if (file.empty())
    return 0;
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  return ec ? 0 : static_cast<uint64_t>(size);
}

std::set<std::string> LibraryStore::missing(const TargetState& state) {
  std::set<std::string> out;
  if (!enabled())
    return out;
  for (const auto& [name, app] : state.applications) {
    for (const auto& d : app.deployments) {
      if (!d.library_sha256.empty() && !out.count(d.library_sha256) &&
          size_of(d.library_sha256, state) == 0)
        out.insert(d.library_sha256);
    }
  }
  return out;
}

Result<std::string> LibraryStore::read(const std::string& sha256, uint64_t offset,
                                       const TargetState& state) {
  const std::string file = file_of(sha256, state);
  if (file.empty())
    return {errc::not_found, "the controller has no library " + sha256};
  return libraries::read_file(file, offset, libraries::kChunkBytes);
}

Result<uint64_t> LibraryStore::upload(const std::string& sha256, uint64_t total, uint64_t offset,
                                      const std::string& piece) {
  if (!enabled()) {
    return {errc::unavailable,
            "this controller keeps no libraries (it runs without a state dir); give the head "
            "--state-dir to upload libraries"};
  }
  if (offset == 0) {
    if (auto st = libraries::check_elf_shared_object(piece); !st)
      return {st.code(), "the uploaded library " + st.message()};
  }
  // A library already whole is not written again (append() returns at
  // once): it is checked when it is served, as any stored library.
  const bool whole_before = dir_.size_of(sha256) == std::optional<uint64_t>(total);
  auto received = dir_.append(sha256, total, offset, piece);
  if (received && *received == total) {
    unnamed_since_.erase(sha256);
    if (!whole_before) {
      verified_.insert(sha256);  // append() hashed every byte it wrote
      log_->info("library {} uploaded ({} bytes)", sha256, total);
    }
  }
  return received;
}

std::vector<std::string> LibraryStore::collect(const TargetState& state, double wall_now_s) {
  std::vector<std::string> removed;
  if (!enabled())
    return removed;
  // Named: by a deployment of the target state, or of an application's last
  // good declaration (a rollback must find the library it pins).
  std::set<std::string> named;
  auto name_libraries = [&named](const ApplicationSpec& app) {
    for (const auto& d : app.deployments) {
      if (!d.library_sha256.empty())
        named.insert(d.library_sha256);
    }
  };
  for (const auto& [name, app] : state.applications)
    name_libraries(app);
  for (const auto& [name, running] : state.last_running)
    name_libraries(running.spec);
  std::set<std::string> stored;
  for (const auto& e : dir_.list()) {
    const bool named_now = !e.partial && named.count(e.sha256) > 0;
    if (named_now)
      continue;
    double since = e.mtime_s;
    if (!e.partial) {
      stored.insert(e.sha256);
      auto [it, inserted] = unnamed_since_.emplace(e.sha256, wall_now_s);
      since = std::max(since, it->second);
    }
    if (wall_now_s - since < retention_s_)
      continue;
    if (e.partial) {
      // A piece only: the complete library (if any) stays.
      if (!dir_.size_of(e.sha256) && !named.count(e.sha256)) {
        dir_.remove(e.sha256);
        removed.push_back(e.sha256);
      }
      continue;
    }
    dir_.remove(e.sha256);
    unnamed_since_.erase(e.sha256);
    verified_.erase(e.sha256);
    removed.push_back(e.sha256);
    log_->info("removed library {}: no deployment has named it for {:.0f} s", e.sha256,
               retention_s_);
  }
  for (auto it = unnamed_since_.begin(); it != unnamed_since_.end();) {
    if (named.count(it->first) || !stored.count(it->first))
      it = unnamed_since_.erase(it);
    else
      ++it;
  }
  return removed;
}

}  // namespace troupe::controller
