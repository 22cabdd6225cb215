// A cluster running with TLS (--tls-dir): members and operators get in,
// everyone else is refused and changes nothing; roles are enforced.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <openssl/ssl.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <vector>


#include "tests/support/cluster.hpp"
#include "tests/support/frames.hpp"
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
        num_replicas: 3
)";

struct Secured {
  Cluster cluster;
  std::string certs = cluster.dir / "certs";
  std::string other = cluster.dir / "other";

  RunResult certs_cmd(std::vector<std::string> args) {
    std::vector<std::string> argv = {bin("troupectl"), "certs"};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv, 30s);
  }

  // `extra`: more arguments of a worker (e.g. its resources).
  explicit Secured(const std::map<std::string, std::vector<std::string>>& extra = {}) {
    REQUIRE(certs_cmd({"init", certs}).exit_code == 0);
    REQUIRE(certs_cmd({"issue", certs, "--name", "head", "--role", "node"}).exit_code == 0);
    REQUIRE(certs_cmd({"issue", certs, "--name", "w1", "--role", "node"}).exit_code == 0);
    REQUIRE(certs_cmd({"issue", certs, "--name", "w2", "--role", "node"}).exit_code == 0);
    REQUIRE(certs_cmd({"issue", certs, "--name", "alice", "--role", "operator"}).exit_code == 0);
    // A second cluster's CA and operator: must not get in.
    REQUIRE(certs_cmd({"init", other}).exit_code == 0);
    REQUIRE(certs_cmd({"issue", other, "--name", "mallory", "--role", "operator"}).exit_code == 0);
    // The nodes' states are asked by the operator.
    cluster.identity = as("alice", {});
    const std::vector<std::string> tls = {"--tls-dir", certs};
    std::map<std::string, std::vector<std::string>> workers = {{"w1", tls}, {"w2", tls}};
    for (const auto& [node, args] : extra)
      workers[node].insert(workers[node].end(), args.begin(), args.end());
    cluster.start({"w1", "w2"}, tls, workers, 30s);
  }

  std::vector<std::string> as(const std::string& name, std::vector<std::string> args) {
    std::vector<std::string> argv = {"--tls-dir", certs, "--tls-name", name};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  // Replica id -> node of the echo application's running replicas, asked
  // by the operator.
  std::map<std::string, std::string> replicas() { return cluster.running_replicas("echo", "Echo"); }

  std::string log_of(const std::string& node) { return cluster.nodes.at(node).output(); }
};

// A TLS client of 127.0.0.1:port that presents `name` of the CA directory
// `dir` and checks nothing of the server (a stranger who goes as far as TLS
// lets it): sends `bytes` once the handshake is through, and reports
// whether the server ended the session within `deadline`, either in the
// handshake or after it (TLS 1.3 tells a client its certificate was refused
// only when it reads).
bool tls_refused(uint16_t port, const std::string& dir, const std::string& name,
                 const std::string& bytes, std::chrono::milliseconds deadline) {
  std::unique_ptr<SSL_CTX, void (*)(SSL_CTX*)> ctx(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  REQUIRE(ctx);
  REQUIRE(SSL_CTX_use_certificate_chain_file(ctx.get(), (dir + "/" + name + ".crt").c_str()) == 1);
  REQUIRE(SSL_CTX_use_PrivateKey_file(ctx.get(), (dir + "/" + name + ".key").c_str(),
                                      SSL_FILETYPE_PEM) == 1);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{static_cast<time_t>(deadline.count() / 1000),
             static_cast<suseconds_t>(deadline.count() % 1000 * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  bool refused = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    std::unique_ptr<SSL, void (*)(SSL*)> ssl(SSL_new(ctx.get()), SSL_free);
    SSL_set_fd(ssl.get(), fd);
    if (SSL_connect(ssl.get()) != 1) {
      refused = true;
    } else if (SSL_write(ssl.get(), bytes.data(), static_cast<int>(bytes.size())) <= 0) {
      refused = true;
    } else {
      // Anything the server sends before it ends the session is discarded:
      // a refused peer gets nothing but an alert.
      char buf[4096];
      int n = 0;
      auto until = std::chrono::steady_clock::now() + deadline;
      while ((n = SSL_read(ssl.get(), buf, sizeof(buf))) > 0 &&
             std::chrono::steady_clock::now() < until) {
      }
      int error = SSL_get_error(ssl.get(), n);
      refused = n <= 0 && error != SSL_ERROR_WANT_READ;  // not merely the timeout
    }
  }
  ::close(fd);
  return refused;
}

}  // namespace

TEST_CASE("with TLS w1 reaches the replicas of w2 over the TLS data port of w2 - plain - foreign and operator clients are refused there - w2 serves on") {
  Secured s({{"w2", {"--resources", "cpu=2,w2=1"}}});
  auto file = s.cluster.write("pinned.yaml", R"(applications:
  - name: echo
    route_prefix: /echo
    import_path: libtroupe_examples.so:Echo
    deployments:
      - name: Echo
        num_replicas: 2
        resources: {w2: 0.1}
)");
  auto deploy = s.cluster.ctl(s.as("alice", {"deploy", file, "--wait"}));
  CAPTURE(deploy.err);
  REQUIRE(deploy.exit_code == 0);
  for (const auto& [id, node] : s.replicas())
    CHECK(node == "w2");

  // w2 opened its data port, with TLS.
  static const std::regex line(R"(other workers reach this node on [^ ]+ \(data port (\d+), TLS\))");
  std::smatch m;
  auto w2_log = s.log_of("w2");
  REQUIRE(std::regex_search(w2_log, m, line));
  const auto port = static_cast<uint16_t>(std::stoi(m[1]));

  // w1's proxy sends to w2's replicas over it: a request answered 200
  // through w1 grew w1's peer sends (the first one to w2 opens the
  // connection and goes over CAF itself).
  const uint16_t w1 = s.cluster.http_ports.at("w1");
  const uint16_t w1_admin = s.cluster.admin_ports.at("w1");
  auto peer_sends = [&] {
    auto n = metric_value(w1_admin, R"(troupe_proxy_replica_sends_total{transport="peer"})");
    REQUIRE(n);
    return static_cast<long>(*n);
  };
  auto answered_over_data_port = [&] {
    return wait_until(
        [&] {
          const long before = peer_sends();
          auto r = http_get(w1, "/echo/over-tls", 5);
          return r && r->status == 200 && peer_sends() > before;
        },
        20s, 100ms);
  };
  REQUIRE(answered_over_data_port());
  CHECK(s.log_of("w1").find("data port connection to node w2 at 127.0.0.1:" +
                            std::to_string(port)) != std::string::npos);
  CHECK(s.log_of("w1").find(", TLS)") != std::string::npos);

  // Strangers at w2's data port, each with a hello frame: plain TCP, a
  // certificate of another CA, an operator's certificate. Each is refused
  // and w2 says who and why.
  const auto hello = stream_frame(troupe::channel::Kind::hello, 0, "not-the-token");
  CHECK(closed_after_sending(port, hello, 10s));
  CHECK(tls_refused(port, s.other, "mallory", hello, 10s));
  CHECK(tls_refused(port, s.certs, "alice", hello, 10s));
  for (const auto& why : {std::string("it does not speak TLS"),
                          std::string("its certificate 'mallory' was refused: unable to get local "
                                      "issuer certificate"),
                          std::string("its certificate 'alice' has the operator role: data ports "
                                      "serve nodes only")}) {
    CAPTURE(why);
    CHECK(wait_until(
        [&] {
          auto log = s.log_of("w2");
          auto at = log.find("refused a data port connection from 127.0.0.1:");
          return at != std::string::npos && log.find(why, at) != std::string::npos;
        },
        10s, 100ms));
  }

  // w2 serves on, over the same data port: w1 never lost its connection.
  REQUIRE(answered_over_data_port());
  CHECK(s.log_of("w1").find("lost the data port connection") == std::string::npos);
}

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

TEST_CASE("a 3-node TLS cluster serves its operator - and refuses strangers - other CAs and wrong roles") {
  Secured s;  // every node ALIVE, as the operator sees it
  const std::map<std::string, std::string> all_alive = {
      {"head", "ALIVE"}, {"w1", "ALIVE"}, {"w2", "ALIVE"}};

  // The operator deploys; replicas spread over the nodes; every node's proxy
  // serves.
  auto file = s.cluster.write("echo.yaml", kEcho);
  auto deploy = s.cluster.ctl(s.as("alice", {"deploy", file, "--wait"}));
  CAPTURE(deploy.err);
  REQUIRE(deploy.exit_code == 0);
  auto before = s.replicas();
  REQUIRE(before.size() == 3);
  std::set<std::string> hosts;
  for (auto& [id, node] : before)
    hosts.insert(node);
  CHECK(hosts.size() >= 2);
  for (const auto& node : {"head", "w1", "w2"}) {
    CAPTURE(node);
    REQUIRE(wait_until(
        [&] {
          auto reply = http_get(s.cluster.http_ports.at(node), "/echo/hi", 10);
          return reply && reply->status == 200;
        },
        20s, 100ms));
  }
  auto status = s.cluster.status();
  REQUIRE(status.is_object());
  CHECK(status.at("applications").at("echo").at("status") == "RUNNING");

  // No certificate: the handshake fails; nothing changes.
  auto plain = s.cluster.ctl({"--timeout", "3", "delete", "echo"});
  CHECK(plain.exit_code == 1);
  CHECK(plain.err.find("cannot reach the controller") != std::string::npos);
  CHECK(plain.err.find("the controller may require TLS: give --tls-dir") != std::string::npos);

  // A certificate of another cluster's CA: refused, and says why.
  auto stranger = s.cluster.ctl(
      {"--tls-dir", s.other, "--tls-name", "mallory", "--timeout", "3", "delete", "echo"});
  CHECK(stranger.exit_code == 1);
  CAPTURE(stranger.err);
  CHECK(stranger.err.find("not signed by this cluster's CA") != std::string::npos);

  // A node certificate may not deploy or delete.
  auto node = s.cluster.ctl(s.as("w1", {"delete", "echo"}));
  CHECK(node.exit_code == 1);
  CHECK(node.err.find("permission denied: delete requires the operator role") != std::string::npos);
  auto node_deploy = s.cluster.ctl(s.as("head", {"deploy", file}));
  CHECK(node_deploy.exit_code == 1);
  CHECK(node_deploy.err.find("permission denied") != std::string::npos);

  // The per-deployment operations and the traffic split need the operator
  // role too; the operator's signatures (over the count, the exact weights,
  // the generation) are accepted.
  for (const auto& args : std::vector<std::vector<std::string>>{{"scale", "echo/Echo", "3"},
                                                                {"traffic", "echo", "Echo=1"},
                                                                {"delete", "echo/Echo"},
                                                                {"rollback", "echo"}}) {
    CAPTURE(args);
    auto refused = s.cluster.ctl(s.as("w1", args));
    CHECK(refused.exit_code == 1);
    CHECK(refused.err.find("permission denied") != std::string::npos);
  }
  // The operator's signed rollback is admitted, and refused on its merits:
  // echo runs its last good declaration.
  auto rollback = s.cluster.ctl(s.as("alice", {"rollback", "echo"}));
  CAPTURE(rollback.err);
  CHECK(rollback.exit_code == 1);
  CHECK(rollback.err.find("is already at its last good declaration") != std::string::npos);
  CHECK(s.cluster.ctl(s.as("alice", {"scale", "echo/Echo", "3"})).exit_code == 0);
  auto traffic = s.cluster.ctl(s.as("alice", {"traffic", "echo", "Echo=1"}));
  CAPTURE(traffic.err);
  CHECK(traffic.exit_code == 0);
  auto generation = s.cluster.status().at("generation").get<uint64_t>();
  auto guarded =
      s.cluster.ctl(s.as("alice", {"deploy", file, "--if-generation", std::to_string(generation)}));
  CAPTURE(guarded.err);
  CHECK(guarded.exit_code == 0);

  // Many short operator sessions: each connects and leaves.
  for (int i = 0; i < 10; ++i)
    CHECK(s.cluster.ctl(s.as("alice", {"nodes"})).exit_code == 0);

  // Nothing changed, and the members' own connections never broke: the same
  // replicas on the same nodes, every node ALIVE, no worker lost the
  // controller.
  CHECK(s.cluster.states() == all_alive);
  CHECK(s.replicas() == before);
  for (const auto& worker : {"w1", "w2"}) {
    CAPTURE(worker);
    CHECK(s.log_of(worker).find("connection to the controller lost") == std::string::npos);
  }
  auto after = s.cluster.status();
  REQUIRE(after.is_object());
  CHECK(after.at("applications").at("echo").at("status") == "RUNNING");
  CHECK(after.at("applications").size() == 1);
  auto reply = http_get(s.cluster.http_ports.at("w2"), "/echo/again", 10);
  REQUIRE(reply.has_value());
  CHECK(reply->status == 200);

  // The head logged each refused peer and why.
  auto head_log = s.log_of("head");
  CHECK(head_log.find("refused TLS peer 127.0.0.1:") != std::string::npos);
  CHECK(head_log.find("it does not speak TLS") != std::string::npos);
  CHECK(head_log.find("it refused our certificate") != std::string::npos);

  // A library on the operator's side: uploaded over TLS by the operator
  // (each piece signed), refused from a node certificate before anything is
  // kept; the workers fetch it over their TLS connections and serve it.
  std::filesystem::create_directories(s.cluster.dir / "build");
  std::filesystem::copy_file(std::string(TROUPE_UPLOAD_FIXTURES) + "/libupload_v1.so",
                             s.cluster.dir / "build/libup.so");
  auto both = s.cluster.write("both.yaml", std::string(kEcho) + R"(  - name: up
    route_prefix: /up
    import_path: ./build/libup.so:UploadModel
    deployments:
      - name: UploadModel
        num_replicas: 3
        max_replicas_per_node: 1
)");
  const std::string store = s.cluster.dir / "head/libraries";
  auto stored = [&] {
    std::set<std::string> names;
    std::error_code ec;  // none before the first upload
    for (std::filesystem::directory_iterator it(store, ec), end; !ec && it != end; it.increment(ec))
      names.insert(it->path().filename().string());
    return names;
  };
  const auto kept = stored();
  auto node_upload = s.cluster.ctl(s.as("w1", {"deploy", both}));
  CHECK(node_upload.exit_code == 1);
  CHECK(node_upload.err.find("permission denied: upload requires the operator role") !=
        std::string::npos);
  CHECK(stored() == kept);
  CHECK_FALSE(s.cluster.status().at("applications").contains("up"));
  auto uploaded = s.cluster.ctl(s.as("alice", {"deploy", both, "--wait"}));
  CAPTURE(uploaded.err);
  CHECK(uploaded.exit_code == 0);
  CHECK(uploaded.out.find("uploaded ") != std::string::npos);
  for (const auto& node : {"head", "w1", "w2"}) {
    CAPTURE(node);
    CHECK(wait_until(
        [&] {
          auto reply = http_get(s.cluster.http_ports.at(node), "/up/", 10);
          return reply && reply->status == 200 &&
                 reply->body.find("\"answer\":\"v1\"") != std::string::npos;
        },
        20s, 100ms));
  }
}
