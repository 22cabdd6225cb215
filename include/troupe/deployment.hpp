// The C++ API for writing a troupe deployment.
//
// A deployment is a class derived from troupe::Deployment, constructed from
// its init args, compiled into a shared library and registered with
// TROUPE_DEPLOYMENT(ClassName). A config names it as
// `import_path: libmy_models.so:ClassName`.
//
//   #include <troupe/deployment.hpp>
//
//   class Hello : public troupe::Deployment {
//    public:
//     explicit Hello(const troupe::Json& args) {}
//     void reconfigure(const troupe::Json& user_config) override {
//       std::lock_guard<std::mutex> lock(mutex_);
//       greeting_ = user_config.value("greeting", "hello");
//     }
//     troupe::Response handle(const troupe::Request& request) override {
//       std::lock_guard<std::mutex> lock(mutex_);
//       return troupe::Response::text(greeting_ + "\n");
//     }
//    private:
//     std::mutex mutex_;
//     std::string greeting_ = "hello";
//   };
//   TROUPE_DEPLOYMENT(Hello)
//
// Threading: the constructor, reconfigure() and check_health() run on the
// replica's control thread; handle() runs on the replica's request threads,
// up to max_ongoing_requests of them at once, possibly while reconfigure() or
// check_health() runs. Guard shared state accordingly. User code never runs on
// the threads of the controller, the proxy or the node agent, so it may block.
//
// Errors: an exception from the constructor is a start failure whose message
// reaches the deployment's status; from check_health() it marks the replica
// unhealthy; from handle() it becomes a 500 response carrying the message,
// and the replica lives on.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe {

// Bumped whenever this header changes in a way that breaks binary
// compatibility; a library built against another version is refused.
constexpr uint32_t kDeploymentAbiVersion = 1;

using Json = nlohmann::json;
using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string path;    // after the application's route prefix; starts with '/'
  std::string query;   // raw query string without '?', e.g. "ms=10&x=1"
  Headers headers;
  std::string body;

  // First header of that name (case-insensitive), or "".
  std::string header(const std::string& name) const;
  // Percent-decoded value of a query parameter, or `fallback`.
  std::string query_param(const std::string& name, const std::string& fallback = "") const;
};

struct Response {
  int status = 200;
  Headers headers;
  std::string body;

  static Response text(std::string body, int status = 200);
  static Response json(const Json& value, int status = 200);
};

class Deployment {
 public:
  virtual ~Deployment() = default;

  // Called once after construction with the deployment's user_config (when
  // it has one), and again whenever only the user_config changes: the replica
  // is not restarted.
  virtual void reconfigure(const Json& user_config) { (void)user_config; }

  // Called every health_check_period_s. Throw to report the replica unhealthy.
  virtual void check_health() {}

  virtual Response handle(const Request& request) = 0;
};

// What TROUPE_DEPLOYMENT exports for each class.
struct DeploymentFactory {
  uint32_t abi_version;
  const char* class_name;
  std::unique_ptr<Deployment> (*create)(const Json& init_args);
};

// Name of the exported symbol for a class: "troupe_deployment_<Class>".
inline std::string deployment_symbol(const std::string& class_name) {
  return "troupe_deployment_" + class_name;
}

}  // namespace troupe

#define TROUPE_DEPLOYMENT(CLASS)                                                    \
  extern "C" __attribute__((visibility("default"))) const ::troupe::DeploymentFactory* \
      troupe_deployment_##CLASS() {                                                \
    static const ::troupe::DeploymentFactory factory{                              \
        ::troupe::kDeploymentAbiVersion, #CLASS,                                   \
        [](const ::troupe::Json& args) -> std::unique_ptr<::troupe::Deployment> {  \
          return std::unique_ptr<::troupe::Deployment>(new CLASS(args));           \
        }};                                                                         \
    return &factory;                                                               \
  }
