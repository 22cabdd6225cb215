// Fixed: answers every request with the same small JSON body, like Noop, but
// with a handler of the default kind (blocking: it may take its time), as
// users' handlers are: troupe calls it inline only while its calls stay
// short (runtime/inline_gate.hpp). What tools/bench/http measures troupe's
// defaults with: the same work as nginx's `return 200` in the benchmark.
#include <troupe/deployment.hpp>

class Fixed : public troupe::Deployment {
 public:
  Fixed(const troupe::Json& /*init_args*/, const troupe::ReplicaContext& /*ctx*/) {}

  troupe::Response handle(const troupe::Request& /*request*/) override {
    troupe::Response r;
    r.status = 200;
    r.headers = {{"Content-Type", "application/json"}};
    r.body = R"({"ok":true})";
    return r;
  }
};

TROUPE_DEPLOYMENT(Fixed)
