// Composition: an ingress deployment (Gateway) that calls two other
// deployments of its application (Upper, Reverse) through deployment handles,
// in parallel, and combines their answers. Handles route like the proxy does
// (include/troupe/deployment.hpp, "Deployment handles"), so the three
// deployments may have their replicas on any nodes.
//
//   GET /compose/?text=Hello  (or POST the text as the body) ->
//     {"input": "Hello",
//      "upper": {"text": "HELLO", "replica_id": ..., "node_id": ...},
//      "reverse": {"text": "olleH", "replica_id": ..., "node_id": ...},
//      "gateway": {"replica_id": ..., "node_id": ...}}
//   GET /compose/call/<Deployment>?text=...  -> that deployment's own answer,
//     passed through as it is (an unknown name: the handle's 404)
//   GET /compose/timed/<Deployment>?wait_ms=W&<query>  -> waits W ms, then
//     calls that deployment with GET and <query> (without wait_ms) and
//     answers {"status": <its status>, "elapsed_ms": <the call's duration>,
//     "query": <the query it sent>};
//     the call inherits what is left of this request's deadline, so with
//     request_timeout_s 1 and wait_ms=700 it gets about 300 ms.
//   GET /compose/last  -> the last /timed answer of this replica (the client
//     of a /timed request may have had its own 504 before it came).
#include <algorithm>
#include <cctype>
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>

#include <troupe/deployment.hpp>

namespace {

// The answer of one handle call as JSON: a 200 with a JSON body is that body;
// anything else is {status, body} and makes the whole request fail.
bool decode(const troupe::Response& r, troupe::Json& out) {
  if (r.status == 200) {
    out = troupe::Json::parse(r.body, nullptr, false);
    if (!out.is_discarded())
      return true;
  }
  out = {{"status", r.status}, {"body", r.body}};
  return false;
}

troupe::Response text_answer(const troupe::ReplicaContext& ctx, std::string text) {
  return troupe::Response::json(
      {{"text", std::move(text)}, {"replica_id", ctx.replica_id}, {"node_id", ctx.node_id}});
}

}  // namespace

class Gateway : public troupe::Deployment {
 public:
  Gateway(const troupe::Json& /*init_args*/, const troupe::ReplicaContext& ctx)
      : ctx_(ctx), upper_(ctx.handle("Upper")), reverse_(ctx.handle("Reverse")) {}

  troupe::Response handle(const troupe::Request& request) override {
    std::string text = request.body.empty() ? request.query_param("text") : request.body;
    static const std::string kCall = "/call/";
    static const std::string kTimed = "/timed/";
    if (request.path.compare(0, kTimed.size(), kTimed) == 0)
      return timed(request, request.path.substr(kTimed.size()));
    if (request.path == "/last") {
      std::lock_guard<std::mutex> lock(mutex_);
      return troupe::Response::json(last_timed_);
    }
    if (request.path.compare(0, kCall.size(), kCall) == 0) {
      // Any deployment of this application by name, answered as it is.
      troupe::Request forwarded;
      forwarded.method = "POST";
      forwarded.body = text;
      return ctx_.handle(request.path.substr(kCall.size())).call(forwarded);
    }
    troupe::Request sub;
    sub.method = "POST";
    sub.body = text;
    // Both calls are in flight at once; each future always gets a Response.
    std::future<troupe::Response> upper = upper_.call_async(sub);
    std::future<troupe::Response> reverse = reverse_.call_async(sub);
    troupe::Json upper_json, reverse_json;
    bool upper_ok = decode(upper.get(), upper_json);
    bool reverse_ok = decode(reverse.get(), reverse_json);
    troupe::Json out = {{"input", text},
                        {"upper", upper_json},
                        {"reverse", reverse_json},
                        {"gateway", {{"replica_id", ctx_.replica_id}, {"node_id", ctx_.node_id}}}};
    if (!upper_ok || !reverse_ok) {
      out["error"] = !upper_ok && !reverse_ok ? "the calls to Upper and Reverse failed"
                     : upper_ok               ? "the call to Reverse failed"
                                              : "the call to Upper failed";
      return troupe::Response::json(out, 502);
    }
    return troupe::Response::json(out);
  }

 private:
  troupe::Response timed(const troupe::Request& request, const std::string& deployment) {
    const int wait_ms = std::stoi(request.query_param("wait_ms", "0"));
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
    troupe::Request sub;
    sub.method = "GET";
    // The query without wait_ms.
    std::string rest;
    std::size_t pos = 0;
    while (pos <= request.query.size()) {
      std::size_t end = request.query.find('&', pos);
      if (end == std::string::npos)
        end = request.query.size();
      std::string part = request.query.substr(pos, end - pos);
      if (!part.empty() && part.compare(0, 8, "wait_ms=") != 0)
        rest += (rest.empty() ? "" : "&") + part;
      pos = end + 1;
    }
    sub.query = rest;
    const auto start = std::chrono::steady_clock::now();
    troupe::Response r = ctx_.handle(deployment).call(sub);
    const auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    troupe::Json out = {{"status", r.status}, {"elapsed_ms", elapsed.count()}, {"query", rest}};
    std::lock_guard<std::mutex> lock(mutex_);
    last_timed_ = out;
    return troupe::Response::json(out);
  }

  const troupe::ReplicaContext ctx_;
  const troupe::DeploymentHandle upper_;
  const troupe::DeploymentHandle reverse_;
  std::mutex mutex_;
  troupe::Json last_timed_ = troupe::Json::object();
};

class Upper : public troupe::Deployment {
 public:
  Upper(const troupe::Json& /*init_args*/, const troupe::ReplicaContext& ctx) : ctx_(ctx) {}

  troupe::Response handle(const troupe::Request& request) override {
    std::string text = request.body;
    std::transform(text.begin(), text.end(), text.begin(),
                   [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    return text_answer(ctx_, std::move(text));
  }

 private:
  const troupe::ReplicaContext ctx_;
};

class Reverse : public troupe::Deployment {
 public:
  Reverse(const troupe::Json& /*init_args*/, const troupe::ReplicaContext& ctx) : ctx_(ctx) {}

  troupe::Response handle(const troupe::Request& request) override {
    return text_answer(ctx_, std::string(request.body.rbegin(), request.body.rend()));
  }

 private:
  const troupe::ReplicaContext ctx_;
};

TROUPE_DEPLOYMENT(Gateway)
TROUPE_DEPLOYMENT(Upper)
TROUPE_DEPLOYMENT(Reverse)
