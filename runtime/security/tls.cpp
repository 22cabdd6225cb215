#include "runtime/security/tls.hpp"

#include <ctime>
#include <filesystem>
#include <system_error>

#include <caf/io/middleman.hpp>
#include <caf/io/publish.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/openssl/publish.hpp>

namespace troupe::security {

namespace {

// CAF opens the files on every new connection, possibly after the process
// changed its working directory.
std::string absolute(const std::string& path) {
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(path, ec);
  return ec ? path : abs.lexically_normal().string();
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

caf::expected<uint16_t> publish(const caf::actor& whom, uint16_t port, const char* in, bool reuse) {
  if (whom && whom.home_system().has_openssl_manager())
    return caf::openssl::publish(whom, port, in, reuse);
  return caf::io::publish(whom, port, in, reuse);
}

}  // namespace troupe::security
