// Finds deployment classes in plugin libraries (see include/troupe/deployment.hpp).
//
//   PluginLoader loader({"/opt/troupe/plugins"});
//   Result<const DeploymentFactory*> factory = loader.resolve("libfoo.so:Hello");
//   if (!factory) return factory.status();  // a message naming path and cause
//   std::unique_ptr<Deployment> d = (*factory)->create(init_args, ctx);  // may throw
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <troupe/deployment.hpp>

#include "replica/plugin/import_path.hpp"
#include "runtime/status.hpp"

namespace troupe {

class PluginLoader {
 public:
  // Libraries are looked up in these directories, in order. Directories that
  // do not exist (yet) are skipped at each resolve().
  // `library_cache`: where pinned libraries ("<name>@<sha256>", see
  // runtime/libraries.hpp) are, as "<sha256>.so" (the node agent puts them
  // there before it starts a replica); empty: pinned names are refused.
  explicit PluginLoader(std::vector<std::string> plugin_dirs, std::string library_cache = "");

  PluginLoader(const PluginLoader&) = delete;
  PluginLoader& operator=(const PluginLoader&) = delete;

  // Loads the library of `import_path` (once; later calls reuse the handle)
  // and returns the factory of its class. Thread-safe.
  //
  // The library name is resolved only inside the plugin dirs: an absolute
  // name, a '..' component, or a file whose canonical location (symlinks
  // followed) is outside the plugin dir it was found in is refused with
  // errc::invalid_argument. Other errors, each naming the path:
  //   - bad import path syntax:                   invalid_argument
  //   - library in no plugin dir:                 not_found
  //   - dlopen failed (dlerror text):             invalid_argument
  //   - class not exported by the library:        not_found
  //   - built against another deployment ABI:     invalid_argument
  //   - a pinned library not in the cache:        not_found
  //   - a pinned library whose content does not
  //     hash to its pin (it is never loaded):     corrupt
  //
  // The returned factory stays valid for the process's lifetime: libraries
  // are never unloaded (see plugin_loader.cpp).
  Result<const DeploymentFactory*> resolve(const std::string& import_path);

  const std::vector<std::string>& plugin_dirs() const { return plugin_dirs_; }
  const std::string& library_cache() const { return library_cache_; }

 private:
  // The canonical path of `library` inside a plugin dir, or why there is none.
  Result<std::string> locate(const std::string& library) const;
  // dlopen()s `canonical_path`, or returns the cached handle. `sha256`
  // given: the file's content must hash to it before it is first loaded.
  Result<void*> open(const std::string& canonical_path, const std::string& sha256 = "");

  const std::vector<std::string> plugin_dirs_;
  const std::string library_cache_;
  std::mutex mutex_;                      // guards handles_
  std::map<std::string, void*> handles_;  // canonical path -> dlopen handle
};

}  // namespace troupe
