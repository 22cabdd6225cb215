#include "runtime/security/certs.hpp"

#include <arpa/inet.h>
#include <sys/stat.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <doctest/doctest.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include "runtime/security/credentials.hpp"
#include "tests/support/temp_dir.hpp"

using troupe::errc;
using namespace troupe::security;
using troupe::testing::TempDir;

namespace {

constexpr int64_t kNow = 1800000000;  // 2027-01-15 08:00:00 UTC

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

unsigned mode_of(const std::string& path) {
  struct stat st;
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 0777;
}

// The certificate in a PEM file, owned by the caller.
X509* read_cert(const std::string& path) {
  std::string pem = slurp(path);
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  REQUIRE(cert != nullptr);
  return cert;
}

std::string subject_alt_names(X509* cert) {
  auto* names =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  REQUIRE(names != nullptr);
  std::string out;
  for (int i = 0; i < sk_GENERAL_NAME_num(names); ++i) {
    GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
    if (name->type == GEN_DNS) {
      const ASN1_STRING* s = name->d.dNSName;
      out += "DNS:" +
             std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                         static_cast<size_t>(ASN1_STRING_length(s))) +
             " ";
    } else if (name->type == GEN_IPADD) {
      const unsigned char* ip = ASN1_STRING_get0_data(name->d.iPAddress);
      char text[INET6_ADDRSTRLEN] = {};
      const int family = ASN1_STRING_length(name->d.iPAddress) == 16 ? AF_INET6 : AF_INET;
      ::inet_ntop(family, ip, text, sizeof(text));
      out += std::string("IP:") + text + " ";
    }
  }
  GENERAL_NAMES_free(names);
  return out;
}

std::string serial_of(X509* cert) {
  BIGNUM* bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(cert), nullptr);
  char* hex = BN_bn2hex(bn);
  std::string out = hex;
  OPENSSL_free(hex);
  BN_free(bn);
  return out;
}

}  // namespace

TEST_CASE("roles print and parse") {
  CHECK(std::string(to_string(Role::node)) == "node");
  CHECK(std::string(to_string(Role::operator_)) == "operator");
  CHECK(role_ou(Role::operator_) == "troupe-operator");
  CHECK(*parse_role("node") == Role::node);
  CHECK(*parse_role("operator") == Role::operator_);
  auto bad = parse_role("admin");
  REQUIRE_FALSE(bad);
  CHECK(bad.status().code() == errc::invalid_argument);
  CHECK(bad.status().message().find("'admin' is not a role") != std::string::npos);
}

TEST_CASE("identity names are validated") {
  CHECK(validate_name("node-1"));
  CHECK(validate_name("ops.alice_2"));
  for (const char* bad : {"", "-x", ".hidden", "a/b", "../x", "a b", "ca", "ü"}) {
    CAPTURE(bad);
    CHECK(validate_name(bad).code() == errc::invalid_argument);
  }
  CHECK_FALSE(validate_name(std::string(65, 'a')));
}

TEST_CASE("init_ca writes a private key and refuses to overwrite a CA") {
  TempDir tmp;
  std::string dir = tmp / "cluster";  // created by init_ca
  REQUIRE(init_ca(dir).is_ok());
  CHECK(mode_of(dir + "/ca.key") == 0600);
  CHECK(mode_of(dir) == 0700);
  std::string key_before = slurp(dir + "/ca.key");

  auto again = init_ca(dir);
  CHECK(again.code() == errc::already_exists);
  CHECK(again.message().find("refusing to overwrite the cluster CA") != std::string::npos);
  CHECK(slurp(dir + "/ca.key") == key_before);

  X509* ca = read_cert(dir + "/ca.crt");
  CHECK(X509_check_ca(ca) == 1);
  X509_free(ca);
  CHECK(init_ca(tmp / "other", 0).code() == errc::invalid_argument);
}

TEST_CASE("issued certificates carry their role - names and a random serial") {
  TempDir tmp;
  REQUIRE(init_ca(tmp.path()).is_ok());
  REQUIRE(issue_certificate(tmp.path(), "node-1", Role::node, 30).is_ok());
  REQUIRE(issue_certificate(tmp.path(), "alice", Role::operator_, 30).is_ok());
  CHECK(mode_of(tmp / "node-1.key") == 0600);

  auto node = load_identity(tmp.path(), "node-1", std::time(nullptr));
  REQUIRE_MESSAGE(node, node.status().to_string());
  CHECK(node->name == "node-1");
  CHECK(node->role == Role::node);
  auto op = load_identity(tmp.path(), "alice", std::time(nullptr));
  REQUIRE_MESSAGE(op, op.status().to_string());
  CHECK(op->role == Role::operator_);
  CHECK(op->not_after > std::time(nullptr) + 29 * 86400);

  X509* a = read_cert(tmp / "node-1.crt");
  X509* b = read_cert(tmp / "alice.crt");
  CHECK(subject_alt_names(a) == "DNS:node-1 DNS:localhost IP:127.0.0.1 ");
  CHECK(serial_of(a) != serial_of(b));
  CHECK(serial_of(a).size() >= 30);  // ~159 random bits, not a counter
  CHECK(X509_check_ca(a) == 0);
  CHECK(X509_check_purpose(a, X509_PURPOSE_SSL_CLIENT, 0) == 1);
  CHECK(X509_check_purpose(a, X509_PURPOSE_SSL_SERVER, 0) == 1);
  X509_free(a);
  X509_free(b);
}

TEST_CASE("issued certificates name the hosts they are given - addresses and DNS names") {
  TempDir tmp;
  REQUIRE(init_ca(tmp.path()).is_ok());
  REQUIRE(issue_certificate(tmp.path(), "etcd1", Role::node, 30,
                            {"10.0.0.5", "fd00::7", "etcd1.example.org"})
              .is_ok());
  X509* c = read_cert(tmp / "etcd1.crt");
  REQUIRE(c);
  CHECK(subject_alt_names(c) ==
        "DNS:etcd1 DNS:localhost IP:127.0.0.1 IP:10.0.0.5 IP:fd00::7 "
        "DNS:etcd1.example.org ");
  // What a TLS client checks: the certificate is valid for the address.
  CHECK(X509_check_ip_asc(c, "10.0.0.5", 0) == 1);
  CHECK(X509_check_ip_asc(c, "10.0.0.6", 0) == 0);
  CHECK(X509_check_host(c, "etcd1.example.org", 0, 0, nullptr) == 1);
  X509_free(c);

  for (const std::string bad : {"two words", "-lead.example", "a..b", "", "x/y", "trail-"}) {
    auto st = issue_certificate(tmp.path(), "bad", Role::node, 30, {bad});
    CHECK(st.code() == errc::invalid_argument);
    CHECK(st.message() == "host '" + bad + "' is neither an IP address nor a DNS name");
  }
  // Nothing is written for a refused host.
  CHECK_FALSE(std::filesystem::exists(tmp / "bad.crt"));
  CHECK_FALSE(std::filesystem::exists(tmp / "bad.key"));
}

TEST_CASE("issue_certificate refuses bad input and never overwrites") {
  TempDir tmp;
  auto no_ca = issue_certificate(tmp.path(), "node-1", Role::node, 30);
  CHECK(no_ca.code() == errc::not_found);
  CHECK(no_ca.message().find("ca.crt") != std::string::npos);

  REQUIRE(init_ca(tmp.path()).is_ok());
  CHECK(issue_certificate(tmp.path(), "../evil", Role::node, 30).code() == errc::invalid_argument);
  CHECK(issue_certificate(tmp.path(), "ca", Role::node, 30).code() == errc::invalid_argument);
  CHECK(issue_certificate(tmp.path(), "n", Role::node, 0).code() == errc::invalid_argument);
  CHECK(issue_certificate(tmp.path(), "n", Role::node, Validity{kNow, kNow}).code() ==
        errc::invalid_argument);

  REQUIRE(issue_certificate(tmp.path(), "node-1", Role::node, 30).is_ok());
  std::string before = slurp(tmp / "node-1.crt");
  auto again = issue_certificate(tmp.path(), "node-1", Role::operator_, 30);
  CHECK(again.code() == errc::already_exists);
  CHECK(slurp(tmp / "node-1.crt") == before);
  CHECK_FALSE(std::filesystem::exists(tmp / "node-1.crt.tmp"));
}
