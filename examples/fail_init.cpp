// FailInit: a replica that never starts; its constructor throws init args
// `message` (default "FailInit always fails to start").
#include <stdexcept>
#include <string>

#include <troupe/deployment.hpp>

class FailInit : public troupe::Deployment {
 public:
  explicit FailInit(const troupe::Json& init_args) {
    std::string message = "FailInit always fails to start";
    if (init_args.is_object() && init_args.contains("message") &&
        init_args.at("message").is_string()) {
      message = init_args.at("message").get<std::string>();
    }
    throw std::runtime_error(message);
  }

  troupe::Response handle(const troupe::Request& /*request*/) override {
    return troupe::Response::text("unreachable\n", 500);
  }
};

TROUPE_DEPLOYMENT(FailInit)
