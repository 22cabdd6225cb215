// InlineProbe: a deployment that declares its handler non-blocking (unless
// `args: {nonblocking: false}`), for the tests of the proxy's inline path
// (proxy/inline_path.cpp). Query parameters:
//   mode=ok (default)  {"replica_id", "max_running", "served"}: max_running is
//                      the most calls this replica ever ran at once, which
//                      max_ongoing_requests bounds on either path
//   spin_us=N          computes (a busy loop, no wait) for N microseconds
//                      first, so that concurrent requests overlap
//   mode=throw         throws std::runtime_error("probe failure")
//   mode=stream&n=N    a streamed answer of N lines "piece <i>\n"
//   mode=big&bytes=N   a text/plain answer of N bytes
//   mode=log&text=T    writes T to the replica's log (ctx.log, level info)
//                      and answers as mode=ok
// Every call counts in the user metric probe_calls_total{mode} (ok or
// throw; the other modes are not counted).
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>

#include <troupe/deployment.hpp>

class InlineProbe : public troupe::Deployment {
 public:
  InlineProbe(const troupe::Json& args, const troupe::ReplicaContext& ctx)
      : ctx_(ctx),
        nonblocking_(args.value("nonblocking", true)),
        calls_ok_(ctx.counter("probe_calls_total", "Calls of the probe by mode.", {{"mode", "ok"}})),
        calls_throw_(
            ctx.counter("probe_calls_total", "Calls of the probe by mode.", {{"mode", "throw"}})) {}

  troupe::Response handle(const troupe::Request& request) override {
    const std::string mode = request.query_param("mode", "ok");
    if (mode == "throw") {
      calls_throw_->inc();
      throw std::runtime_error("probe failure");
    }
    if (mode == "stream") {
      int n = std::stoi(request.query_param("n", "3"));
      return troupe::Response::streaming(
          [n](troupe::StreamWriter& out) {
            for (int i = 0; i < n; ++i) {
              if (!out.write("piece " + std::to_string(i) + "\n"))
                return;
            }
          },
          "text/plain");
    }
    if (mode == "big") {
      troupe::Response big;
      big.headers = {{"Content-Type", "text/plain"}};
      big.body.assign(std::stoul(request.query_param("bytes", "0")), 'b');
      for (size_t i = 0; i < big.body.size(); i += 1000)
        big.body[i] = static_cast<char>('0' + (i / 1000) % 10);
      return big;
    }
    if (mode == "log")
      ctx_.log(troupe::LogLevel::info, request.query_param("text", ""));
    calls_ok_->inc();
    int now = ++running_;
    int seen = max_running_.load();
    while (now > seen && !max_running_.compare_exchange_weak(seen, now)) {
    }
    auto until = std::chrono::steady_clock::now() +
                 std::chrono::microseconds(std::stoi(request.query_param("spin_us", "0")));
    while (std::chrono::steady_clock::now() < until) {
    }
    --running_;
    uint64_t served = ++served_;
    return troupe::Response::json({{"replica_id", ctx_.replica_id},
                                   {"max_running", max_running_.load()},
                                   {"served", served}});
  }

  bool nonblocking() const override { return nonblocking_; }

 private:
  const troupe::ReplicaContext ctx_;
  const bool nonblocking_;
  const std::shared_ptr<troupe::Counter> calls_ok_;
  const std::shared_ptr<troupe::Counter> calls_throw_;
  std::atomic<int> running_{0};
  std::atomic<int> max_running_{0};
  std::atomic<uint64_t> served_{0};
};

TROUPE_DEPLOYMENT(InlineProbe)
