// Declared applications for the integration tests.
#pragma once

#include <cstdint>
#include <string>

#include "controller/core/model.hpp"

namespace troupe::testing {

// An application whose only (ingress) deployment is the class `cls` of
// libtroupe_examples.so, code version v1, with the short health-check and
// graceful-shutdown settings the integration tests use. Tests change what
// they need on the result.
inline controller::ApplicationSpec example_app(const std::string& name, const std::string& prefix,
                                               const std::string& cls, uint32_t replicas) {
  controller::DeploymentSpec d;
  d.name = cls;
  d.import_path = "libtroupe_examples.so:" + cls;
  d.code_version = "v1";
  d.config.num_replicas = replicas;
  d.config.health_check_period_s = 0.5;
  d.config.health_check_timeout_s = 2;
  d.config.graceful_shutdown_wait_loop_s = 0.2;
  d.config.graceful_shutdown_timeout_s = 2;
  controller::ApplicationSpec app;
  app.name = name;
  app.route_prefix = prefix;
  app.ingress = cls;
  app.deployments = {d};
  return app;
}

}  // namespace troupe::testing
