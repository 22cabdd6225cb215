// TLS with mutual certificate authentication for CAF's network layer, through
// CAF 0.17's OpenSSL module (issue 9).
//
// What CAF 0.17.6's OpenSSL module does (libcaf_openssl/src/openssl/
// session.cpp, create_ssl_context(), and manager.cpp): when any of
// openssl.certificate/key/passphrase/cafile/capath is set, *both* sides of
// every connection load the certificate chain and key, trust cafile/capath,
// and call SSL_CTX_set_verify(SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT)
// with ciphers "HIGH:!aNULL:!MD5"; so the accepting side demands a client
// certificate and both verify the peer's chain and validity period (OpenSSL's
// default verification: expired or foreign certificates fail the handshake).
// It does NOT check host names or any subject field (any certificate of the
// CA is accepted for any peer: roles are checked by credentials.hpp), keeps no
// CRL, does not tell actors which certificate the peer presented, and logs
// nothing about a refused handshake in Debian's build: the connecting side
// only sees its connect fail (sec::disconnect_during_handshake or
// cannot_connect_to_node), the accepting side sees nothing.
// Each connection creates a fresh SSL_CTX from the configured *files*, so
// renewed files apply to new connections, and a file that became unreadable
// throws inside CAF's multiplexer thread (process abort): configure_tls()
// therefore checks every file up front and passes absolute paths.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include <openssl/ossl_typ.h>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/expected.hpp>
#include <caf/io/middleman_actor.hpp>

#include "runtime/security/credentials.hpp"
#include "runtime/status.hpp"

namespace troupe::security {

// Loads CAF's OpenSSL module and points it at <tls_dir>/ca.crt (openssl.cafile)
// and the identity's <name>.crt / <name>.key (openssl.certificate / .key; see
// credentials.hpp for how an empty name is resolved). Call it after
// configure_actor_system() (the module requires the middleman to be loaded
// first) and before constructing the actor_system. Nothing is changed in `cfg`
// unless every check passes: files exist and parse, the key matches, the
// certificate chains to ca.crt, carries a role and is valid at `unix_now`
// (permission_denied "... expired on <date>" otherwise).
Status configure_tls(caf::actor_system_config& cfg, const std::string& tls_dir,
                     const std::string& identity_name, int64_t unix_now);
// The same at the current time.
Status configure_tls(caf::actor_system_config& cfg, const std::string& tls_dir,
                     const std::string& identity_name);

// True when `sys` runs CAF's OpenSSL module.
bool tls_enabled(const caf::actor_system& sys);

// A TLS handshake this process refused (accepting: a peer connected to us)
// or that failed when we connected out: who, and OpenSSL's reason.
struct HandshakeFailure {
  bool accepting = false;
  std::string peer;    // "address:port"
  std::string reason;  // e.g. "its certificate 'x' was refused: certificate has expired"
};
using HandshakeFailureHandler = std::function<void(const HandshakeFailure&)>;

// Installs (or, with an empty function, removes) the process-wide handler
// for failed handshakes of CAF's OpenSSL transport. It runs on CAF's
// multiplexer thread: keep it short and non-blocking (a log line).
void on_handshake_failure(HandshakeFailureHandler handler);

// --- TLS sessions troupe drives itself (the data ports, proxy/data_tls.hpp) ---

// The verdict on a certificate of a data port's peer, as an SSL verify
// callback sees it: "" when OpenSSL verified the chain (`preverified`) and
// the peer's own certificate (depth 0) carries the node role; otherwise why
// not, naming the certificate, e.g. "its certificate 'alice' has the
// operator role: data ports serve nodes only" or "its certificate 'mallory'
// was refused: unable to get local issuer certificate".
std::string node_peer_refusal(bool preverified, X509_STORE_CTX* store);

// Why a handshake failed, from the OpenSSL error `code` it ended with, in
// the words of the "refused TLS peer" log lines: "it presented no
// certificate", "it does not speak TLS (it may run without --tls-dir)",
// "it refused our certificate (...)", or OpenSSL's reason.
std::string handshake_error_reason(unsigned long code);

// Leaves the failed handshake of `ssl` to its owner, who logs it with its
// own words: the handler of on_handshake_failure() is not told of it.
void report_handshake_failure_myself(SSL* ssl);

namespace detail {
// True when this process's SSL_read/SSL_write/SSL_connect/SSL_accept resolve
// to troupe's wrappers that clear OpenSSL's error queue first (see
// openssl_error_queue.cpp); configure_tls() refuses to enable TLS otherwise.
bool error_queue_guard_active();
}  // namespace detail

// The middleman actor to send connect_atom / publish_atom requests to: the
// OpenSSL module's when TLS is on, the plain middleman's otherwise. (Requests
// to sys.middleman().actor_handle() would open plain-text connections.)
caf::io::middleman_actor transport_actor(caf::actor_system& sys);

// Publishes `whom` like caf::io::publish, over TLS when TLS is on. Blocks the
// calling thread (do not call it from an actor).
caf::expected<uint16_t> publish(const caf::actor& whom, uint16_t port, const char* in = nullptr,
                                bool reuse = false);

// Why a TLS connection to host:port fails, in words, for when a CAF connect
// through the OpenSSL module ended in sec::disconnect_during_handshake (CAF
// itself does not say why). Performs one TLS handshake with the same files
// configure_tls() uses, each step bounded by `timeout`, then waits up to
// `timeout` for the peer's first bytes or alert. Returns ok when the peer
// accepted us; otherwise permission_denied, e.g.
//   "127.0.0.1:7300: the certificate 'head' it presented expired on <date>"
//   "127.0.0.1:7300: the certificate 'x' it presented is not signed by this
//    cluster's CA (unable to get local issuer certificate)"
//   "127.0.0.1:7300 refused our certificate 'old' (sslv3 alert certificate
//    expired): certificate 'old' (DIR/old.crt) expired on <date>"
// or unavailable when nothing answers. Our own certificate is presented even
// when expired, so the peer's verdict is reported. Blocks the calling thread.
Status diagnose_tls(const std::string& host, uint16_t port, const std::string& tls_dir,
                    const std::string& identity_name, std::chrono::milliseconds timeout);

}  // namespace troupe::security
