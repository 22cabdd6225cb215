// Statuses the controller reports for deployments, applications and replicas,
// each with the trigger that caused the last transition and a human message.
#pragma once

#include <cstdint>
#include <string>

namespace troupe::controller {

// Identifies a deployment: application name and deployment name.
struct DeploymentId {
  std::string app;
  std::string name;

  std::string to_string() const { return app + "/" + name; }
  friend bool operator<(const DeploymentId& a, const DeploymentId& b) {
    return a.app != b.app ? a.app < b.app : a.name < b.name;
  }
  friend bool operator==(const DeploymentId& a, const DeploymentId& b) {
    return a.app == b.app && a.name == b.name;
  }
  friend bool operator!=(const DeploymentId& a, const DeploymentId& b) { return !(a == b); }
};

enum class ReplicaState {
  starting,    // pending allocation (no node fits yet), then pending initialization
  updating,    // a reconfigure with a new user_config is in flight
  recovering,  // adopted after a controller restart; asking it for its version
  running,     // serving; health-checked
  stopping,    // asked to stop; killed after the grace period; gone when confirmed
};

enum class DeploymentStatus {
  updating,
  healthy,
  unhealthy,
  upscaling,
  downscaling,
  deploy_failed,
};

// Ray Serve's DeploymentStatusTrigger (a deployment being deleted is UPDATING
// with trigger DELETING; one back from UNHEALTHY is HEALTHY with UNSPECIFIED).
enum class DeploymentTrigger {
  unspecified,
  config_update_started,
  config_update_completed,
  upscale_completed,
  downscale_completed,
  autoscaling,
  replica_startup_failed,
  health_check_failed,
  deleting,
};

enum class ApplicationStatus {
  deploying,
  running,
  unhealthy,
  deploy_failed,
  deleting,
};

const char* to_string(ReplicaState s);
const char* to_string(DeploymentStatus s);
const char* to_string(DeploymentTrigger t);
const char* to_string(ApplicationStatus s);

struct DeploymentStatusInfo {
  DeploymentStatus status = DeploymentStatus::updating;
  DeploymentTrigger trigger = DeploymentTrigger::config_update_started;
  std::string message;
};

struct ApplicationStatusInfo {
  ApplicationStatus status = ApplicationStatus::deploying;
  std::string message;
};

}  // namespace troupe::controller
