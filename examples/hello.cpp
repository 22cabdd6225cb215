// Hello: a greeting taken from user_config {greeting: ...}; changing it
// reconfigures the replica in place.
#include <mutex>
#include <stdexcept>
#include <string>

#include <troupe/deployment.hpp>

class Hello : public troupe::Deployment {
 public:
  Hello(const troupe::Json& /*init_args*/, const troupe::ReplicaContext& ctx) : ctx_(ctx) {}

  // A missing greeting goes back to the default; a non-string one fails the
  // replica (see the Errors rules in deployment.hpp).
  void reconfigure(const troupe::Json& user_config) override {
    std::string greeting = "hello";
    if (user_config.is_object() && user_config.contains("greeting")) {
      const auto& value = user_config.at("greeting");
      if (!value.is_string()) {
        throw std::invalid_argument("Hello: user_config.greeting must be a string, got " +
                                    value.dump());
      }
      greeting = value.get<std::string>();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    greeting_ = std::move(greeting);
  }

  troupe::Response handle(const troupe::Request& /*request*/) override {
    std::string greeting;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      greeting = greeting_;
    }
    return troupe::Response::json({{"greeting", greeting},
                                   {"replica_id", ctx_.replica_id},
                                   {"node_id", ctx_.node_id},
                                   {"version", ctx_.version}});
  }

 private:
  const troupe::ReplicaContext ctx_;
  std::mutex mutex_;  // guards greeting_: reconfigure() races with handle()
  std::string greeting_ = "hello";
};

TROUPE_DEPLOYMENT(Hello)
