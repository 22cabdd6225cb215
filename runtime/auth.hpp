// Signing and checking the credentials of write requests (issue 9). With TLS
// off (no identity, no CA) signing yields an empty credential and checks pass:
// the cluster is then loopback-only or explicitly --insecure.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/security/certs.hpp"
#include "runtime/security/credentials.hpp"
#include "runtime/status.hpp"
#include "runtime/wire.hpp"

namespace troupe {

// The write requests a credential signs. Node operations are signed by a
// node certificate for that node; the others by an operator certificate.
enum class Operation {
  register_node,  // node
  heartbeat,      // node
  deregister,     // node
  leave,          // node: it is stopping, move its replicas first
  drain,
  deploy,  // also apply
  delete_app,
  shutdown,
  kill,
  scale,     // one deployment's replica count
  traffic,   // an application's traffic split
  upload,    // a piece of a deployment library
  rollback,  // an application back to its last good declaration
};

// The operation's name: part of the signed digest and of refusal messages,
// so the names never change ("register", "heartbeat", "deregister", "leave", "drain",
// "deploy", "delete", "shutdown", "kill", "scale", "traffic", "upload",
// "rollback").
const char* operation_name(Operation op);

// The digest both sides compute for an operation and its arguments.
std::string operation_digest(Operation op, const std::vector<std::string>& args);

// What a (traffic, app, weights) request signs: the application, then
// "NAME=W" per weight with W in hexadecimal floating point (exact, so both
// sides compute the same text).
std::vector<std::string> traffic_args(const std::string& app, const TrafficWeights& weights);

// Signs with `identity` when there is one; an empty credential otherwise.
Credential sign_request(const std::optional<security::Identity>& identity, Operation op,
                        const std::vector<std::string>& args);

// Checks a credential against the cluster CA (`ca_pem`, empty: no checks).
// `node_id` set: the caller must hold a node certificate for exactly that
// node; otherwise it must hold an operator certificate.
Status check_request(const std::string& ca_pem, const Credential& credential, Operation op,
                     const std::vector<std::string>& args,
                     const std::optional<std::string>& node_id = std::nullopt);

// The credentials a controller accepted, kept while they could still pass
// the timestamp check (their timestamp + `window_s`), so that a second use of
// one is refused: a captured credential cannot be replayed for the same
// operation. Plain data, driven by the caller's clock (Unix seconds).
class ReplayGuard {
 public:
  explicit ReplayGuard(int64_t window_s = 120) : window_s_(window_s) {}
  // ok, remembering `credential`; or permission_denied "permission denied:
  // <op>: this credential was used already (signed at <time>); a request is
  // signed anew for each call". An empty credential (no TLS) passes and is
  // not kept. Forgets what expired at `unix_now` first.
  Status admit(const Credential& credential, Operation op, int64_t unix_now);
  size_t remembered() const { return seen_.size(); }

 private:
  int64_t window_s_;
  std::unordered_map<std::string, int64_t> seen_;  // signature identity -> expiry
  std::multimap<int64_t, std::string> expiries_;
};

}  // namespace troupe
