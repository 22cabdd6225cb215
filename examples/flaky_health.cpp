// FlakyHealth: passes the first N health checks, then fails every one. N is
// `healthy_checks` from user_config, else from init args, else 3.
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <troupe/deployment.hpp>

namespace {

int64_t healthy_checks_field(const troupe::Json& obj, int64_t fallback, const std::string& what) {
  if (!obj.is_object() || !obj.contains("healthy_checks"))
    return fallback;
  const auto& value = obj.at("healthy_checks");
  if (!value.is_number_integer() || value.get<int64_t>() < 0) {
    throw std::invalid_argument(what + ".healthy_checks must be a non-negative integer, got " +
                                value.dump());
  }
  return value.get<int64_t>();
}

}  // namespace

class FlakyHealth : public troupe::Deployment {
 public:
  FlakyHealth(const troupe::Json& init_args, const troupe::ReplicaContext& ctx)
      : ctx_(ctx),
        from_init_args_(healthy_checks_field(init_args, 3, "FlakyHealth: init args")),
        healthy_checks_(from_init_args_) {}

  void reconfigure(const troupe::Json& user_config) override {
    healthy_checks_ =
        healthy_checks_field(user_config, from_init_args_, "FlakyHealth: user_config");
  }

  // Counts every call; a new user_config changes N but not the count.
  void check_health() override {
    const int64_t n = healthy_checks_.load();
    if (++checks_ > n) {
      throw std::runtime_error("unhealthy after " + std::to_string(n) + " checks");
    }
  }

  troupe::Response handle(const troupe::Request& /*request*/) override {
    return troupe::Response::json({{"checks", checks_.load()},
                                   {"healthy_checks", healthy_checks_.load()},
                                   {"replica_id", ctx_.replica_id}});
  }

 private:
  const troupe::ReplicaContext ctx_;
  const int64_t from_init_args_;
  std::atomic<int64_t> healthy_checks_;
  std::atomic<int64_t> checks_{0};
};

TROUPE_DEPLOYMENT(FlakyHealth)
