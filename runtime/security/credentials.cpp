#include "runtime/security/credentials.hpp"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include <openssl/bn.h>
#include <openssl/ecdsa.h>
#include <openssl/err.h>
#include <openssl/evp.h>

#include "runtime/security/openssl_util.hpp"

namespace troupe::security {

namespace {

using detail::PkeyPtr;
using detail::X509Ptr;

struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* p) const { EVP_MD_CTX_free(p); }
};
using MdCtxPtr = std::unique_ptr<EVP_MD_CTX, MdCtxDeleter>;

// Domain separation: a credential signature can never be mistaken for a
// signature over anything else made with the same key.
std::string signed_message(int64_t timestamp, const std::string& request_digest) {
  return "troupe-credential-v1\n" + std::to_string(timestamp) + "\n" + request_digest;
}

std::string base64_encode(const std::string& bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()),
                          static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(std::max(n, 0)));
  return out;
}

// false on malformed input.
bool base64_decode(const std::string& text, std::string& bytes) {
  if (text.empty() || text.size() % 4 != 0)
    return false;
  bytes.assign(3 * text.size() / 4, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(bytes.data()),
                          reinterpret_cast<const unsigned char*>(text.data()),
                          static_cast<int>(text.size()));
  if (n < 0)
    return false;
  // EVP_DecodeBlock counts the padding as zero bytes.
  size_t padding = text.size() - text.find_last_not_of('=') - 1;
  if (padding > 2)
    return false;
  bytes.resize(static_cast<size_t>(n) - padding);
  return true;
}

std::string sha256_hex(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += digits[md[i] >> 4];
    out += digits[md[i] & 0xf];
  }
  return out;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items)
    out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace

Result<TlsFiles> find_tls_files(const std::string& tls_dir, const std::string& name) {
  std::string chosen = name;
  if (chosen.empty()) {
    std::error_code ec;
    std::vector<std::string> candidates;
    for (std::filesystem::directory_iterator it(tls_dir, ec), end; !ec && it != end;
         it.increment(ec)) {
      const std::filesystem::path& path = it->path();
      if (path.extension() == ".crt" && path.stem() != "ca")
        candidates.push_back(path.stem().string());
    }
    if (ec)
      return Status(errc::not_found, tls_dir + ": cannot list the TLS directory: " + ec.message());
    std::sort(candidates.begin(), candidates.end());
    if (candidates.size() != 1)
      return Status(errc::invalid_argument,
                    tls_dir + ": expected exactly one identity <name>.crt besides ca.crt, found " +
                        (candidates.empty() ? std::string("none") : join(candidates)) +
                        "; name the identity explicitly");
    chosen = candidates.front();
  } else if (Status s = validate_name(chosen); !s) {
    return s;
  }
  TlsFiles files{tls_dir + "/ca.crt", tls_dir + "/" + chosen + ".crt",
                 tls_dir + "/" + chosen + ".key"};
  for (const std::string& path : {files.ca_file, files.certificate_file, files.key_file}) {
    if (!detail::file_exists(path))
      return Status(errc::not_found, path + ": no such file (TLS directory " + tls_dir + ")");
  }
  return files;
}

Result<Identity> load_identity(const std::string& tls_dir, const std::string& name,
                               int64_t unix_now) {
  Result<TlsFiles> files = find_tls_files(tls_dir, name);
  if (!files)
    return files.status();
  Identity id;
  for (auto [path, out] : {std::pair{files->ca_file, &id.ca_pem},
                           std::pair{files->certificate_file, &id.certificate_pem},
                           std::pair{files->key_file, &id.key_pem}}) {
    Result<std::string> text = detail::read_file(path);
    if (!text)
      return text.status();
    *out = std::move(*text);
  }
  Result<X509Ptr> ca = detail::parse_certificate(id.ca_pem, files->ca_file);
  if (!ca)
    return ca.status();
  Result<X509Ptr> cert = detail::parse_certificate(id.certificate_pem, files->certificate_file);
  if (!cert)
    return cert.status();
  Result<PkeyPtr> key = detail::parse_private_key(id.key_pem, files->key_file);
  if (!key)
    return key.status();
  if (X509_check_private_key(cert->get(), key->get()) != 1) {
    detail::openssl_error();
    return Status(errc::invalid_argument,
                  files->key_file + " does not belong to " + files->certificate_file);
  }
  id.name = detail::common_name(cert->get());
  std::string label = "certificate '" + id.name + "' (" + files->certificate_file + ")";
  if (Status s = detail::verify_chain(ca->get(), cert->get(), unix_now, label); !s)
    return s;
  Result<Role> role = detail::role_of(cert->get());
  if (!role)
    return role.status();
  id.role = *role;
  id.not_after = detail::to_unix(X509_get0_notAfter(cert->get()));
  return id;
}

std::string request_digest(const std::string& operation, const std::vector<std::string>& args) {
  // Length prefixes keep ("a,b") and ("a", "b") apart.
  std::string canonical = std::to_string(operation.size()) + ":" + operation;
  for (const std::string& arg : args)
    canonical += ";" + std::to_string(arg.size()) + ":" + arg;
  return operation + " sha256:" + sha256_hex(canonical);
}

Result<Credential> sign(const Identity& identity, const std::string& request_digest,
                        int64_t unix_now) {
  Result<PkeyPtr> key = detail::parse_private_key(identity.key_pem, identity.name + ".key");
  if (!key)
    return Status(errc::internal, key.status().message());
  std::string message = signed_message(unix_now, request_digest);
  MdCtxPtr ctx(EVP_MD_CTX_new());
  size_t size = 0;
  if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key->get()) != 1 ||
      EVP_DigestSign(ctx.get(), nullptr, &size,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1)
    return Status(errc::internal, "cannot sign the request: " + detail::openssl_error());
  std::string signature(size, '\0');
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(signature.data()), &size,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1)
    return Status(errc::internal, "cannot sign the request: " + detail::openssl_error());
  signature.resize(size);
  return Credential{identity.certificate_pem, unix_now, base64_encode(signature)};
}

std::string signature_identity(const Credential& credential) {
  std::string bytes;
  if (!base64_decode(credential.signature, bytes))
    return "";
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  ECDSA_SIG* sig = d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(bytes.size()));
  if (sig == nullptr || p != reinterpret_cast<const unsigned char*>(bytes.data()) + bytes.size()) {
    ECDSA_SIG_free(sig);
    ERR_clear_error();
    return "bytes:" + bytes;
  }
  const BIGNUM* r = ECDSA_SIG_get0_r(sig);
  std::string out(static_cast<size_t>(BN_num_bytes(r)), '\0');
  BN_bn2bin(r, reinterpret_cast<unsigned char*>(out.data()));
  ECDSA_SIG_free(sig);
  return "ecdsa-r:" + out;
}

Result<Role> verify(const std::string& ca_pem, const Credential& credential,
                    const std::string& request_digest, int64_t unix_now, int64_t max_skew_s) {
  Result<Caller> caller = verify_caller(ca_pem, credential, request_digest, unix_now, max_skew_s);
  if (!caller)
    return caller.status();
  return caller->role;
}

Result<Caller> verify_caller(const std::string& ca_pem, const Credential& credential,
                             const std::string& request_digest, int64_t unix_now,
                             int64_t max_skew_s) {
  Result<X509Ptr> ca = detail::parse_certificate(ca_pem, "the cluster CA");
  if (!ca)
    return Status(errc::internal, ca.status().message());
  if (credential.certificate_pem.empty())
    return Status(errc::permission_denied,
                  "permission denied: the request carries no certificate (is TLS configured "
                  "with --tls-dir?)");
  Result<X509Ptr> cert =
      detail::parse_certificate(credential.certificate_pem, "the caller's certificate");
  if (!cert)
    return Status(errc::permission_denied, cert.status().message());
  std::string name = detail::common_name(cert->get());
  std::string label = "certificate '" + name + "'";
  if (Status s = detail::verify_chain(ca->get(), cert->get(), unix_now, label); !s)
    return s;
  Result<Role> role = detail::role_of(cert->get());
  if (!role)
    return role.status();
  std::string signature;
  bool signature_ok = base64_decode(credential.signature, signature);
  if (signature_ok) {
    std::string message = signed_message(credential.timestamp, request_digest);
    MdCtxPtr ctx(EVP_MD_CTX_new());
    EVP_PKEY* public_key = X509_get0_pubkey(cert->get());
    signature_ok =
        ctx && public_key != nullptr &&
        EVP_DigestVerifyInit(ctx.get(), nullptr, EVP_sha256(), nullptr, public_key) == 1 &&
        EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                         signature.size(), reinterpret_cast<const unsigned char*>(message.data()),
                         message.size()) == 1;
    detail::openssl_error();
  }
  if (!signature_ok)
    return Status(errc::permission_denied,
                  "bad signature: the credential was not made by the holder of " + label +
                      " for this request");
  // Compared without subtracting: a signed but absurd timestamp must not
  // overflow.
  bool behind = credential.timestamp < unix_now - max_skew_s;
  bool ahead = credential.timestamp > unix_now + max_skew_s;
  if (behind || ahead) {
    uint64_t distance =
        behind ? static_cast<uint64_t>(unix_now) - static_cast<uint64_t>(credential.timestamp)
               : static_cast<uint64_t>(credential.timestamp) - static_cast<uint64_t>(unix_now);
    return Status(errc::permission_denied,
                  "stale credential: signed at " + detail::format_utc(credential.timestamp) + ", " +
                      std::to_string(distance) + " s " + (behind ? "behind" : "ahead of") +
                      " the controller's clock (allowed ±" + std::to_string(max_skew_s) + " s)");
  }
  return Caller{name, *role};
}

Status require_role(Role have, Role required, const std::string& operation) {
  if (have == required)
    return Status::ok();
  return Status(errc::permission_denied,
                "permission denied: " + operation + " requires the " + to_string(required) +
                    " role (the caller's certificate has the " + to_string(have) + " role)");
}

Status authorize(const std::string& ca_pem, const Credential& credential,
                 const std::string& operation, const std::vector<std::string>& args, Role required,
                 int64_t unix_now, int64_t max_skew_s) {
  Result<Role> role =
      verify(ca_pem, credential, request_digest(operation, args), unix_now, max_skew_s);
  if (!role)
    return Status(role.status().code(),
                  "permission denied for " + operation + ": " + role.status().message());
  return require_role(*role, required, operation);
}

}  // namespace troupe::security
