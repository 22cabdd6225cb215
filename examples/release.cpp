// Release: a stand-in for one release of a model server, to try rollouts.
// Init args (each optional):
//   release          a label the answers carry ("v1")
//   status           the HTTP status every answer has (200)
//   unhealthy_for_ms check_health() fails for this long after the
//                    constructor, then passes (0); "forever" never passes,
//                    like a release that loaded broken weights.
// A change of init args is a new version: the replicas are replaced through
// the rolling update, whose start-up gate keeps a release that fails its
// first health check from ever taking traffic.
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <troupe/deployment.hpp>

#include "example_util.hpp"

class Release : public troupe::Deployment {
 public:
  Release(const troupe::Json& args, const troupe::ReplicaContext& ctx)
      : ctx_(ctx),
        release_(string_arg(args, "release", "v1")),
        status_(status_arg(args)),
        forever_(args.is_object() && args.contains("unhealthy_for_ms") &&
                 args.at("unhealthy_for_ms") == "forever"),
        unhealthy_for_(forever_ ? 0
                                : troupe_examples::ms_field(args, "unhealthy_for_ms", 0,
                                                            "Release: init args")),
        born_(std::chrono::steady_clock::now()) {}

  void check_health() override {
    if (forever_)
      throw std::runtime_error("release " + release_ + ": the model's weights did not load");
    auto age = std::chrono::steady_clock::now() - born_;
    if (age < std::chrono::milliseconds(unhealthy_for_)) {
      throw std::runtime_error("release " + release_ + ": still warming up");
    }
  }

  troupe::Response handle(const troupe::Request& /*request*/) override {
    return troupe::Response::json(
        {{"release", release_}, {"replica_id", ctx_.replica_id}, {"node_id", ctx_.node_id}},
        status_);
  }

 private:
  static std::string string_arg(const troupe::Json& args, const char* key, const char* fallback) {
    if (!args.is_object() || !args.contains(key))
      return fallback;
    if (!args.at(key).is_string()) {
      throw std::invalid_argument(std::string("Release: init args.") + key +
                                  " must be a string, got " + args.at(key).dump());
    }
    return args.at(key).get<std::string>();
  }

  static int status_arg(const troupe::Json& args) {
    if (!args.is_object() || !args.contains("status"))
      return 200;
    const auto& v = args.at("status");
    if (!v.is_number_integer() || v.get<int64_t>() < 100 || v.get<int64_t>() > 599) {
      throw std::invalid_argument("Release: init args.status must be an HTTP status, got " +
                                  v.dump());
    }
    return static_cast<int>(v.get<int64_t>());
  }

  const troupe::ReplicaContext ctx_;
  const std::string release_;
  const int status_;
  const bool forever_;
  const int64_t unhealthy_for_;
  const std::chrono::steady_clock::time_point born_;
};

TROUPE_DEPLOYMENT(Release)
