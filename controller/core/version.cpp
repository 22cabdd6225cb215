#include "controller/core/version.hpp"

#include <cstdint>
#include <cstdio>
#include <string>

namespace troupe::controller {

namespace {

void fnv_mix(uint64_t& h, const std::string& s) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  // A separator byte so that ("ab","c") and ("a","bc") differ.
  h ^= 0xff;
  h *= 1099511628211ULL;
}

}  // namespace

std::string code_identity(const DeploymentSpec& spec) {
  uint64_t h = 14695981039346656037ULL;
  fnv_mix(h, spec.code_version);
  fnv_mix(h, spec.import_path);
  // The library's content: a rebuild restarts the replicas. Mixed in only
  // when known, so the identity of a spec without it did not change.
  if (!spec.library_sha256.empty())
    fnv_mix(h, "library=" + spec.library_sha256);
  fnv_mix(h, spec.init_args);
  fnv_mix(h, spec.config.resources.to_string());
  // How the replica process is run. Mixed in only when not the default, so
  // the identity of a spec that leaves both at their defaults is the one it
  // had before these fields existed.
  if (spec.config.isolation != Isolation::process)
    fnv_mix(h, std::string("isolation=") + to_string(spec.config.isolation));
  if (spec.config.memory_limit_bytes != 0)
    fnv_mix(h, "memory_limit=" + std::to_string(spec.config.memory_limit_bytes));
  // Where replicas may run, like Ray Serve's version (whose hash covers
  // max_replicas_per_node): a new limit replaces the replicas by a rolling
  // update, which places them under it.
  if (spec.config.max_replicas_per_node != 0)
    fnv_mix(h, "max_replicas_per_node=" + std::to_string(spec.config.max_replicas_per_node));
  // Replicas get the threshold when they start: a change restarts them.
  if (spec.config.stuck_after_s != 0)
    fnv_mix(h, "stuck_after=" + std::to_string(spec.config.stuck_after_s));
  // A replica's ModelCache takes its capacity when it is built: a change
  // restarts the replicas (Ray Serve: an argument of @serve.multiplexed).
  if (spec.config.max_num_models_per_replica != -1)
    fnv_mix(h, "max_models=" + std::to_string(spec.config.max_num_models_per_replica));
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  if (spec.code_version.empty())
    return hex;
  return spec.code_version + "-" + hex;
}

ReplicaVersion version_of(const DeploymentSpec& spec) {
  return {code_identity(spec), spec.config.user_config, batch_key(spec.config)};
}

std::string batch_key(uint32_t max_batch_size, double wait_s, bool adaptive) {
  const DeploymentConfig defaults;
  if (max_batch_size == defaults.max_batch_size && !adaptive &&
      wait_s == defaults.batch_wait_timeout_s)
    return "";
  if (adaptive)
    return "max=" + std::to_string(max_batch_size) + " wait=auto";
  char wait[40];
  std::snprintf(wait, sizeof wait, "%.17g", wait_s);
  return "max=" + std::to_string(max_batch_size) + " wait=" + wait;
}

std::string batch_key(const DeploymentConfig& config) {
  return batch_key(config.max_batch_size, config.batch_wait_timeout_s, config.batch_wait_auto);
}

std::string replica_import_path(const DeploymentSpec& spec) {
  if (spec.library_sha256.empty())
    return spec.import_path;
  const auto colon = spec.import_path.find(':');
  if (colon == std::string::npos)
    return spec.import_path;  // refused by validation before it gets here
  const std::string library = spec.import_path.substr(0, colon);
  const auto slash = library.rfind('/');
  const std::string name = slash == std::string::npos ? library : library.substr(slash + 1);
  return name + "@" + spec.library_sha256 + spec.import_path.substr(colon);
}

std::string effective_code_version(const DeploymentSpec& spec) {
  return spec.code_version.empty() ? code_identity(spec) : spec.code_version;
}

const char* to_string(ChangeKind kind) {
  switch (kind) {
    case ChangeKind::unchanged:
      return "unchanged";
    case ChangeKind::scaled:
      return "scaled";
    case ChangeKind::config_only:
      return "config_only";
    case ChangeKind::reconfigure:
      return "reconfigure";
    case ChangeKind::restart:
      return "restart";
    case ChangeKind::created:
      return "created";
  }
  return "?";
}

ChangeKind classify_change(const DeploymentSpec& from, const DeploymentSpec& to) {
  if (from == to)
    return ChangeKind::unchanged;
  if (code_identity(from) != code_identity(to))
    return ChangeKind::restart;
  if (from.config.user_config != to.config.user_config ||
      batch_key(from.config) != batch_key(to.config))
    return ChangeKind::reconfigure;
  // Compare everything except the scaling fields.
  DeploymentSpec a = from;
  DeploymentSpec b = to;
  a.config.num_replicas = b.config.num_replicas = 0;
  a.config.autoscaling_config.reset();
  b.config.autoscaling_config.reset();
  if (a == b)
    return ChangeKind::scaled;
  return ChangeKind::config_only;
}

}  // namespace troupe::controller
