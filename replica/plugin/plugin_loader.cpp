#include "replica/plugin/plugin_loader.hpp"

#include <dlfcn.h>

#include <utility>

#include "runtime/libraries.hpp"

namespace troupe {

namespace {

std::string last_dlerror(const char* fallback) {
  const char* error = dlerror();
  return error != nullptr ? error : fallback;
}

}  // namespace

PluginLoader::PluginLoader(std::vector<std::string> plugin_dirs, std::string library_cache)
    : plugin_dirs_(std::move(plugin_dirs)), library_cache_(std::move(library_cache)) {}

Result<std::string> PluginLoader::locate(const std::string& library) const {
  if (auto pin = libraries::split_pinned(library)) {
    if (library_cache_.empty()) {
      return {errc::not_found, "library '" + library +
                                   "' is pinned by its SHA-256 and this process has no "
                                   "library cache"};
    }
    libraries::LibraryDir cache(library_cache_);
    if (!cache.size_of(pin->sha256)) {
      return {errc::not_found, "library '" + library + "' is not in the library cache " +
                                   library_cache_};
    }
    return cache.path_of(pin->sha256);
  }
  return libraries::locate(plugin_dirs_, library);
}

// Handles are never dlclose()d. Unloading a C++ library is unsafe: its static
// objects, thread_locals, registered atexit handlers and any pointer into it
// (a vtable of a live object, a factory, a std::function, an exception in
// flight) would dangle, and glibc may keep it loaded anyway (RTLD_NODELETE,
// unique symbols). A new build of a pinned library (runtime/libraries.hpp)
// is a file of another name (its hash) and loads next to the old one; a new
// build of a library named in the plugin path should get a new file name.
Result<void*> PluginLoader::open(const std::string& canonical_path, const std::string& sha256) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = handles_.find(canonical_path);
  if (it != handles_.end())
    return it->second;
  if (!sha256.empty()) {
    // Checked right before the first load: a cached file changed since the
    // node put it there is refused, never loaded.
    auto actual = libraries::sha256_file(canonical_path);
    if (!actual)
      return actual.status();
    if (*actual != sha256) {
      return {errc::corrupt, "library '" + canonical_path + "' has content of SHA-256 " +
                                 *actual + ", not the " + sha256 +
                                 " it is pinned to (damaged or changed); refusing to load it"};
    }
  }
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
  auto pin = libraries::split_pinned(parsed->library);
  auto handle = open(*path, pin ? pin->sha256 : std::string());
  // Messages name the file loaded and, for a pinned one, what it is.
  const std::string shown = pin ? *path + "' (" + parsed->library + ")" : *path + "'";
  if (!handle)
    return handle.status();

  const std::string symbol = deployment_symbol(parsed->class_name);
  dlerror();
  void* address = dlsym(*handle, symbol.c_str());
  if (address == nullptr) {
    return {errc::not_found, "library '" + shown + " has no deployment '" + parsed->class_name +
                                 "' (symbol " + symbol + ": " + last_dlerror("symbol is null") +
                                 ")"};
  }
  using Exported = const DeploymentFactory* (*)();
  const DeploymentFactory* factory = reinterpret_cast<Exported>(address)();
  if (factory == nullptr) {
    return {errc::internal, "library '" + shown + ": " + symbol + "() returned no factory"};
  }
  if (factory->abi_version != kDeploymentAbiVersion) {
    return {errc::invalid_argument,
            "library '" + shown + ": deployment '" + parsed->class_name +
                "' was built against deployment ABI " + std::to_string(factory->abi_version) +
                ", this node supports " + std::to_string(kDeploymentAbiVersion) +
                "; rebuild it against this node's <troupe/deployment.hpp>"};
  }
  if (factory->create == nullptr) {
    return {errc::internal, "library '" + shown + ": deployment '" + parsed->class_name +
                                "' has no create function"};
  }
  return factory;
}

}  // namespace troupe
