// Signing and checking the credentials of write requests (issue 9). With TLS
// off (no identity, no CA) signing yields an empty credential and checks pass:
// the cluster is then loopback-only or explicitly --insecure.
#pragma once

#include <optional>
#include <string>
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

}  // namespace troupe
