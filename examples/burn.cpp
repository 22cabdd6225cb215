// Burn: keeps a CPU busy for ?ms=N (default 10) to exercise load.
#include <chrono>
#include <cstdint>

#include <troupe/deployment.hpp>

#include "example_util.hpp"

class Burn : public troupe::Deployment {
 public:
  explicit Burn(const troupe::Json& /*init_args*/) {}

  troupe::Response handle(const troupe::Request& request) override {
    const std::string text = request.query_param("ms", "10");
    const int64_t ms = troupe_examples::parse_ms(text);
    if (ms < 0)
      return troupe_examples::bad_ms(text);
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
    volatile uint64_t sink = 0;  // volatile: the loop must not be optimized away
    while (Clock::now() < deadline) {
      for (int i = 0; i < 1000; ++i)
        sink = sink * 6364136223846793005ULL + 1;
    }
    return troupe::Response::json({{"burned_ms", ms}});
  }
};

TROUPE_DEPLOYMENT(Burn)
