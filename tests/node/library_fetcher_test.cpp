// The node's library cache (node/library_fetcher.hpp) over a temporary dir, a
// fake controller that answers at once or when told, and a fake clock: the
// cached copy (verified, its stamp reused, refused when corrupt), the plugin
// path's copy, the fetch in pieces and its failures, and the pruning.
#include "node/library_fetcher.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tests/support/temp_dir.hpp"

namespace troupe::node {
namespace {

namespace fs = std::filesystem;
using Ensured = LibraryFetcher::Ensured;
using Level = LibraryFetcher::Note::Level;
using Event = LibraryFetcher::Note::Event;
using troupe::testing::TempDir;

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_all(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

struct timespec mtime_of(const fs::path& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mtim;
}

void set_mtime(const fs::path& path, struct timespec when) {
  struct timespec times[2] = {when, when};
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0);
}

void set_mtime_s(const fs::path& path, double seconds) {
  set_mtime(path, {static_cast<time_t>(seconds), 0});
}

libraries::Pinned pin_of(const std::string& name, const std::string& bytes) {
  return {name, libraries::sha256_hex(bytes)};
}

// Bytes of a library (the cache does not look inside).
std::string content(char fill, size_t n = 35) {
  std::string s(n, fill);
  s[0] = 'L';
  return s;
}

// The controller: the libraries it holds, in pieces of `chunk` bytes. It
// answers at once, or (`queued`) when the test runs what is pending. What the
// fetcher's replies return (the notes) is kept, as the agent would log it.
struct FakeSource : LibraryFetcher::Source {
  std::map<std::string, std::string> held;  // sha256 -> bytes
  std::map<std::string, uint64_t> claimed;  // a size to answer instead
  Status fail_size;                         // not ok: the size request fails
  Status fail_piece;                        // not ok: the piece requests fail
  size_t chunk = 10;
  bool queued = false;
  int size_calls = 0;
  int piece_calls = 0;
  std::deque<std::function<void()>> pending;
  LibraryFetcher::Notes notes;

  void answer(std::function<LibraryFetcher::Notes()> reply) {
    auto run = [this, reply] {
      auto got = reply();
      notes.insert(notes.end(), got.begin(), got.end());
    };
    if (queued)
      pending.push_back(run);
    else
      run();
  }
  void size(const std::string& sha256, SizeReply reply) override {
    ++size_calls;
    Result<uint64_t> size = uint64_t{0};
    if (!fail_size)
      size = fail_size;
    else if (auto c = claimed.find(sha256); c != claimed.end())
      size = c->second;
    else if (auto h = held.find(sha256); h != held.end())
      size = uint64_t{h->second.size()};
    answer([reply, size] { return reply(size); });
  }
  void piece(const std::string& sha256, uint64_t offset, PieceReply reply) override {
    ++piece_calls;
    Result<std::string> piece = std::string();
    if (!fail_piece) {
      piece = fail_piece;
    } else if (auto h = held.find(sha256); h != held.end() && offset < h->second.size()) {
      piece = h->second.substr(offset, chunk);
    }
    answer([reply, piece] { return reply(piece); });
  }
  // Runs one pending answer; false when none is left.
  bool step() {
    if (pending.empty())
      return false;
    auto next = std::move(pending.front());
    pending.pop_front();
    next();
    return true;
  }
  void drain() {
    while (step()) {
    }
  }
  bool noted(Level level, const std::string& text) const {
    return std::any_of(notes.begin(), notes.end(),
                       [&](const auto& n) { return n.level == level && n.text == text; });
  }
  // The notes that report `event` (the agent counts them).
  size_t counted(Event event) const {
    return static_cast<size_t>(std::count_if(notes.begin(), notes.end(),
                                             [&](const auto& n) { return n.event == event; }));
  }
};

// What a waiter was called with, and how often.
struct Outcomes {
  std::vector<Status> got;
  LibraryFetcher::Done waiter() {
    return [this](const Status& s) { got.push_back(s); };
  }
};

struct Fixture {
  TempDir cache;
  TempDir plugins;
  std::chrono::steady_clock::time_point steady{};
  double wall = 0;
  std::unique_ptr<LibraryFetcher> fetcher;

  Fixture() {
    LibraryFetcher::Options o;
    o.cache_dir = cache.path();
    o.plugin_path = {plugins.path()};
    o.retention_s = 100;
    o.prune_interval_s = 60;
    o.steady_now = [this] { return steady; };
    o.wall_now_s = [this] { return wall; };
    fetcher = std::make_unique<LibraryFetcher>(std::move(o));
  }
  libraries::LibraryDir dir() const { return libraries::LibraryDir(cache.path(), false); }
  fs::path cached(const libraries::Pinned& pin) const { return dir().path_of(pin.sha256); }
  void put(const libraries::Pinned& pin, const std::string& bytes) const {
    REQUIRE(dir().put(pin.sha256, bytes));
  }
  std::string what(const libraries::Pinned& pin) const {
    return "library " + libraries::pinned(pin.name, pin.sha256);
  }
};

TEST_CASE("library fetcher: the pin of an import path") {
  const std::string h(64, 'a');
  auto pin = pinned_library("libm.so@" + h + ":Model");
  REQUIRE(pin);
  CHECK(pin->name == "libm.so");
  CHECK(pin->sha256 == h);
  CHECK_FALSE(pinned_library("libm.so:Model"));
  CHECK_FALSE(pinned_library("libm.so@" + std::string(63, 'a') + ":Model"));
}

TEST_CASE("library fetcher: a cached copy is verified and used without the controller") {
  Fixture f;
  const auto bytes = content('a');
  const auto pin = pin_of("libm.so", bytes);
  f.put(pin, bytes);
  auto source = std::make_shared<FakeSource>();
  Outcomes out;
  auto report = f.fetcher->ensure(pin, source, out.waiter());
  CHECK(report.how == Ensured::verified);
  CHECK(report.notes.empty());
  REQUIRE(out.got.size() == 1);
  CHECK(out.got[0].is_ok());
  CHECK(source->size_calls == 0);
  CHECK(source->piece_calls == 0);
  CHECK_FALSE(f.fetcher->fetching(pin.sha256));
}

TEST_CASE("library fetcher: an unchanged stamp is not hashed again - a changed one is") {
  Fixture f;
  const auto bytes = content('a');
  const auto pin = pin_of("libm.so", bytes);
  f.put(pin, bytes);
  auto source = std::make_shared<FakeSource>();
  source->held[pin.sha256] = bytes;
  Outcomes out;
  CHECK(f.fetcher->ensure(pin, source, out.waiter()).how == Ensured::verified);
  // Other bytes of the same size under the same modification time: the
  // stamp is what it was, so the copy is taken as verified (a re-hash would
  // have refused it).
  const auto path = f.cached(pin);
  const auto stamp = mtime_of(path);
  write_all(path, content('b'));
  set_mtime(path, stamp);
  auto again = f.fetcher->ensure(pin, source, out.waiter());
  CHECK(again.how == Ensured::reused);
  REQUIRE(out.got.size() == 2);
  CHECK(out.got[1].is_ok());
  CHECK(read_all(path) == content('b'));
  CHECK(source->size_calls == 0);
  // Once the stamp changes, the content is checked, refused and fetched again.
  set_mtime(path, {stamp.tv_sec + 1, stamp.tv_nsec});
  auto third = f.fetcher->ensure(pin, source, out.waiter());
  CHECK(third.how == Ensured::fetching);
  REQUIRE(out.got.size() == 3);
  CHECK(out.got[2].is_ok());
  CHECK(read_all(path) == bytes);
  CHECK(source->size_calls == 1);
}

TEST_CASE("library fetcher: a corrupt cached copy is refused and fetched again") {
  Fixture f;
  const auto bytes = content('a');
  const auto pin = pin_of("libm.so", bytes);
  f.put(pin, bytes);
  write_all(f.cached(pin), content('z'));
  auto source = std::make_shared<FakeSource>();
  source->held[pin.sha256] = bytes;
  Outcomes out;
  auto report = f.fetcher->ensure(pin, source, out.waiter());
  CHECK(report.how == Ensured::fetching);
  REQUIRE(report.notes.size() == 1);
  CHECK(report.notes[0].level == Level::error);
  CHECK(report.notes[0].event == Event::cached_copy_refused);
  CHECK(report.notes[0].text == "refused the cached " + f.what(pin) + ": library " +
                                    f.cached(pin).string() + " has content of SHA-256 " +
                                    libraries::sha256_hex(content('z')) + ", not " + pin.sha256 +
                                    " (damaged or changed); removed it; fetching it again");
  REQUIRE(out.got.size() == 1);
  CHECK(out.got[0].is_ok());
  CHECK(read_all(f.cached(pin)) == bytes);
  CHECK(source->noted(Level::info, "fetched " + f.what(pin) + " (35 bytes) from the controller"));
  CHECK(source->counted(Event::fetched) == 1);
  // Verified on the next use (the fetch itself records no stamp), then reused.
  CHECK(f.fetcher->ensure(pin, source, out.waiter()).how == Ensured::verified);
  CHECK(f.fetcher->ensure(pin, source, out.waiter()).how == Ensured::reused);
  CHECK(source->size_calls == 1);
}

TEST_CASE("library fetcher: the plugin path's copy of the same build is put in the cache") {
  Fixture f;
  const auto bytes = content('p');
  const auto pin = pin_of("libm.so", bytes);
  write_all(f.plugins / "libm.so", bytes);
  auto source = std::make_shared<FakeSource>();
  Outcomes out;
  auto report = f.fetcher->ensure(pin, source, out.waiter());
  CHECK(report.how == Ensured::copied);
  REQUIRE(out.got.size() == 1);
  CHECK(out.got[0].is_ok());
  CHECK(read_all(f.cached(pin)) == bytes);
  CHECK(source->size_calls == 0);
  // Another build under that name is not it: the controller is asked.
  const auto other = pin_of("libm.so", content('q'));
  source->held[other.sha256] = content('q');
  CHECK(f.fetcher->ensure(other, source, out.waiter()).how == Ensured::fetching);
  REQUIRE(out.got.size() == 2);
  CHECK(out.got[1].is_ok());
  CHECK(read_all(f.cached(other)) == content('q'));
}

TEST_CASE("library fetcher: without the controller a library the node lacks is an error") {
  Fixture f;
  const auto pin = pin_of("libm.so", content('a'));
  Outcomes out;
  auto report = f.fetcher->ensure(pin, nullptr, out.waiter());
  CHECK(report.how == Ensured::failed);
  REQUIRE(out.got.size() == 1);
  CHECK(out.got[0].code() == errc::unavailable);
  CHECK(out.got[0].message() == "library libm.so@" + pin.sha256 +
                                    " is not in this node's cache and the controller is not "
                                    "connected");
  CHECK_FALSE(f.fetcher->fetching(pin.sha256));
}

TEST_CASE("library fetcher: a fetch in pieces answers every waiter once") {
  Fixture f;
  const auto bytes = content('a');
  const auto pin = pin_of("libm.so", bytes);
  auto source = std::make_shared<FakeSource>();
  source->held[pin.sha256] = bytes;
  source->queued = true;
  Outcomes first, second;
  CHECK(f.fetcher->ensure(pin, source, first.waiter()).how == Ensured::fetching);
  // A second replica of the same library joins the fetch; a source it
  // brings is not used.
  auto unused = std::make_shared<FakeSource>();
  CHECK(f.fetcher->ensure(pin, unused, second.waiter()).how == Ensured::joined);
  CHECK(f.fetcher->fetching(pin.sha256));
  CHECK(unused->size_calls == 0);
  REQUIRE(source->step());  // the size
  REQUIRE(source->step());  // bytes 0-9
  CHECK(first.got.empty());
  CHECK(second.got.empty());
  source->drain();
  CHECK(source->size_calls == 1);
  CHECK(source->piece_calls == 4);  // 10 + 10 + 10 + 5 bytes
  REQUIRE(first.got.size() == 1);
  REQUIRE(second.got.size() == 1);
  CHECK(first.got[0].is_ok());
  CHECK(second.got[0].is_ok());
  CHECK_FALSE(f.fetcher->fetching(pin.sha256));
  CHECK(read_all(f.cached(pin)) == bytes);
  CHECK(source->notes.size() == 1);
  CHECK(source->noted(Level::info, "fetched " + f.what(pin) + " (35 bytes) from the controller"));
  CHECK(source->counted(Event::fetched) == 1);  // once for both waiters
}

TEST_CASE("library fetcher: the controller's failures end the fetch with their reason") {
  Fixture f;
  const auto bytes = content('a');
  const auto pin = pin_of("libm.so", bytes);
  auto source = std::make_shared<FakeSource>();
  Outcomes out;
  SUBCASE("it has no such library") {
    CHECK(f.fetcher->ensure(pin, source, out.waiter()).how == Ensured::fetching);
    REQUIRE(out.got.size() == 1);
    CHECK(out.got[0].code() == errc::not_found);
    CHECK(out.got[0].message() == "the controller has no " + f.what(pin));
  }
  SUBCASE("the size request fails") {
    source->fail_size = Status(errc::timeout, "no answer in 10 s");
    CHECK(f.fetcher->ensure(pin, source, out.waiter()).how == Ensured::fetching);
    REQUIRE(out.got.size() == 1);
    CHECK(out.got[0].code() == errc::unavailable);
    CHECK(out.got[0].message() ==
          "cannot fetch " + f.what(pin) + " from the controller: no answer in 10 s");
  }
  SUBCASE("a piece request fails") {
    source->held[pin.sha256] = bytes;
    source->fail_piece = Status(errc::unavailable, "connection lost");
    CHECK(f.fetcher->ensure(pin, source, out.waiter()).how == Ensured::fetching);
    REQUIRE(out.got.size() == 1);
    CHECK(out.got[0].code() == errc::unavailable);
    CHECK(out.got[0].message() ==
          "cannot fetch " + f.what(pin) + " from the controller: connection lost");
  }
  CHECK_FALSE(f.fetcher->fetching(pin.sha256));
  CHECK_FALSE(fs::exists(f.cached(pin)));
}

TEST_CASE("library fetcher: an empty piece before the end is an io_error") {
  Fixture f;
  const auto bytes = content('a');
  const auto pin = pin_of("libm.so", bytes);
  auto source = std::make_shared<FakeSource>();
  source->held[pin.sha256] = bytes.substr(0, 20);  // it claims 35, has 20
  source->claimed[pin.sha256] = 35;
  Outcomes out;
  CHECK(f.fetcher->ensure(pin, source, out.waiter()).how == Ensured::fetching);
  REQUIRE(out.got.size() == 1);
  CHECK(out.got[0].code() == errc::io_error);
  CHECK(out.got[0].message() == f.what(pin) + ": the controller sent 20 of 35 bytes");
  CHECK(source->piece_calls == 3);
  CHECK_FALSE(fs::exists(f.cached(pin)));
}

TEST_CASE("library fetcher: content that does not hash to the pin is refused - nothing cached") {
  Fixture f;
  const auto pin = pin_of("libm.so", content('a'));
  auto source = std::make_shared<FakeSource>();
  source->held[pin.sha256] = content('x');  // same size, other bytes
  Outcomes out;
  CHECK(f.fetcher->ensure(pin, source, out.waiter()).how == Ensured::fetching);
  REQUIRE(out.got.size() == 1);
  CHECK_FALSE(out.got[0].is_ok());
  const std::string reason = "the library received has SHA-256 " +
                             libraries::sha256_hex(content('x')) + ", not " + pin.sha256 +
                             "; refused";
  CHECK(out.got[0].code() == errc::invalid_argument);
  CHECK(out.got[0].message() == f.what(pin) + ": " + reason);
  CHECK(source->noted(Level::error, f.what(pin) + ": " + reason));
  CHECK(source->counted(Event::fetched) == 0);
  CHECK(source->counted(Event::cached_copy_refused) == 0);  // it was never cached
  CHECK(f.dir().list().empty());  // neither the library nor its pieces
  // The next attempt asks again (no stamp of a refused copy is kept).
  source->held[pin.sha256] = content('a');
  CHECK(f.fetcher->ensure(pin, source, out.waiter()).how == Ensured::fetching);
  REQUIRE(out.got.size() == 2);
  CHECK(out.got[1].is_ok());
}

TEST_CASE("library fetcher: an answer after the fetcher is gone does nothing") {
  Fixture f;
  const auto bytes = content('a');
  const auto pin = pin_of("libm.so", bytes);
  auto source = std::make_shared<FakeSource>();
  source->held[pin.sha256] = bytes;
  source->queued = true;
  Outcomes out;
  CHECK(f.fetcher->ensure(pin, source, out.waiter()).how == Ensured::fetching);
  f.fetcher.reset();
  source->drain();
  CHECK(out.got.empty());
  CHECK(source->piece_calls == 0);
}

TEST_CASE(
    "library fetcher: pruning keeps to its interval - the retention - used and awaited "
    "libraries") {
  Fixture f;
  const double now = static_cast<double>(std::time(nullptr));
  f.wall = now + 10000;
  const auto a = pin_of("a.so", content('a'));  // used by a replica
  const auto b = pin_of("b.so", content('b'));  // unused and old: removed
  const auto c = pin_of("c.so", content('c'));  // unused, written recently
  const auto d = pin_of("d.so", content('d'));  // being fetched: its first piece is in
  f.put(a, content('a'));
  f.put(b, content('b'));
  f.put(c, content('c'));
  set_mtime_s(f.cached(a), f.wall - 500);
  set_mtime_s(f.cached(b), f.wall - 500);
  set_mtime_s(f.cached(c), f.wall - 50);
  auto source = std::make_shared<FakeSource>();
  source->held[d.sha256] = content('d');
  source->queued = true;
  Outcomes out;
  CHECK(f.fetcher->ensure(b, source, out.waiter()).how == Ensured::verified);
  const auto b_stamp = mtime_of(f.cached(b));
  CHECK(f.fetcher->ensure(d, source, out.waiter()).how == Ensured::fetching);
  REQUIRE(source->step());
  REQUIRE(source->step());
  REQUIRE(f.dir().list().size() == 4);  // a, b, c and d's piece (written 10000 s "ago")

  CHECK(f.fetcher->prune({a.sha256}) == std::vector<std::string>{b.sha256});
  CHECK_FALSE(fs::exists(f.cached(b)));
  // Not again before the interval, whatever is no longer used.
  f.wall += 1000;
  f.steady += std::chrono::seconds(59);
  CHECK(f.fetcher->prune({}).empty());
  CHECK(fs::exists(f.cached(a)));
  // Once it is over, the unused a and c go (d's fetch still runs).
  f.steady += std::chrono::seconds(1);
  auto removed = f.fetcher->prune({});
  std::sort(removed.begin(), removed.end());
  std::vector<std::string> expected{a.sha256, c.sha256};
  std::sort(expected.begin(), expected.end());
  CHECK(removed == expected);
  source->drain();
  REQUIRE(out.got.size() == 2);
  CHECK(out.got[1].is_ok());
  CHECK(read_all(f.cached(d)) == content('d'));

  // A removed library's stamp is forgotten: a copy that comes back with the
  // same stamp but other content is checked, not taken as verified.
  write_all(f.cached(b), content('y'));
  set_mtime(f.cached(b), b_stamp);
  source->queued = false;
  source->held[b.sha256] = content('b');
  auto report = f.fetcher->ensure(b, source, out.waiter());
  CHECK(report.how == Ensured::fetching);
  CHECK(report.notes.size() == 1);
  REQUIRE(out.got.size() == 3);
  CHECK(out.got[2].is_ok());
  CHECK(read_all(f.cached(b)) == content('b'));
}

TEST_CASE("library fetcher: no cache dir - no pruning") {
  LibraryFetcher::Options o;
  o.wall_now_s = [] { return 1e12; };
  LibraryFetcher fetcher(std::move(o));
  CHECK(fetcher.prune({}).empty());
}

}  // namespace
}  // namespace troupe::node
