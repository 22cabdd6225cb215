#include "replica/plugin/plugin_loader.hpp"

#include <dlfcn.h>

#include <filesystem>
#include <system_error>
#include <utility>

namespace troupe {

namespace fs = std::filesystem;

namespace {

std::string dirs_list(const std::vector<std::string>& dirs) {
  std::string out = "[";
  for (size_t i = 0; i < dirs.size(); ++i) {
    if (i > 0)
      out += ", ";
    out += dirs[i];
  }
  return out + "]";
}

// True when `path` is `dir` or below it; both canonical.
bool is_within(const fs::path& path, const fs::path& dir) {
  auto p = path.begin();
  for (auto d = dir.begin(); d != dir.end(); ++d, ++p) {
    if (d->empty())
      continue;  // a trailing separator yields an empty element
    if (p == path.end() || *p != *d)
      return false;
  }
  return true;
}

std::string last_dlerror(const char* fallback) {
  const char* error = dlerror();
  return error != nullptr ? error : fallback;
}

}  // namespace

PluginLoader::PluginLoader(std::vector<std::string> plugin_dirs)
    : plugin_dirs_(std::move(plugin_dirs)) {}

Result<std::string> PluginLoader::locate(const std::string& library) const {
  const fs::path name(library);
  if (name.is_absolute()) {
    return {errc::invalid_argument, "library '" + library +
                                        "' is an absolute path; libraries are loaded only from "
                                        "the plugin path " +
                                        dirs_list(plugin_dirs_) + ", name one relative to it"};
  }
  for (const auto& part : name) {
    if (part == "..") {
      return {errc::invalid_argument,
              "library '" + library + "' contains a '..' component; libraries are loaded only " +
                  "from inside the plugin path " + dirs_list(plugin_dirs_)};
    }
  }
  for (const auto& dir : plugin_dirs_) {
    std::error_code ec;
    const fs::path canonical_dir = fs::canonical(dir, ec);
    if (ec)
      continue;  // a missing plugin dir holds nothing
    const fs::path candidate = canonical_dir / name;
    if (!fs::exists(fs::symlink_status(candidate, ec)))
      continue;
    const fs::path canonical = fs::canonical(candidate, ec);
    if (ec) {
      // Present but unresolvable: a dangling symlink or an unreadable dir.
      return {errc::not_found, "library '" + library + "' in plugin dir '" + dir +
                                   "' cannot be resolved: " + ec.message()};
    }
    if (!is_within(canonical, canonical_dir)) {
      return {errc::invalid_argument, "library '" + library + "' in plugin dir '" + dir +
                                          "' resolves to '" + canonical.string() +
                                          "', outside the plugin dir; refusing to load it"};
    }
    if (!fs::is_regular_file(canonical, ec)) {
      return {errc::invalid_argument,
              "library '" + library + "' in plugin dir '" + dir + "' is not a regular file"};
    }
    return canonical.string();
  }
  return {errc::not_found,
          "library '" + library + "' not found in plugin path " + dirs_list(plugin_dirs_)};
}

// Handles are never dlclose()d. Unloading a C++ library is unsafe: its static
// objects, thread_locals, registered atexit handlers and any pointer into it
// (a vtable of a live object, a factory, a std::function, an exception in
// flight) would dangle, and glibc may keep it loaded anyway (RTLD_NODELETE,
// unique symbols). A new code version should ship under a new file name, which
// loads next to the old one.
Result<void*> PluginLoader::open(const std::string& canonical_path) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = handles_.find(canonical_path);
  if (it != handles_.end())
    return it->second;
  // Held across dlopen so one path is opened once; the library's static
  // initializers run here and must not call back into this loader.
  dlerror();
  void* handle = dlopen(canonical_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return {errc::invalid_argument,
            "cannot load library '" + canonical_path + "': " + last_dlerror("dlopen failed")};
  }
  handles_.emplace(canonical_path, handle);
  return handle;
}

Result<const DeploymentFactory*> PluginLoader::resolve(const std::string& import_path) {
  auto parsed = parse_import_path(import_path);
  if (!parsed)
    return parsed.status();
  auto path = locate(parsed->library);
  if (!path)
    return path.status();
  auto handle = open(*path);
  if (!handle)
    return handle.status();

  const std::string symbol = deployment_symbol(parsed->class_name);
  dlerror();
  void* address = dlsym(*handle, symbol.c_str());
  if (address == nullptr) {
    return {errc::not_found, "library '" + *path + "' has no deployment '" + parsed->class_name +
                                 "' (symbol " + symbol + ": " + last_dlerror("symbol is null") +
                                 ")"};
  }
  using Exported = const DeploymentFactory* (*)();
  const DeploymentFactory* factory = reinterpret_cast<Exported>(address)();
  if (factory == nullptr) {
    return {errc::internal, "library '" + *path + "': " + symbol + "() returned no factory"};
  }
  if (factory->abi_version != kDeploymentAbiVersion) {
    return {errc::invalid_argument,
            "library '" + *path + "': deployment '" + parsed->class_name +
                "' was built against deployment ABI " + std::to_string(factory->abi_version) +
                ", this node supports " + std::to_string(kDeploymentAbiVersion) +
                "; rebuild it against this node's <troupe/deployment.hpp>"};
  }
  if (factory->create == nullptr) {
    return {errc::internal, "library '" + *path + "': deployment '" + parsed->class_name +
                                "' has no create function"};
  }
  return factory;
}

}  // namespace troupe
