// A TLS context made from files and made again when they change: the data
// ports' (proxy/data_tls.hpp) and the HTTPS listener's (ServerTls below).
// Each new connection asks for the current context; one that is open keeps
// the context it started with.
//
// A change is seen by the files' modification time (nanoseconds), inode and
// size, so a file replaced by a rename (how certificate tools write) or
// rewritten in place is noticed at the next connection, even within the same
// second. reload() makes it again regardless (SIGHUP). When the new files do
// not load (a key that does not match the certificate, a half-written file),
// the last good context stays and the error is kept for the caller to log.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <openssl/ssl.h>
#include <boost/asio/ssl/context.hpp>

#include "runtime/status.hpp"

namespace troupe::proxy {

class ReloadingTlsContext {
 public:
  using ContextPtr = std::shared_ptr<boost::asio::ssl::context>;
  using Make = std::function<Result<ContextPtr>()>;

  // `files`: what `make` reads. Loads once; the error is make()'s.
  static Result<std::unique_ptr<ReloadingTlsContext>> load(std::vector<std::string> files,
                                                           Make make);

  // The context for a new connection, made again first when a file changed.
  // Any thread.
  ContextPtr context();
  // Makes the context again now; the error says why the last good one stays.
  Status reload();
  // Contexts made after the first (successful or not), and the last failure
  // ("" when the last attempt succeeded).
  uint64_t reloads() const;
  std::string last_error() const;

 private:
  struct Stamp {
    int64_t mtime_ns = 0;
    ino_t inode = 0;
    off_t size = -1;
    bool operator==(const Stamp& o) const {
      return mtime_ns == o.mtime_ns && inode == o.inode && size == o.size;
    }
  };
  ReloadingTlsContext(std::vector<std::string> files, Make make)
      : files_(std::move(files)), make_(std::move(make)) {}
  std::vector<Stamp> stamps() const;
  Status remake();  // holding mutex_

  const std::vector<std::string> files_;
  const Make make_;
  mutable std::mutex mutex_;
  std::vector<Stamp> loaded_;
  ContextPtr context_;
  uint64_t reloads_ = 0;
  std::string last_error_;
};

// A connection of the gRPC port (proxy/grpc_server.hpp) over ServerTls:
// marked before its handshake, it negotiates "h2" by ALPN, and fails the
// handshake when the client does not offer it; the HTTPS port's connections
// negotiate "http/1.1" when offered.
void mark_grpc(SSL* ssl);
int grpc_mark_index();

// The HTTPS listener's TLS (troupe-node --https-port): the service's own
// certificate chain and key (not the cluster CA's: e.g. one from a public
// CA), TLS 1.2 and 1.3 only; with a client CA, clients must present a
// certificate it signed. Made again when the files change or on reload().
class ServerTls {
 public:
  // The errors name the file that is missing or bad.
  static Result<std::shared_ptr<ServerTls>> load(const std::string& certificate_file,
                                                 const std::string& key_file,
                                                 const std::string& client_ca_file = "");
  ReloadingTlsContext::ContextPtr context() { return files_->context(); }
  Status reload() { return files_->reload(); }
  uint64_t reloads() const { return files_->reloads(); }
  bool verifies_clients() const { return verify_clients_; }

 private:
  std::unique_ptr<ReloadingTlsContext> files_;
  bool verify_clients_ = false;
};

}  // namespace troupe::proxy
