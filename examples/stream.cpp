// Streaming answers (Response::event_stream, Response::streaming) that stop
// as soon as their client leaves.
//
// Ticker: `?n=N&ms=M` (defaults 5 and 200) answers server-sent events
// `data: 0` ... `data: N-1`, M ms apart; `?fail_after=K` throws after K
// events (the client sees the stream end without its final chunk).
// Bytes: `?mb=N&chunk=K` (defaults 1 and 65536) streams exactly N MiB of a
// fixed pattern in chunks of K bytes (application/octet-stream).
// Relay: an ingress that streams what another deployment (init_args `to`,
// default Ticker) streams, piece by piece through a deployment handle.
// Both answer their statistics at `/stats` (JSON): how many streams started,
// completed and were cancelled, what was sent, and `last_cancel_ns`, the
// steady_clock time (CLOCK_MONOTONIC, ns) at which a producer last noticed
// that its stream was cancelled (0: never).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <troupe/deployment.hpp>

#include "example_util.hpp"

namespace {

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ?name= as an integer in [min, max]; `fallback` when absent; -1 when
// invalid.
int64_t bounded_param(const troupe::Request& request, const char* name, int64_t fallback,
                      int64_t min, int64_t max) {
  const std::string text = request.query_param(name);
  if (text.empty())
    return fallback;
  int64_t value = troupe_examples::parse_bounded(text, max);
  return value < min ? -1 : value;
}

troupe::Response bad_param(const troupe::Request& request, const char* name, int64_t min,
                           int64_t max) {
  return troupe::Response::json(
      {{"error", std::string(name) + " must be an integer in [" + std::to_string(min) + ", " +
                     std::to_string(max) + "], got '" + request.query_param(name) + "'"}},
      400);
}

}  // namespace

class Ticker : public troupe::Deployment {
 public:
  Ticker(const troupe::Json& /*init_args*/, const troupe::ReplicaContext& ctx) : ctx_(ctx) {}

  troupe::Response handle(const troupe::Request& request) override {
    if (request.path == "/stats") {
      return troupe::Response::json({{"streams_started", streams_started_.load()},
                                     {"streams_completed", streams_completed_.load()},
                                     {"streams_cancelled", streams_cancelled_.load()},
                                     {"streams_failed", streams_failed_.load()},
                                     {"events_sent", events_sent_.load()},
                                     {"last_cancel_ns", last_cancel_ns_.load()},
                                     {"replica_id", ctx_.replica_id}});
    }
    constexpr int64_t kMaxN = 100000, kMaxMs = 60000;
    const int64_t n = bounded_param(request, "n", 5, 0, kMaxN);
    if (n < 0)
      return bad_param(request, "n", 0, kMaxN);
    const int64_t ms = bounded_param(request, "ms", 200, 0, kMaxMs);
    if (ms < 0)
      return bad_param(request, "ms", 0, kMaxMs);
    // -1: never fails.
    int64_t fail_after = -1;
    if (!request.query_param("fail_after").empty()) {
      fail_after = bounded_param(request, "fail_after", -1, 0, kMaxN);
      if (fail_after < 0)
        return bad_param(request, "fail_after", 0, kMaxN);
    }
    // The producer runs after handle() returned, on this thread; `request`
    // stays valid meanwhile.
    return troupe::Response::event_stream([this, n, ms, fail_after,
                                           &request](troupe::StreamWriter& out) {
      ++streams_started_;
      for (int64_t i = 0; i < n; ++i) {
        if (i == fail_after) {
          ++streams_failed_;
          throw std::runtime_error("Ticker: failing after " + std::to_string(i) +
                                   " events, as asked (fail_after)");
        }
        if (!out.event(std::to_string(i)))
          return cancelled();
        ++events_sent_;
        if (i + 1 < n && request.wait_cancelled(std::chrono::milliseconds(ms)))
          return cancelled();
      }
      if (fail_after == n) {
        ++streams_failed_;
        throw std::runtime_error("Ticker: failing after " + std::to_string(n) +
                                 " events, as asked (fail_after)");
      }
      ++streams_completed_;
    });
  }

 private:
  void cancelled() {
    last_cancel_ns_ = steady_now_ns();
    ++streams_cancelled_;
  }

  const troupe::ReplicaContext ctx_;
  std::atomic<int64_t> streams_started_{0};
  std::atomic<int64_t> streams_completed_{0};
  std::atomic<int64_t> streams_cancelled_{0};
  std::atomic<int64_t> streams_failed_{0};
  std::atomic<int64_t> events_sent_{0};
  std::atomic<int64_t> last_cancel_ns_{0};
};

TROUPE_DEPLOYMENT(Ticker)

class Bytes : public troupe::Deployment {
 public:
  Bytes(const troupe::Json& /*init_args*/, const troupe::ReplicaContext& ctx) : ctx_(ctx) {}

  troupe::Response handle(const troupe::Request& request) override {
    if (request.path == "/stats") {
      return troupe::Response::json({{"streams_started", streams_started_.load()},
                                     {"streams_completed", streams_completed_.load()},
                                     {"streams_cancelled", streams_cancelled_.load()},
                                     {"bytes_sent", bytes_sent_.load()},
                                     {"last_cancel_ns", last_cancel_ns_.load()},
                                     {"replica_id", ctx_.replica_id}});
    }
    constexpr int64_t kMaxMb = 1024, kMaxChunk = 4 * 1024 * 1024;
    const int64_t mb = bounded_param(request, "mb", 1, 1, kMaxMb);
    if (mb < 0)
      return bad_param(request, "mb", 1, kMaxMb);
    const int64_t chunk = bounded_param(request, "chunk", 65536, 1, kMaxChunk);
    if (chunk < 0)
      return bad_param(request, "chunk", 1, kMaxChunk);
    return troupe::Response::streaming(
        [this, mb, chunk](troupe::StreamWriter& out) {
          ++streams_started_;
          // A fixed pattern: byte i of the stream is 'a' + i % 26 when every
          // chunk is a multiple of 26 long, else it repeats per chunk.
          std::string pattern(static_cast<std::size_t>(chunk), '\0');
          for (std::size_t i = 0; i < pattern.size(); ++i)
            pattern[i] = static_cast<char>('a' + i % 26);
          int64_t left = mb * 1024 * 1024;
          while (left > 0) {
            const auto size = static_cast<std::size_t>(std::min<int64_t>(left, chunk));
            if (!out.write(std::string_view(pattern).substr(0, size))) {
              last_cancel_ns_ = steady_now_ns();
              ++streams_cancelled_;
              return;
            }
            bytes_sent_ += static_cast<int64_t>(size);
            left -= static_cast<int64_t>(size);
          }
          ++streams_completed_;
        },
        "application/octet-stream");
  }

 private:
  const troupe::ReplicaContext ctx_;
  std::atomic<int64_t> streams_started_{0};
  std::atomic<int64_t> streams_completed_{0};
  std::atomic<int64_t> streams_cancelled_{0};
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> last_cancel_ns_{0};
};

TROUPE_DEPLOYMENT(Bytes)

// Relay: an ingress that streams what another deployment of its application
// streams, through a deployment handle (DeploymentHandle::stream): every path
// and query goes to the deployment named by init_args `to` (default
// "Ticker"), and each piece is written on as it arrives. The reader's pace
// reaches the producer (a slow client slows the Ticker too), and a client
// that leaves cancels both. A callee that fails mid-stream makes this stream
// end early as well.
class Relay : public troupe::Deployment {
 public:
  Relay(const troupe::Json& init_args, const troupe::ReplicaContext& ctx)
      : to_(ctx.handle(init_args.value("to", std::string("Ticker")))) {}

  troupe::Response handle(const troupe::Request& request) override {
    troupe::Request forwarded;
    forwarded.path = request.path;
    forwarded.query = request.query;
    auto in = std::make_shared<troupe::ResponseStream>(to_.stream(forwarded));
    int status = in->status();
    std::string content_type = "application/octet-stream";
    for (const auto& [name, value] : in->headers()) {
      if (troupe::detail::ascii_iequals(name, "Content-Type"))
        content_type = value;
    }
    return troupe::Response::streaming(
        [in](troupe::StreamWriter& out) {
          std::string piece;
          while (in->next(piece)) {
            if (!out.write(piece)) {
              in->cancel();
              return;
            }
          }
          if (!in->complete())
            throw std::runtime_error("the relayed stream ended early");
        },
        content_type, status);
  }

 private:
  troupe::DeploymentHandle to_;
};

TROUPE_DEPLOYMENT(Relay)
