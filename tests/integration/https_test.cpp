// The HTTPS port of a node's proxy (troupe-node --https-port, proxy/
// tls_context.hpp), checked with the clients users have: curl and openssl
// s_client. The service's own CA and certificates are made here with the
// openssl command, as a user would (not the cluster's `troupectl certs`).
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"

using namespace troupe::testing;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

const char* kApps = R"(http_options: {request_timeout_s: 60}
applications:
  - name: echo
    route_prefix: /echo
    import_path: libtroupe_examples.so:Echo
    deployments:
      - name: Echo
        num_replicas: 1
  - name: stream
    route_prefix: /stream
    import_path: libtroupe_examples.so:Ticker
    deployments:
      - name: Ticker
        num_replicas: 1
        max_ongoing_requests: 5
  - name: sleep
    route_prefix: /sleep
    import_path: libtroupe_examples.so:Sleep
    deployments:
      - name: Sleep
        num_replicas: 1
        max_ongoing_requests: 4
)";

// Runs a shell command line; REQUIREs exit 0.
std::string sh(const std::string& line) {
  auto r = run({"/bin/sh", "-c", line}, 30s);
  CAPTURE(line);
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  return r.out;
}

// A CA of the service (not of the cluster) and certificates it signs, for
// 127.0.0.1.
struct ServiceCa {
  std::string dir;
  explicit ServiceCa(std::string d, const std::string& name = "svc-ca") : dir(std::move(d)) {
    std::filesystem::create_directories(dir);
    sh("cd '" + dir + "' && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes " +
       "-keyout ca.key -out ca.crt -days 2 -subj /CN=" + name + " 2>/dev/null");
  }
  std::string ca() const { return dir + "/ca.crt"; }
  // <dir>/<name>.crt and .key, subject CN=<name>, for 127.0.0.1 and
  // localhost.
  void issue(const std::string& name) const {
    sh("cd '" + dir + "' && printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > " + name +
       ".ext && openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout " + name +
       ".key -out " + name + ".csr -subj /CN=" + name + " 2>/dev/null && openssl x509 -req -in " +
       name + ".csr -CA ca.crt -CAkey ca.key -CAcreateserial -out " + name +
       ".crt -days 2 -extfile " + name + ".ext 2>/dev/null");
  }
};

struct HttpsNode {
  Cluster cluster;
  ServiceCa ca{cluster.dir / "service-ca"};
  uint16_t https = free_port();
  uint16_t http = 0;
  uint16_t admin = 0;

  explicit HttpsNode(std::vector<std::string> extra = {}) {
    ca.issue("server");
    std::vector<std::string> args = {"--https-port", std::to_string(https), "--https-cert",
                                     ca.dir + "/server.crt", "--https-key",
                                     ca.dir + "/server.key"};
    args.insert(args.end(), extra.begin(), extra.end());
    cluster.start({}, args);
    http = cluster.http_ports.at("head");
    admin = cluster.admin_ports.at("head");
  }

  // curl over HTTPS with the service's CA: its exit code, output and errors.
  RunResult curl(const std::string& target, const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> argv = {"/usr/bin/curl", "-sS", "--cacert", ca.ca(), "--max-time", "20",
                                     "-o", "-", "-w", "\n%{http_code}"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back("https://127.0.0.1:" + std::to_string(https) + target);
    return run(argv, 30s);
  }

  // The subject the HTTPS port presents to a new connection.
  std::string served_subject() const {
    auto r = run({"/bin/sh", "-c",
                  "openssl s_client -connect 127.0.0.1:" + std::to_string(https) +
                      " </dev/null 2>/dev/null | openssl x509 -noout -subject"},
                 20s);
    return r.out;
  }

  double metric(const std::string& series) const {
    return metric_value(admin, series).value_or(-1);
  }
};

// The status code curl printed last (-w), and the body before it.
int code_of(const RunResult& r) {
  auto at = r.out.rfind('\n');
  return at == std::string::npos ? 0 : std::atoi(r.out.c_str() + at + 1);
}
std::string body_of(const RunResult& r) {
  auto at = r.out.rfind('\n');
  return at == std::string::npos ? r.out : r.out.substr(0, at);
}

}  // namespace

TEST_CASE("https: curl with the service's CA gets answers - streams - 504s - and cancels a stream by leaving - as over HTTP") {
  HttpsNode n;
  n.cluster.deploy_yaml("apps.yaml", kApps);
  REQUIRE(n.cluster.wait_all_answer("head", {"/echo/", "/stream/stats", "/sleep/?ms=0"}));

  auto echo = n.curl("/echo/over-tls?x=1");
  CAPTURE(echo.err);
  REQUIRE(echo.exit_code == 0);
  CHECK(code_of(echo) == 200);
  auto body = json::parse(body_of(echo));
  CHECK(body.at("path") == "/over-tls");
  CHECK(body.at("query") == "x=1");
  // The same answer as over plain HTTP.
  auto plain = http_get(n.http, "/echo/over-tls?x=1", 10);
  REQUIRE(plain);
  CHECK(json::parse(plain->body).at("path") == body.at("path"));

  // A stream arrives event by event, complete.
  auto stream = n.curl("/stream/?n=5&ms=100", {"-N"});
  CAPTURE(stream.err);
  REQUIRE(stream.exit_code == 0);
  CHECK(code_of(stream) == 200);
  for (int i = 0; i < 5; ++i)
    CHECK(body_of(stream).find("data: " + std::to_string(i)) != std::string::npos);

  // A request timeout (the client's, 2 s): 504 over HTTPS too.
  auto late = n.curl("/sleep/?ms=5000", {"-H", "X-Request-Timeout-Seconds: 2"});
  CAPTURE(late.err);
  REQUIRE(late.exit_code == 0);
  CHECK(code_of(late) == 504);

  // A client that leaves a stream cancels it at the replica, as over HTTP
  // (the event interval is 10 s and the request timeout 60 s: only a
  // cancellation ends it early).
  auto stats = [&] {
    auto r = http_get(n.http, "/stream/stats", 10);
    return r && r->status == 200 ? json::parse(r->body) : json::object();
  };
  const auto cancelled_before = stats().value("streams_cancelled", int64_t{-1});
  REQUIRE(cancelled_before >= 0);
  auto left = n.curl("/stream/?n=100&ms=10000", {"-N", "--max-time", "1"});
  CHECK(left.exit_code == 28);  // curl's own timeout: it left
  CHECK(wait_until([&] { return stats().value("streams_cancelled", int64_t{-1}) > cancelled_before; },
                   10s, 100ms));

  // A client that closes properly, with a TLS close_notify before its FIN,
  // while its stream runs cancels too (the close_notify's bytes wait unread:
  // only the FIN tells): openssl s_client sends the request and closes when
  // its input ends, here half a second later (the client's own pace, not a
  // wait for the node).
  const auto cancelled_mid = stats().value("streams_cancelled", int64_t{-1});
  sh("(printf 'GET /stream/?n=100&ms=10000 HTTP/1.1\\r\\nHost: t\\r\\n\\r\\n'; sleep 0.5) | "
     "timeout 10 openssl "
     "s_client -quiet -no_ign_eof -connect 127.0.0.1:" +
     std::to_string(n.https) + " -CAfile " + n.ca.ca() + " >/dev/null 2>&1; true");
  CHECK(wait_until([&] { return stats().value("streams_cancelled", int64_t{-1}) > cancelled_mid; },
                   10s, 100ms));

  // Counted by scheme.
  CHECK(n.metric(R"(troupe_proxy_requests_by_scheme_total{scheme="https"})") >= 4);
  CHECK(n.metric(R"(troupe_proxy_requests_by_scheme_total{scheme="http"})") >= 1);
}

TEST_CASE("https: a certificate swapped on disk is served to the next connection - and SIGHUP reads the files again - without a restart") {
  HttpsNode n;
  REQUIRE(n.served_subject().find("CN = server") != std::string::npos);
  const auto pid = n.cluster.nodes.at("head").pid();

  // Renewed the way certificate tools do: new files renamed over the old.
  n.ca.issue("renewed");
  namespace fs = std::filesystem;
  fs::copy_file(n.ca.dir + "/renewed.key", n.ca.dir + "/server.key.new");
  fs::copy_file(n.ca.dir + "/renewed.crt", n.ca.dir + "/server.crt.new");
  fs::rename(n.ca.dir + "/server.key.new", n.ca.dir + "/server.key");
  fs::rename(n.ca.dir + "/server.crt.new", n.ca.dir + "/server.crt");
  CHECK(n.served_subject().find("CN = renewed") != std::string::npos);
  auto r = n.curl("/-/readyz");
  const int renewed_code = code_of(r);  // a route table or not: served over the renewed certificate
  CHECK((renewed_code == 200 || renewed_code == 503));

  // A broken renewal (a key that is not the certificate's) keeps the last
  // good certificate; SIGHUP says why.
  fs::copy_file(n.ca.dir + "/ca.key", n.ca.dir + "/server.key.new");
  fs::rename(n.ca.dir + "/server.key.new", n.ca.dir + "/server.key");
  CHECK(n.served_subject().find("CN = renewed") != std::string::npos);
  ::kill(pid, SIGHUP);
  CHECK(wait_until(
      [&] {
        return n.cluster.nodes.at("head").output().find(
                   "SIGHUP: the HTTPS port keeps its certificate: HTTPS: --https-key") !=
               std::string::npos;
      },
      10s, 50ms));
  // Mended: SIGHUP reads it again, and the node still runs.
  fs::copy_file(n.ca.dir + "/renewed.key", n.ca.dir + "/server.key.new");
  fs::rename(n.ca.dir + "/server.key.new", n.ca.dir + "/server.key");
  ::kill(pid, SIGHUP);
  CHECK(wait_until(
      [&] {
        return n.cluster.nodes.at("head").output().find(
                   "SIGHUP: the HTTPS port's certificate read again") != std::string::npos;
      },
      10s, 50ms));
  CHECK(n.served_subject().find("CN = renewed") != std::string::npos);
  CHECK(n.cluster.nodes.at("head").running());
}

TEST_CASE("https: TLS 1.0 and 1.1 and plain HTTP on the HTTPS port are refused - TLS 1.2 and 1.3 served") {
  HttpsNode n;
  for (const std::string version : {"1.0", "1.1"}) {
    CAPTURE(version);
    auto r = n.curl("/-/livez", {"--tlsv" + version, "--tls-max", version});
    CHECK(r.exit_code == 35);  // curl: the TLS handshake failed
  }
  for (const std::string version : {"1.2", "1.3"}) {
    CAPTURE(version);
    auto r = n.curl("/-/livez", {"--tlsv" + version, "--tls-max", version});
    CAPTURE(r.err);
    CHECK(r.exit_code == 0);
    CHECK(code_of(r) == 200);
  }
  // Plain HTTP: a plain-text 400 that says so, then the connection closes.
  auto plain = http_get(n.https, "/-/livez", 10);
  REQUIRE(plain);
  CHECK(plain->status == 400);
  CHECK(plain->body.find("this port speaks HTTPS") != std::string::npos);
  CHECK(n.metric(R"(troupe_proxy_tls_handshakes_refused_total{reason="protocol_version"})") >= 2);
  CHECK(n.metric(R"(troupe_proxy_tls_handshakes_refused_total{reason="plain_http"})") == 1);
  // The HTTP port is unchanged.
  CHECK(http_get(n.http, "/-/livez", 10)->status == 200);
}

TEST_CASE("https: with --https-client-ca a client without a certificate or with one of another CA is refused - one of that CA is served") {
  TempDir clients_dir;
  ServiceCa clients(clients_dir / "clients", "client-ca");
  clients.issue("alice");
  ServiceCa other(clients_dir / "other", "other-ca");
  other.issue("mallory");
  HttpsNode n({"--https-client-ca", clients.ca()});

  auto none = n.curl("/-/livez");
  CHECK(none.exit_code != 0);
  auto stranger = n.curl("/-/livez", {"--cert", other.dir + "/mallory.crt", "--key",
                                      other.dir + "/mallory.key"});
  CHECK(stranger.exit_code != 0);
  auto alice = n.curl("/-/livez", {"--cert", clients.dir + "/alice.crt", "--key",
                                   clients.dir + "/alice.key"});
  CAPTURE(alice.err);
  CHECK(alice.exit_code == 0);
  CHECK(code_of(alice) == 200);
  const double refused =
      n.metric(R"(troupe_proxy_tls_handshakes_refused_total{reason="client_certificate_refused"})") +
      n.metric(R"(troupe_proxy_tls_handshakes_refused_total{reason="no_client_certificate"})");
  CHECK(refused >= 1);
}

TEST_CASE("https: a bad --https-* option stops the node with a message naming it") {
  Cluster c;
  ServiceCa ca(c.dir / "ca");
  ca.issue("server");
  ca.issue("other");
  struct Case {
    std::vector<std::string> args;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {{"--https-port", "9443"}, "--https-port needs --https-cert FILE and --https-key FILE"},
      {{"--https-cert", ca.dir + "/server.crt"}, "need --https-port"},
      {{"--https-port", std::to_string(free_port()), "--https-cert", ca.dir + "/missing.crt",
        "--https-key", ca.dir + "/server.key"},
       "--https-cert " + ca.dir + "/missing.crt"},
      {{"--https-port", std::to_string(free_port()), "--https-cert", ca.dir + "/server.crt",
        "--https-key", ca.dir + "/other.key"},
       "--https-key " + ca.dir + "/other.key"},
  };
  for (const auto& k : cases) {
    std::vector<std::string> argv = {bin("troupe-node"), "--head",   "--state-dir",
                                     c.dir / "s",       "--port",   std::to_string(free_port()),
                                     "--http-port",     std::to_string(free_port()),
                                     "--admin-port",    "0"};
    argv.insert(argv.end(), k.args.begin(), k.args.end());
    auto r = run(argv, 20s);
    CAPTURE(k.fragment);
    CAPTURE(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(k.fragment) != std::string::npos);
  }
}

TEST_CASE("admin: off loopback with --tls-dir the admin port speaks HTTPS only - metrics for the cluster's certificates - the dashboard for operators only") {
  Cluster c;
  const std::string certs = c.dir / "certs";
  const std::string other = c.dir / "other";
  auto certs_cmd = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {bin("troupectl"), "certs"});
    return run(args, 30s).exit_code;
  };
  REQUIRE(certs_cmd({"init", certs}) == 0);
  REQUIRE(certs_cmd({"issue", certs, "--name", "head", "--role", "node"}) == 0);
  REQUIRE(certs_cmd({"issue", certs, "--name", "prometheus", "--role", "node"}) == 0);
  REQUIRE(certs_cmd({"issue", certs, "--name", "alice", "--role", "operator"}) == 0);
  REQUIRE(certs_cmd({"init", other}) == 0);
  REQUIRE(certs_cmd({"issue", other, "--name", "mallory", "--role", "operator"}) == 0);
  c.identity = {"--tls-dir", certs, "--tls-name", "alice"};
  // 0.0.0.0: off loopback, as a multi-host cluster's admin port is (this test
  // reaches it over 127.0.0.1 only).
  c.start({}, {"--tls-dir", certs, "--admin-bind", "0.0.0.0"});
  const std::string admin = "https://127.0.0.1:" + std::to_string(c.admin_ports.at("head"));
  auto get = [&](const std::string& path, const std::string& dir, const std::string& name) {
    std::vector<std::string> argv = {"/usr/bin/curl", "-sS",   "--cacert", certs + "/ca.crt",
                                     "--max-time",    "20",    "-o",       "-",
                                     "-w",            "\n%{http_code}"};
    if (!name.empty())
      argv.insert(argv.end(), {"--cert", dir + "/" + name + ".crt", "--key", dir + "/" + name + ".key"});
    argv.push_back(admin + path);
    return run(argv, 30s);
  };

  // An operator: everything, the dashboard's state included.
  auto state = get("/-/dashboard/state", certs, "alice");
  CAPTURE(state.err);
  REQUIRE(state.exit_code == 0);
  CHECK(code_of(state) == 200);
  CHECK(json::parse(body_of(state)).contains("nodes"));
  CHECK(code_of(get("/-/metrics", certs, "alice")) == 200);
  // A node certificate (a Prometheus given one): metrics and routes, not the
  // dashboard.
  auto metrics = get("/-/metrics", certs, "prometheus");
  CHECK(code_of(metrics) == 200);
  CHECK(body_of(metrics).find("troupe_build_info") != std::string::npos);
  CHECK(code_of(get("/-/routes", certs, "prometheus")) == 200);
  auto refused = get("/-/dashboard/state", certs, "prometheus");
  CHECK(code_of(refused) == 403);
  CHECK(body_of(refused).find("needs an operator certificate; this one has the node role") !=
        std::string::npos);
  // No certificate, another cluster's: no handshake. Plain HTTP: 400.
  CHECK(get("/-/metrics", certs, "").exit_code != 0);
  CHECK(get("/-/metrics", other, "mallory").exit_code != 0);
  auto plain = http_get(c.admin_ports.at("head"), "/-/metrics", 10);
  REQUIRE(plain);
  CHECK(plain->status == 400);
}

TEST_CASE(
    "https: with --https-cert the gRPC port speaks TLS - grpcio with the service's CA calls it - a "
    "client that does not offer h2 is refused") {
  const uint16_t grpc_port = free_port();
  HttpsNode n({"--grpc-port", std::to_string(grpc_port)});
  n.cluster.deploy_yaml("greeter.yaml", R"(applications:
  - name: greeter
    route_prefix: /greeter
    import_path: libtroupe_grpc_example.so:Greeter
    deployments:
      - name: Greeter
        num_replicas: 1
)");
  REQUIRE(n.cluster.wait_answers("head", "/greeter/stats"));
  const std::string source = TROUPE_SOURCE_DIR;
  auto grpc = [&](const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"/usr/bin/python3",
                                     source + "/tests/integration/grpc_client.py",
                                     "--port",
                                     std::to_string(grpc_port),
                                     "--proto",
                                     source + "/examples/grpc/greeter.proto",
                                     "--gen",
                                     n.cluster.dir / "pygen"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = run(argv, 60s);
    CAPTURE(r.err);
    REQUIRE(r.exit_code == 0);
    return json::parse(r.out);
  };
  auto said = grpc({"--ca", n.ca.ca(), "say", "tls"});
  CHECK(said["code"] == "OK");
  CHECK(said["replies"][0]["message"] == "Hello, tls!");
  auto counted = grpc({"--ca", n.ca.ca(), "count", "tls", "3", "0"});
  CHECK(counted["replies"].size() == 3);
  // Without TLS, the port does not answer gRPC.
  auto plain = grpc({"--timeout", "3", "say", "plain"});
  CHECK(plain["code"] == "UNAVAILABLE");
  // Over TLS with HTTP/2 (ALPN h2), curl reaches it; offering only
  // HTTP/1.1, its handshake is refused (curl: exit 35, an SSL connect error).
  const std::string url =
      "https://127.0.0.1:" + std::to_string(grpc_port) + "/troupe.examples.Greeter/SayHello";
  auto h2 = run({"/bin/sh", "-c",
                 "printf '\\0\\0\\0\\0\\0' | /usr/bin/curl -sS --cacert '" + n.ca.ca() +
                     "' -D - -o /dev/null -H 'content-type: application/grpc' -H 'te: trailers' "
                     "--data-binary @- " +
                     url},
                30s);
  CAPTURE(h2.err);
  CHECK(h2.exit_code == 0);
  CHECK(h2.out.find("HTTP/2 200") != std::string::npos);
  CHECK(h2.out.find("grpc-status: 0") != std::string::npos);
  auto h1 = run({"/usr/bin/curl", "-sS", "--http1.1", "--cacert", n.ca.ca(), "-o", "/dev/null",
                 "--data-binary", "x", url},
                30s);
  CHECK(h1.exit_code == 35);
  CHECK(n.metric("troupe_proxy_tls_handshakes_refused_total{reason=\"grpc_handshake\"}") >= 1);
  // The HTTPS port still speaks HTTP/1.1 to a client that offers h2 first.
  auto https = n.curl("/greeter/stats", {"-D", "-"});
  CHECK(https.exit_code == 0);
  CHECK(https.out.find("HTTP/1.1 200") != std::string::npos);
}
