// TLS on the data ports (issue 41): with --tls-dir, the connections between
// workers' proxies (proxy/peer_client.cpp, proxy/peer_server.cpp) speak TLS
// with the cluster's certificates, both sides verified: the peer must
// present a certificate of the cluster's CA with the node role (an operator's
// certificate, another CA's, or none is refused). The token is still
// presented inside the TLS session. Connections are long-lived (one per
// pair of io thread and peer node), so a handshake is paid once per
// connection, not per request.
#pragma once

#include <memory>
#include <string>

#include <boost/asio/ssl/context.hpp>

#include "proxy/tls_context.hpp"
#include "runtime/status.hpp"

namespace troupe::proxy {

class DataTls {
 public:
  // The CA, certificate and key of the identity `name` in `tls_dir` (as
  // troupe-node's --tls-dir and node id name them); the error names the
  // file that is missing or bad.
  static Result<std::shared_ptr<DataTls>> load(const std::string& tls_dir,
                                                const std::string& name);

  // The context for a new connection: loaded again when one of the files
  // changed since (a renewed certificate applies to the next connections,
  // as it does for CAF's). When the new files do not load, the last good
  // context stays. Any thread.
  std::shared_ptr<boost::asio::ssl::context> context() { return files_->context(); }

 private:
  static Result<std::shared_ptr<boost::asio::ssl::context>> make(const std::string& ca,
                                                                 const std::string& certificate,
                                                                 const std::string& key);

  std::unique_ptr<ReloadingTlsContext> files_;
};

}  // namespace troupe::proxy
