#include "node/replica_user.hpp"

#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

namespace troupe::node {

namespace {

namespace fs = std::filesystem;

Status sys_error(const std::string& what) {
  return Status(errc::internal, what + ": " + std::strerror(errno));
}

std::string octal(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof(text), "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

std::string who(const RunAs& user) {
  return "user " + user.name + " (uid " + std::to_string(user.uid) + ")";
}

// The rwx bits (4, 2, 1) `user` has on a file with this owner and mode,
// with its primary group only (the replica keeps no other). ACLs are not
// read.
int bits_for(const struct stat& st, const RunAs& user) {
  if (user.uid == 0)
    return 7;
  if (st.st_uid == user.uid)
    return static_cast<int>((st.st_mode >> 6) & 7);
  if (st.st_gid == user.gid)
    return static_cast<int>((st.st_mode >> 3) & 7);
  return static_cast<int>(st.st_mode & 7);
}

// The directories from / down to the parent of `path`, and `path`.
Result<std::vector<fs::path>> chain_to(const std::string& path) {
  std::error_code ec;
  fs::path full = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec)
    return Status(errc::invalid_argument, "cannot resolve '" + path + "': " + ec.message());
  std::vector<fs::path> chain;
  fs::path at = full.root_path();
  chain.push_back(at);
  for (const auto& part : full.relative_path()) {
    at /= part;
    chain.push_back(at);
  }
  return chain;
}

}  // namespace

std::optional<RunAs> lookup_user(const std::string& name) {
  long size = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buffer(size > 0 ? static_cast<size_t>(size) : 16384);
  passwd entry{};
  passwd* found = nullptr;
  if (::getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found) != 0 || !found)
    return std::nullopt;
  return RunAs{name, found->pw_uid, found->pw_gid};
}

Result<std::optional<RunAs>> choose_replica_user(const std::string& requested, uid_t node_uid,
                                                 bool can_switch, const UserLookup& lookup,
                                                 std::string& warning) {
  warning.clear();
  if (!requested.empty()) {
    auto user = lookup(requested);
    if (!user)
      return Status(errc::invalid_argument, "--replica-user " + requested + ": no such user");
    if (user->uid == node_uid)
      return std::optional<RunAs>();  // the node's own user: nothing to change
    if (!can_switch) {
      return Status(errc::invalid_argument,
                    "--replica-user " + requested + ": troupe-node runs as uid " +
                        std::to_string(node_uid) +
                        " without CAP_SETUID and CAP_SETGID, so it cannot start processes as "
                        "another user (run it as root, or give it those capabilities)");
    }
    return std::optional<RunAs>(*user);
  }
  if (node_uid != 0)
    return std::optional<RunAs>();
  auto user = lookup(kDefaultReplicaUser);
  if (!user || user->uid == 0) {
    warning = std::string("replica processes run as root, with the node's keys and state within "
                          "reach of user code: there is no user '") +
              kDefaultReplicaUser +
              "' (./troupe and the .deb create it; or pass --replica-user USER)";
    return std::optional<RunAs>();
  }
  return std::optional<RunAs>(*user);
}

bool can_switch_user() {
  if (::geteuid() == 0)
    return true;
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (::syscall(SYS_capget, &header, data) != 0)
    return false;
  auto has = [&](int cap) { return (data[cap / 32].effective & (1u << (cap % 32))) != 0; };
  return has(CAP_SETUID) && has(CAP_SETGID);
}

Status reachable_by(const std::string& path, const RunAs& user) {
  auto chain = chain_to(path);
  if (!chain)
    return chain.status();
  for (size_t i = 0; i < chain->size(); ++i) {
    const auto& at = (*chain)[i];
    struct stat st {};
    if (::stat(at.c_str(), &st) != 0)
      return Status(errc::not_found, "cannot stat " + at.string() + ": " + std::strerror(errno));
    bool last = i + 1 == chain->size();
    bool dir = S_ISDIR(st.st_mode);
    int need = last && !dir ? 4 : 1;  // a file: read it; a directory: search it
    if ((bits_for(st, user) & need) != need) {
      return Status(errc::permission_denied,
                    who(user) + " cannot " + (need == 4 ? "read " : "search ") + at.string() +
                        " (mode " + octal(st.st_mode) + ", owner uid " +
                        std::to_string(st.st_uid) + ", gid " + std::to_string(st.st_gid) +
                        ") on the way to " + path);
    }
  }
  return Status::ok();
}

Status unreadable_by(const std::string& path, const RunAs& user) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return Status(errc::not_found, "cannot stat " + path + ": " + std::strerror(errno));
  if (!reachable_by(path, user).is_ok())
    return Status::ok();  // a directory on the way keeps it out
  return Status(errc::permission_denied,
                path + " is readable by " + who(user) + " (mode " + octal(st.st_mode) +
                    ", owner uid " + std::to_string(st.st_uid) +
                    "): user code would hold it (chmod 600 " + path + ")");
}

namespace {

// The cache replicas load pinned libraries from: 0755, its files 0644.
Status open_library_cache(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return Status(errc::io_error, "cannot create the library cache " + dir + ": " + ec.message());
  if (::chmod(dir.c_str(), 0755) != 0)
    return Status(errc::io_error, "cannot open the library cache " + dir + " to replica processes: " +
                                      std::strerror(errno));
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_regular_file(ec))
      fs::permissions(entry.path(), fs::perms::owner_read | fs::perms::owner_write |
                                        fs::perms::group_read | fs::perms::others_read, ec);
  }
  return Status::ok();
}

// What replica processes must reach as `user`: an error names the first
// that they cannot.
Status replica_reach(const IsolationInputs& in, const RunAs& user) {
  std::vector<std::string> needed{in.library_cache};
  for (const auto& dir : in.plugin_path) {
    std::error_code ec;
    if (fs::is_directory(dir, ec))
      needed.push_back(dir);
  }
  for (const auto& path : needed) {
    if (auto st = reachable_by(path, user); !st)
      return st;
  }
  return Status::ok();
}

// Every private key in the TLS dir out of `user`'s reach.
Status keys_kept_from(const std::string& tls_dir, const RunAs& user) {
  if (tls_dir.empty())
    return Status::ok();
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(tls_dir, ec)) {
    if (entry.path().extension() != ".key")
      continue;
    if (auto st = unreadable_by(entry.path().string(), user); !st)
      return Status(errc::permission_denied, "--tls-dir: " + st.message());
  }
  if (ec)
    return Status(errc::io_error, "--tls-dir " + tls_dir + ": " + ec.message());
  return Status::ok();
}

// The state dir 0711 (others may pass through to the library cache, not
// list it) and everything in it but the cache without group and other
// permissions.
Status keep_state(const std::string& state_dir, const std::string& library_cache) {
  if (state_dir.empty())
    return Status::ok();
  if (::chmod(state_dir.c_str(), 0711) != 0)
    return Status(errc::io_error, "cannot close the state dir " + state_dir + ": " +
                                      std::strerror(errno));
  std::error_code ec;
  const auto cache = fs::weakly_canonical(library_cache, ec);
  for (const auto& entry : fs::directory_iterator(state_dir, ec)) {
    std::error_code same_ec;
    if (fs::equivalent(entry.path(), cache, same_ec))
      continue;
    fs::permissions(entry.path(), fs::perms::group_all | fs::perms::others_all,
                    fs::perm_options::remove | fs::perm_options::nofollow, same_ec);
    if (same_ec)
      return Status(errc::io_error, "cannot close " + entry.path().string() + ": " +
                                        same_ec.message());
  }
  if (ec)
    return Status(errc::io_error, "cannot list the state dir " + state_dir + ": " + ec.message());
  return Status::ok();
}

}  // namespace

Result<Isolation> isolate_replicas(const IsolationInputs& in) {
  Isolation out;
  auto chosen = choose_replica_user(in.requested, ::geteuid(), can_switch_user(), lookup_user,
                                    out.warning);
  if (!chosen)
    return chosen.status();
  if (!chosen.value())
    return out;
  const RunAs user = *chosen.value();
  if (auto st = open_library_cache(in.library_cache); !st)
    return st;
  if (auto st = replica_reach(in, user); !st) {
    if (!in.requested.empty())
      return Status(errc::invalid_argument, "--replica-user " + user.name + ": " + st.message());
    out.warning = "replica processes run as root, with the node's keys and state within reach "
                  "of user code: " + st.message() + " (or pass --replica-user)";
    return out;
  }
  if (auto st = keys_kept_from(in.tls_dir, user); !st)
    return st;
  ::umask(077);
  if (auto st = keep_state(in.state_dir, in.library_cache); !st)
    return st;
  // A cache deeper in the state dir is closed off with its parent.
  if (auto st = replica_reach(in, user); !st) {
    return Status(errc::invalid_argument,
                  "--library-cache " + in.library_cache + ": " + st.message() +
                      " (a library cache in the state dir must be one of its entries)");
  }
  out.user = user;
  return out;
}

Status drop_to(uid_t uid, gid_t gid) {
  if (::setgroups(1, &gid) != 0)
    return sys_error("setgroups");
  if (::setresgid(gid, gid, gid) != 0)
    return sys_error("setresgid " + std::to_string(gid));
  if (::setresuid(uid, uid, uid) != 0)
    return sys_error("setresuid " + std::to_string(uid));
  // From root, the uid change clears every capability; from a node that
  // holds CAP_SETUID as another user, they would stay: drop them all.
  if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
    return sys_error("clearing the ambient capabilities");
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct none[2] = {};
  if (::syscall(SYS_capset, &header, none) != 0)
    return sys_error("dropping the capabilities");
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
    return sys_error("PR_SET_NO_NEW_PRIVS");
  if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0)
    return sys_error("PR_SET_DUMPABLE");
  uid_t r = 0, e = 0, s = 0;
  ::getresuid(&r, &e, &s);
  if (r != uid || e != uid || s != uid)
    return Status(errc::internal, "the uid did not change to " + std::to_string(uid));
  if (uid != 0 && ::setresuid(0, 0, 0) == 0)
    return Status(errc::internal, "the process could become root again");
  return Status::ok();
}

}  // namespace troupe::node
