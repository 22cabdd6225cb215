// A temporary directory of a test's or a tool's own. Header-only, so that
// tests which link nothing of tools/ (the unit tests of the store, the
// replica's plugins, security) use it as well as the multi-process tests
// (tests/support) and the chaos tool do.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace troupe::proc {

// A fresh directory /tmp/<prefix>-XXXXXX, removed with its content on
// destruction unless keep() was called.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "troupe-test") {
    std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr)
      throw std::runtime_error("mkdtemp failed for " + tmpl);
    path_ = tmpl;
  }
  ~TempDir() {
    if (keep_)
      return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  void keep() { keep_ = true; }

 private:
  std::string path_;
  bool keep_ = false;
};

}  // namespace troupe::proc
