// An import path names a deployment class in a plugin library:
// "libfoo.so:ClassName" (Ray Serve's "module:attribute", for shared libraries).
#pragma once

#include <string>

#include "runtime/status.hpp"

namespace troupe {

struct ImportPath {
  std::string library;     // file name relative to a plugin dir, e.g. "libfoo.so"
  std::string class_name;  // a C identifier, e.g. "Hello"
};

// Splits at the first ':'. Fails with errc::invalid_argument, naming the value,
// when there is no ':', either part is empty, or the class name is not a C
// identifier (so "ns::Hello" is refused: TROUPE_DEPLOYMENT exports plain
// names). Does not look at the file system; PluginLoader checks the library.
Result<ImportPath> parse_import_path(const std::string& value);

// True for [A-Za-z_][A-Za-z0-9_]*.
bool is_c_identifier(const std::string& name);

}  // namespace troupe
