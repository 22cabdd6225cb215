#include "tools/troupectl/upload.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <troupe/deployment.hpp>

#include "replica/plugin/import_path.hpp"
#include "runtime/libraries.hpp"

namespace troupe::ctl {

namespace fs = std::filesystem;

namespace {

// How long loading a library in the child may take.
constexpr int kLoadCheckTimeoutMs = 20000;

// True when `path` is `dir` or below it; both canonical.
bool is_within(const fs::path& path, const fs::path& dir) {
  auto p = path.begin();
  for (auto d = dir.begin(); d != dir.end(); ++d, ++p) {
    if (d->empty())
      continue;
    if (p == path.end() || *p != *d)
      return false;
  }
  return true;
}

// In a child process: loads `path` and checks that it exports each class of
// `classes` for this ABI, and that a class whose deployment batches (its
// value names the field that asks for it; empty: none does) implements
// handle_batch(). The child writes the first problem (or nothing) to a pipe
// and exits; the library's code never runs in troupectl itself.
Status check_exports(const std::string& path, const std::map<std::string, std::string>& classes) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    return {errc::io_error, std::string("cannot check the library: pipe: ") + std::strerror(errno)};
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return {errc::io_error, std::string("cannot check the library: fork: ") + std::strerror(errno)};
  }
  if (pid == 0) {
    ::close(fds[0]);
    std::string problem;
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* e = ::dlerror();
      problem = std::string("cannot be loaded: ") + (e ? e : "dlopen failed");
    }
    for (auto entry = classes.begin(); problem.empty() && entry != classes.end(); ++entry) {
      const std::string* it = &entry->first;
      const std::string symbol = deployment_symbol(*it);
      void* address = ::dlsym(handle, symbol.c_str());
      if (address == nullptr) {
        problem = "has no deployment '" + *it + "' (no symbol " + symbol +
                  "; is TROUPE_DEPLOYMENT(" + *it + ") in it?)";
        break;
      }
      using Exported = const DeploymentFactory* (*)();
      const DeploymentFactory* factory = reinterpret_cast<Exported>(address)();
      if (factory == nullptr) {
        problem = symbol + "() returned no factory";
      } else if (factory->abi_version != kDeploymentAbiVersion) {
        problem = "deployment '" + *it + "' was built against deployment ABI " +
                  std::to_string(factory->abi_version) + ", this troupe uses " +
                  std::to_string(kDeploymentAbiVersion) +
                  "; rebuild it against this troupe's <troupe/deployment.hpp>";
      } else if (!entry->second.empty() && !factory->batches) {
        problem = "has deployment '" + *it + "', which does not implement handle_batch(), but " +
                  entry->second +
                  ": only a class that overrides troupe::Deployment::handle_batch() can batch "
                  "(set max_batch_size: 1 and remove batch_wait_timeout_s: auto, or implement "
                  "it)";
      }
    }
    size_t done = 0;
    while (done < problem.size()) {
      ssize_t n = ::write(fds[1], problem.data() + done, problem.size() - done);
      if (n <= 0)
        break;
      done += static_cast<size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string problem;
  char buffer[4096];
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kLoadCheckTimeoutMs);
  bool timed_out = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0) {
      timed_out = r == 0;
      break;
    }
    ssize_t n = ::read(fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    problem.append(buffer, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out)
    ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return {errc::invalid_argument, "did not finish loading within " +
                                        std::to_string(kLoadCheckTimeoutMs / 1000) + " s"};
  }
  if (WIFSIGNALED(status)) {
    return {errc::invalid_argument, std::string("crashed while loading (") +
                                        ::strsignal(WTERMSIG(status)) + ")"};
  }
  if (!problem.empty())
    return {errc::invalid_argument, problem};
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return {errc::invalid_argument,
            "ended its loading process with exit status " + std::to_string(WEXITSTATUS(status))};
  }
  return Status::ok();
}

}  // namespace

Result<std::vector<LocalLibrary>> prepare_uploads(controller::TargetState& state,
                                                  const std::string& config_file) {
  std::error_code ec;
  const fs::path config_dir = fs::canonical(fs::absolute(config_file, ec).parent_path(), ec);
  if (ec)
    return {errc::invalid_argument, config_file + ": cannot resolve its directory: " + ec.message()};
  // Canonical path -> index in `out`, and the classes each must export.
  std::map<std::string, size_t> index;
  std::vector<LocalLibrary> out;
  // class -> which deployment asks it to batch, and how ("": none).
  std::vector<std::map<std::string, std::string>> classes;
  std::map<std::string, std::string> first_user;  // path -> "application 'a' deployment 'd'"
  for (auto& [app_name, app] : state.applications) {
    for (auto& d : app.deployments) {
      auto parsed = parse_import_path(d.import_path);
      if (!parsed || !libraries::is_local_path(parsed->library))
        continue;
      const std::string who = config_file + ": application '" + app_name + "' deployment '" +
                              d.name + "': library '" + parsed->library + "'";
      auto fail = [&](const std::string& why) {
        return Status(errc::invalid_argument, who + " " + why);
      };
      fs::path given(parsed->library);
      fs::path full = given.is_absolute() ? given : config_dir / given;
      const fs::path canonical = fs::canonical(full, ec);
      if (ec)
        return fail("cannot be read: " + ec.message());
      if (!is_within(canonical, config_dir)) {
        return fail("resolves to " + canonical.string() + ", outside the config's directory " +
                    config_dir.string() + "; libraries are uploaded only from inside it");
      }
      if (!fs::is_regular_file(canonical, ec))
        return fail("is not a regular file");
      const auto size = fs::file_size(canonical, ec);
      if (ec)
        return fail("cannot be read: " + ec.message());
      if (size > libraries::kMaxLibraryBytes) {
        return fail("is " + std::to_string(size) + " bytes, over the limit of " +
                    std::to_string(libraries::kMaxLibraryBytes) + " bytes");
      }
      auto [it, fresh] = index.try_emplace(canonical.string(), out.size());
      if (fresh) {
        std::ifstream in(canonical, std::ios::binary);
        std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (!in.good() && !in.eof())
          return fail("cannot be read");
        if (auto elf = libraries::check_elf_shared_object(bytes); !elf)
          return fail(elf.message());
        LocalLibrary lib;
        lib.path = canonical.string();
        lib.sha256 = libraries::sha256_hex(bytes);
        lib.bytes = std::move(bytes);
        out.push_back(std::move(lib));
        classes.emplace_back();
        first_user[canonical.string()] = who;
      }
      std::string& batching = classes[it->second][parsed->class_name];
      if (batching.empty() && (d.config.max_batch_size > 1 || d.config.batch_wait_auto)) {
        batching = "application '" + app_name + "' deployment '" + d.name + "' sets " +
                   (d.config.max_batch_size > 1
                        ? "max_batch_size: " + std::to_string(d.config.max_batch_size)
                        : std::string("batch_wait_timeout_s: auto"));
      }
      d.library_sha256 = out[it->second].sha256;
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (auto st = check_exports(out[i].path, classes[i]); !st)
      return Status(errc::invalid_argument, first_user[out[i].path] + " " + st.message());
  }
  return out;
}

Status upload(const LocalLibrary& library, uint64_t held, const SendPiece& send) {
  const uint64_t total = library.bytes.size();
  if (held == total)
    return Status::ok();
  uint64_t offset = 0;
  while (offset < total) {
    const uint64_t n = std::min<uint64_t>(libraries::kChunkBytes, total - offset);
    auto got = send(library.sha256, total, offset, library.bytes.substr(offset, n));
    if (!got) {
      return Status(got.status().code(),
                    "upload of " + library.path + " failed: " + got.status().message());
    }
    if (*got != offset + n) {
      return Status(errc::internal, "upload of " + library.path + ": the controller holds " +
                                        std::to_string(*got) + " bytes after a piece ending at " +
                                        std::to_string(offset + n));
    }
    offset += n;
  }
  return Status::ok();
}

}  // namespace troupe::ctl
