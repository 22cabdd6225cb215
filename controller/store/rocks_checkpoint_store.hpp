// The controller's checkpoint in a RocksDB database of its own
// (<state-dir>/checkpoint), written ahead with synced, atomic writes.
//
// Key layout (one column family):
//   "head"        CheckpointHead: target_capacity, generation, the
//                 autoscaled counts, the last good declarations (an
//                 application's own is written as `current`, so the head
//                 stays small), and how many application keys belong with it
//   "app/<name>"  one ApplicationSpec per application
// Every save() is one WriteBatch (head + the application keys that changed +
// deletions), so a crash leaves either the old or the new state, never a mix.
// Why per-application keys: the common change touches one application, and
// with 1,000 deployments a whole-state value is ~0.65 MB; writing only the
// changed application keeps each synced write small (WAL bytes, memtable
// churn, flushes) while load() stays a single ordered scan. See save().
//
// Not thread-safe: one owner (the controller actor) calls it.
#pragma once

#include <spdlog/logger.h>

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "controller/core/checkpoint_store.hpp"

namespace rocksdb {
class DB;
class Env;
}  // namespace rocksdb

namespace troupe::controller {

struct RocksCheckpointStoreOptions {
  // The environment RocksDB does its file I/O through; nullptr means
  // rocksdb::Env::Default(). Tests inject I/O failures here. Not owned: it
  // must outlive the store.
  rocksdb::Env* env = nullptr;
  // Where RocksDB's own warnings and errors go (prefixed "rocksdb: "); null:
  // nowhere. Never to a LOG file in the checkpoint directory (see the .cpp).
  std::shared_ptr<spdlog::logger> log;
};

class RocksCheckpointStore final : public CheckpointStore {
 public:
  // Opens the database in directory `path`, creating it when missing (its
  // parent must exist). Errors name `path` and carry RocksDB's message:
  // errc::corrupt when RocksDB reports corruption (the controller must not
  // start), errc::io_error for everything else (unwritable or missing parent
  // directory, the database already open by another process, ...).
  static Result<std::unique_ptr<RocksCheckpointStore>> open(
      const std::string& path, const RocksCheckpointStoreOptions& options = {});

  ~RocksCheckpointStore() override;
  RocksCheckpointStore(const RocksCheckpointStore&) = delete;
  RocksCheckpointStore& operator=(const RocksCheckpointStore&) = delete;

  // One synced WriteBatch. Returns errc::io_error (naming the path) when the
  // write fails; then the caller must treat the change as not made. It may
  // still have reached the disk (a failed sync is not a failed write), so a
  // restart could load it: that is the caller's "nothing may be assumed"
  // either way. RocksDB refuses writes after a failed log write, so the next
  // save() first closes and reopens the database (failing with the reason if
  // it cannot), then rewrites every key instead of trusting what it believes
  // is stored: the result is exactly the state passed.
  Status save(const TargetState& state) override;

  // Reads every key from one consistent snapshot. std::nullopt for a
  // database nothing was ever saved in. Any undecodable value, stray key,
  // missing head or application count that does not match is errc::corrupt
  // naming the path and the key; a record from a newer binary is
  // errc::version_mismatch. After a failed save() it still returns the state
  // before that save (what the open database holds).
  Result<std::optional<TargetState>> load() override;

  const std::string& path() const { return path_; }

 private:
  RocksCheckpointStore(std::string path, const RocksCheckpointStoreOptions& options,
                       std::unique_ptr<rocksdb::DB> db);
  Status reopen_after_failure();
  void remember(std::map<std::string, std::string> stored);

  std::string path_;
  RocksCheckpointStoreOptions options_;
  std::unique_ptr<rocksdb::DB> db_;
  // What the last successful save() or load() left under "app/<name>":
  // encoded record by application name. Only valid while known_ is true;
  // after open() or a failed write it is not, and save() rewrites all keys.
  std::map<std::string, std::string> stored_;
  bool known_ = false;
  // A write failed: RocksDB refuses further writes until the database is
  // reopened, which the next save() does.
  bool write_failed_ = false;
};

}  // namespace troupe::controller
