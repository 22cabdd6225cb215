#include "runtime/security/credentials.hpp"

#include <filesystem>

#include <doctest/doctest.h>

#include "tests/support/temp_dir.hpp"

using troupe::errc;
using troupe::Status;
using namespace troupe::security;
using troupe::testing::TempDir;

namespace {

// Fixed clocks: every outcome below is independent of the real time.
constexpr int64_t kIssued = 1700000000;                  // 2023-11-14 22:13:20 UTC
constexpr int64_t kExpires = 1900000000;                 // 2030-03-17 17:46:40 UTC
constexpr int64_t kNow = 1800000000;                     // 2027-01-15 08:00:00 UTC
constexpr Validity kCaValidity{1600000000, 2000000000};  // 2020 .. 2033

bool contains(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

// Two clusters' CAs, each with identities valid from kIssued to kExpires.
struct Clusters {
  TempDir tmp;
  std::string home = tmp / "home";
  std::string foreign = tmp / "foreign";

  Clusters() {
    REQUIRE(init_ca(home, kCaValidity).is_ok());
    REQUIRE(init_ca(foreign, kCaValidity).is_ok());
    Validity valid{kIssued, kExpires};
    REQUIRE(issue_certificate(home, "alice", Role::operator_, valid).is_ok());
    REQUIRE(issue_certificate(home, "node-1", Role::node, valid).is_ok());
    REQUIRE(issue_certificate(foreign, "mallory", Role::operator_, valid).is_ok());
  }

  Identity identity(const std::string& dir, const std::string& name, int64_t now = kNow) {
    auto id = load_identity(dir, name, now);
    REQUIRE_MESSAGE(id, id.status().to_string());
    return *id;
  }
  std::string home_ca() { return identity(home, "alice").ca_pem; }
};

Credential sign_ok(const Identity& id, const std::string& digest, int64_t now) {
  auto c = sign(id, digest, now);
  REQUIRE_MESSAGE(c, c.status().to_string());
  return *c;
}

}  // namespace

TEST_CASE("request digests are canonical and unambiguous") {
  CHECK(request_digest("drain", {"node-1"}) == request_digest("drain", {"node-1"}));
  CHECK(request_digest("drain", {"node-1"}).rfind("drain sha256:", 0) == 0);
  CHECK(request_digest("drain", {"node-1"}) != request_digest("drain", {"node-2"}));
  CHECK(request_digest("drain", {"a,b"}) != request_digest("drain", {"a", "b"}));
  CHECK(request_digest("drain", {"a;1:b"}) != request_digest("drain", {"a", "b"}));
  CHECK(request_digest("delete", {"x"}) != request_digest("drain", {"x"}));
}

TEST_CASE("a signed credential verifies and yields the signer's role") {
  Clusters c;
  std::string digest = request_digest("drain", {"node-1"});
  auto op = verify(c.home_ca(), sign_ok(c.identity(c.home, "alice"), digest, kNow), digest, kNow);
  REQUIRE_MESSAGE(op, op.status().to_string());
  CHECK(*op == Role::operator_);
  auto node =
      verify(c.home_ca(), sign_ok(c.identity(c.home, "node-1"), digest, kNow), digest, kNow);
  REQUIRE(node);
  CHECK(*node == Role::node);
  auto caller =
      verify_caller(c.home_ca(), sign_ok(c.identity(c.home, "node-1"), digest, kNow), digest, kNow);
  REQUIRE(caller);
  CHECK(caller->name == "node-1");
  CHECK(caller->role == Role::node);
}

TEST_CASE("the CA certificate itself is no identity") {
  Clusters c;
  Identity alice = c.identity(c.home, "alice");
  std::string digest = request_digest("drain", {"x"});
  Credential cred = sign_ok(alice, digest, kNow);
  cred.certificate_pem = alice.ca_pem;
  auto role = verify(c.home_ca(), cred, digest, kNow);
  REQUIRE_FALSE(role);
  CHECK(role.status().code() == errc::permission_denied);
  CHECK(contains(role.status(), "carries no troupe role"));
}

TEST_CASE("a credential from another cluster's CA is refused") {
  Clusters c;
  std::string digest = request_digest("deploy", {"app"});
  // mallory's identity is perfectly valid in its own cluster...
  Identity mallory = c.identity(c.foreign, "mallory");
  auto role = verify(c.home_ca(), sign_ok(mallory, digest, kNow), digest, kNow);
  REQUIRE_FALSE(role);
  CHECK(role.status().code() == errc::permission_denied);
  CHECK(contains(role.status(), "certificate 'mallory' is not signed by this cluster's CA"));
  // ...and cannot be loaded against the home CA either.
  std::filesystem::create_directory(c.tmp / "mixed");
  std::filesystem::copy_file(c.home + "/ca.crt", c.tmp / "mixed/ca.crt");
  std::filesystem::copy_file(c.foreign + "/mallory.crt", c.tmp / "mixed/mallory.crt");
  std::filesystem::copy_file(c.foreign + "/mallory.key", c.tmp / "mixed/mallory.key");
  auto loaded = load_identity(c.tmp / "mixed", "", kNow);
  REQUIRE_FALSE(loaded);
  CHECK(contains(loaded.status(), "is not signed by this cluster's CA"));
}

TEST_CASE("an expired certificate is refused with the date it expired") {
  Clusters c;
  REQUIRE(
      issue_certificate(c.home, "old", Role::operator_, Validity{kIssued, kIssued + 3600}).is_ok());
  std::string digest = request_digest("shutdown", {});
  // Signing does not look at the validity: the controller decides.
  Identity old = c.identity(c.home, "old", kIssued + 60);
  auto role = verify(c.home_ca(), sign_ok(old, digest, kNow), digest, kNow);
  REQUIRE_FALSE(role);
  CHECK(role.status().code() == errc::permission_denied);
  CHECK(role.status().message() == "certificate 'old' expired on 2023-11-14 23:13:20 UTC");
  auto at_start = load_identity(c.home, "old", kNow);
  REQUIRE_FALSE(at_start);
  CHECK(contains(at_start.status(), "expired on 2023-11-14 23:13:20 UTC"));
}

TEST_CASE("an expired cluster CA is named as such") {
  TempDir tmp;
  REQUIRE(init_ca(tmp.path(), Validity{kIssued, kNow + 100}).is_ok());
  REQUIRE(
      issue_certificate(tmp.path(), "alice", Role::operator_, Validity{kIssued, kExpires}).is_ok());
  auto alice = load_identity(tmp.path(), "alice", kNow);
  REQUIRE(alice);
  std::string digest = request_digest("drain", {"n"});
  auto role = verify(alice->ca_pem, sign_ok(*alice, digest, kNow + 200), digest, kNow + 200);
  REQUIRE_FALSE(role);
  CHECK(role.status().message() == "the cluster CA certificate expired on 2027-01-15 08:01:40 UTC");
}

TEST_CASE("a certificate that is not valid yet is refused") {
  Clusters c;
  REQUIRE(issue_certificate(c.home, "future", Role::operator_, Validity{kNow + 86400, kExpires})
              .is_ok());
  std::string digest = request_digest("kill", {"r1"});
  Identity future = c.identity(c.home, "future", kNow + 2 * 86400);
  auto role = verify(c.home_ca(), sign_ok(future, digest, kNow), digest, kNow);
  REQUIRE_FALSE(role);
  CHECK(
      contains(role.status(), "certificate 'future' is not valid before 2027-01-16 08:00:00 UTC"));
}

TEST_CASE("a tampered digest - signature or certificate is refused") {
  Clusters c;
  Identity alice = c.identity(c.home, "alice");
  std::string digest = request_digest("drain", {"node-1"});
  Credential cred = sign_ok(alice, digest, kNow);

  SUBCASE("another request") {
    auto role = verify(c.home_ca(), cred, request_digest("drain", {"node-2"}), kNow);
    REQUIRE_FALSE(role);
    CHECK(role.status().code() == errc::permission_denied);
    CHECK(contains(role.status(), "bad signature"));
  }
  SUBCASE("a flipped signature byte") {
    cred.signature[10] = cred.signature[10] == 'A' ? 'B' : 'A';
    CHECK(contains(verify(c.home_ca(), cred, digest, kNow).status(), "bad signature"));
  }
  SUBCASE("a signature that is not base64") {
    cred.signature = "not base64!";
    CHECK(contains(verify(c.home_ca(), cred, digest, kNow).status(), "bad signature"));
  }
  SUBCASE("a moved timestamp") {
    cred.timestamp += 1;
    CHECK(contains(verify(c.home_ca(), cred, digest, kNow).status(), "bad signature"));
  }
  SUBCASE("a node's signature presented with an operator's certificate") {
    Credential by_node = sign_ok(c.identity(c.home, "node-1"), digest, kNow);
    by_node.certificate_pem = alice.certificate_pem;
    auto role = verify(c.home_ca(), by_node, digest, kNow);
    REQUIRE_FALSE(role);
    CHECK(contains(role.status(),
                   "bad signature: the credential was not made by the holder of "
                   "certificate 'alice'"));
  }
  SUBCASE("no certificate at all") {
    cred.certificate_pem.clear();
    CHECK(contains(verify(c.home_ca(), cred, digest, kNow).status(), "carries no certificate"));
  }
  SUBCASE("garbage instead of a certificate") {
    cred.certificate_pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    CHECK(verify(c.home_ca(), cred, digest, kNow).status().code() == errc::permission_denied);
  }
}

TEST_CASE("a stale or early timestamp is refused") {
  Clusters c;
  Identity alice = c.identity(c.home, "alice");
  std::string digest = request_digest("delete", {"app"});
  CHECK(verify(c.home_ca(), sign_ok(alice, digest, kNow - 120), digest, kNow));
  CHECK(verify(c.home_ca(), sign_ok(alice, digest, kNow + 120), digest, kNow));

  auto stale = verify(c.home_ca(), sign_ok(alice, digest, kNow - 121), digest, kNow);
  REQUIRE_FALSE(stale);
  CHECK(stale.status().code() == errc::permission_denied);
  CHECK(stale.status().message() ==
        "stale credential: signed at 2027-01-15 07:57:59 UTC, 121 s behind the controller's "
        "clock (allowed ±120 s)");
  auto early = verify(c.home_ca(), sign_ok(alice, digest, kNow + 600), digest, kNow);
  CHECK(contains(early.status(), "600 s ahead of the controller's clock"));
  CHECK(verify(c.home_ca(), sign_ok(alice, digest, kNow - 500), digest, kNow, 600));
  auto absurd = verify(c.home_ca(), sign_ok(alice, digest, INT64_MIN), digest, kNow);
  CHECK(contains(absurd.status(), "stale credential"));
}

TEST_CASE("roles authorize operations") {
  Clusters c;
  Identity alice = c.identity(c.home, "alice");
  Identity node = c.identity(c.home, "node-1");
  auto digest = request_digest("drain", {"node-1"});

  CHECK(authorize(c.home_ca(), sign_ok(alice, digest, kNow), "drain", {"node-1"}, Role::operator_,
                  kNow));
  Status refused = authorize(c.home_ca(), sign_ok(node, digest, kNow), "drain", {"node-1"},
                             Role::operator_, kNow);
  CHECK(refused.code() == errc::permission_denied);
  CHECK(refused.message() ==
        "permission denied: drain requires the operator role (the caller's certificate has "
        "the node role)");

  auto reg = request_digest("register", {"node-1"});
  CHECK(authorize(c.home_ca(), sign_ok(node, reg, kNow), "register", {"node-1"}, Role::node, kNow));
  CHECK(require_role(Role::operator_, Role::node, "register").code() == errc::permission_denied);

  Status expired = authorize(c.home_ca(), sign_ok(alice, digest, kNow), "drain", {"node-1"},
                             Role::operator_, kExpires + 1);
  CHECK(expired.message() ==
        "permission denied for drain: certificate 'alice' expired on 2030-03-17 17:46:40 UTC");
}

TEST_CASE("a TLS directory resolves its identity") {
  Clusters c;
  SUBCASE("explicit name") {
    auto files = find_tls_files(c.home, "node-1");
    REQUIRE(files);
    CHECK(files->certificate_file == c.home + "/node-1.crt");
    CHECK(files->key_file == c.home + "/node-1.key");
    CHECK(files->ca_file == c.home + "/ca.crt");
  }
  SUBCASE("the only identity of a directory") {
    auto files = find_tls_files(c.foreign, "");
    REQUIRE(files);
    CHECK(files->certificate_file == c.foreign + "/mallory.crt");
  }
  SUBCASE("several identities need a name") {
    auto files = find_tls_files(c.home, "");
    REQUIRE_FALSE(files);
    CHECK(contains(files.status(), "found alice, node-1"));
  }
  SUBCASE("a missing file is named") {
    std::filesystem::remove(c.home + "/node-1.key");
    auto files = find_tls_files(c.home, "node-1");
    REQUIRE_FALSE(files);
    CHECK(files.status().code() == errc::not_found);
    CHECK(contains(files.status(), c.home + "/node-1.key: no such file"));
  }
  SUBCASE("a key that belongs to another certificate") {
    std::filesystem::copy_file(c.home + "/alice.key", c.home + "/node-1.key",
                               std::filesystem::copy_options::overwrite_existing);
    auto id = load_identity(c.home, "node-1", kNow);
    REQUIRE_FALSE(id);
    CHECK(contains(id.status(), "node-1.key does not belong to"));
  }
}
