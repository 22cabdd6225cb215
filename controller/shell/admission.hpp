// What a call to the controller must pass before anything changes, decided as
// plain functions: the protocol version of a hello, a node's registration, and
// the operator's write calls (deploy, apply, delete, shutdown). The actor
// answers a refusal with the Status as a caf::error; troupectl, the node agent
// and tests match these messages, so their texts are an interface.
//
// Credentials are checked with check_request (runtime/auth.hpp) against the
// cluster CA in `ca_pem`; an empty `ca_pem` (no TLS) admits every credential.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <spdlog/logger.h>

#include "controller/core/limits.hpp"
#include "controller/membership.hpp"
#include "controller/shell/recovery_gate.hpp"
#include "runtime/auth.hpp"
#include "runtime/status.hpp"
#include "runtime/wire.hpp"

namespace troupe::controller {

// errc::version_mismatch naming both versions unless `version` is
// kProtocolVersion: the answer to a hello of a mismatched binary.
Status check_protocol_version(uint32_t version);

// Everything a registration must pass, in this order: the caller's
// credential (a node certificate for exactly `info.id`), the protocol
// version, the node id, its resources, and an agent handle (`agent_given`).
// The first refusal is returned; a foreign or missing credential and a
// mismatched protocol version are also logged to `log` (they point at a
// misconfigured cluster the operator must see; the rest the node's own log
// names). Admitted: the node's record, registration times still unset.
Result<NodeRecord> admit_node(const std::string& ca_pem, const troupe::NodeInfo& info,
                              bool agent_given, const Credential& cred, spdlog::logger& log);

// A node may join a controller of its kind only: a highly available one
// (`ha`: it runs under a leader election) refuses a single head's agent; a
// single head refuses a head candidate and a worker given several heads.
// errc::conflict naming the node, what it is and what this head is.
Status check_head_mode(bool ha, const troupe::NodeInfo& info);

// An operator's write call (`operation` with `args`, as the caller signed
// them): an operator credential first, then a recovered controller
// (errc::unavailable while `recovery` is still collecting, see RecoveryGate).
Status admit_operator_call(const std::string& ca_pem, const Credential& cred,
                           Operation operation, const std::vector<std::string>& args,
                           const RecoveryGate& recovery);

// What every deploy call (one application or a whole config) must pass
// before its bytes are even decoded: admit_operator_call(deploy,
// {encoded, signed_too...}), then the config size limit. The core checks the
// replica limits. `signed_too`: further arguments the caller signed (the
// generation of `deploy --if-generation`).
Status admit_deploy(const std::string& ca_pem, const Credential& cred, const std::string& encoded,
                    const RecoveryGate& recovery, const Limits& limits,
                    const std::vector<std::string>& signed_too = {});

}  // namespace troupe::controller
