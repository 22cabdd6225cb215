// Sleep: blocks the request for ?ms=N, else user_config {ms: N}, else 100 ms.
// Useful to fill max_ongoing_requests and to test timeouts. It waits with
// Request::wait_cancelled, so a request whose client left (or whose deadline
// passed) ends at once with 499 {"cancelled": true, "slept_ms": <actual>}.
// `?cancel=ignore` sleeps without looking at cancellation: a handler that
// never returns early (stuck replicas, tests/integration/stuck_test.cpp).
// `/stats` answers {completed, cancelled, last_cancel_ns, replica_id}:
// last_cancel_ns is the steady_clock time (CLOCK_MONOTONIC, ns) at which a
// request last noticed its cancellation (0: never).
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
    if (request.path == "/stats") {
      return troupe::Response::json({{"completed", completed_.load()},
                                     {"cancelled", cancelled_.load()},
                                     {"last_cancel_ns", last_cancel_ns_.load()},
                                     {"replica_id", ctx_.replica_id}});
    }
    int64_t ms = default_ms_.load();
    const std::string text = request.query_param("ms");
    if (!text.empty()) {
      ms = troupe_examples::parse_ms(text);
      if (ms < 0)
        return troupe_examples::bad_ms(text);
    }
    const auto start = std::chrono::steady_clock::now();
    if (request.query_param("cancel") == "ignore") {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      ++completed_;
      return troupe::Response::json({{"slept_ms", ms}, {"replica_id", ctx_.replica_id}});
    }
    if (request.wait_cancelled(std::chrono::milliseconds(ms))) {
      const auto now = std::chrono::steady_clock::now();
      last_cancel_ns_ =
          std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
      ++cancelled_;
      const int64_t slept =
          std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count();
      return troupe::Response::json({{"cancelled", true}, {"slept_ms", slept}}, 499);
    }
    ++completed_;
    return troupe::Response::json({{"slept_ms", ms}, {"replica_id", ctx_.replica_id}});
  }

 private:
  const troupe::ReplicaContext ctx_;
  std::atomic<int64_t> default_ms_{100};
  std::atomic<int64_t> completed_{0};
  std::atomic<int64_t> cancelled_{0};
  std::atomic<int64_t> last_cancel_ns_{0};
};

TROUPE_DEPLOYMENT(Sleep)
