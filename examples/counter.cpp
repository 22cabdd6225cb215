// Counter: counts the requests this replica served (state is per replica).
#include <atomic>
#include <cstdint>

#include <troupe/deployment.hpp>

class Counter : public troupe::Deployment {
 public:
  Counter(const troupe::Json& /*init_args*/, const troupe::ReplicaContext& ctx) : ctx_(ctx) {}

  troupe::Response handle(const troupe::Request& /*request*/) override {
    const int64_t count = count_.fetch_add(1) + 1;  // concurrent requests each get their own
    return troupe::Response::json(
        {{"count", count}, {"replica_id", ctx_.replica_id}, {"node_id", ctx_.node_id}});
  }

 private:
  const troupe::ReplicaContext ctx_;
  std::atomic<int64_t> count_{0};
};

TROUPE_DEPLOYMENT(Counter)
