#include "runtime/security/openssl_util.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <vector>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509_vfy.h>

namespace troupe::security::detail {

namespace {

struct BioDeleter {
  void operator()(BIO* p) const { BIO_free(p); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;

struct StoreDeleter {
  void operator()(X509_STORE* p) const { X509_STORE_free(p); }
};
struct StoreCtxDeleter {
  void operator()(X509_STORE_CTX* p) const { X509_STORE_CTX_free(p); }
};

BioPtr memory_bio(const std::string& data) {
  return BioPtr(BIO_new_mem_buf(data.data(), static_cast<int>(data.size())));
}

// Every OU entry of the subject.
std::vector<std::string> organizational_units(X509* cert) {
  std::vector<std::string> result;
  X509_NAME* subject = X509_get_subject_name(cert);
  int pos = -1;
  while ((pos = X509_NAME_get_index_by_NID(subject, NID_organizationalUnitName, pos)) >= 0) {
    ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, pos));
    result.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(data)),
                        static_cast<size_t>(ASN1_STRING_length(data)));
  }
  return result;
}

}  // namespace

std::string openssl_error() {
  unsigned long code = ERR_get_error();
  std::string result;
  if (code != 0) {
    char buf[256];
    ERR_error_string_n(code, buf, sizeof(buf));
    result = buf;
  }
  ERR_clear_error();
  return result;
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT)
      return Status(errc::not_found, path + ": no such file");
    return Status(errc::io_error, path + ": cannot read: " + std::strerror(errno));
  }
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad())
    return Status(errc::io_error, path + ": read failed");
  return out.str();
}

Status write_file(const std::string& path, const std::string& data, unsigned mode) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0)
    return Status(errc::io_error, tmp + ": cannot create: " + std::strerror(errno));
  // open() applies the umask; a private key must be 0600 whatever it is.
  bool ok = ::fchmod(fd, mode) == 0;
  size_t done = 0;
  while (ok && done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    ok = n > 0;
    if (ok)
      done += static_cast<size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  int saved = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    if (ok)
      saved = errno;
    ::unlink(tmp.c_str());
    return Status(errc::io_error, path + ": cannot write: " + std::strerror(saved));
  }
  return Status::ok();
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

Result<X509Ptr> parse_certificate(const std::string& pem, const std::string& what) {
  BioPtr bio = memory_bio(pem);
  X509Ptr cert(bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!cert) {
    std::string detail = openssl_error();
    return Status(errc::invalid_argument,
                  what + ": not a PEM certificate" + (detail.empty() ? "" : " (" + detail + ")"));
  }
  return cert;
}

Result<PkeyPtr> parse_private_key(const std::string& pem, const std::string& what) {
  BioPtr bio = memory_bio(pem);
  // An empty passphrase callback result makes an encrypted key fail instead of
  // prompting on the terminal.
  auto no_passphrase = [](char*, int, int, void*) { return 0; };
  PkeyPtr key(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr) : nullptr);
  if (!key) {
    std::string detail = openssl_error();
    return Status(errc::invalid_argument, what + ": not an unencrypted PEM private key" +
                                              (detail.empty() ? "" : " (" + detail + ")"));
  }
  return key;
}

std::string certificate_to_pem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509(bio.get(), cert) != 1)
    return {};
  char* data = nullptr;
  long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(size));
}

std::string common_name(X509* cert) {
  X509_NAME* subject = X509_get_subject_name(cert);
  int pos = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (pos < 0)
    return {};
  ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, pos));
  return std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(data)),
                     static_cast<size_t>(ASN1_STRING_length(data)));
}

Result<Role> role_of(X509* cert) {
  std::string name = common_name(cert);
  Result<Role> found(errc::permission_denied,
                     "certificate '" + name + "' carries no troupe role (expected OU=" +
                         role_ou(Role::node) + " or OU=" + role_ou(Role::operator_) + ")");
  int matches = 0;
  for (const std::string& ou : organizational_units(cert)) {
    for (Role role : {Role::node, Role::operator_}) {
      if (ou == role_ou(role)) {
        found = role;
        ++matches;
      }
    }
  }
  if (matches > 1)
    return Status(errc::permission_denied,
                  "certificate '" + name + "' carries more than one troupe role");
  return found;
}

int64_t to_unix(const ASN1_TIME* t) {
  struct tm parts;
  std::memset(&parts, 0, sizeof(parts));
  if (ASN1_TIME_to_tm(t, &parts) != 1)
    return 0;
  return static_cast<int64_t>(timegm(&parts));
}

std::string format_utc(int64_t unix_seconds) {
  time_t t = static_cast<time_t>(unix_seconds);
  struct tm parts;
  if (gmtime_r(&t, &parts) == nullptr)
    return "Unix time " + std::to_string(unix_seconds);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &parts);
  return buf;
}

Status verify_chain(X509* ca, X509* cert, int64_t unix_now, const std::string& label) {
  std::unique_ptr<X509_STORE, StoreDeleter> store(X509_STORE_new());
  std::unique_ptr<X509_STORE_CTX, StoreCtxDeleter> ctx(X509_STORE_CTX_new());
  if (!store || !ctx || X509_STORE_add_cert(store.get(), ca) != 1 ||
      X509_STORE_CTX_init(ctx.get(), store.get(), cert, nullptr) != 1)
    return Status(errc::internal, "cannot set up certificate verification: " + openssl_error());
  // The caller's clock decides expiry, so tests (and the controller) are
  // deterministic about "now".
  X509_VERIFY_PARAM_set_time(X509_STORE_CTX_get0_param(ctx.get()), static_cast<time_t>(unix_now));
  if (X509_verify_cert(ctx.get()) == 1)
    return Status::ok();
  int error = X509_STORE_CTX_get_error(ctx.get());
  int depth = X509_STORE_CTX_get_error_depth(ctx.get());
  X509* failing = X509_STORE_CTX_get_current_cert(ctx.get());
  if (failing == nullptr)
    failing = cert;
  ERR_clear_error();
  std::string who = depth == 0 ? label : "the cluster CA certificate";
  switch (error) {
    case X509_V_ERR_CERT_HAS_EXPIRED:
      return Status(errc::permission_denied,
                    who + " expired on " + format_utc(to_unix(X509_get0_notAfter(failing))));
    case X509_V_ERR_CERT_NOT_YET_VALID:
      return Status(errc::permission_denied, who + " is not valid before " +
                                                 format_utc(to_unix(X509_get0_notBefore(failing))) +
                                                 " (check the clocks)");
    default:
      return Status(errc::permission_denied, label + " is not signed by this cluster's CA (" +
                                                 X509_verify_cert_error_string(error) + ")");
  }
}

}  // namespace troupe::security::detail
