#include "controller/store/rocks_checkpoint_store.hpp"

#include <doctest/doctest.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <string>

#include "controller/store/codec.hpp"
#include "tests/store/store_test_support.hpp"
#include "tests/support/temp_dir.hpp"
#include "tools/common/tmpfs.hpp"

using namespace troupe;
using namespace troupe::controller;
using troupe::controller::testing::full_state;
using troupe::testing::TempDir;

namespace {

bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

std::unique_ptr<RocksCheckpointStore> open_ok(const std::string& path,
                                              const RocksCheckpointStoreOptions& options = {}) {
  auto store = RocksCheckpointStore::open(path, options);
  REQUIRE_MESSAGE(store.has_value(), store.status().to_string());
  return std::move(store).value();
}

TargetState load_ok(RocksCheckpointStore& store) {
  auto loaded = store.load();
  REQUIRE_MESSAGE(loaded.has_value(), loaded.status().to_string());
  REQUIRE(loaded->has_value());
  return **loaded;
}

// The database as RocksDB itself sees it, to plant bad data behind the
// store's back. The store must not have it open at the same time.
void raw_put(const std::string& path, const std::string& key, const std::string& value) {
  rocksdb::DB* raw = nullptr;
  REQUIRE(rocksdb::DB::Open(rocksdb::Options(), path, &raw).ok());
  std::unique_ptr<rocksdb::DB> db(raw);
  rocksdb::WriteOptions sync;
  sync.sync = true;
  REQUIRE(db->Put(sync, key, value).ok());
  REQUIRE(db->Close().ok());
}

void raw_delete(const std::string& path, const std::string& key) {
  rocksdb::DB* raw = nullptr;
  REQUIRE(rocksdb::DB::Open(rocksdb::Options(), path, &raw).ok());
  std::unique_ptr<rocksdb::DB> db(raw);
  rocksdb::WriteOptions sync;
  sync.sync = true;
  REQUIRE(db->Delete(sync, key).ok());
  REQUIRE(db->Close().ok());
}

// A file system whose write-ahead log files (*.log) fail appends or syncs on
// demand: the failure a full or broken disk gives a synced write.
class FlakyFileSystem : public rocksdb::FileSystemWrapper {
 public:
  explicit FlakyFileSystem(const std::shared_ptr<rocksdb::FileSystem>& base)
      : FileSystemWrapper(base) {}
  static const char* kClassName() { return "FlakyFileSystem"; }
  const char* Name() const override { return kClassName(); }

  std::atomic<bool> fail_appends{false};
  std::atomic<bool> fail_syncs{false};

  rocksdb::IOStatus NewWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* result,
                                    rocksdb::IODebugContext* dbg) override {
    auto s = target()->NewWritableFile(name, options, result, dbg);
    if (s.ok() && name.size() > 4 && name.compare(name.size() - 4, 4, ".log") == 0) {
      *result = std::make_unique<File>(std::move(*result), *this);
    }
    return s;
  }

 private:
  class File : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(std::unique_ptr<rocksdb::FSWritableFile>&& file, FlakyFileSystem& fs)
        : FSWritableFileOwnerWrapper(std::move(file)), fs_(fs) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                             rocksdb::IODebugContext* dbg) override {
      if (fs_.fail_appends) {
        return rocksdb::IOStatus::IOError("injected append failure");
      }
      return FSWritableFileOwnerWrapper::Append(data, options, dbg);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                             const rocksdb::DataVerificationInfo& info,
                             rocksdb::IODebugContext* dbg) override {
      if (fs_.fail_appends) {
        return rocksdb::IOStatus::IOError("injected append failure");
      }
      return FSWritableFileOwnerWrapper::Append(data, options, info, dbg);
    }
    rocksdb::IOStatus Sync(const rocksdb::IOOptions& options,
                           rocksdb::IODebugContext* dbg) override {
      if (fs_.fail_syncs) {
        return rocksdb::IOStatus::IOError("injected sync failure");
      }
      return FSWritableFileOwnerWrapper::Sync(options, dbg);
    }
    rocksdb::IOStatus Fsync(const rocksdb::IOOptions& options,
                            rocksdb::IODebugContext* dbg) override {
      if (fs_.fail_syncs) {
        return rocksdb::IOStatus::IOError("injected sync failure");
      }
      return FSWritableFileOwnerWrapper::Fsync(options, dbg);
    }

   private:
    FlakyFileSystem& fs_;
  };
};

}  // namespace

TEST_CASE("an empty store loads nothing") {
  TempDir dir;
  auto store = open_ok(dir / "checkpoint");
  auto loaded = store->load();
  REQUIRE(loaded.has_value());
  CHECK_FALSE(loaded->has_value());
  CHECK(store->path() == dir / "checkpoint");
}

TEST_CASE("a saved state survives a restart") {
  TempDir dir;
  const auto path = dir / "checkpoint";
  const auto state = full_state();
  {
    auto store = open_ok(path);
    REQUIRE(store->save(state).is_ok());
    CHECK(load_ok(*store) == state);
  }
  auto fresh = open_ok(path);  // a new controller process, as far as RocksDB knows
  CHECK(load_ok(*fresh) == state);
  // Last good declarations too: shop's, its own, is read back from its
  // application's key; search's, an older one, from the head.
  CHECK(load_ok(*fresh).last_running == state.last_running);
}

TEST_CASE("save overwrites: changed - added and deleted applications") {
  TempDir dir;
  const auto path = dir / "checkpoint";
  auto state = full_state();
  auto store = open_ok(path);
  REQUIRE(store->save(state).is_ok());

  auto next = state;
  next.applications.erase("search");
  next.applications.erase("empty");
  next.applications.at("shop").deployments[0].config.num_replicas = 11;
  ApplicationSpec added;
  added.name = "added";
  added.route_prefix = "/added";
  next.applications.emplace(added.name, added);
  next.target_capacity.reset();
  next.http.keep_alive_timeout_s.reset();  // the head changes with it
  next.generation += 1;
  REQUIRE(store->save(next).is_ok());
  CHECK(load_ok(*store) == next);
  store.reset();

  auto reopened = open_ok(path);
  CHECK(load_ok(*reopened) == next);

  SUBCASE("a store that never loaded still removes applications it did not save") {
    TargetState only;
    only.generation = 99;
    only.applications.emplace("search", state.applications.at("search"));
    reopened.reset();
    auto blind = open_ok(path);  // no load(): what is stored is unknown to it
    REQUIRE(blind->save(only).is_ok());
    blind.reset();
    CHECK(load_ok(*open_ok(path)) == only);
  }
  SUBCASE("saving an empty target state keeps it distinct from never saved") {
    TargetState none;
    REQUIRE(reopened->save(none).is_ok());
    reopened.reset();
    auto loaded = open_ok(path)->load();
    REQUIRE(loaded.has_value());
    REQUIRE(loaded->has_value());
    CHECK(**loaded == none);
  }
}

TEST_CASE("an undecodable stored value is corrupt - naming the database and key") {
  TempDir dir;
  const auto path = dir / "checkpoint";
  {
    auto store = open_ok(path);
    REQUIRE(store->save(full_state()).is_ok());
  }
  std::string key;
  std::string fragment;
  SUBCASE("application value") {
    key = "app/shop";
    raw_put(path, key, "\x01\x02garbage");
    fragment = "does not start with the checkpoint magic";
  }
  SUBCASE("truncated application value") {
    key = "app/search";
    raw_put(path, key, encode_application(full_state().applications.at("search")).substr(0, 40));
    fragment = "cannot be decoded";
  }
  SUBCASE("head value") {
    key = "head";
    raw_put(path, key, "");
    fragment = "shorter than the 8-byte header";
  }
  SUBCASE("an application stored under another application's key") {
    key = "app/empty";
    raw_put(path, key, encode_application(full_state().applications.at("shop")));
    fragment = "holds application 'shop'";
  }
  SUBCASE("a stray key") {
    key = "zzz";
    raw_put(path, key, "x");
    fragment = "unexpected key";
  }
  SUBCASE("an application key missing") {
    raw_delete(path, "app/search");
    key = "head";
    fragment = "records 3 applications, but 2 are stored";
  }
  SUBCASE("the head missing") {
    raw_delete(path, "head");
    fragment = "3 application keys but no key 'head'";
  }
  SUBCASE("a record from a newer binary") {
    key = "app/shop";
    auto bytes = encode_application(full_state().applications.at("shop"));
    bytes[4] = static_cast<char>(kFormatVersion + 1);
    raw_put(path, key, bytes);
    fragment = "newer than the " + std::to_string(kFormatVersion) + " this binary reads";
  }
  auto store = open_ok(path);
  auto loaded = store->load();
  REQUIRE_FALSE(loaded.has_value());
  const auto& status = loaded.status();
  CHECK(status.code() == (contains(fragment, "newer") ? errc::version_mismatch : errc::corrupt));
  CHECK(contains(status.message(), "checkpoint database " + path));
  if (!key.empty()) {
    CHECK(contains(status.message(), "key '" + key + "'"));
  }
  CHECK_MESSAGE(contains(status.message(), fragment), status.message());
}

TEST_CASE("open of an unusable directory is io_error naming it") {
  TempDir dir;
  SUBCASE("a path under a regular file") {
    const auto file = dir / "plain-file";
    std::ofstream(file) << "not a directory";
    const auto path = file + "/checkpoint";
    auto store = RocksCheckpointStore::open(path);
    REQUIRE_FALSE(store.has_value());
    CHECK(store.status().code() == errc::io_error);
    CHECK(contains(store.status().message(), "cannot open checkpoint database " + path + ": "));
    CHECK(contains(store.status().message(), "IO error"));  // RocksDB's own message
  }
  SUBCASE("a missing parent directory") {
    const auto path = dir / "missing/checkpoint";
    auto store = RocksCheckpointStore::open(path);
    REQUIRE_FALSE(store.has_value());
    CHECK(store.status().code() == errc::io_error);
    CHECK(contains(store.status().message(), path));
  }
  SUBCASE("the database already open (a second controller on the same state dir)") {
    const auto path = dir / "checkpoint";
    auto first = open_ok(path);
    auto second = RocksCheckpointStore::open(path);
    REQUIRE_FALSE(second.has_value());
    CHECK(second.status().code() == errc::io_error);
    CHECK(contains(second.status().message(), path));
    CHECK(contains(second.status().message(), "lock"));
  }
}

TEST_CASE("a database whose files are corrupt is refused as corrupt") {
  TempDir dir;
  const auto path = dir / "checkpoint";
  {
    auto store = open_ok(path);
    REQUIRE(store->save(full_state()).is_ok());
  }
  std::ofstream(path + "/CURRENT", std::ios::trunc) << "MANIFEST-garbage\n";
  auto store = RocksCheckpointStore::open(path);
  REQUIRE_FALSE(store.has_value());
  CHECK(store.status().code() == errc::corrupt);
  CHECK(contains(store.status().message(), "cannot open checkpoint database " + path));
}

TEST_CASE("a failed write changes nothing") {
  TempDir dir;
  const auto path = dir / "checkpoint";
  auto fs = std::make_shared<FlakyFileSystem>(rocksdb::FileSystem::Default());
  auto env = rocksdb::NewCompositeEnv(fs);
  RocksCheckpointStoreOptions options;
  options.env = env.get();

  const auto before = full_state();
  auto after = before;
  after.applications.erase("search");
  after.applications.at("shop").ingress = "cart";
  after.generation += 1;

  auto store = open_ok(path, options);
  REQUIRE(store->save(before).is_ok());

  SUBCASE("the log append fails: not in memory, not on disk") {
    fs->fail_appends = true;
    auto saved = store->save(after);
    REQUIRE_FALSE(saved.is_ok());
    CHECK(saved.code() == errc::io_error);
    CHECK(contains(saved.message(), "checkpoint database " + path + ": synced write failed"));
    CHECK(contains(saved.message(), "injected append failure"));
    CHECK(load_ok(*store) == before);

    fs->fail_appends = false;
    store.reset();
    CHECK(load_ok(*open_ok(path, options)) == before);
  }
  SUBCASE("the sync fails: the store still reads the previous state") {
    fs->fail_syncs = true;
    auto saved = store->save(after);
    REQUIRE_FALSE(saved.is_ok());
    CHECK(saved.code() == errc::io_error);
    CHECK(contains(saved.message(), "injected sync failure"));
    CHECK(load_ok(*store) == before);
  }
  SUBCASE("once the disk works again, the next save succeeds and is exactly its state") {
    // The failed batch adds "ghost". A failed sync may still have put it in
    // the log, where reopening would replay it: the next save must delete it
    // even though the state the store read back never showed it.
    auto ghostly = after;
    ApplicationSpec ghost;
    ghost.name = "ghost";
    ghostly.applications.emplace(ghost.name, ghost);
    fs->fail_syncs = true;
    REQUIRE_FALSE(store->save(ghostly).is_ok());
    CHECK(load_ok(*store) == before);
    fs->fail_syncs = false;

    auto third = before;
    third.generation += 2;
    auto saved = store->save(third);
    REQUIRE_MESSAGE(saved.is_ok(), saved.to_string());
    CHECK(load_ok(*store) == third);
    store.reset();
    CHECK(load_ok(*open_ok(path, options)) == third);
  }
}

TEST_CASE("a full disk: the save fails naming the cause - saves work again once space returns") {
  TempDir dir;
  troupe::proc::Tmpfs disk(dir / "disk", "8m");
  REQUIRE_MESSAGE(disk.mounted, "mount tmpfs on " << disk.path << ": " << disk.error);
  const auto path = disk.path + "/checkpoint";
  auto store = open_ok(path);
  auto state = full_state();
  REQUIRE(store->save(state).is_ok());
  auto [filled, full] = troupe::proc::fill_disk(disk.path + "/filler");
  REQUIRE(full);
  // Saves go on until what RocksDB holds of its log is used up; then one
  // fails, naming the database and the cause, and changes nothing.
  Status failed;
  TargetState last_saved = state;
  for (int i = 0; i < 5000 && failed.is_ok(); ++i) {
    auto next = last_saved;
    next.generation += 1;
    failed = store->save(next);
    if (failed.is_ok())
      last_saved = next;
  }
  REQUIRE_FALSE(failed.is_ok());
  CHECK(failed.code() == errc::io_error);
  CHECK(contains(failed.message(), "checkpoint database " + path));
  CHECK(contains(failed.message(), "No space left on device"));
  CHECK(load_ok(*store) == last_saved);
  auto again = last_saved;
  again.generation += 100;

  std::filesystem::remove(disk.path + "/filler");
  auto saved = store->save(again);
  REQUIRE_MESSAGE(saved.is_ok(), saved.to_string());
  CHECK(load_ok(*store) == again);
  store.reset();
  CHECK(load_ok(*open_ok(path)) == again);
}
