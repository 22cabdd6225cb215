// Application-level authentication and authorization of write requests
// (issue 9).
//
// CAF's TLS layer proves that a peer holds *some* certificate of the cluster
// CA, but does not tell actors which one, so the role cannot be checked there.
// Instead, every write request carries a Credential: the caller's certificate,
// a timestamp, and a signature by the caller's private key over
//   "troupe-credential-v1\n" + <timestamp> + "\n" + <request digest>
// (ECDSA/RSA with SHA-256, base64). The request digest names the operation and
// its arguments (request_digest() below); caller and controller compute it
// independently from the request, so a credential signed for "drain node-1"
// does not authorize "drain node-2" or "delete app".
//
// A TLS directory (--tls-dir DIR) holds ca.crt and the identity
// <name>.crt / <name>.key. The name is given explicitly, or, when it is empty,
// the directory must hold exactly one <name>.crt (besides ca.crt) with its
// <name>.key. ca.key never needs to be on a node or an operator's machine.
//
// Replay: a captured credential stays valid for the same request digest within
// ±max_skew_s; the controller therefore remembers the signatures it accepted
// within that window and refuses a second use (ReplayGuard, runtime/auth.hpp),
// by signature_identity() below, which an attacker cannot vary without the key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/security/certs.hpp"
#include "runtime/status.hpp"

namespace troupe::security {

// The holder of a certificate: what troupectl and troupe-node load at start.
struct Identity {
  std::string name;             // the certificate's CN (== file name)
  Role role = Role::node;       // from the certificate's subject OU
  std::string ca_pem;           // ca.crt: the cluster CA
  std::string certificate_pem;  // <name>.crt
  std::string key_pem;          // <name>.key (unencrypted PEM)
  int64_t not_after = 0;        // Unix seconds: when the certificate expires
};

// Files of an identity in a TLS directory.
struct TlsFiles {
  std::string ca_file;           // <dir>/ca.crt
  std::string certificate_file;  // <dir>/<name>.crt
  std::string key_file;          // <dir>/<name>.key
};

// The paths of an identity. With an empty `name`, the directory must hold
// exactly one <name>.crt besides ca.crt (invalid_argument listing the
// candidates otherwise). not_found naming the file when one is missing.
Result<TlsFiles> find_tls_files(const std::string& tls_dir, const std::string& name = "");

// Loads and checks an identity: every file exists and parses, the key belongs
// to the certificate, the certificate chains to ca.crt and carries a role, and
// it is valid at `unix_now` (permission_denied "... expired on <date>"
// otherwise).
Result<Identity> load_identity(const std::string& tls_dir, const std::string& name,
                               int64_t unix_now);

// What a write request carries to prove who sent it. Plain data: the wire
// encoding (CAF inspect) lives with the wire types.
struct Credential {
  std::string certificate_pem;  // the caller's certificate
  int64_t timestamp = 0;        // Unix seconds when the caller signed
  std::string signature;        // base64 signature (see the top of this file)
};

// A canonical, unambiguous digest of an operation and its arguments:
// "<operation> sha256:<hex of the length-prefixed arguments>". Caller and
// controller must pass the same arguments in the same order, e.g.
// request_digest("drain", {"node-1"}), request_digest("deploy", {name, spec}).
std::string request_digest(const std::string& operation, const std::vector<std::string>& args);

// Signs `request_digest` at `unix_now` with the identity's key. Fails only when
// the identity's key is unusable (internal).
Result<Credential> sign(const Identity& identity, const std::string& request_digest,
                        int64_t unix_now);

// Checks a credential against the cluster CA (`ca_pem`, the controller's
// ca.crt) and returns the caller's role. Every failure is permission_denied
// with a message saying which check failed:
//   "certificate 'x' is not signed by this cluster's CA (...)"
//   "certificate 'x' expired on 2026-11-29 16:32:30 UTC"
//   "certificate 'x' is not valid before ... (check the clocks)"
//   "certificate 'x' carries no troupe role ..."
//   "bad signature: the credential was not made by the holder of certificate
//    'x' for this request"
//   "stale credential: signed at ..., 300 s from the controller's clock
//    (allowed ±120 s)"
Result<Role> verify(const std::string& ca_pem, const Credential& credential,
                    const std::string& request_digest, int64_t unix_now, int64_t max_skew_s = 120);

// Who made a verified credential.
struct Caller {
  std::string name;  // the certificate's CN, e.g. the node id or the operator
  Role role = Role::node;
};

// verify() that also returns the certificate's name, so the controller can
// insist that a node certificate registers, heartbeats and deregisters only
// the node of the same name (a node must not speak for another node).
Result<Caller> verify_caller(const std::string& ca_pem, const Credential& credential,
                             const std::string& request_digest, int64_t unix_now,
                             int64_t max_skew_s = 120);

// What makes a credential's signature one use: the same for every form a
// third party can give the same signature. An ECDSA signature (r, s) is
// also valid as (r, n - s), so it is named by r (which only the key's holder
// can choose anew); any other signature by its bytes. "" when the signature
// is not base64.
std::string signature_identity(const Credential& credential);

// permission_denied "permission denied: <operation> requires the operator role
// (the caller's certificate has the node role)" unless `have == required`.
// Roles do not nest: operators do not register nodes, nodes do not operate.
Status require_role(Role have, Role required, const std::string& operation);

// verify() followed by require_role(): what the controller calls for each
// write request.
Status authorize(const std::string& ca_pem, const Credential& credential,
                 const std::string& operation, const std::vector<std::string>& args, Role required,
                 int64_t unix_now, int64_t max_skew_s = 120);

}  // namespace troupe::security
