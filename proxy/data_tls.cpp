#include "proxy/data_tls.hpp"

#include <openssl/ssl.h>

#include "runtime/security/credentials.hpp"

namespace troupe::proxy {

namespace ssl = boost::asio::ssl;

Result<std::shared_ptr<DataTls>> DataTls::load(const std::string& tls_dir,
                                               const std::string& name) {
  auto files = security::find_tls_files(tls_dir, name);
  if (!files)
    return files.status();
  auto loaded = ReloadingTlsContext::load(
      {files->ca_file, files->certificate_file, files->key_file},
      [ca = files->ca_file, certificate = files->certificate_file, key = files->key_file] {
        return make(ca, certificate, key);
      });
  if (!loaded)
    return loaded.status();
  auto tls = std::make_shared<DataTls>();
  tls->files_ = std::move(loaded.value());
  return tls;
}

Result<std::shared_ptr<ssl::context>> DataTls::make(const std::string& ca,
                                                    const std::string& certificate,
                                                    const std::string& key) {
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls);
  // TLS 1.2 and 1.3 only; peers verified both ways (the node role is
  // checked per connection, FrameConn::handshake()).
  SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_compression);
  boost::system::error_code ec;
  std::string step;
  if (ctx->use_certificate_chain_file(certificate, ec); ec) {
    step = certificate;
  } else if (ctx->use_private_key_file(key, ssl::context::pem, ec); ec) {
    step = key;
  } else if (ctx->load_verify_file(ca, ec); ec) {
    step = ca;
  } else {
    ctx->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert, ec);
    step = "the verification mode";
  }
  if (ec)
    return Status(errc::invalid_argument, "data port TLS: " + step + ": " + ec.message());
  return ctx;
}

}  // namespace troupe::proxy
