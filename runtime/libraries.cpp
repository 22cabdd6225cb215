#include "runtime/libraries.hpp"

#include <elf.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <system_error>

namespace troupe::libraries {

namespace fs = std::filesystem;

// Outside the file's anonymous namespace: LibraryDir::Progress holds one.
struct DigestDeleter {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};
using Digest = std::unique_ptr<EVP_MD_CTX, DigestDeleter>;

namespace {

constexpr const char* kSuffix = ".so";
constexpr const char* kPartialPrefix = ".partial-";

Digest new_digest() {
  Digest ctx(EVP_MD_CTX_new());
  if (ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    ctx.reset();
  return ctx;
}

std::string finish_hex(EVP_MD_CTX* ctx) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, md, &len);
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(len * 2);
  for (unsigned i = 0; i < len; ++i) {
    out += digits[md[i] >> 4];
    out += digits[md[i] & 0xf];
  }
  return out;
}

std::string dirs_list(const std::vector<std::string>& dirs) {
  std::string out = "[";
  for (size_t i = 0; i < dirs.size(); ++i) {
    if (i > 0)
      out += ", ";
    out += dirs[i];
  }
  return out + "]";
}

// True when `path` is `dir` or below it; both canonical.
bool is_within(const fs::path& path, const fs::path& dir) {
  auto p = path.begin();
  for (auto d = dir.begin(); d != dir.end(); ++d, ++p) {
    if (d->empty())
      continue;  // a trailing separator yields an empty element
    if (p == path.end() || *p != *d)
      return false;
  }
  return true;
}

std::string errno_text() {
  return std::strerror(errno);
}

// Writes all of `bytes` to `fd` (the file at `path`, for the message).
Status write_all(int fd, std::string_view bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return {errc::io_error, "cannot write " + path + ": " + errno_text()};
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

// Writes `bytes` to a new temporary file beside `target`, flushes it to disk
// (when `durable`) and renames it into place.
Status write_atomically(const std::string& target, std::string_view bytes, bool durable) {
  const std::string tmp = target + ".tmp-" + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return {errc::io_error, "cannot create " + tmp + ": " + errno_text()};
  // 0644 whatever the umask: replica processes of another user load it
  // (node/replica_user.hpp).
  (void)::fchmod(fd, 0644);
  if (auto written = write_all(fd, bytes, tmp); !written) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return written;
  }
  if ((durable && ::fsync(fd) != 0) || ::close(fd) != 0) {
    Status st(errc::io_error, "cannot write " + tmp + ": " + errno_text());
    ::unlink(tmp.c_str());
    return st;
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    Status st(errc::io_error, "cannot rename " + tmp + " to " + target + ": " + errno_text());
    ::unlink(tmp.c_str());
    return st;
  }
  return Status::ok();
}

Result<std::string> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return {errc::io_error, "cannot read " + path + ": " + errno_text()};
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad())
    return {errc::io_error, "cannot read " + path + ": " + errno_text()};
  return bytes;
}

}  // namespace

std::string sha256_hex(std::string_view bytes) {
  auto ctx = new_digest();
  if (!ctx)
    return {};
  EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size());
  return finish_hex(ctx.get());
}

namespace {

// Feeds the whole content of the file at `path` into `ctx`.
Status digest_file(const std::string& path, EVP_MD_CTX* ctx) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return {errc::io_error, "cannot read " + path + ": " + errno_text()};
  std::string buffer(1 << 20, '\0');
  for (;;) {
    ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      Status st(errc::io_error, "cannot read " + path + ": " + errno_text());
      ::close(fd);
      return st;
    }
    if (n == 0)
      break;
    EVP_DigestUpdate(ctx, buffer.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  return Status::ok();
}

}  // namespace

Result<std::string> sha256_file(const std::string& path) {
  auto ctx = new_digest();
  if (!ctx)
    return {errc::internal, "cannot set up SHA-256"};
  if (auto st = digest_file(path, ctx.get()); !st)
    return st;
  return finish_hex(ctx.get());
}

bool is_sha256(std::string_view text) {
  if (text.size() != 64)
    return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
      return false;
  }
  return true;
}

std::optional<Pinned> split_pinned(const std::string& library) {
  auto at = library.rfind('@');
  if (at == std::string::npos || at == 0)
    return std::nullopt;
  std::string hex = library.substr(at + 1);
  if (!is_sha256(hex))
    return std::nullopt;
  return Pinned{library.substr(0, at), std::move(hex)};
}

std::string pinned(const std::string& name, const std::string& sha256) {
  return name + "@" + sha256;
}

bool is_local_path(const std::string& library) {
  return library.rfind("./", 0) == 0 || library.rfind("../", 0) == 0 ||
         library.rfind("/", 0) == 0;
}

Status check_elf_shared_object(std::string_view bytes) {
  if (bytes.size() < EI_NIDENT || std::memcmp(bytes.data(), ELFMAG, SELFMAG) != 0)
    return {errc::invalid_argument, "is not an ELF file"};
  const auto* ident = reinterpret_cast<const unsigned char*>(bytes.data());
#if defined(__LP64__)
  const unsigned char want_class = ELFCLASS64;
  using Header = Elf64_Ehdr;
#else
  const unsigned char want_class = ELFCLASS32;
  using Header = Elf32_Ehdr;
#endif
  if (ident[EI_CLASS] != want_class) {
    return {errc::invalid_argument, std::string("is a ") +
                                        (ident[EI_CLASS] == ELFCLASS64 ? "64" : "32") +
                                        "-bit ELF file; this machine runs " +
                                        (want_class == ELFCLASS64 ? "64" : "32") + "-bit code"};
  }
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  const unsigned char want_data = ELFDATA2LSB;
#else
  const unsigned char want_data = ELFDATA2MSB;
#endif
  if (ident[EI_DATA] != want_data)
    return {errc::invalid_argument, "is an ELF file of the other byte order"};
  if (bytes.size() < sizeof(Header))
    return {errc::invalid_argument, "is a truncated ELF file"};
  Header header;
  std::memcpy(&header, bytes.data(), sizeof header);
#if defined(__x86_64__)
  const unsigned want_machine = EM_X86_64;
  const char* machine_name = "x86-64";
#elif defined(__aarch64__)
  const unsigned want_machine = EM_AARCH64;
  const char* machine_name = "aarch64";
#elif defined(__i386__)
  const unsigned want_machine = EM_386;
  const char* machine_name = "i386";
#elif defined(__arm__)
  const unsigned want_machine = EM_ARM;
  const char* machine_name = "arm";
#else
  const unsigned want_machine = header.e_machine;
  const char* machine_name = "this";
#endif
  if (header.e_machine != want_machine) {
    return {errc::invalid_argument, "is an ELF file for another architecture (machine " +
                                        std::to_string(header.e_machine) + ", not " +
                                        machine_name + ")"};
  }
  if (header.e_type != ET_DYN) {
    return {errc::invalid_argument,
            std::string("is an ELF ") +
                (header.e_type == ET_EXEC ? "executable"
                 : header.e_type == ET_REL ? "object file"
                                           : "file of type " + std::to_string(header.e_type)) +
                ", not a shared library"};
  }
  return Status::ok();
}

Result<std::string> read_file(const std::string& path, uint64_t offset, uint64_t max) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT)
      return {errc::not_found, path + " is gone"};
    return {errc::io_error, "cannot read " + path + ": " + errno_text()};
  }
  std::string out(max, '\0');
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n =
        ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      Status st(errc::io_error, "cannot read " + path + ": " + errno_text());
      ::close(fd);
      return st;
    }
    if (n == 0)
      break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

Result<std::string> locate(const std::vector<std::string>& dirs, const std::string& library) {
  const fs::path name(library);
  if (name.is_absolute()) {
    return {errc::invalid_argument, "library '" + library +
                                        "' is an absolute path; libraries are loaded only from "
                                        "the plugin path " +
                                        dirs_list(dirs) + ", name one relative to it"};
  }
  for (const auto& part : name) {
    if (part == "..") {
      return {errc::invalid_argument,
              "library '" + library + "' contains a '..' component; libraries are loaded only " +
                  "from inside the plugin path " + dirs_list(dirs)};
    }
  }
  for (const auto& dir : dirs) {
    std::error_code ec;
    const fs::path canonical_dir = fs::canonical(dir, ec);
    if (ec)
      continue;  // a missing plugin dir holds nothing
    const fs::path candidate = canonical_dir / name;
    if (!fs::exists(fs::symlink_status(candidate, ec)))
      continue;
    const fs::path canonical = fs::canonical(candidate, ec);
    if (ec) {
      // Present but unresolvable: a dangling symlink or an unreadable dir.
      return {errc::not_found, "library '" + library + "' in plugin dir '" + dir +
                                   "' cannot be resolved: " + ec.message()};
    }
    if (!is_within(canonical, canonical_dir)) {
      return {errc::invalid_argument, "library '" + library + "' in plugin dir '" + dir +
                                          "' resolves to '" + canonical.string() +
                                          "', outside the plugin dir; refusing to load it"};
    }
    if (!fs::is_regular_file(canonical, ec)) {
      return {errc::invalid_argument,
              "library '" + library + "' in plugin dir '" + dir + "' is not a regular file"};
    }
    return canonical.string();
  }
  return {errc::not_found, "library '" + library + "' not found in plugin path " + dirs_list(dirs)};
}

// ------------------------------------------------------------- LibraryDir

struct LibraryDir::Progress {
  uint64_t have = 0;  // bytes hashed (and in the partial file)
  Digest digest;
};

LibraryDir::LibraryDir(std::string dir, bool durable) : dir_(std::move(dir)), durable_(durable) {}

std::string LibraryDir::path_of(const std::string& sha256) const {
  return (fs::path(dir_) / (sha256 + kSuffix)).string();
}

std::string LibraryDir::partial_path(const std::string& sha256) const {
  return (fs::path(dir_) / (kPartialPrefix + sha256)).string();
}

Status LibraryDir::open() const {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec)
    return {errc::io_error, "cannot create library dir " + dir_ + ": " + ec.message()};
  return Status::ok();
}

std::optional<uint64_t> LibraryDir::size_of(const std::string& sha256) const {
  if (!is_sha256(sha256))
    return std::nullopt;
  struct stat st {};
  if (::stat(path_of(sha256).c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    return std::nullopt;
  return static_cast<uint64_t>(st.st_size);
}

std::optional<LibraryDir::Stamp> LibraryDir::stamp_of(const std::string& sha256) const {
  if (!is_sha256(sha256))
    return std::nullopt;
  struct stat st {};
  if (::stat(path_of(sha256).c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    return std::nullopt;
  return Stamp{static_cast<uint64_t>(st.st_size),
               static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

Result<bool> LibraryDir::verify(const std::string& sha256) const {
  if (!size_of(sha256))
    return false;
  auto actual = sha256_file(path_of(sha256));
  if (!actual)
    return actual.status();
  if (*actual == sha256)
    return true;
  std::error_code ec;
  fs::remove(path_of(sha256), ec);
  return {errc::corrupt, "library " + path_of(sha256) + " has content of SHA-256 " + *actual +
                             ", not " + sha256 + " (damaged or changed); removed it"};
}

Status LibraryDir::put(const std::string& sha256, std::string_view bytes) const {
  if (!is_sha256(sha256))
    return {errc::invalid_argument, "'" + sha256 + "' is not a SHA-256 in hex"};
  auto actual = sha256_hex(bytes);
  if (actual != sha256) {
    return {errc::invalid_argument,
            "library content has SHA-256 " + actual + ", not " + sha256 + "; refused"};
  }
  if (auto st = open(); !st)
    return st;
  return write_atomically(path_of(sha256), bytes, durable_);
}

Status LibraryDir::put_file(const std::string& sha256, const std::string& source) const {
  auto bytes = read_all(source);
  if (!bytes)
    return bytes.status();
  return put(sha256, *bytes);
}

Result<std::string> LibraryDir::read(const std::string& sha256, uint64_t offset,
                                     uint64_t max) const {
  if (!is_sha256(sha256))
    return {errc::invalid_argument, "'" + sha256 + "' is not a SHA-256 in hex"};
  if (!size_of(sha256))
    return {errc::not_found, "no library " + sha256 + " is stored here"};
  return read_file(path_of(sha256), offset, max);
}

Result<uint64_t> LibraryDir::append(const std::string& sha256, uint64_t total, uint64_t offset,
                                    std::string_view piece) const {
  if (!is_sha256(sha256))
    return {errc::invalid_argument, "'" + sha256 + "' is not a SHA-256 in hex"};
  if (total == 0 || total > kMaxLibraryBytes) {
    return {errc::invalid_argument, "a library of " + std::to_string(total) +
                                        " bytes; the limit is " +
                                        std::to_string(kMaxLibraryBytes) + " bytes"};
  }
  if (offset + piece.size() > total || piece.size() > kChunkBytes) {
    return {errc::invalid_argument, "a piece of " + std::to_string(piece.size()) +
                                        " bytes at offset " + std::to_string(offset) +
                                        " does not fit a library of " + std::to_string(total) +
                                        " bytes"};
  }
  if (auto held = size_of(sha256); held && *held == total)
    return total;  // already complete
  if (auto st = open(); !st)
    return st;
  const std::string partial = partial_path(sha256);
  struct stat st {};
  uint64_t have = ::stat(partial.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  if (offset != 0 && offset != have) {
    return {errc::conflict, "a piece at offset " + std::to_string(offset) + " of library " +
                                sha256 + ", which has " + std::to_string(have) +
                                " bytes so far; start over from offset 0"};
  }
  // The hash runs along with the pieces, so the last one costs what any
  // piece costs, not a read of the whole library (up to kMaxLibraryBytes, on
  // the thread of the controller or the node agent). Its state is set up
  // again from the pieces on disk when there is none that matches them (this
  // object is new: a restarted controller, a new agent).
  auto& progress = in_progress_[sha256];
  if (offset == 0 || !progress || progress->have != have) {
    progress = std::make_shared<Progress>();
    progress->digest = new_digest();
    if (!progress->digest) {
      in_progress_.erase(sha256);
      return {errc::internal, "cannot set up SHA-256"};
    }
    if (offset != 0) {
      if (auto st = digest_file(partial, progress->digest.get()); !st) {
        in_progress_.erase(sha256);
        return st;
      }
      progress->have = have;
    }
  }
  int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (offset == 0 ? O_TRUNC : O_APPEND),
                  0644);
  if (fd < 0) {
    in_progress_.erase(sha256);
    return {errc::io_error, "cannot write " + partial + ": " + errno_text()};
  }
  (void)::fchmod(fd, 0644);  // as in write_atomically
  if (auto written = write_all(fd, piece, partial); !written) {
    ::close(fd);
    in_progress_.erase(sha256);
    return written;
  }
  EVP_DigestUpdate(progress->digest.get(), piece.data(), piece.size());
  const uint64_t now_have = offset + piece.size();
  progress->have = now_have;
  if (now_have < total) {
    ::close(fd);
    return now_have;
  }
  auto done = std::move(progress);
  in_progress_.erase(sha256);
  if (durable_ && ::fsync(fd) != 0) {
    Status failed(errc::io_error, "cannot write " + partial + ": " + errno_text());
    ::close(fd);
    return failed;
  }
  ::close(fd);
  const std::string actual = finish_hex(done->digest.get());
  if (actual != sha256) {
    ::unlink(partial.c_str());
    return {errc::invalid_argument, "the library received has SHA-256 " + actual + ", not " +
                                        sha256 + "; refused"};
  }
  if (::rename(partial.c_str(), path_of(sha256).c_str()) != 0)
    return {errc::io_error, "cannot rename " + partial + ": " + errno_text()};
  return total;
}

std::vector<LibraryDir::Entry> LibraryDir::list() const {
  std::vector<Entry> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string file = it->path().filename().string();
    Entry e;
    if (file.size() == 64 + 3 && file.compare(64, 3, kSuffix) == 0) {
      e.sha256 = file.substr(0, 64);
    } else if (file.rfind(kPartialPrefix, 0) == 0) {
      e.sha256 = file.substr(std::strlen(kPartialPrefix));
      e.partial = true;
    } else {
      continue;
    }
    if (!is_sha256(e.sha256))
      continue;
    struct stat st {};
    if (::stat(it->path().c_str(), &st) != 0)
      continue;
    e.mtime_s = static_cast<double>(st.st_mtime);
    out.push_back(std::move(e));
  }
  return out;
}

void LibraryDir::remove(const std::string& sha256) const {
  if (!is_sha256(sha256))
    return;
  std::error_code ec;
  fs::remove(path_of(sha256), ec);
  fs::remove(partial_path(sha256), ec);
  in_progress_.erase(sha256);
}

std::vector<std::string> stale_libraries(const std::vector<LibraryDir::Entry>& entries,
                                         const std::set<std::string>& used, double wall_now_s,
                                         double retention_s) {
  std::set<std::string> stale;
  for (const auto& e : entries) {
    if (used.count(e.sha256) == 0 && wall_now_s - e.mtime_s >= retention_s)
      stale.insert(e.sha256);
  }
  return {stale.begin(), stale.end()};
}

}  // namespace troupe::libraries
