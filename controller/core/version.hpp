// Version semantics of a deployment: what a change of the spec does to the
// replicas that already run.
#pragma once

#include <string>

#include "controller/core/model.hpp"

namespace troupe::controller {

// What a replica runs. `code` covers everything whose change requires a new
// process (code_version, import_path, init_args, resources, isolation,
// memory_limit_bytes); `user_config` is applied in place by reconfigure(). A
// replica reports this pair when it is ready, so that a recovering controller
// learns what it runs.
struct ReplicaVersion {
  std::string code;
  std::string user_config;
  // The batching it runs with (batch_key()): applied in place like
  // user_config; "" for batching off at the default wait.
  std::string batch;

  friend bool operator==(const ReplicaVersion& a, const ReplicaVersion& b) {
    return a.code == b.code && a.user_config == b.user_config && a.batch == b.batch;
  }
  friend bool operator!=(const ReplicaVersion& a, const ReplicaVersion& b) { return !(a == b); }
};

// "<code_version>-<16 hex digits>", the hex digits a stable hash (FNV-1a) of
// code_version, import_path, init_args and resources, of the library's
// SHA-256 when known, and of isolation and
// memory_limit_bytes when they differ from their defaults (so identities of
// specs that leave them at the defaults did not change when they were added);
// just the hex digits when code_version is empty. Equal specs give equal
// strings on every platform.
std::string code_identity(const DeploymentSpec& spec);

ReplicaVersion version_of(const DeploymentSpec& spec);

// The batching fields of a deployment as ReplicaVersion::batch compares
// them: "" when they are the defaults (batching off, the default wait), so
// that versions of deployments that never set them did not change; else
// "max=<n> wait=<seconds, exact>|auto".
std::string batch_key(uint32_t max_batch_size, double wait_s, bool adaptive);
std::string batch_key(const DeploymentConfig& config);

// The import path a replica is started with: with library_sha256 set, the
// library pinned by it ("<file name>@<sha256>:<Class>", runtime/libraries.hpp),
// which the node loads from its library cache; else import_path as it is.
std::string replica_import_path(const DeploymentSpec& spec);

// The version a client names in prev_version: the user's code_version, or the
// derived code identity when the user set none.
std::string effective_code_version(const DeploymentSpec& spec);

// How going from `from` to `to` affects running replicas.
enum class ChangeKind {
  unchanged,    // identical spec: a no-op
  scaled,       // only num_replicas / autoscaling_config differ
  config_only,  // controller-side options differ (health-check timing, limits, ...)
  reconfigure,  // user_config or batching differs: running replicas are reconfigured in place
  restart,      // code, import path, init args, resources, isolation or memory limit differ
  created,      // a new deployment (never returned by classify_change)
};

const char* to_string(ChangeKind kind);

ChangeKind classify_change(const DeploymentSpec& from, const DeploymentSpec& to);

}  // namespace troupe::controller
