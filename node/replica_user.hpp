// The user replica processes run as, so that user code does not hold the
// node's secrets: its TLS keys, the controller's checkpoint, its state
// directory, other replicas' logs.
//
// `--replica-user USER` names it; a node that runs as root (or holds
// CAP_SETUID and CAP_SETGID) without it uses the dedicated user
// `troupe-replica` when that exists (`./troupe` and the .deb create it). The
// node starts troupe-replica as itself; troupe-replica drops to that user
// before it reads its secret or loads any user code (drop_to): only that
// user's primary group, no capabilities, PR_SET_NO_NEW_PRIVS, not dumpable
// (so that replicas of the same user cannot ptrace or read each other's
// /proc files). The node keeps what it writes to itself (umask 077, the state
// dir 0711, its library cache 0755 with 0644 files, since replicas load
// their libraries from it) and refuses to start when that user could read
// its TLS keys or could not reach the libraries it must load.
//
// Plain POSIX; tested in tests/node/replica_user_test.cpp and, with real
// users, tests/integration/replica_user_test.cpp.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "runtime/status.hpp"

namespace troupe::node {

constexpr const char* kDefaultReplicaUser = "troupe-replica";

struct RunAs {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
};

// A user's uid and primary gid by name; empty when there is no such user.
using UserLookup = std::function<std::optional<RunAs>(const std::string& name)>;
// getpwnam_r.
std::optional<RunAs> lookup_user(const std::string& name);

// Who replica processes run as: empty for "as the node". `requested` is
// --replica-user ("" when not given); `node_uid` the node's effective uid;
// `can_switch` whether the node may start processes as another user (root,
// or CAP_SETUID and CAP_SETGID). `warning` says why the replicas run as the
// node when a root node has no user to run them as.
Result<std::optional<RunAs>> choose_replica_user(const std::string& requested, uid_t node_uid,
                                                 bool can_switch, const UserLookup& lookup,
                                                 std::string& warning);

// Whether this process may start processes as another user.
bool can_switch_user();

// Whether `user` can search every directory from / down to `path` and
// read `path` (a file or a directory), judged from the mode bits and
// owners; an error names the first one that stops it.
Status reachable_by(const std::string& path, const RunAs& user);

// Whether `user` could read `path` (mode bits and owner), for the keys the
// node must keep to itself: an error names the file and its mode.
Status unreadable_by(const std::string& path, const RunAs& user);

// What isolate_replicas needs to know of the node.
struct IsolationInputs {
  std::string requested;           // --replica-user, "" when not given
  std::string state_dir;           // "" : none
  std::string library_cache;       // the node's cache of pinned libraries
  std::vector<std::string> plugin_path;
  std::string tls_dir;             // "" : no TLS
};

struct Isolation {
  std::optional<RunAs> user;  // empty: replica processes run as the node
  std::string warning;        // why they run as the node although it is root
};

// At the node's start, after its state dir exists: chooses the user
// (choose_replica_user) and, for another user, prepares the node: the
// library cache 0755 with its files 0644; the plugin path and the cache
// within that user's reach (troupe-replica itself is started as the node) (else a requested user is an
// error, the default one a warning and no switch); every TLS key out of its
// reach (else an error); then umask 077, the state dir 0711 and everything
// in it but the cache without group and other permissions.
Result<Isolation> isolate_replicas(const IsolationInputs& in);

// troupe-replica's side: becomes `uid`/`gid` for good (see above); an error
// when any step fails (the process must not go on as the node's user).
Status drop_to(uid_t uid, gid_t gid);

}  // namespace troupe::node
