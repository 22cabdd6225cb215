// Deployment libraries addressed by their content (issue 21).
//
// A deployment's library is pinned by the SHA-256 of its bytes: the
// controller keeps every pinned library in its state dir (uploaded by
// `troupectl deploy`, or copied from the head's plugin path), node agents
// fetch what they miss into a cache, and a replica loads the file of that
// hash only after checking its content again. The hash is part of the
// deployment's code version, so a rebuilt library rolls the replicas and an
// identical one changes nothing.
//
// What a replica spec names: "<name>@<64 hex digits>:<Class>", where <name>
// is the library's file name (for messages) and the digits its SHA-256. A
// library without "@" is looked up by name in the plugin path, as before.
//
// Plain C++ (no CAF): used by the controller, the node, the replica loader
// and troupectl.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.hpp"

namespace troupe::libraries {

// The largest library troupectl uploads and the controller stores.
inline constexpr uint64_t kMaxLibraryBytes = 256ull << 20;
// Libraries travel in pieces of this size (one CAF message each), so that a
// large one never holds a node's network thread for long.
inline constexpr uint64_t kChunkBytes = 4ull << 20;

// Lowercase hex SHA-256 of `bytes`.
std::string sha256_hex(std::string_view bytes);
// Of a file's content, read in pieces.
Result<std::string> sha256_file(const std::string& path);
// 64 lowercase hex digits.
bool is_sha256(std::string_view text);

// "<name>@<sha256>" <-> (name, sha256). `split_pinned` gives nothing for a
// library without a well-formed pin.
struct Pinned {
  std::string name;
  std::string sha256;
};
std::optional<Pinned> split_pinned(const std::string& library);
std::string pinned(const std::string& name, const std::string& sha256);

// A library named in a config by its path on the operator's machine, relative
// to the config file ("./build/libmodels.so", "../lib/libm.so") or absolute,
// not by a name in the plugin path ("libm.so", "models/libm.so").
bool is_local_path(const std::string& library);

// Checks that `bytes` are an ELF shared object for this machine's
// architecture; the error names what is wrong.
Status check_elf_shared_object(std::string_view bytes);

// Up to `max` bytes of the file at `path` from `offset`.
Result<std::string> read_file(const std::string& path, uint64_t offset, uint64_t max);

// Finds `name` (relative, no "..") in `dirs`: its canonical path. The first
// dir holding it wins; a file that resolves outside its dir, or is not a
// regular file, is refused.
Result<std::string> locate(const std::vector<std::string>& dirs, const std::string& name);

// A directory of libraries, each in "<sha256>.so": the controller's store and
// a node's cache. Writes are atomic (a temporary file renamed into place), so
// a reader never sees half a library.
class LibraryDir {
 public:
  // `durable`: writes are flushed to disk before they count (the
  // controller's store); a cache that can fetch again skips that.
  explicit LibraryDir(std::string dir, bool durable = true);

  const std::string& dir() const { return dir_; }
  std::string path_of(const std::string& sha256) const;

  // Creates the directory (and its parents) when missing.
  Status open() const;
  // The size of the stored file of `sha256`; nothing when there is none. Does
  // not read the content.
  std::optional<uint64_t> size_of(const std::string& sha256) const;
  // The stored file's size and modification time (ns): what changes when
  // someone writes it.
  struct Stamp {
    uint64_t size = 0;
    int64_t mtime_ns = 0;
    friend bool operator==(const Stamp& a, const Stamp& b) {
      return a.size == b.size && a.mtime_ns == b.mtime_ns;
    }
  };
  std::optional<Stamp> stamp_of(const std::string& sha256) const;
  // Whether the stored file's content hashes to `sha256`. A file that does
  // not (damaged, or changed by someone) is removed, and the answer says so.
  Result<bool> verify(const std::string& sha256) const;
  // Stores `bytes` after checking they hash to `sha256`.
  Status put(const std::string& sha256, std::string_view bytes) const;
  // Copies the file at `source` in, checking its content hashes to `sha256`.
  Status put_file(const std::string& sha256, const std::string& source) const;
  // Up to `max` bytes of the stored file from `offset`.
  Result<std::string> read(const std::string& sha256, uint64_t offset, uint64_t max) const;

  // A library arriving in pieces: `offset` 0 starts it over; the pieces must
  // come in order. When the last byte of `total` is in, the content is checked
  // and the file put in place. Returns the bytes received so far. The content
  // is hashed piece by piece as it arrives (the state is kept here, so one
  // thread at a time appends); an upload continued by a new LibraryDir
  // hashes the pieces already on disk once.
  Result<uint64_t> append(const std::string& sha256, uint64_t total, uint64_t offset,
                          std::string_view piece) const;

  // What the directory holds: complete libraries and pieces of uploads, with
  // when each file was last written (seconds since the epoch).
  struct Entry {
    std::string sha256;
    bool partial = false;
    double mtime_s = 0;
  };
  std::vector<Entry> list() const;
  // Removes the library of `sha256` (and any pieces of it).
  void remove(const std::string& sha256) const;

 private:
  std::string partial_path(const std::string& sha256) const;

  std::string dir_;
  bool durable_;
  // The running hash of each library arriving in pieces.
  struct Progress;
  mutable std::map<std::string, std::shared_ptr<Progress>> in_progress_;
};

// What a node's cache may drop (the node agent looks every
// library_cache_prune_interval_s): the libraries and pieces in `entries`
// that `used` does not name and whose file was last written `retention_s`
// or more before `wall_now_s` (seconds since the epoch). Each hash once.
std::vector<std::string> stale_libraries(const std::vector<LibraryDir::Entry>& entries,
                                         const std::set<std::string>& used, double wall_now_s,
                                         double retention_s);

}  // namespace troupe::libraries
