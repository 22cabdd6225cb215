#include "proxy/data_tls.hpp"

#include <sys/stat.h>

#include <openssl/ssl.h>

#include "runtime/security/credentials.hpp"

namespace troupe::proxy {

namespace ssl = boost::asio::ssl;

namespace {

std::time_t mtime(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_mtime : 0;
}

}  // namespace

Result<std::shared_ptr<DataTls>> DataTls::load(const std::string& tls_dir,
                                               const std::string& name) {
  auto files = security::find_tls_files(tls_dir, name);
  if (!files)
    return files.status();
  auto tls = std::make_shared<DataTls>();
  tls->ca_file_ = files->ca_file;
  tls->certificate_file_ = files->certificate_file;
  tls->key_file_ = files->key_file;
  tls->loaded_ = tls->stamp();
  auto made = make(tls->ca_file_, tls->certificate_file_, tls->key_file_);
  if (!made)
    return made.status();
  tls->context_ = std::move(made.value());
  return tls;
}

DataTls::Stamp DataTls::stamp() const {
  return Stamp{mtime(ca_file_), mtime(certificate_file_), mtime(key_file_)};
}

std::shared_ptr<ssl::context> DataTls::context() {
  std::lock_guard<std::mutex> lock(mutex_);
  auto now = stamp();
  if (!(now == loaded_)) {
    loaded_ = now;
    if (auto made = make(ca_file_, certificate_file_, key_file_))
      context_ = std::move(made.value());
  }
  return context_;
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
