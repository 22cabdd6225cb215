// Greeter: a gRPC service (greeter.proto, package troupe.examples) served
// through a node's gRPC port, decoded and encoded with its own protobuf code
// (Debian's libprotobuf). A call reaches handle() as a POST whose path is the
// method's full name, whose content-type is application/grpc, whose headers
// are the call's metadata and whose body is the request message
// (docs/grpc.md):
//   /troupe.examples.Greeter/SayHello     one HelloReply
//   /troupe.examples.Greeter/CountHellos  `count` HelloReplies, `interval_ms`
//                                         apart: one StreamWriter::write()
//                                         is one message
//   /troupe.examples.Greeter/Wait         a HelloReply after `interval_ms`,
//                                         or CANCELLED once the call is
//                                         cancelled or past its deadline
//   /troupe.examples.Greeter/Crash        aborts the replica process
// Another method is UNIMPLEMENTED (the answer's own grpc-status); a body
// that is not a HelloRequest is a 400, INVALID_ARGUMENT to the client.
//
// Over HTTP, GET /stats answers {said, streamed, cancelled, last_cancel_ns,
// replica_id}: last_cancel_ns is the steady_clock time (CLOCK_MONOTONIC, ns)
// at which a call last noticed its cancellation (0: never).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <troupe/deployment.hpp>

#include "greeter.pb.h"

namespace {

constexpr const char* kService = "/troupe.examples.Greeter/";
constexpr uint32_t kMaxCount = 100000;

troupe::Response grpc_answer(const troupe::examples::HelloReply& reply) {
  troupe::Response r;
  r.headers.emplace_back("Content-Type", "application/grpc");
  r.body = reply.SerializeAsString();
  return r;
}

}  // namespace

class Greeter : public troupe::Deployment {
 public:
  Greeter(const troupe::Json& /*init_args*/, const troupe::ReplicaContext& ctx) : ctx_(ctx) {}

  troupe::Response handle(const troupe::Request& request) override {
    if (request.header("content-type").rfind("application/grpc", 0) != 0) {
      if (request.path == "/stats") {
        return troupe::Response::json({{"said", said_.load()},
                                       {"streamed", streamed_.load()},
                                       {"cancelled", cancelled_.load()},
                                       {"last_cancel_ns", last_cancel_ns_.load()},
                                       {"replica_id", ctx_.replica_id}});
      }
      return troupe::Response::json(
          {{"error",
            "Greeter is a gRPC service (examples/grpc/greeter.proto); over HTTP "
            "it serves GET /stats only"}},
          404);
    }
    troupe::examples::HelloRequest in;
    if (!in.ParseFromString(request.body)) {
      return troupe::Response::json(
          {{"error", "the request message is not a troupe.examples.HelloRequest"}}, 400);
    }
    const std::string method = request.path.rfind(kService, 0) == 0
                                   ? request.path.substr(std::string(kService).size())
                                   : std::string();
    if (method == "SayHello") {
      ++said_;
      troupe::examples::HelloReply reply;
      reply.set_message("Hello, " + in.name() + "!");
      reply.set_replica_id(ctx_.replica_id);
      return grpc_answer(reply);
    }
    if (method == "CountHellos")
      return count(request, in);
    if (method == "Wait") {
      if (request.wait_cancelled(std::chrono::milliseconds(in.interval_ms()))) {
        noticed_cancel();
        return troupe::Response::json({{"error", "the call was cancelled"}}, 499);
      }
      troupe::examples::HelloReply reply;
      reply.set_message("waited " + std::to_string(in.interval_ms()) + " ms");
      reply.set_replica_id(ctx_.replica_id);
      return grpc_answer(reply);
    }
    if (method == "Crash")
      std::abort();
    troupe::Response r = troupe::Response::json({{"error", "no such method"}}, 404);
    r.headers.emplace_back("grpc-status", "12");
    r.headers.emplace_back("grpc-message", "Greeter has no method '" + request.path + "'");
    return r;
  }

 private:
  troupe::Response count(const troupe::Request& request, const troupe::examples::HelloRequest& in) {
    if (in.count() > kMaxCount) {
      return troupe::Response::json({{"error", "count " + std::to_string(in.count()) + " is over " +
                                                   std::to_string(kMaxCount)}},
                                    400);
    }
    const uint32_t n = in.count() == 0 ? 1 : in.count();
    const auto interval = std::chrono::milliseconds(in.interval_ms());
    troupe::Response r = troupe::Response::streaming(
        [this, n, interval, name = in.name(), &request](troupe::StreamWriter& out) {
          for (uint32_t i = 0; i < n; ++i) {
            troupe::examples::HelloReply reply;
            reply.set_message("Hello, " + name + "!");
            reply.set_index(i);
            reply.set_replica_id(ctx_.replica_id);
            if (!out.write(reply.SerializeAsString())) {
              if (request.cancelled())
                noticed_cancel();
              return;
            }
            ++streamed_;
            if (i + 1 < n && interval.count() > 0 && request.wait_cancelled(interval)) {
              noticed_cancel();
              return;
            }
          }
        },
        "application/grpc");
    return r;
  }

  void noticed_cancel() {
    last_cancel_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
    ++cancelled_;
  }

  const troupe::ReplicaContext ctx_;
  std::atomic<int64_t> said_{0};
  std::atomic<int64_t> streamed_{0};
  std::atomic<int64_t> cancelled_{0};
  std::atomic<int64_t> last_cancel_ns_{0};
};

TROUPE_DEPLOYMENT(Greeter)
