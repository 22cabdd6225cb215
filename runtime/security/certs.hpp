// The cluster CA and the certificates it issues (issue 9).
//
// Layout of a CA directory (`troupectl certs init DIR`, `certs issue DIR`):
//   ca.crt, ca.key          the cluster CA (self-signed, CA:TRUE, pathlen:0)
//   <name>.crt, <name>.key  an identity issued by it
// Keys are EC P-256, PEM (PKCS#8, unencrypted), mode 0600; certificates are
// PEM, mode 0644, X.509 v3 signed with SHA-256, with a random 159-bit serial.
//
// The role is stored in the subject: OU=troupe-node or OU=troupe-operator
// (subject "O=troupe, OU=troupe-<role>, CN=<name>"). A certificate has exactly
// one troupe-* OU; the CA has none. Identity certificates carry
// basicConstraints CA:FALSE, keyUsage digitalSignature, extendedKeyUsage
// serverAuth+clientAuth (nodes accept and open connections), and
// subjectAltName DNS:<name>, DNS:localhost, IP:127.0.0.1, plus the hosts the
// issuer names (`certs issue --host`): a server whose clients check its name,
// such as an etcd member of highly available heads at 10.0.0.5.
//
// What a node's or troupectl's --tls-dir needs is described in credentials.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/status.hpp"

namespace troupe::security {

// What a certificate holder may do. Operators deploy, delete, drain, shut
// down and kill; nodes only register themselves (and heartbeat).
enum class Role { node, operator_ };

// "node" / "operator".
const char* to_string(Role role);
// Accepts "node" and "operator"; invalid_argument otherwise.
Result<Role> parse_role(const std::string& text);
// The subject OU that encodes the role: "troupe-node" / "troupe-operator".
std::string role_ou(Role role);

// A certificate's validity window in Unix seconds.
struct Validity {
  int64_t not_before = 0;
  int64_t not_after = 0;
};

// Names of identities: 1 to 64 characters of [A-Za-z0-9._-], starting with a
// letter or digit, and not "ca" (reserved for the CA's files). The name is the
// CN, a DNS subjectAltName and the file name.
Status validate_name(const std::string& name);

// Creates `dir` (0700) when missing and writes a new CA: ca.key (0600), then
// ca.crt. already_exists when ca.crt or ca.key is there: a CA is never
// replaced, since every certificate issued by it would stop working.
// `valid_days` must be >= 1.
Status init_ca(const std::string& dir, int valid_days = 3650);
// The same with an explicit window (tests that run on a fixed clock).
Status init_ca(const std::string& dir, Validity validity);

// Writes <name>.key (0600) and <name>.crt, signed by the CA in `dir`, valid
// from five minutes ago (tolerates clock skew between machines) for
// `valid_days` (>= 1). already_exists when either file exists: to reissue,
// delete the old files first. not_found when `dir` holds no CA.
// `hosts`: more subjectAltNames, each an IPv4 or IPv6 address (IP:) or a DNS
// name (DNS:); invalid_argument naming the first that is neither.
Status issue_certificate(const std::string& dir, const std::string& name, Role role,
                         int valid_days = 365, const std::vector<std::string>& hosts = {});

// The same with an explicit window, which may lie in the past or the future:
// tests use it to make expired and not-yet-valid certificates.
// invalid_argument when not_after <= not_before.
Status issue_certificate(const std::string& dir, const std::string& name, Role role,
                         Validity validity, const std::vector<std::string>& hosts = {});

// The subjectAltName value of an identity: "DNS:<name>,DNS:localhost,
// IP:127.0.0.1" and the hosts; invalid_argument naming a host that is not an
// IP address or a DNS name.
Result<std::string> subject_alt_names_of(const std::string& name,
                                         const std::vector<std::string>& hosts);

}  // namespace troupe::security
