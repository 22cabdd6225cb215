// What a call must pass before the controller changes anything: the hello's
// protocol version, a node's registration (every refusal, in order, and what
// the operator sees in the log), and the operator's write calls.
#include "controller/shell/admission.hpp"

#include <ctime>
#include <memory>
#include <optional>
#include <sstream>

#include <doctest/doctest.h>
#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/ecdsa.h>
#include <openssl/evp.h>
#include <openssl/obj_mac.h>
#include <spdlog/sinks/ostream_sink.h>

#include "runtime/auth.hpp"
#include "tests/controller/fakes.hpp"
#include "tests/support/temp_dir.hpp"

using namespace troupe;
using namespace troupe::controller;
using troupe::controller::testing::FakeClock;

namespace {

// A logger whose lines ("<level> <message>") the test reads.
struct CapturedLog {
  std::ostringstream out;
  std::shared_ptr<spdlog::logger> logger;
  CapturedLog() {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(out);
    sink->set_pattern("%l %v");
    logger = std::make_shared<spdlog::logger>("admission-test", sink);
    logger->set_level(spdlog::level::trace);
  }
  std::string text() const { return out.str(); }
};

troupe::NodeInfo node_info(const std::string& id = "n1") {
  return troupe::NodeInfo{id, "10.0.0.7", 8001, "cpu=4,mem=8G", 4242, kProtocolVersion};
}

// A cluster CA with the identities the tests sign with. check_request
// verifies against the real time; these certificates are valid from five
// minutes ago for a year, and a credential is checked a moment after it was
// signed, far inside the allowed skew (120 s), so no outcome depends on time.
struct TlsCluster {
  troupe::testing::TempDir dir;
  std::string ca_pem;

  TlsCluster() {
    REQUIRE(security::init_ca(dir.path()).is_ok());
    REQUIRE(security::issue_certificate(dir.path(), "n1", security::Role::node).is_ok());
    REQUIRE(security::issue_certificate(dir.path(), "n2", security::Role::node).is_ok());
    REQUIRE(security::issue_certificate(dir.path(), "alice", security::Role::operator_).is_ok());
    ca_pem = identity("alice").ca_pem;
  }

  security::Identity identity(const std::string& name) {
    auto id = security::load_identity(dir.path(), name, std::time(nullptr));
    REQUIRE_MESSAGE(id, id.status().to_string());
    return *id;
  }

  Credential sign(const std::string& name, Operation op,
                  const std::vector<std::string>& args) {
    auto c = sign_request(identity(name), op, args);
    REQUIRE_FALSE(c.empty());
    return c;
  }
};

}  // namespace

TEST_CASE("admission: a hello must speak the controller's protocol version") {
  CHECK(check_protocol_version(kProtocolVersion).is_ok());
  auto s = check_protocol_version(kProtocolVersion + 1);
  CHECK(s.code() == errc::version_mismatch);
  CHECK(s.message() == "the controller speaks protocol version " +
                           std::to_string(kProtocolVersion) + ", the caller " +
                           std::to_string(kProtocolVersion + 1) + "; upgrade one of them");
}

TEST_CASE("admission: an admitted node gets a record of what it reported") {
  CapturedLog log;
  auto rec = admit_node("", node_info(), true, Credential{}, *log.logger);
  REQUIRE_MESSAGE(rec, rec.status().to_string());
  CHECK(rec->id == "n1");
  CHECK(rec->host == "10.0.0.7");
  CHECK(rec->http_port == 8001);
  CHECK(rec->pid == 4242);
  CHECK(rec->resources == *parse_resources("cpu=4,mem=8G"));
  CHECK(rec->state == NodeState::alive);
  CHECK(rec->incarnation == 0);  // Membership assigns it
  CHECK(log.text().empty());
}

TEST_CASE("admission: without a credential a TLS cluster refuses the node and says so") {
  CapturedLog log;
  // check_request refuses an empty credential before it reads the CA.
  auto rec =
      admit_node("-----BEGIN CERTIFICATE-----", node_info(), true, Credential{}, *log.logger);
  REQUIRE_FALSE(rec);
  CHECK(rec.status().code() == errc::permission_denied);
  CHECK(rec.status().message() ==
        "permission denied: register needs a signed credential (a node certificate of this "
        "cluster)");
  CHECK(log.text() ==
        "warning refused registration of node n1 (pid 4242): permission denied: register "
        "needs a signed credential (a node certificate of this cluster)\n");
}

TEST_CASE("admission: a node registers only with its own node certificate") {
  TlsCluster cluster;
  CapturedLog log;
  auto own = admit_node(cluster.ca_pem, node_info("n1"), true,
                        cluster.sign("n1", Operation::register_node, {"n1"}), *log.logger);
  CHECK_MESSAGE(own, own.status().to_string());
  CHECK(log.text().empty());

  auto other = admit_node(cluster.ca_pem, node_info("n1"), true,
                          cluster.sign("n2", Operation::register_node, {"n1"}), *log.logger);
  REQUIRE_FALSE(other);
  CHECK(other.status().message() ==
        "permission denied: the certificate of node 'n2' cannot register node 'n1'");

  auto op = admit_node(cluster.ca_pem, node_info("n1"), true,
                       cluster.sign("alice", Operation::register_node, {"n1"}), *log.logger);
  REQUIRE_FALSE(op);
  CHECK(op.status().message() ==
        "permission denied: register requires the node role (the caller's certificate has the "
        "operator role)");

  // Signed for another node id: the digest does not match the request.
  auto replayed = admit_node(cluster.ca_pem, node_info("n1"), true,
                             cluster.sign("n1", Operation::register_node, {"n2"}), *log.logger);
  CHECK_FALSE(replayed);
  CHECK(replayed.status().code() == errc::permission_denied);
}

TEST_CASE("admission: a node of another protocol version is refused and logged as an error") {
  CapturedLog log;
  auto info = node_info();
  info.protocol_version = kProtocolVersion + 3;
  auto rec = admit_node("", info, true, Credential{}, *log.logger);
  REQUIRE_FALSE(rec);
  CHECK(rec.status().code() == errc::version_mismatch);
  CHECK(rec.status().message() == "the controller speaks protocol version " +
                                      std::to_string(kProtocolVersion) + ", node 'n1' speaks " +
                                      std::to_string(kProtocolVersion + 3));
  CHECK(log.text() == "error refused node n1 (pid 4242): protocol version " +
                          std::to_string(kProtocolVersion + 3) + ", controller speaks " +
                          std::to_string(kProtocolVersion) + "\n");
}

TEST_CASE("admission: the credential is checked before anything the node reports") {
  CapturedLog log;
  auto info = node_info("bad id!");
  info.protocol_version = kProtocolVersion + 1;
  info.resources = "cpu=";
  auto rec = admit_node("-----BEGIN CERTIFICATE-----", info, false, Credential{}, *log.logger);
  REQUIRE_FALSE(rec);
  CHECK(rec.status().code() == errc::permission_denied);
}

TEST_CASE("admission: a bad node id - bad resources or no agent are refused without a log line") {
  CapturedLog log;
  auto bad_id = node_info("bad id!");
  auto rec = admit_node("", bad_id, true, Credential{}, *log.logger);
  REQUIRE_FALSE(rec);
  CHECK(rec.status().code() == errc::invalid_argument);
  CHECK(rec.status().message() ==
        "node id 'bad id!' may contain only letters, digits, '.', '_' and '-'");

  auto bad_resources = node_info();
  bad_resources.resources = "cpu=lots";
  rec = admit_node("", bad_resources, true, Credential{}, *log.logger);
  REQUIRE_FALSE(rec);
  CHECK(rec.status().code() == errc::invalid_argument);
  CHECK(rec.status().message() ==
        "resource 'cpu' has amount 'lots'; expected a non-negative number with optional K/M/G/T");

  rec = admit_node("", node_info(), false, Credential{}, *log.logger);
  REQUIRE_FALSE(rec);
  CHECK(rec.status().code() == errc::invalid_argument);
  CHECK(rec.status().message() == "no agent handle given");
  CHECK(log.text().empty());
}

TEST_CASE("admission: one cluster never mixes a single head with head candidates - either way refused naming both") {
  auto as = [](uint8_t mode, const std::string& id) {
    auto info = node_info(id);
    info.head_mode = mode;
    return info;
  };
  // What each kind of head admits.
  for (bool ha : {false, true}) {
    CAPTURE(ha);
    CHECK(check_head_mode(ha, as(HeadMode::one_head, "w1")).is_ok());
  }
  CHECK(check_head_mode(true, as(HeadMode::head_list, "w1")).is_ok());
  CHECK(check_head_mode(true, as(HeadMode::candidate, "h2")).is_ok());
  CHECK(check_head_mode(false, as(HeadMode::single_head, "head")).is_ok());

  auto candidate = check_head_mode(false, as(HeadMode::candidate, "h2"));
  CHECK(candidate.code() == errc::conflict);
  CHECK(candidate.message() ==
        "this head is a single head (no --ha-etcd) but node 'h2' is a head candidate "
        "(--ha-etcd): a cluster has one head or highly available head candidates on etcd, "
        "never both");
  auto listed = check_head_mode(false, as(HeadMode::head_list, "w1"));
  CHECK(listed.code() == errc::conflict);
  CHECK(listed.message().find("node 'w1' was given several heads to join (--join)") !=
        std::string::npos);
  auto single = check_head_mode(true, as(HeadMode::single_head, "head"));
  CHECK(single.code() == errc::conflict);
  CHECK(single.message().find("this head is a highly available head candidate (--ha-etcd) but "
                              "node 'head' is a single head (no --ha-etcd)") != std::string::npos);
}

TEST_CASE("admission: operator calls need an operator credential - then a recovered controller") {
  FakeClock clock;
  RecoveryGate recovering(clock, 3.0, {"n1"});
  RecoveryGate ready(clock, 3.0, {});
  ready.finish();
  CHECK(admit_operator_call("", Credential{}, Operation::delete_app, {"a"}, ready).is_ok());
  auto s = admit_operator_call("", Credential{}, Operation::delete_app, {"a"}, recovering);
  CHECK(s.code() == errc::unavailable);
  CHECK(s.message() ==
        "the controller is recovering its state after a restart; retry in a few seconds");
  // The credential first: a stranger learns nothing about the recovery.
  s = admit_operator_call("-----BEGIN CERTIFICATE-----", Credential{}, Operation::shutdown, {"nodes"},
                          recovering);
  CHECK(s.code() == errc::permission_denied);
  CHECK(s.message() ==
        "permission denied: shutdown needs a signed credential (an operator certificate of this "
        "cluster)");

  TlsCluster cluster;
  CHECK(admit_operator_call(cluster.ca_pem, cluster.sign("alice", Operation::delete_app, {"a"}), Operation::delete_app, {"a"},
                            ready)
            .is_ok());
  s = admit_operator_call(cluster.ca_pem, cluster.sign("n1", Operation::delete_app, {"a"}), Operation::delete_app, {"a"},
                          ready);
  CHECK(s.code() == errc::permission_denied);
  // Signed for another application.
  s = admit_operator_call(cluster.ca_pem, cluster.sign("alice", Operation::delete_app, {"b"}), Operation::delete_app, {"a"},
                          ready);
  CHECK(s.code() == errc::permission_denied);
}

TEST_CASE("admission: a deploy is also held to the config size limit") {
  FakeClock clock;
  RecoveryGate ready(clock, 3.0, {});
  ready.finish();
  RecoveryGate recovering(clock, 3.0, {});
  Limits limits;
  limits.max_config_bytes = 4;
  CHECK(admit_deploy("", Credential{}, "1234", ready, limits).is_ok());
  auto s = admit_deploy("", Credential{}, "12345", ready, limits);
  CHECK(s.code() == errc::invalid_argument);
  CHECK(s.message() ==
        "the config is 5 bytes encoded; the cluster accepts at most 4 (troupe-node "
        "--max-config-bytes)");
  // Recovery before size: the caller retries the same config.
  CHECK(admit_deploy("", Credential{}, "12345", recovering, limits).code() == errc::unavailable);

  TlsCluster cluster;
  CHECK(
      admit_deploy(cluster.ca_pem, cluster.sign("alice", Operation::deploy, {"1234"}), "1234", ready, limits)
          .is_ok());
  // The signature covers the encoded config: other bytes are refused.
  CHECK(
      admit_deploy(cluster.ca_pem, cluster.sign("alice", Operation::deploy, {"1234"}), "4321", ready, limits)
          .code() == errc::permission_denied);
}

// --- replay (runtime/auth.hpp, ReplayGuard) ----------------------------------------

namespace {

std::string from_base64(const std::string& text) {
  std::string bytes(3 * text.size() / 4, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(bytes.data()),
                          reinterpret_cast<const unsigned char*>(text.data()),
                          static_cast<int>(text.size()));
  REQUIRE(n >= 0);
  size_t padding = text.size() - text.find_last_not_of('=') - 1;
  bytes.resize(static_cast<size_t>(n) - padding);
  return bytes;
}

std::string to_base64(const std::string& bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()),
                          static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

// The same ECDSA signature (P-256) in its other valid form, (r, n - s):
// what someone who captured a credential can make without the key.
std::string other_form(const std::string& signature_b64) {
  std::string der = from_base64(signature_b64);
  const auto* p = reinterpret_cast<const unsigned char*>(der.data());
  ECDSA_SIG* sig = d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(der.size()));
  REQUIRE(sig != nullptr);
  EC_GROUP* group = EC_GROUP_new_by_curve_name(NID_X9_62_prime256v1);
  REQUIRE(group != nullptr);
  BIGNUM* r = BN_dup(ECDSA_SIG_get0_r(sig));
  BIGNUM* s = BN_new();
  REQUIRE(BN_sub(s, EC_GROUP_get0_order(group), ECDSA_SIG_get0_s(sig)) == 1);
  ECDSA_SIG* flipped = ECDSA_SIG_new();
  REQUIRE(ECDSA_SIG_set0(flipped, r, s) == 1);
  unsigned char* out = nullptr;
  int len = i2d_ECDSA_SIG(flipped, &out);
  REQUIRE(len > 0);
  std::string encoded(reinterpret_cast<char*>(out), static_cast<size_t>(len));
  OPENSSL_free(out);
  ECDSA_SIG_free(flipped);
  ECDSA_SIG_free(sig);
  EC_GROUP_free(group);
  CHECK(encoded != der);
  return to_base64(encoded);
}

}  // namespace

TEST_CASE("replay: a credential is accepted once within its window - a fresh signature passes - it is forgotten when it expired") {
  TlsCluster cluster;
  ReplayGuard guard(120);
  auto cred = cluster.sign("alice", Operation::drain, {"n1"});
  const int64_t now = cred.timestamp;
  CHECK(guard.admit(cred, Operation::drain, now).is_ok());
  auto again = guard.admit(cred, Operation::drain, now + 5);
  CHECK(again.code() == errc::permission_denied);
  CHECK(again.message().rfind("permission denied: drain: this credential was used already "
                              "(signed at ",
                              0) == 0);
  CHECK(again.message().find("); a request is signed anew for each call") != std::string::npos);
  // The same request signed again: a new signature, a new credential.
  auto fresh = cluster.sign("alice", Operation::drain, {"n1"});
  CHECK(guard.admit(fresh, Operation::drain, now + 5).is_ok());
  CHECK(guard.remembered() == 2);
  // Past its window the timestamp check refuses it anyway: it is forgotten.
  CHECK(guard.admit(Credential{}, Operation::drain, now + 121 + 5).is_ok());
  CHECK(guard.remembered() == 0);
  // No TLS: nothing to remember.
  CHECK(guard.admit(Credential{}, Operation::drain, now).is_ok());
  CHECK(guard.remembered() == 0);
}

TEST_CASE("replay: the other form of an ECDSA signature is the same credential") {
  TlsCluster cluster;
  auto cred = cluster.sign("alice", Operation::drain, {"n1"});
  Credential flipped = cred;
  flipped.signature = other_form(cred.signature);
  // It passes the signature check: only remembering r catches it.
  security::Credential c{flipped.certificate_pem, flipped.timestamp, flipped.signature};
  auto verified = security::verify(cluster.ca_pem, c, security::request_digest("drain", {"n1"}),
                                   flipped.timestamp);
  CHECK_MESSAGE(verified, verified.status().to_string());
  ReplayGuard guard;
  CHECK(guard.admit(cred, Operation::drain, cred.timestamp).is_ok());
  CHECK(guard.admit(flipped, Operation::drain, cred.timestamp).code() == errc::permission_denied);
}
