#include "proxy/tls_context.hpp"

#include <sys/stat.h>

#include <openssl/ssl.h>

namespace troupe::proxy {

namespace ssl = boost::asio::ssl;

Result<std::unique_ptr<ReloadingTlsContext>> ReloadingTlsContext::load(
    std::vector<std::string> files, Make make) {
  std::unique_ptr<ReloadingTlsContext> r(new ReloadingTlsContext(std::move(files), std::move(make)));
  r->loaded_ = r->stamps();
  auto made = r->make_();
  if (!made)
    return made.status();
  r->context_ = std::move(made.value());
  return r;
}

std::vector<ReloadingTlsContext::Stamp> ReloadingTlsContext::stamps() const {
  std::vector<Stamp> out;
  out.reserve(files_.size());
  for (const auto& f : files_) {
    struct stat st {};
    Stamp s;
    if (::stat(f.c_str(), &st) == 0) {
      s.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
      s.inode = st.st_ino;
      s.size = st.st_size;
    }
    out.push_back(s);
  }
  return out;
}

Status ReloadingTlsContext::remake() {
  loaded_ = stamps();
  ++reloads_;
  auto made = make_();
  if (!made) {
    last_error_ = made.status().message();
    return made.status();
  }
  context_ = std::move(made.value());
  last_error_.clear();
  return Status::ok();
}

ReloadingTlsContext::ContextPtr ReloadingTlsContext::context() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!(stamps() == loaded_))
    (void)remake();  // a failure keeps the last good context (last_error())
  return context_;
}

Status ReloadingTlsContext::reload() {
  std::lock_guard<std::mutex> lock(mutex_);
  return remake();
}

uint64_t ReloadingTlsContext::reloads() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reloads_;
}

std::string ReloadingTlsContext::last_error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_error_;
}

namespace {

// ALPN: a connection of the gRPC port (marked by mark_grpc) speaks HTTP/2
// ("h2") or nothing; the HTTPS port speaks HTTP/1.1, and says so when the
// client offers it (curl offers h2 first).
int select_protocol(SSL* ssl, const unsigned char** out, unsigned char* outlen,
                    const unsigned char* in, unsigned int inlen, void*) {
  const bool grpc = SSL_get_ex_data(ssl, grpc_mark_index()) != nullptr;
  static const unsigned char kH2[] = {2, 'h', '2'};
  static const unsigned char kHttp11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  const unsigned char* want = grpc ? kH2 : kHttp11;
  unsigned char* chosen = nullptr;
  if (SSL_select_next_proto(&chosen, outlen, want, want[0] + 1u, in, inlen) ==
      OPENSSL_NPN_NEGOTIATED) {
    *out = chosen;
    return SSL_TLSEXT_ERR_OK;
  }
  return grpc ? SSL_TLSEXT_ERR_ALERT_FATAL : SSL_TLSEXT_ERR_NOACK;
}

Result<ReloadingTlsContext::ContextPtr> make_server_context(const std::string& certificate,
                                                            const std::string& key,
                                                            const std::string& client_ca) {
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_compression |
                   ssl::context::single_dh_use);
  // Resumed sessions skip the full handshake; with client certificates
  // OpenSSL needs a context id to resume at all.
  static const unsigned char kSessionContext[] = "troupe-https";
  SSL_CTX_set_session_id_context(ctx->native_handle(), kSessionContext,
                                 sizeof(kSessionContext) - 1);
  SSL_CTX_set_alpn_select_cb(ctx->native_handle(), &select_protocol, nullptr);
  boost::system::error_code ec;
  std::string step;
  if (ctx->use_certificate_chain_file(certificate, ec); ec) {
    step = "--https-cert " + certificate;
  } else if (ctx->use_private_key_file(key, ssl::context::pem, ec); ec) {
    step = "--https-key " + key;
  } else if (SSL_CTX_check_private_key(ctx->native_handle()) != 1) {
    return Status(errc::invalid_argument,
                  "HTTPS: --https-key " + key + " is not the key of --https-cert " + certificate);
  } else if (!client_ca.empty()) {
    if (ctx->load_verify_file(client_ca, ec); ec) {
      step = "--https-client-ca " + client_ca;
    } else {
      // The CA names sent to the client, so it can pick its certificate.
      if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(client_ca.c_str()))
        SSL_CTX_set_client_CA_list(ctx->native_handle(), names);
      ctx->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert, ec);
      step = "the verification mode";
    }
  }
  if (ec)
    return Status(errc::invalid_argument, "HTTPS: " + step + ": " + ec.message());
  return ctx;
}

}  // namespace

int grpc_mark_index() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}

void mark_grpc(SSL* ssl) {
  static int mark = 1;
  SSL_set_ex_data(ssl, grpc_mark_index(), &mark);
}

Result<std::shared_ptr<ServerTls>> ServerTls::load(const std::string& certificate_file,
                                                   const std::string& key_file,
                                                   const std::string& client_ca_file) {
  std::vector<std::string> files = {certificate_file, key_file};
  if (!client_ca_file.empty())
    files.push_back(client_ca_file);
  auto loaded = ReloadingTlsContext::load(files, [=] {
    return make_server_context(certificate_file, key_file, client_ca_file);
  });
  if (!loaded)
    return loaded.status();
  auto tls = std::make_shared<ServerTls>();
  tls->files_ = std::move(loaded.value());
  tls->verify_clients_ = !client_ca_file.empty();
  return tls;
}

}  // namespace troupe::proxy
