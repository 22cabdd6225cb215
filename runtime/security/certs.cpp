#include "runtime/security/certs.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cctype>
#include <ctime>
#include <filesystem>
#include <system_error>

#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/pem.h>
#include <openssl/rand.h>

#include "runtime/security/openssl_util.hpp"

namespace troupe::security {

namespace {

using detail::openssl_error;
using detail::PkeyPtr;
using detail::X509Ptr;

// Certificates start five minutes in the past so that a peer whose clock is a
// little behind does not see a fresh certificate as "not yet valid".
constexpr int64_t kBackdateSeconds = 300;
constexpr int64_t kDaySeconds = 24 * 60 * 60;

struct BioDeleter {
  void operator()(BIO* p) const { BIO_free(p); }
};

struct Paths {
  std::string crt;
  std::string key;
};

Paths paths_of(const std::string& dir, const std::string& name) {
  std::string base = dir.empty() ? name : dir + "/" + name;
  return {base + ".crt", base + ".key"};
}

Status fail(const std::string& what) {
  std::string detail = openssl_error();
  return Status(errc::internal, what + (detail.empty() ? "" : ": " + detail));
}

Result<PkeyPtr> new_key() {
  PkeyPtr key(EVP_EC_gen("P-256"));
  if (!key)
    return fail("cannot generate an EC P-256 key");
  return key;
}

std::string key_to_pem(EVP_PKEY* key) {
  std::unique_ptr<BIO, BioDeleter> bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1)
    return {};
  char* data = nullptr;
  long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

// A positive random serial of 159 bits (RFC 5280 allows at most 20 octets).
Status set_random_serial(X509* cert) {
  unsigned char bytes[20];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1)
    return fail("cannot draw a random serial");
  bytes[0] = static_cast<unsigned char>((bytes[0] & 0x7f) | 0x01);
  BIGNUM* bn = BN_bin2bn(bytes, sizeof(bytes), nullptr);
  bool ok = bn != nullptr && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert)) != nullptr;
  BN_free(bn);
  return ok ? Status::ok() : fail("cannot set the serial");
}

Status add_name_entry(X509_NAME* name, const char* field, const std::string& value) {
  if (X509_NAME_add_entry_by_txt(name, field, MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(value.c_str()), -1, -1,
                                 0) != 1)
    return fail(std::string("cannot set subject ") + field);
  return Status::ok();
}

Status add_extension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  bool ok = ext != nullptr && X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok ? Status::ok() : fail(std::string("cannot add extension ") + OBJ_nid2sn(nid));
}

// A certificate for `subject_key` with the fields every troupe certificate
// shares; the caller adds the extensions and signs.
Result<X509Ptr> new_certificate(EVP_PKEY* subject_key, Validity validity) {
  X509Ptr cert(X509_new());
  if (!cert || X509_set_version(cert.get(), 2) != 1)
    return fail("cannot create a certificate");
  if (Status s = set_random_serial(cert.get()); !s)
    return s;
  if (ASN1_TIME_set(X509_getm_notBefore(cert.get()), static_cast<time_t>(validity.not_before)) ==
          nullptr ||
      ASN1_TIME_set(X509_getm_notAfter(cert.get()), static_cast<time_t>(validity.not_after)) ==
          nullptr)
    return fail("cannot set the validity");
  if (X509_set_pubkey(cert.get(), subject_key) != 1)
    return fail("cannot set the public key");
  return cert;
}

Validity days_from_now(int valid_days) {
  int64_t now = static_cast<int64_t>(std::time(nullptr));
  return {now - kBackdateSeconds, now + static_cast<int64_t>(valid_days) * kDaySeconds};
}

Status check_days(int valid_days) {
  if (valid_days < 1)
    return Status(errc::invalid_argument,
                  "valid_days: " + std::to_string(valid_days) + " must be >= 1");
  return Status::ok();
}

std::string random_hex(int bytes) {
  unsigned char buf[16];
  RAND_bytes(buf, bytes);
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < bytes; ++i) {
    out += digits[buf[i] >> 4];
    out += digits[buf[i] & 0xf];
  }
  return out;
}

// Writes the key first and the certificate last: a certificate file means the
// identity is complete.
Status write_pair(const Paths& paths, EVP_PKEY* key, X509* cert) {
  std::string key_pem = key_to_pem(key);
  std::string crt_pem = detail::certificate_to_pem(cert);
  if (key_pem.empty() || crt_pem.empty())
    return fail("cannot encode PEM");
  if (Status s = detail::write_file(paths.key, key_pem, 0600); !s)
    return s;
  return detail::write_file(paths.crt, crt_pem, 0644);
}

Status refuse_existing(const Paths& paths, const std::string& what) {
  for (const std::string& path : {paths.crt, paths.key}) {
    if (detail::file_exists(path))
      return Status(errc::already_exists, path + " already exists: refusing to overwrite " + what);
  }
  return Status::ok();
}

}  // namespace

const char* to_string(Role role) {
  switch (role) {
    case Role::node:
      return "node";
    case Role::operator_:
      return "operator";
  }
  return "unknown";
}

Result<Role> parse_role(const std::string& text) {
  if (text == "node")
    return Role::node;
  if (text == "operator")
    return Role::operator_;
  return Status(errc::invalid_argument,
                "role: '" + text + "' is not a role (expected node or operator)");
}

std::string role_ou(Role role) {
  return std::string("troupe-") + to_string(role);
}

Status validate_name(const std::string& name) {
  if (name.empty() || name.size() > 64)
    return Status(errc::invalid_argument, "name: '" + name + "' must be 1 to 64 characters");
  if (!std::isalnum(static_cast<unsigned char>(name[0])))
    return Status(errc::invalid_argument,
                  "name: '" + name + "' must start with a letter or a digit");
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_')
      return Status(errc::invalid_argument,
                    "name: '" + name + "' may only contain letters, digits, '.', '-' and '_'");
  }
  if (name == "ca")
    return Status(errc::invalid_argument, "name: 'ca' is reserved for the cluster CA");
  return Status::ok();
}

Status init_ca(const std::string& dir, int valid_days) {
  if (Status s = check_days(valid_days); !s)
    return s;
  return init_ca(dir, days_from_now(valid_days));
}

Status init_ca(const std::string& dir, Validity validity) {
  if (validity.not_after <= validity.not_before)
    return Status(errc::invalid_argument, "validity: not_after must be later than not_before");
  Paths paths = paths_of(dir, "ca");
  if (Status s = refuse_existing(paths, "the cluster CA"); !s)
    return s;
  std::error_code ec;
  if (!dir.empty() && !std::filesystem::exists(dir, ec)) {
    std::filesystem::create_directories(dir, ec);
    if (ec)
      return Status(errc::io_error, dir + ": cannot create: " + ec.message());
    std::filesystem::permissions(dir, std::filesystem::perms::owner_all, ec);
  }
  Result<PkeyPtr> key = new_key();
  if (!key)
    return key.status();
  Result<X509Ptr> cert = new_certificate(key->get(), validity);
  if (!cert)
    return cert.status();
  X509* x = cert->get();
  X509_NAME* subject = X509_get_subject_name(x);
  // The random suffix tells two clusters' CAs apart in error messages.
  for (Status s : {add_name_entry(subject, "O", "troupe"),
                   add_name_entry(subject, "CN", "troupe cluster CA " + random_hex(4))}) {
    if (!s)
      return s;
  }
  if (X509_set_issuer_name(x, subject) != 1)
    return fail("cannot set the issuer");
  for (Status s : {add_extension(x, x, NID_basic_constraints, "critical,CA:TRUE,pathlen:0"),
                   add_extension(x, x, NID_key_usage, "critical,keyCertSign,cRLSign"),
                   add_extension(x, x, NID_subject_key_identifier, "hash"),
                   add_extension(x, x, NID_authority_key_identifier, "keyid:always")}) {
    if (!s)
      return s;
  }
  if (X509_sign(x, key->get(), EVP_sha256()) <= 0)
    return fail("cannot sign the CA certificate");
  return write_pair(paths, key->get(), x);
}

Status issue_certificate(const std::string& dir, const std::string& name, Role role,
                         int valid_days, const std::vector<std::string>& hosts) {
  if (Status s = check_days(valid_days); !s)
    return s;
  return issue_certificate(dir, name, role, days_from_now(valid_days), hosts);
}

Result<std::string> subject_alt_names_of(const std::string& name,
                                         const std::vector<std::string>& hosts) {
  std::string out = "DNS:" + name + ",DNS:localhost,IP:127.0.0.1";
  for (const auto& h : hosts) {
    unsigned char addr[sizeof(in6_addr)];
    if (::inet_pton(AF_INET, h.c_str(), addr) == 1 || ::inet_pton(AF_INET6, h.c_str(), addr) == 1) {
      out += ",IP:" + h;
      continue;
    }
    // A DNS name: labels of letters, digits and '-', not starting or ending
    // with '-', dot-separated, at most 253 characters in all.
    bool ok = !h.empty() && h.size() <= 253 && h.front() != '.' && h.back() != '.' &&
              h.find("..") == std::string::npos;
    for (size_t i = 0; ok && i < h.size(); ++i) {
      char c = h[i];
      bool edge = i == 0 || i + 1 == h.size() || h[i - 1] == '.' || h[i + 1] == '.';
      ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || (c == '-' && !edge);
    }
    if (!ok)
      return Status(errc::invalid_argument,
                    "host '" + h + "' is neither an IP address nor a DNS name");
    out += ",DNS:" + h;
  }
  return out;
}

Status issue_certificate(const std::string& dir, const std::string& name, Role role,
                         Validity validity, const std::vector<std::string>& hosts) {
  if (Status s = validate_name(name); !s)
    return s;
  Result<std::string> alt_names = subject_alt_names_of(name, hosts);
  if (!alt_names)
    return alt_names.status();
  if (validity.not_after <= validity.not_before)
    return Status(errc::invalid_argument, "validity: not_after must be later than not_before");
  Paths ca_paths = paths_of(dir, "ca");
  Result<std::string> ca_pem = detail::read_file(ca_paths.crt);
  if (!ca_pem)
    return Status(ca_pem.status().code(),
                  ca_pem.status().message() + " (create a CA first: troupectl certs init DIR)");
  Result<std::string> ca_key_pem = detail::read_file(ca_paths.key);
  if (!ca_key_pem)
    return ca_key_pem.status();
  Result<X509Ptr> ca = detail::parse_certificate(*ca_pem, ca_paths.crt);
  if (!ca)
    return ca.status();
  Result<PkeyPtr> ca_key = detail::parse_private_key(*ca_key_pem, ca_paths.key);
  if (!ca_key)
    return ca_key.status();
  if (X509_check_private_key(ca->get(), ca_key->get()) != 1) {
    openssl_error();
    return Status(errc::invalid_argument, ca_paths.key + " does not belong to " + ca_paths.crt);
  }
  Paths paths = paths_of(dir, name);
  if (Status s = refuse_existing(paths, "the certificate of '" + name + "'"); !s)
    return s;
  Result<PkeyPtr> key = new_key();
  if (!key)
    return key.status();
  Result<X509Ptr> cert = new_certificate(key->get(), validity);
  if (!cert)
    return cert.status();
  X509* x = cert->get();
  X509_NAME* subject = X509_get_subject_name(x);
  for (Status s :
       {add_name_entry(subject, "O", "troupe"), add_name_entry(subject, "OU", role_ou(role)),
        add_name_entry(subject, "CN", name)}) {
    if (!s)
      return s;
  }
  if (X509_set_issuer_name(x, X509_get_subject_name(ca->get())) != 1)
    return fail("cannot set the issuer");
  X509* issuer = ca->get();
  for (Status s : {add_extension(x, issuer, NID_basic_constraints, "critical,CA:FALSE"),
                   add_extension(x, issuer, NID_key_usage, "critical,digitalSignature"),
                   add_extension(x, issuer, NID_ext_key_usage, "serverAuth,clientAuth"),
                   add_extension(x, issuer, NID_subject_alt_name, *alt_names),
                   add_extension(x, issuer, NID_subject_key_identifier, "hash"),
                   add_extension(x, issuer, NID_authority_key_identifier, "keyid:always")}) {
    if (!s)
      return s;
  }
  if (X509_sign(x, ca_key->get(), EVP_sha256()) <= 0)
    return fail("cannot sign the certificate");
  return write_pair(paths, key->get(), x);
}

}  // namespace troupe::security
