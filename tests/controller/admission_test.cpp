// What a call must pass before the controller changes anything: the hello's
// protocol version, a node's registration (every refusal, in order, and what
// the operator sees in the log), and the operator's write calls.
#include "controller/shell/admission.hpp"

#include <ctime>
#include <memory>
#include <optional>
#include <sstream>

#include <doctest/doctest.h>
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
