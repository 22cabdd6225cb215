// Noop: answers every request with the same small JSON body, doing no work —
// the deployment the HTTP benchmark measures the data path with (the same
// answer nginx gives in the benchmark's "nginx direct" case).
#include <troupe/deployment.hpp>

class Noop : public troupe::Deployment {
 public:
  Noop(const troupe::Json& /*init_args*/, const troupe::ReplicaContext& /*ctx*/) {}

  troupe::Response handle(const troupe::Request& /*request*/) override {
    troupe::Response r;
    r.status = 200;
    r.headers = {{"Content-Type", "application/json"}};
    r.body = R"({"ok":true})";
    return r;
  }

  // It only builds a constant: an in-process replica is called inline by the
  // node's proxy (no hand-off to a request thread).
  bool nonblocking() const override { return true; }
};

TROUPE_DEPLOYMENT(Noop)
