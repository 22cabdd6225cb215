// TEST ONLY (libtroupe_bad_abi.so): exports a deployment that claims
// deployment ABI version 999, so tests can check that the loader refuses a
// library built against another version of <troupe/deployment.hpp>. Written
// by hand instead of with TROUPE_DEPLOYMENT, which always stamps the current
// version. Never name it in a config.
#include <memory>
#include <stdexcept>

#include <troupe/deployment.hpp>

namespace {

std::unique_ptr<troupe::Deployment> create_bad_abi(const troupe::Json&,
                                                   const troupe::ReplicaContext&) {
  throw std::logic_error("BadAbi must never be constructed: its ABI version is wrong");
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const troupe::DeploymentFactory*
troupe_deployment_BadAbi() {
  static const troupe::DeploymentFactory factory{999, "BadAbi", &create_bad_abi, false};
  return &factory;
}
