#include "controller/core/deployment_status.hpp"

namespace troupe::controller {

const char* to_string(ReplicaState s) {
  switch (s) {
    case ReplicaState::starting:
      return "STARTING";
    case ReplicaState::updating:
      return "UPDATING";
    case ReplicaState::recovering:
      return "RECOVERING";
    case ReplicaState::running:
      return "RUNNING";
    case ReplicaState::stopping:
      return "STOPPING";
  }
  return "?";
}

const char* to_string(DeploymentStatus s) {
  switch (s) {
    case DeploymentStatus::updating:
      return "UPDATING";
    case DeploymentStatus::healthy:
      return "HEALTHY";
    case DeploymentStatus::unhealthy:
      return "UNHEALTHY";
    case DeploymentStatus::upscaling:
      return "UPSCALING";
    case DeploymentStatus::downscaling:
      return "DOWNSCALING";
    case DeploymentStatus::deploy_failed:
      return "DEPLOY_FAILED";
  }
  return "?";
}

const char* to_string(DeploymentTrigger t) {
  switch (t) {
    case DeploymentTrigger::unspecified:
      return "UNSPECIFIED";
    case DeploymentTrigger::config_update_started:
      return "CONFIG_UPDATE_STARTED";
    case DeploymentTrigger::config_update_completed:
      return "CONFIG_UPDATE_COMPLETED";
    case DeploymentTrigger::upscale_completed:
      return "UPSCALE_COMPLETED";
    case DeploymentTrigger::downscale_completed:
      return "DOWNSCALE_COMPLETED";
    case DeploymentTrigger::autoscaling:
      return "AUTOSCALING";
    case DeploymentTrigger::replica_startup_failed:
      return "REPLICA_STARTUP_FAILED";
    case DeploymentTrigger::health_check_failed:
      return "HEALTH_CHECK_FAILED";
    case DeploymentTrigger::deleting:
      return "DELETING";
  }
  return "?";
}

const char* to_string(ApplicationStatus s) {
  switch (s) {
    case ApplicationStatus::deploying:
      return "DEPLOYING";
    case ApplicationStatus::running:
      return "RUNNING";
    case ApplicationStatus::unhealthy:
      return "UNHEALTHY";
    case ApplicationStatus::deploy_failed:
      return "DEPLOY_FAILED";
    case ApplicationStatus::deleting:
      return "DELETING";
  }
  return "?";
}

}  // namespace troupe::controller
