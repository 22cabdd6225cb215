// Echo: returns the request as JSON, with the replica that served it.
#include <troupe/deployment.hpp>

class Echo : public troupe::Deployment {
 public:
  Echo(const troupe::Json& /*init_args*/, const troupe::ReplicaContext& ctx) : ctx_(ctx) {}

  troupe::Response handle(const troupe::Request& request) override {
    // Repeated headers are joined with ", " as HTTP allows.
    troupe::Json headers = troupe::Json::object();
    for (const auto& [name, value] : request.headers) {
      auto it = headers.find(name);
      if (it == headers.end()) {
        headers[name] = value;
      } else {
        *it = it->get<std::string>() + ", " + value;
      }
    }
    return troupe::Response::json({{"method", request.method},
                                   {"path", request.path},
                                   {"query", request.query},
                                   {"headers", headers},
                                   {"body", request.body},
                                   {"replica_id", ctx_.replica_id},
                                   {"node_id", ctx_.node_id}});
  }

 private:
  const troupe::ReplicaContext ctx_;  // immutable: safe to read from any thread
};

TROUPE_DEPLOYMENT(Echo)
