// Libraries addressed by their content (runtime/libraries.hpp): the hash, the
// pinned names, the ELF check and the directory the controller stores them
// in and the nodes cache them in.
#include "runtime/libraries.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <ctime>
#include <string>
#include <vector>

#include "tools/common/process.hpp"

namespace troupe::libraries {
namespace {

namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

const std::string kExamples = std::string(TROUPE_TEST_PLUGIN_DIR) + "/libtroupe_examples.so";

TEST_CASE("sha256 of known inputs") {
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  auto of_file = sha256_file(kExamples);
  REQUIRE(of_file);
  CHECK(*of_file == sha256_hex(read_file(kExamples)));
  CHECK_FALSE(sha256_file("/nonexistent/lib.so"));
}

TEST_CASE("pinned names and local paths") {
  const std::string h(64, 'a');
  auto p = split_pinned("libm.so@" + h);
  REQUIRE(p);
  CHECK(p->name == "libm.so");
  CHECK(p->sha256 == h);
  CHECK(pinned("libm.so", h) == "libm.so@" + h);
  CHECK_FALSE(split_pinned("libm.so"));
  CHECK_FALSE(split_pinned("libm.so@" + std::string(63, 'a')));
  CHECK_FALSE(split_pinned("libm.so@" + std::string(64, 'A')));  // lowercase only
  CHECK_FALSE(split_pinned("@" + h));
  CHECK(is_sha256(h));
  CHECK_FALSE(is_sha256("xyz"));

  CHECK(is_local_path("./build/libm.so"));
  CHECK(is_local_path("../libm.so"));
  CHECK(is_local_path("/opt/libm.so"));
  CHECK_FALSE(is_local_path("libm.so"));
  CHECK_FALSE(is_local_path("models/libm.so"));  // a name inside the plugin path
}

TEST_CASE("the ELF check names what is wrong") {
  const std::string good = read_file(kExamples);
  CHECK(check_elf_shared_object(good));
  CHECK(contains(check_elf_shared_object("#!/bin/sh\n").message(), "is not an ELF file"));
  CHECK(contains(check_elf_shared_object("").message(), "is not an ELF file"));
  std::string other_class = good;
  other_class[4] = 1;  // ELFCLASS32
  CHECK(contains(check_elf_shared_object(other_class).message(), "32-bit ELF file"));
  std::string other_machine = good;
  other_machine[18] = static_cast<char>(other_machine[18] == 0x3e ? 0xb7 : 0x3e);
  CHECK(contains(check_elf_shared_object(other_machine).message(), "another architecture"));
  std::string object = good;
  object[16] = 1;  // ET_REL
  object[17] = 0;
  CHECK(contains(check_elf_shared_object(object).message(), "object file, not a shared library"));
  CHECK(contains(check_elf_shared_object(good.substr(0, 20)).message(), "truncated"));
}

TEST_CASE("a library dir stores by hash and refuses content of another hash") {
  proc::TempDir tmp;
  LibraryDir dir(tmp / "libs");
  REQUIRE(dir.open());
  const std::string bytes = "some library bytes";
  const std::string sha = sha256_hex(bytes);
  CHECK_FALSE(dir.size_of(sha));
  CHECK(dir.put(sha, bytes));
  REQUIRE(dir.size_of(sha));
  CHECK(*dir.size_of(sha) == bytes.size());
  auto ok = dir.verify(sha);
  REQUIRE(ok);
  CHECK(*ok);
  auto part = dir.read(sha, 5, 7);
  REQUIRE(part);
  CHECK(*part == "library");
  CHECK(dir.read(sha256_hex("other"), 0, 10).status().code() == errc::not_found);

  auto wrong = dir.put(sha256_hex("other"), bytes);
  CHECK(wrong.code() == errc::invalid_argument);
  CHECK(contains(wrong.message(), "refused"));
  CHECK_FALSE(dir.size_of(sha256_hex("other")));

  SUBCASE("a stored file someone changed is reported and removed") {
    std::ofstream(dir.path_of(sha), std::ios::trunc) << "changed bytes!!!!!";
    auto checked = dir.verify(sha);
    REQUIRE_FALSE(checked);
    CHECK(checked.status().code() == errc::corrupt);
    CHECK(contains(checked.status().message(), "damaged or changed"));
    CHECK_FALSE(dir.size_of(sha));
  }
  SUBCASE("list and remove") {
    auto entries = dir.list();
    REQUIRE(entries.size() == 1);
    CHECK(entries[0].sha256 == sha);
    CHECK_FALSE(entries[0].partial);
    dir.remove(sha);
    CHECK(dir.list().empty());
  }
}

TEST_CASE("an upload in pieces is kept only whole and with the right hash") {
  proc::TempDir tmp;
  LibraryDir dir(tmp / "libs");
  const std::string bytes = "0123456789abcdef";
  const std::string sha = sha256_hex(bytes);
  auto a = dir.append(sha, bytes.size(), 0, bytes.substr(0, 6));
  REQUIRE(a);
  CHECK(*a == 6);
  CHECK_FALSE(dir.size_of(sha));  // not yet
  auto list = dir.list();
  REQUIRE(list.size() == 1);
  CHECK(list[0].partial);
  // Out of order: refused, naming where it stands.
  auto gap = dir.append(sha, bytes.size(), 10, bytes.substr(10));
  REQUIRE_FALSE(gap);
  CHECK(gap.status().code() == errc::conflict);
  auto b = dir.append(sha, bytes.size(), 6, bytes.substr(6));
  REQUIRE(b);
  CHECK(*b == bytes.size());
  REQUIRE(dir.size_of(sha));
  CHECK(*dir.read(sha, 0, 100) == bytes);
  // Again once whole: nothing to do.
  CHECK(*dir.append(sha, bytes.size(), 0, bytes.substr(0, 6)) == bytes.size());

  const std::string other = sha256_hex("something else");
  auto bad = dir.append(other, bytes.size(), 0, bytes);
  REQUIRE_FALSE(bad);
  CHECK(contains(bad.status().message(), "refused"));
  CHECK_FALSE(dir.size_of(other));
  auto huge = dir.append(other, kMaxLibraryBytes + 1, 0, "x");
  REQUIRE_FALSE(huge);
  CHECK(contains(huge.status().message(), "the limit is"));
}

// The hash runs along with the pieces (the last piece does not read the
// whole library again); a LibraryDir that did not see the first pieces (a
// restarted controller, a new agent) hashes what is on disk once and goes on.
TEST_CASE("an upload in pieces continues in a new library dir and starts over at offset 0") {
  proc::TempDir tmp;
  std::string bytes;
  for (int i = 0; i < 3000; ++i)
    bytes += std::to_string(i * 7919);
  const std::string sha = sha256_hex(bytes);
  const size_t third = bytes.size() / 3;
  {
    LibraryDir first(tmp / "libs", false);
    REQUIRE(first.append(sha, bytes.size(), 0, bytes.substr(0, third)));
  }
  LibraryDir second(tmp / "libs", false);
  auto b = second.append(sha, bytes.size(), third, bytes.substr(third, third));
  REQUIRE(b);
  CHECK(*b == 2 * third);
  auto c = second.append(sha, bytes.size(), 2 * third, bytes.substr(2 * third));
  REQUIRE(c);
  CHECK(*c == bytes.size());
  CHECK(*second.read(sha, 0, bytes.size()) == bytes);
  second.remove(sha);
  CHECK_FALSE(second.size_of(sha));

  // Pieces of other content, then the upload starts over at offset 0 with
  // the right ones: the hash of the first attempt does not carry over.
  REQUIRE(second.append(sha, bytes.size(), 0, std::string(third, 'x')));
  REQUIRE(second.append(sha, bytes.size(), 0, bytes.substr(0, third)));
  REQUIRE(second.append(sha, bytes.size(), third, bytes.substr(third)));
  CHECK(*second.read(sha, 0, bytes.size()) == bytes);
  second.remove(sha);

  // A wrong piece in the middle: the whole is refused and nothing is kept.
  REQUIRE(second.append(sha, bytes.size(), 0, bytes.substr(0, third)));
  std::string wrong = bytes.substr(third, third);
  wrong[0] = wrong[0] == 'z' ? 'y' : 'z';
  REQUIRE(second.append(sha, bytes.size(), third, wrong));
  auto refused = second.append(sha, bytes.size(), 2 * third, bytes.substr(2 * third));
  REQUIRE_FALSE(refused);
  CHECK(contains(refused.status().message(), "refused"));
  CHECK_FALSE(second.size_of(sha));
  CHECK(second.list().empty());
}

TEST_CASE("a node's cache drops what no replica uses once it is old enough") {
  const std::string a(64, 'a'), b(64, 'b'), c(64, 'c'), d(64, 'd');
  std::vector<LibraryDir::Entry> entries = {
      {a, false, 1000},  // used: kept however old
      {b, false, 1000},  // unused and old: dropped
      {c, false, 4590},  // unused, written 10 s ago: kept
      {d, true, 500},    // pieces of a fetch that stopped long ago: dropped
      {b, true, 900},    // and pieces of b too: b once
  };
  auto stale = stale_libraries(entries, {a}, 4600, 3600);
  CHECK(stale == std::vector<std::string>{b, d});
  // Exactly the retention: dropped; a moment before: kept.
  CHECK(stale_libraries({{c, false, 1000}}, {}, 4600, 3600) == std::vector<std::string>{c});
  CHECK(stale_libraries({{c, false, 1000.5}}, {}, 4600, 3600).empty());
  CHECK(stale_libraries({}, {a}, 4600, 3600).empty());

  // What LibraryDir::list() gives it: a library and the pieces of another.
  proc::TempDir tmp;
  LibraryDir dir(tmp / "cache", false);
  const std::string bytes = "library bytes";
  const std::string whole = sha256_hex(bytes);
  const std::string partial = sha256_hex("another library");
  REQUIRE(dir.put(whole, bytes));
  REQUIRE(dir.append(partial, 100, 0, "another"));
  const double now = static_cast<double>(std::time(nullptr));
  CHECK(stale_libraries(dir.list(), {}, now, 3600).empty());
  auto later = stale_libraries(dir.list(), {whole}, now + 3600 + 60, 3600);
  CHECK(later == std::vector<std::string>{partial});
}

TEST_CASE("locate finds a name in the plugin dirs and refuses escapes") {
  auto found = locate({"/nonexistent", TROUPE_TEST_PLUGIN_DIR}, "libtroupe_examples.so");
  REQUIRE(found);
  CHECK(fs::path(*found).filename() == "libtroupe_examples.so");
  CHECK(locate({TROUPE_TEST_PLUGIN_DIR}, "libnone.so").status().code() == errc::not_found);
  CHECK(contains(locate({TROUPE_TEST_PLUGIN_DIR}, "../x.so").status().message(), "'..'"));
  CHECK(contains(locate({TROUPE_TEST_PLUGIN_DIR}, "/x.so").status().message(), "absolute"));
}

}  // namespace
}  // namespace troupe::libraries
