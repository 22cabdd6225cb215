// Internal helpers shared by certs.cpp, credentials.cpp and tls.cpp: owning
// pointers for OpenSSL objects, PEM and file I/O, and the readable names of
// certificates and times used in error messages. Not part of the public API.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <openssl/evp.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "runtime/security/certs.hpp"
#include "runtime/status.hpp"

namespace troupe::security::detail {

struct X509Deleter {
  void operator()(X509* p) const { X509_free(p); }
};
struct PkeyDeleter {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyDeleter>;

// The oldest queued OpenSSL error as text ("" when none), and clears the queue.
std::string openssl_error();

// Reads a whole file. not_found when it does not exist, io_error otherwise.
Result<std::string> read_file(const std::string& path);

// Writes `data` to `path` with `mode` (e.g. 0600) through a temporary file and
// a rename, so a crash never leaves a half-written key or certificate.
Status write_file(const std::string& path, const std::string& data, unsigned mode);

bool file_exists(const std::string& path);

// The first certificate or private key in a PEM text; `what` names the source
// in the error ("ca.crt").
Result<X509Ptr> parse_certificate(const std::string& pem, const std::string& what);
Result<PkeyPtr> parse_private_key(const std::string& pem, const std::string& what);

std::string certificate_to_pem(X509* cert);

// The subject's CN ("" when absent).
std::string common_name(X509* cert);

// The troupe role in the subject's OU (see certs.hpp), or permission_denied.
Result<Role> role_of(X509* cert);

// Unix seconds of an ASN.1 time, and a time as "2026-11-29 16:32:30 UTC".
int64_t to_unix(const ASN1_TIME* t);
std::string format_utc(int64_t unix_seconds);

// Verifies that `cert` chains to `ca` and is valid at `unix_now`. Errors are
// permission_denied and say what is wrong in words a user understands
// ("certificate 'node1' expired on 2026-11-29 16:32:30 UTC"); `label` names
// the certificate ("certificate 'node1'").
Status verify_chain(X509* ca, X509* cert, int64_t unix_now, const std::string& label);

}  // namespace troupe::security::detail
