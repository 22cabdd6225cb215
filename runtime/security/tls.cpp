#include "runtime/security/tls.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <system_error>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <caf/io/middleman.hpp>
#include <caf/io/publish.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/openssl/publish.hpp>

#include "runtime/security/openssl_util.hpp"

namespace troupe::security {

namespace {

// CAF opens the files on every new connection, possibly after the process
// changed its working directory.
std::string absolute(const std::string& path) {
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(path, ec);
  return ec ? path : abs.lexically_normal().string();
}

struct SslCtxDeleter {
  void operator()(SSL_CTX* p) const { SSL_CTX_free(p); }
};
struct SslDeleter {
  void operator()(SSL* p) const { SSL_free(p); }
};

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0)
      ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// OpenSSL writes to the socket with write(): a peer that already closed it
// would kill the process with SIGPIPE. Blocked for this thread while alive.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &saved_);
  }
  ~SigpipeBlock() {
    struct timespec zero = {0, 0};
    while (sigtimedwait(&pipe_, nullptr, &zero) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t pipe_;
  sigset_t saved_;
};

// A blocking TCP connection whose connect, reads and writes each give up
// after `timeout`.
Result<std::unique_ptr<Fd>> connect_with_timeout(const std::string& host, uint16_t port,
                                                 std::chrono::milliseconds timeout) {
  std::string where = host + ":" + std::to_string(port);
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0)
    return Status(errc::unavailable, where + ": " + ::gai_strerror(rc));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(found, ::freeaddrinfo);
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    auto fd = std::make_unique<Fd>(
        ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (fd->get() < 0)
      continue;
    int rc = ::connect(fd->get(), a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd pfd{fd->get(), POLLOUT, 0};
      rc = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
      if (rc == 1) {
        int error = 0;
        socklen_t len = sizeof(error);
        ::getsockopt(fd->get(), SOL_SOCKET, SO_ERROR, &error, &len);
        errno = error;
        rc = error == 0 ? 0 : -1;
      } else {
        errno = rc == 0 ? ETIMEDOUT : errno;
        rc = -1;
      }
    }
    if (rc != 0) {
      last_error = std::strerror(errno);
      continue;
    }
    // Back to blocking, bounded by the socket timeouts.
    ::fcntl(fd->get(), F_SETFL, ::fcntl(fd->get(), F_GETFL) & ~O_NONBLOCK);
    timeval tv{static_cast<time_t>(timeout.count() / 1000),
               static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
    ::setsockopt(fd->get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd->get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    return fd;
  }
  return Status(errc::unavailable, where + ": cannot connect: " + last_error);
}

// Keeps the certificate the peer presented when OpenSSL refuses it, so the
// refusal can be explained with verify_chain()'s words.
int remember_refused_peer(int ok, X509_STORE_CTX* store) {
  if (ok == 0) {
    auto* ssl =
        static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
    auto* slot = ssl ? static_cast<detail::X509Ptr*>(SSL_get_app_data(ssl)) : nullptr;
    X509* peer = X509_STORE_CTX_get0_cert(store);
    if (slot != nullptr && !*slot && peer != nullptr && X509_up_ref(peer) == 1)
      slot->reset(peer);
  }
  return ok;
}

// The reason of the last queued TLS error ("tlsv13 alert certificate
// required"), and clears the queue.
std::string last_tls_reason() {
  unsigned long code = ERR_peek_last_error();
  const char* reason = code != 0 ? ERR_reason_error_string(code) : nullptr;
  ERR_clear_error();
  return reason != nullptr ? reason : "no reason given";
}

}  // namespace

Status configure_tls(caf::actor_system_config& cfg, const std::string& tls_dir,
                     const std::string& identity_name, int64_t unix_now) {
  if (tls_dir.empty())
    return Status(errc::invalid_argument, "--tls-dir: must not be empty");
  Result<TlsFiles> files = find_tls_files(tls_dir, identity_name);
  if (!files)
    return files.status();
  Result<Identity> identity = load_identity(tls_dir, identity_name, unix_now);
  if (!identity)
    return identity.status();
  if (!detail::error_queue_guard_active()) {
    return Status(errc::internal,
                  "TLS is unavailable in this program: OpenSSL's I/O calls do not resolve to "
                  "troupe's error-queue guard (see runtime/security/openssl_error_queue.cpp)");
  }
  cfg.load<caf::openssl::manager>();
  cfg.openssl_cafile = absolute(files->ca_file);
  cfg.openssl_certificate = absolute(files->certificate_file);
  cfg.openssl_key = absolute(files->key_file);
  // Keys are written unencrypted (0600); a passphrase would have to be typed
  // at every start of every node.
  cfg.openssl_passphrase.clear();
  cfg.openssl_capath.clear();
  return Status::ok();
}

Status configure_tls(caf::actor_system_config& cfg, const std::string& tls_dir,
                     const std::string& identity_name) {
  return configure_tls(cfg, tls_dir, identity_name, static_cast<int64_t>(std::time(nullptr)));
}

bool tls_enabled(const caf::actor_system& sys) {
  return sys.has_openssl_manager();
}

caf::io::middleman_actor transport_actor(caf::actor_system& sys) {
  if (sys.has_openssl_manager())
    return sys.openssl_manager().actor_handle();
  return sys.middleman().actor_handle();
}

Status diagnose_tls(const std::string& host, uint16_t port, const std::string& tls_dir,
                    const std::string& identity_name, std::chrono::milliseconds timeout) {
  int64_t now = static_cast<int64_t>(std::time(nullptr));
  Result<TlsFiles> files = find_tls_files(tls_dir, identity_name);
  if (!files)
    return files.status();
  // An expired or not yet valid identity of our own is still presented: the
  // peer's verdict is what the caller wants to see, with our problem added.
  Result<Identity> identity = load_identity(tls_dir, identity_name, now);
  if (!identity && identity.status().code() != errc::permission_denied)
    return identity.status();
  std::string own_problem = identity ? "" : ": " + identity.status().message();
  std::string own_name = std::filesystem::path(files->certificate_file).stem().string();
  Result<std::string> ca_pem = detail::read_file(files->ca_file);
  if (!ca_pem)
    return ca_pem.status();
  std::string where = host + ":" + std::to_string(port);
  SigpipeBlock no_sigpipe;
  std::unique_ptr<SSL_CTX, SslCtxDeleter> ctx(SSL_CTX_new(TLS_client_method()));
  if (!ctx || SSL_CTX_use_certificate_chain_file(ctx.get(), files->certificate_file.c_str()) != 1 ||
      SSL_CTX_use_PrivateKey_file(ctx.get(), files->key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_load_verify_locations(ctx.get(), files->ca_file.c_str(), nullptr) != 1)
    return Status(errc::internal, "cannot set up TLS: " + detail::openssl_error());
  // The same verification as CAF's OpenSSL module (session.cpp).
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                     remember_refused_peer);
  auto fd = connect_with_timeout(host, port, timeout);
  if (!fd)
    return fd.status();
  std::unique_ptr<SSL, SslDeleter> ssl(SSL_new(ctx.get()));
  detail::X509Ptr refused_peer;
  if (!ssl || SSL_set_fd(ssl.get(), (*fd)->get()) != 1)
    return Status(errc::internal, "cannot set up TLS: " + detail::openssl_error());
  SSL_set_app_data(ssl.get(), &refused_peer);
  ERR_clear_error();
  int rc = SSL_connect(ssl.get());
  if (rc == 1) {
    // With TLS 1.3 the server checks our certificate after our side of the
    // handshake completed: its verdict is the first thing we read (CAF's
    // BASP server handshake when accepted, an alert when refused).
    char byte;
    rc = SSL_read(ssl.get(), &byte, 1);
    if (rc > 0)
      return Status::ok();
    int error = SSL_get_error(ssl.get(), rc);
    if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
      ERR_clear_error();  // no verdict within the timeout: not refused
      return Status::ok();
    }
  }
  if (SSL_get_verify_result(ssl.get()) != X509_V_OK || refused_peer) {
    std::string why = X509_verify_cert_error_string(SSL_get_verify_result(ssl.get()));
    ERR_clear_error();
    if (refused_peer) {
      Result<detail::X509Ptr> ca = detail::parse_certificate(*ca_pem, files->ca_file);
      if (ca) {
        std::string label =
            "the certificate '" + detail::common_name(refused_peer.get()) + "' it presented";
        Status s = detail::verify_chain(ca->get(), refused_peer.get(), now, label);
        if (!s)
          return Status(errc::permission_denied, where + ": " + s.message());
      }
    }
    return Status(errc::permission_denied, where + ": its certificate was refused (" + why + ")");
  }
  if (ERR_peek_last_error() != 0)
    return Status(errc::permission_denied, where + " refused our certificate '" + own_name + "' (" +
                                               last_tls_reason() + ")" + own_problem);
  return Status(errc::unavailable,
                where + " closed the connection during the TLS handshake without saying why");
}

caf::expected<uint16_t> publish(const caf::actor& whom, uint16_t port, const char* in, bool reuse) {
  if (whom && whom.home_system().has_openssl_manager())
    return caf::openssl::publish(whom, port, in, reuse);
  return caf::io::publish(whom, port, in, reuse);
}

std::string node_peer_refusal(bool preverified, X509_STORE_CTX* store) {
  X509* cert = X509_STORE_CTX_get_current_cert(store);
  // Name the peer's own certificate, even when one further up its chain failed.
  X509* own = X509_STORE_CTX_get0_cert(store);
  std::string name = own != nullptr ? detail::common_name(own) : std::string();
  if (name.empty() && cert != nullptr)
    name = detail::common_name(cert);
  if (name.empty())
    name = "(no name)";
  if (!preverified) {
    return "its certificate '" + name + "' was refused: " +
           X509_verify_cert_error_string(X509_STORE_CTX_get_error(store));
  }
  if (X509_STORE_CTX_get_error_depth(store) != 0 || cert == nullptr)
    return "";  // the CA: verified by OpenSSL
  Result<Role> role = detail::role_of(cert);
  if (!role)
    return "its " + role.status().message();
  if (role.value() != Role::node)
    return "its certificate '" + name + "' has the " + to_string(role.value()) +
           " role: data ports serve nodes only";
  return "";
}

}  // namespace troupe::security
