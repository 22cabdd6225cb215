// A cluster running with TLS (--tls-dir): members and operators get in,
// everyone else is refused and changes nothing; roles are enforced.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"

using namespace troupe::testing;
using nlohmann::json;

namespace {

const char* kEcho = R"(applications:
  - name: echo
    route_prefix: /echo
    import_path: libtroupe_examples.so:Echo
    deployments:
      - name: Echo
        num_replicas: 2
)";

struct Secured {
  Cluster cluster;
  std::string certs = cluster.dir / "certs";
  std::string other = cluster.dir / "other";

  RunResult ctl(std::vector<std::string> args, std::chrono::milliseconds timeout = 60s) {
    std::vector<std::string> argv = {bin("troupectl"), "--address", cluster.address};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv, timeout);
  }

  RunResult certs_cmd(std::vector<std::string> args) {
    std::vector<std::string> argv = {bin("troupectl"), "certs"};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv, 30s);
  }

  Secured() {
    REQUIRE(certs_cmd({"init", certs}).exit_code == 0);
    REQUIRE(certs_cmd({"issue", certs, "--name", "head", "--role", "node"}).exit_code == 0);
    REQUIRE(certs_cmd({"issue", certs, "--name", "alice", "--role", "operator"}).exit_code == 0);
    // A second cluster's CA and operator: must not get in.
    REQUIRE(certs_cmd({"init", other}).exit_code == 0);
    REQUIRE(certs_cmd({"issue", other, "--name", "mallory", "--role", "operator"}).exit_code == 0);
    cluster.start_head({"--tls-dir", certs});
  }

  std::string write(const std::string& name, const std::string& text) {
    auto path = cluster.dir / name;
    std::ofstream(path) << text;
    return path;
  }
};

}  // namespace

TEST_CASE("certs init refuses to overwrite a CA - issue needs a CA") {
  TempDir dir;
  auto bin_ctl = bin("troupectl");
  REQUIRE(run({bin_ctl, "certs", "init", dir / "ca"}).exit_code == 0);
  auto again = run({bin_ctl, "certs", "init", dir / "ca"});
  CHECK(again.exit_code == 1);
  CHECK(again.err.find("refusing to overwrite the cluster CA") != std::string::npos);
  auto no_ca = run({bin_ctl, "certs", "issue", dir / "none", "--name", "x"});
  CHECK(no_ca.exit_code == 1);
  auto bad_role = run({bin_ctl, "certs", "issue", dir / "ca", "--name", "x", "--role", "god"});
  CHECK(bad_role.exit_code == 2);
}

TEST_CASE("a TLS cluster serves its operator - and refuses strangers - other CAs and wrong roles") {
  Secured s;
  auto operator_args = std::vector<std::string>{"--tls-dir", s.certs, "--tls-name", "alice"};
  // The operator deploys, sees status, and the proxy serves.
  REQUIRE(wait_until(
      [&] {
        auto r = s.ctl({"--tls-dir", s.certs, "--tls-name", "alice", "--timeout", "2", "nodes"});
        return r.exit_code == 0 && r.out.find("ALIVE") != std::string::npos;
      },
      20s, 200ms));
  auto file = s.write("echo.yaml", kEcho);
  auto deploy = s.ctl({"--tls-dir", s.certs, "--tls-name", "alice", "deploy", file, "--wait"});
  CAPTURE(deploy.err);
  REQUIRE(deploy.exit_code == 0);
  auto reply = http_get(s.cluster.http_ports.at("head"), "/echo/hi", 10);
  REQUIRE(reply.has_value());
  CHECK(reply->status == 200);
  auto status = s.ctl({"--tls-dir", s.certs, "--tls-name", "alice", "status", "--json"});
  REQUIRE(status.exit_code == 0);
  auto before = json::parse(status.out).at("applications");
  CHECK(before.at("echo").at("status") == "RUNNING");

  // No certificate: the handshake fails; nothing changes.
  auto plain = s.ctl({"--timeout", "3", "delete", "echo"});
  CHECK(plain.exit_code == 1);
  CHECK(plain.err.find("cannot reach the controller") != std::string::npos);

  // A certificate of another cluster's CA: refused, and says why.
  auto stranger =
      s.ctl({"--tls-dir", s.other, "--tls-name", "mallory", "--timeout", "3", "delete", "echo"});
  CHECK(stranger.exit_code == 1);
  CAPTURE(stranger.err);
  CHECK(stranger.err.find("not signed by this cluster's CA") != std::string::npos);

  // A node certificate may not deploy or delete.
  auto node = s.ctl({"--tls-dir", s.certs, "--tls-name", "head", "delete", "echo"});
  CHECK(node.exit_code == 1);
  CHECK(node.err.find("permission denied: delete requires the operator role") != std::string::npos);

  auto after = s.ctl({"--tls-dir", s.certs, "--tls-name", "alice", "status", "--json"});
  REQUIRE(after.exit_code == 0);
  CHECK(json::parse(after.out).at("applications").at("echo").at("status") == "RUNNING");
  CHECK(json::parse(after.out).at("applications").size() == 1);
}
