// Sleep: blocks the request for ?ms=N, else user_config {ms: N}, else 100 ms.
// Useful to fill max_ongoing_requests and to test timeouts.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include <troupe/deployment.hpp>

#include "example_util.hpp"

class Sleep : public troupe::Deployment {
 public:
  Sleep(const troupe::Json& /*init_args*/, const troupe::ReplicaContext& ctx) : ctx_(ctx) {}

  void reconfigure(const troupe::Json& user_config) override {
    default_ms_ = troupe_examples::ms_field(user_config, "ms", 100, "Sleep: user_config");
  }

  troupe::Response handle(const troupe::Request& request) override {
    int64_t ms = default_ms_.load();
    const std::string text = request.query_param("ms");
    if (!text.empty()) {
      ms = troupe_examples::parse_ms(text);
      if (ms < 0)
        return troupe_examples::bad_ms(text);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return troupe::Response::json({{"slept_ms", ms}, {"replica_id", ctx_.replica_id}});
  }

 private:
  const troupe::ReplicaContext ctx_;
  std::atomic<int64_t> default_ms_{100};
};

TROUPE_DEPLOYMENT(Sleep)
