#include "controller/store/rocks_checkpoint_store.hpp"

#include <rocksdb/db.h>
#include <rocksdb/iterator.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include <cstdarg>
#include <cstdio>
#include <limits>
#include <utility>

#include "controller/store/codec.hpp"

namespace troupe::controller {
namespace {

constexpr const char* kHeadKey = "head";
constexpr const char* kAppPrefix = "app/";
constexpr size_t kAppPrefixSize = 4;

std::string app_key(const std::string& name) {
  return kAppPrefix + name;
}

bool is_app_key(const rocksdb::Slice& key) {
  return key.starts_with(rocksdb::Slice(kAppPrefix, kAppPrefixSize));
}

// RocksDB reports corruption of its own files as Corruption; everything else
// (I/O, locks, permissions, a stopped database) is an I/O failure to us.
errc code_of(const rocksdb::Status& s) {
  return s.IsCorruption() ? errc::corrupt : errc::io_error;
}

}  // namespace

RocksCheckpointStore::RocksCheckpointStore(std::string path,
                                           const RocksCheckpointStoreOptions& options,
                                           std::unique_ptr<rocksdb::DB> db)
    : path_(std::move(path)), options_(options), db_(std::move(db)) {}

RocksCheckpointStore::~RocksCheckpointStore() {
  if (db_) {
    // Close() reports errors the destructor would swallow; there is nothing
    // to do about them here (every save was synced), so they are ignored.
    db_->Close().PermitUncheckedError();
  }
}

namespace {

// RocksDB's own messages go to the node's log, not to a LOG file in the
// checkpoint directory. On a full disk that file is the first write to fail,
// and RocksDB 7.8 as Debian builds it (assertions on) aborts the process on
// the next message to a logger whose file write failed: a full state disk
// must refuse deploys, not take the head down. Warnings and errors only.
class InfoLog final : public rocksdb::Logger {
 public:
  explicit InfoLog(std::shared_ptr<spdlog::logger> log)
      : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL), log_(std::move(log)) {}

  using rocksdb::Logger::Logv;
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (!log_ || level < GetInfoLogLevel() || level == rocksdb::InfoLogLevel::HEADER_LEVEL)
      return;
    char text[1024];
    std::vsnprintf(text, sizeof(text), format, ap);
    auto spd = level >= rocksdb::InfoLogLevel::ERROR_LEVEL ? spdlog::level::err
                                                            : spdlog::level::warn;
    log_->log(spd, "rocksdb: {}", text);
  }

 private:
  std::shared_ptr<spdlog::logger> log_;
};

rocksdb::Options db_options(const RocksCheckpointStoreOptions& store_options) {
  rocksdb::Options options;
  options.info_log = std::make_shared<InfoLog>(store_options.log);
  options.create_if_missing = true;
  // Refuse to open over inconsistencies instead of skipping them.
  options.paranoid_checks = true;
  // kPointInTimeRecovery (the default) is right for synced writes: it drops
  // only a torn tail, i.e. a write that was never acknowledged.
  options.wal_recovery_mode = rocksdb::WALRecoveryMode::kPointInTimeRecovery;
  // The state is small; keep a few info logs, not RocksDB's default 1000.
  options.keep_log_file_num = 4;
  if (store_options.env != nullptr) {
    options.env = store_options.env;
  }
  return options;
}

Result<std::unique_ptr<rocksdb::DB>> open_db(const std::string& path,
                                             const RocksCheckpointStoreOptions& options) {
  rocksdb::DB* raw = nullptr;
  auto s = rocksdb::DB::Open(db_options(options), path, &raw);
  if (!s.ok()) {
    return Status(code_of(s), "cannot open checkpoint database " + path + ": " + s.ToString());
  }
  return std::unique_ptr<rocksdb::DB>(raw);
}

}  // namespace

Result<std::unique_ptr<RocksCheckpointStore>> RocksCheckpointStore::open(
    const std::string& path, const RocksCheckpointStoreOptions& options) {
  auto db = open_db(path, options);
  if (!db) {
    return db.status();
  }
  return std::unique_ptr<RocksCheckpointStore>(
      new RocksCheckpointStore(path, options, std::move(db).value()));
}

// What load() read is what the next save() may diff against — unless a write
// failed since the database was opened: the log may then hold more than the
// open database shows.
void RocksCheckpointStore::remember(std::map<std::string, std::string> stored) {
  if (write_failed_) {
    return;
  }
  stored_ = std::move(stored);
  known_ = true;
}

// After a failed synced write RocksDB keeps refusing writes (a "background
// error" that DB::Resume() does not clear for WAL failures), so the database
// is closed and opened again: recovery replays what the log really holds,
// and the next save() rewrites every key (known_ is false), so whether or
// not the failed write reached the disk, the result is exactly the new state.
Status RocksCheckpointStore::reopen_after_failure() {
  if (!write_failed_) {
    return Status::ok();
  }
  if (db_) {
    // Its error is the one the failed save already reported.
    db_->Close().PermitUncheckedError();
    db_.reset();
  }
  auto db = open_db(path_, options_);
  if (!db) {
    return Status(db.status().code(), "after an earlier failed write, " + db.status().message());
  }
  db_ = std::move(db).value();
  write_failed_ = false;
  known_ = false;
  stored_.clear();
  return Status::ok();
}

// Layout choice: only the applications whose encoded record differs from
// what is stored are written, plus deletions and the head. The common change
// touches one application, so a save of a 1,000-deployment state writes a
// few KB instead of the whole state (tools/bench/checkpoint_write: p50
// ~0.4 ms against ~1.3 ms for one whole-state value, whose 0.65 MB writes
// also fill a memtable every ~100 saves and stall a save ~10 ms on each
// flush). Encoding every application to compare costs ~0.2 ms per save at
// 1,000 deployments. Comparing encoded bytes (not model
// equality) means "what is durable differs", and it also rewrites records
// loaded from an older schema once. When what is stored is unknown (fresh
// open without load(), or after a failed write, whose effect is uncertain:
// a failed sync may still leave the data on disk) every application key is
// rewritten and every key not in `state` deleted, so the result is exactly
// `state` either way.
Status RocksCheckpointStore::save(const TargetState& state) {
  if (state.applications.size() > std::numeric_limits<uint32_t>::max()) {
    return Status(errc::invalid_argument, "too many applications to checkpoint");
  }
  if (auto st = reopen_after_failure(); !st) {
    return st;
  }

  rocksdb::WriteBatch batch;
  std::map<std::string, std::string> next;
  auto check = [this](const rocksdb::Status& s, const char* what) -> Status {
    if (s.ok()) {
      return Status::ok();
    }
    return Status(code_of(s),
                  std::string("checkpoint database ") + path_ + ": " + what + ": " + s.ToString());
  };

  if (known_) {
    for (const auto& [name, bytes] : stored_) {
      if (state.applications.count(name) == 0) {
        if (auto st = check(batch.Delete(app_key(name)), "batching a delete"); !st) {
          return st;
        }
      }
    }
  } else {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
    for (it->Seek(kAppPrefix); it->Valid() && is_app_key(it->key()); it->Next()) {
      auto name = it->key().ToString().substr(kAppPrefixSize);
      if (state.applications.count(name) == 0) {
        if (auto st = check(batch.Delete(it->key()), "batching a delete"); !st) {
          return st;
        }
      }
    }
    if (auto st = check(it->status(), "listing stored applications"); !st) {
      return st;
    }
  }

  for (const auto& [name, app] : state.applications) {
    auto bytes = encode_application(app);
    auto old = known_ ? stored_.find(name) : stored_.end();
    if (old == stored_.end() || old->second != bytes) {
      if (auto st = check(batch.Put(app_key(name), bytes), "batching a write"); !st) {
        return st;
      }
    }
    next.emplace(name, std::move(bytes));
  }
  auto head = encode_head(state, static_cast<uint32_t>(state.applications.size()));
  if (auto st = check(batch.Put(kHeadKey, head), "batching a write"); !st) {
    return st;
  }

  rocksdb::WriteOptions write_options;
  write_options.sync = true;  // durable before we return: this is a write-ahead
  auto s = db_->Write(write_options, &batch);
  if (!s.ok()) {
    known_ = false;
    stored_.clear();
    write_failed_ = true;
    return Status(errc::io_error,
                  "checkpoint database " + path_ + ": synced write failed: " + s.ToString());
  }
  stored_ = std::move(next);
  known_ = true;
  return Status::ok();
}

// After a failed save() this still reads the open database, i.e. the state
// before the failed write (RocksDB applies a batch to memory only after its
// log write succeeded). It does not reopen: a failed sync may have left the
// new batch in the log, and reopening would replay it.
Result<std::optional<TargetState>> RocksCheckpointStore::load() {
  if (!db_) {  // an earlier reopen failed; nothing else to read from
    if (auto st = reopen_after_failure(); !st) {
      return st;
    }
  }
  auto where = [this](const std::string& key) {
    return "checkpoint database " + path_ + ", key '" + key + "': ";
  };
  // An iterator reads from an implicit snapshot: head and applications come
  // from the same committed batch.
  rocksdb::ReadOptions read_options;
  read_options.verify_checksums = true;
  read_options.fill_cache = false;  // read once at startup
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read_options));

  std::optional<CheckpointHead> head;
  TargetState state;
  std::map<std::string, std::string> stored;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    auto key = it->key().ToString();
    auto value = it->value();
    std::string_view bytes(value.data(), value.size());
    if (key == kHeadKey) {
      auto decoded = decode_head(bytes);
      if (!decoded) {
        return Status(decoded.status().code(), where(key) + decoded.status().message());
      }
      head = std::move(decoded).value();
    } else if (is_app_key(it->key())) {
      auto name = key.substr(kAppPrefixSize);
      auto decoded = decode_application(bytes);
      if (!decoded) {
        return Status(decoded.status().code(), where(key) + decoded.status().message());
      }
      if (decoded->name != name) {
        return Status(errc::corrupt, where(key) + "holds application '" + decoded->name + "'");
      }
      state.applications.emplace(name, std::move(decoded).value());
      stored.emplace(name, value.ToString());
    } else {
      return Status(errc::corrupt, where(key) + "unexpected key in a checkpoint database");
    }
  }
  if (!it->status().ok()) {
    return Status(code_of(it->status()),
                  "checkpoint database " + path_ + ": reading failed: " + it->status().ToString());
  }

  if (!head) {
    if (state.applications.empty()) {
      remember(std::move(stored));
      return std::optional<TargetState>();  // nothing was ever saved
    }
    return Status(errc::corrupt, "checkpoint database " + path_ + ": " +
                                     std::to_string(state.applications.size()) +
                                     " application keys but no key '" + kHeadKey + "'");
  }
  if (head->application_count != state.applications.size()) {
    return Status(errc::corrupt, where(kHeadKey) + "records " +
                                     std::to_string(head->application_count) +
                                     " applications, but " +
                                     std::to_string(state.applications.size()) + " are stored");
  }
  head->state.applications = std::move(state.applications);
  if (auto st = resolve_current(head->state, head->last_running_current); !st)
    return Status(st.code(), where(kHeadKey) + st.message());
  remember(std::move(stored));
  return std::optional<TargetState>(std::move(head->state));
}

}  // namespace troupe::controller
