// Clears OpenSSL's per-thread error queue before every TLS I/O call that
// CAF 0.17's OpenSSL transport makes.
//
// OpenSSL requires the calling thread's error queue to be empty before
// SSL_read, SSL_write, SSL_connect or SSL_accept, because SSL_get_error()
// reports SSL_ERROR_SSL whenever the queue holds anything, whatever the call
// itself did (see SSL_get_error(3)). CAF 0.17.6 (libcaf_openssl,
// session.cpp) calls SSL_get_error() after each of these calls but never
// clears the queue. All sessions of an actor system are driven by the one
// multiplexer thread, so one peer that closes its connection without a TLS
// close_notify (every troupectl call does, at exit) leaves an "unexpected eof"
// entry behind, and the next read of any other session that would merely
// block (SSL_ERROR_WANT_READ) is taken for a fatal error: the connection is
// closed. In a cluster that meant each troupectl call dropped the head's
// connections to its worker nodes, which the controller then declared DEAD.
//
// The executable defines these four functions; the dynamic linker binds
// libcaf_openssl's calls to them (the executable comes first in the lookup
// order), and each clears the queue and calls OpenSSL's own function.
//
// CAF also says nothing when a handshake fails. The wrappers see each
// handshake's outcome (CAF starts it with SSL_accept/SSL_connect and lets
// SSL_read/SSL_write continue it), and SSL_CTX_set_verify's wrapper adds a
// verify callback that notes which certificate failed; the handler installed
// with on_handshake_failure() is told once per connection who the peer was
// and why it failed.

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include "runtime/security/tls.hpp"

namespace {

template <class Fn>
Fn next_definition(const char* name) {
  void* sym = ::dlsym(RTLD_NEXT, name);
  if (sym == nullptr) {
    std::fprintf(stderr, "troupe: cannot find OpenSSL's %s: %s\n", name, ::dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(sym);
}

using Handler = troupe::security::HandshakeFailureHandler;

std::mutex handler_mutex;
std::shared_ptr<const Handler> handler;

std::shared_ptr<const Handler> current_handler() {
  std::lock_guard<std::mutex> guard(handler_mutex);
  return handler;
}

std::string peer_address(SSL* ssl) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  int fd = SSL_get_fd(ssl);
  if (fd < 0 || ::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return "an unknown peer";
  char host[INET6_ADDRSTRLEN] = {0};
  if (addr.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "a non-IP peer";
}

std::string common_name(X509* cert) {
  char name[256] = {0};
  if (cert == nullptr ||
      X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, name,
                                sizeof(name)) <= 0)
    return "";
  return name;
}

// What troupe remembers of one TLS session's handshake, kept in the SSL
// object's ex_data and freed with it.
struct Handshake {
  std::string peer;             // taken while the socket is surely connected
  std::string refused_cert;     // common name of a certificate that failed
  std::string refused_because;  // and why
  bool reported = false;
};

void free_handshake(void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) {
  delete static_cast<Handshake*>(ptr);
}

int handshake_index() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, free_handshake);
  return index;
}

Handshake* handshake_of(SSL* ssl) {
  int index = handshake_index();
  if (index < 0)
    return nullptr;
  auto* h = static_cast<Handshake*>(SSL_get_ex_data(ssl, index));
  if (h == nullptr) {
    h = new Handshake;
    h->peer = peer_address(ssl);
    if (SSL_set_ex_data(ssl, index, h) != 1) {
      delete h;
      return nullptr;
    }
  }
  return h;
}

// Installed in place of CAF's "no callback": does not change the verdict,
// only remembers which certificate failed and why.
int remember_verify_failure(int ok, X509_STORE_CTX* store) {
  if (ok == 1)
    return ok;
  auto* ssl = static_cast<SSL*>(
      X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  if (ssl == nullptr)
    return ok;
  if (auto* h = handshake_of(ssl); h != nullptr && h->refused_cert.empty()) {
    // Name the peer's own certificate, even when a certificate further up
    // its chain is the one that failed.
    std::string name = common_name(X509_STORE_CTX_get0_cert(store));
    if (name.empty())
      name = common_name(X509_STORE_CTX_get_current_cert(store));
    h->refused_cert = name.empty() ? "(no name)" : name;
    h->refused_because = X509_verify_cert_error_string(X509_STORE_CTX_get_error(store));
  }
  return ok;
}

// Why the handshake failed, from what OpenSSL left behind. Reads the error
// queue without consuming it: CAF's own handling is unchanged.
std::string failure_reason(const Handshake& h, int error) {
  if (!h.refused_cert.empty())
    return "its certificate '" + h.refused_cert + "' was refused: " + h.refused_because;
  if (unsigned long code = ERR_peek_last_error(); code != 0)
    return troupe::security::handshake_error_reason(code);
  if (error == SSL_ERROR_SYSCALL || error == SSL_ERROR_ZERO_RETURN)
    return "it closed the connection during the handshake";
  return "the handshake failed (SSL error " + std::to_string(error) + ")";
}

// After any I/O call on `ssl`: a handshake that ended in an error is
// reported once. Calls after the handshake completed are not handshakes.
void check_handshake(SSL* ssl, int ret, bool during_handshake) {
  if (ret > 0 || !during_handshake)
    return;
  int error = SSL_get_error(ssl, ret);
  if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE)
    return;  // still in progress
  Handshake* h = handshake_of(ssl);
  if (h == nullptr || h->reported)
    return;
  h->reported = true;
  auto handler = current_handler();
  if (!handler || !*handler)
    return;
  troupe::security::HandshakeFailure failure{SSL_is_server(ssl) == 1, h->peer,
                                             failure_reason(*h, error)};
  try {
    (*handler)(failure);
  } catch (...) {
    // A handler must not take CAF's multiplexer thread down.
  }
}

// Before a call that may run (part of) the handshake: note the peer while
// its socket is connected.
bool begin(SSL* ssl) {
  bool in_handshake = SSL_is_init_finished(ssl) != 1;
  if (in_handshake)
    handshake_of(ssl);
  ERR_clear_error();
  return in_handshake;
}

}  // namespace

extern "C" {

int SSL_read(SSL* ssl, void* buf, int num) {
  static const auto real = next_definition<int (*)(SSL*, void*, int)>("SSL_read");
  bool in_handshake = begin(ssl);
  int ret = real(ssl, buf, num);
  check_handshake(ssl, ret, in_handshake);
  return ret;
}

int SSL_write(SSL* ssl, const void* buf, int num) {
  static const auto real = next_definition<int (*)(SSL*, const void*, int)>("SSL_write");
  bool in_handshake = begin(ssl);
  int ret = real(ssl, buf, num);
  check_handshake(ssl, ret, in_handshake);
  return ret;
}

int SSL_connect(SSL* ssl) {
  static const auto real = next_definition<int (*)(SSL*)>("SSL_connect");
  bool in_handshake = begin(ssl);
  int ret = real(ssl);
  check_handshake(ssl, ret, in_handshake);
  return ret;
}

int SSL_accept(SSL* ssl) {
  static const auto real = next_definition<int (*)(SSL*)>("SSL_accept");
  bool in_handshake = begin(ssl);
  int ret = real(ssl);
  check_handshake(ssl, ret, in_handshake);
  return ret;
}

// CAF installs no verify callback; troupe's only remembers failures.
void SSL_CTX_set_verify(SSL_CTX* ctx, int mode, SSL_verify_cb callback) {
  static const auto real =
      next_definition<void (*)(SSL_CTX*, int, SSL_verify_cb)>("SSL_CTX_set_verify");
  real(ctx, mode, callback != nullptr ? callback : remember_verify_failure);
}

}  // extern "C"

namespace troupe::security {

std::string handshake_error_reason(unsigned long code) {
  switch (ERR_GET_REASON(code)) {
    case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
      return "it presented no certificate";
    case SSL_R_WRONG_VERSION_NUMBER:
    case SSL_R_HTTP_REQUEST:
    case SSL_R_PACKET_LENGTH_TOO_LONG:
      return "it does not speak TLS (it may run without --tls-dir)";
    default:
      break;
  }
  const char* text = ERR_reason_error_string(code);
  std::string reason = text != nullptr ? text : "OpenSSL error " + std::to_string(code);
  if (reason.rfind("sslv3 alert ", 0) == 0 || reason.rfind("tlsv1 alert ", 0) == 0)
    return "it refused our certificate (" + reason + ")";
  return reason;
}

void report_handshake_failure_myself(SSL* ssl) {
  if (Handshake* h = handshake_of(ssl); h != nullptr)
    h->reported = true;
}

void on_handshake_failure(HandshakeFailureHandler h) {
  auto next = h ? std::make_shared<const HandshakeFailureHandler>(std::move(h)) : nullptr;
  std::lock_guard<std::mutex> guard(handler_mutex);
  handler = std::move(next);
}

}  // namespace troupe::security

namespace troupe::security::detail {

bool error_queue_guard_active() {
  // Ours only when the dynamic linker resolves the name to this definition,
  // as it does for libcaf_openssl's calls.
  return ::dlsym(RTLD_DEFAULT, "SSL_read") == reinterpret_cast<void*>(&SSL_read) &&
         ::dlsym(RTLD_DEFAULT, "SSL_write") == reinterpret_cast<void*>(&SSL_write) &&
         ::dlsym(RTLD_DEFAULT, "SSL_connect") == reinterpret_cast<void*>(&SSL_connect) &&
         ::dlsym(RTLD_DEFAULT, "SSL_accept") == reinterpret_cast<void*>(&SSL_accept) &&
         ::dlsym(RTLD_DEFAULT, "SSL_CTX_set_verify") ==
             reinterpret_cast<void*>(&SSL_CTX_set_verify);
}

}  // namespace troupe::security::detail
