// troupectl against a real cluster, run exactly as an operator runs it.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <set>
#include <sstream>

#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"

using namespace troupe::testing;
using nlohmann::json;

namespace {

struct Ctl {
  Cluster cluster;

  Ctl() { cluster.start({"w1"}); }

  json status() {
    auto s = cluster.status();
    REQUIRE(s.is_object());
    return s;
  }

  // What must not change when a bad deploy is refused: applications and
  // their replicas.
  std::set<std::string> fingerprint() {
    std::set<std::string> out;
    auto s = status();
    for (const auto& [name, app] : s.at("applications").items()) {
      for (const auto& [dname, dep] : app.at("deployments").items()) {
        for (const auto& r : dep.at("replicas")) {
          out.insert(name + "/" + dname + "/" + r.at("id").get<std::string>() + "/" +
                     r.at("state").get<std::string>());
        }
      }
    }
    return out;
  }
};

const char* kGreeter = R"(applications:
  - name: greeter
    route_prefix: /greet
    import_path: libtroupe_examples.so:Hello
    deployments:
      - name: Hello
        num_replicas: 2
        user_config: {greeting: hi}
)";

}  // namespace

TEST_CASE("deploy --wait - status --json - config round trip - delete") {
  Ctl c;
  auto r =
      c.cluster.ctl({"deploy", std::string(TROUPE_SOURCE_DIR) + "/examples/hello.yaml", "--wait"});
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("greeter/Hello: HEALTHY, 3/3 running") != std::string::npos);
  CHECK(r.out.find("all applications are RUNNING") != std::string::npos);

  // The documented shape of status --json.
  auto s = c.status();
  const auto& app = s.at("applications").at("greeter");
  CHECK(app.at("status") == "RUNNING");
  CHECK(app.contains("message"));
  CHECK(app.at("route_prefix") == "/greet");
  const auto& dep = app.at("deployments").at("Hello");
  CHECK(dep.at("status") == "HEALTHY");
  CHECK(dep.contains("message"));
  REQUIRE(dep.at("replicas").size() == 3);
  for (const auto& row : dep.at("replicas")) {
    for (auto key : {"id", "node", "state", "version"})
      CHECK(row.contains(key));
  }

  // config -> deploy is a no-op: nothing restarts.
  auto before = c.fingerprint();
  auto config = c.cluster.ctl({"config"});
  REQUIRE(config.exit_code == 0);
  auto file = c.cluster.write("roundtrip.yaml", config.out);
  auto again = c.cluster.ctl({"deploy", file});
  CHECK(again.exit_code == 0);
  CHECK(again.out.find("unchanged") != std::string::npos);
  CHECK(c.fingerprint() == before);

  // Human-readable status names the replicas.
  auto table = c.cluster.ctl({"status", "greeter"});
  CHECK(table.exit_code == 0);
  CHECK(table.out.find("greeter  RUNNING  /greet") != std::string::npos);

  auto del = c.cluster.ctl({"delete", "greeter"});
  CHECK(del.exit_code == 0);
  CHECK(wait_until([&] { return c.status().at("applications").empty(); }, 20s, 100ms));
  auto missing = c.cluster.ctl({"delete", "greeter"});
  CHECK(missing.exit_code == 1);
  CHECK(missing.err.find("\"greeter\" is not a known application") != std::string::npos);
}

TEST_CASE("every kind of bad config is refused with a message naming it - nothing changes") {
  Ctl c;
  auto ok = c.cluster.ctl({"deploy", c.cluster.write("good.yaml", kGreeter), "--wait"});
  REQUIRE(ok.exit_code == 0);
  auto before = c.fingerprint();
  REQUIRE(before.size() == 2);

  struct Case {
    const char* name;
    std::string yaml;
    std::string fragment;
  };
  std::vector<Case> cases = {
      {"syntax", "applications: [\n  - name: x\n", "syntax.yaml:2:3: YAML syntax error"},
      {"unknown", std::string(kGreeter) + "        num_replica: 3\n",
       "unknown field 'num_replica' in deployment 'Hello'; did you mean 'num_replicas'?"},
      {"type", std::string(kGreeter) + "        max_ongoing_requests: lots\n",
       "max_ongoing_requests: expected"},
      {"range", std::string(kGreeter) + "        health_check_timeout_s: -1\n",
       "health_check_timeout_s"},
      {"dup_app", std::string(kGreeter) + R"(  - name: greeter
    route_prefix: /other
    import_path: libtroupe_examples.so:Echo
)",
       "greeter"},
      {"dup_dep", std::string(kGreeter) + "      - name: Hello\n", "Hello"},
      {"prefix", R"(applications:
  - name: bad
    route_prefix: nope
    import_path: libtroupe_examples.so:Echo
)",
       "route_prefix"},
      {"same_prefix", std::string(kGreeter) + R"(  - name: other
    route_prefix: /greet
    import_path: libtroupe_examples.so:Echo
)",
       "route_prefix '/greet' of application 'other' is already used by application 'greeter'"},
      {"empty", "", "is empty"},
  };
  for (const auto& k : cases) {
    CAPTURE(k.name);
    auto file = c.cluster.write(std::string(k.name) + ".yaml", k.yaml);
    auto r = c.cluster.ctl({"deploy", file});
    CAPTURE(r.err);
    CHECK(r.exit_code == 1);
    CHECK(r.err.find(k.fragment) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(c.fingerprint() == before);
  }

  // A library that no node has: accepted, then DEPLOY_FAILED with the
  // loader's message; the running application is untouched.
  auto missing = c.cluster.write("missing.yaml", std::string(kGreeter) + R"(  - name: ghost
    route_prefix: /ghost
    import_path: libnot_there.so:Ghost
)");
  auto r = c.cluster.ctl({"deploy", missing, "--wait", "--wait-timeout", "60"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("library 'libnot_there.so' not found in plugin path") != std::string::npos);
  CHECK(c.fingerprint() == before);

  // A class the library does not have: likewise, with the loader's message.
  auto no_class = c.cluster.write("no_class.yaml", std::string(kGreeter) + R"(  - name: ghost
    route_prefix: /ghost
    import_path: libtroupe_examples.so:Ghost
)");
  auto rc = c.cluster.ctl({"deploy", no_class, "--wait", "--wait-timeout", "60"});
  CHECK(rc.exit_code == 1);
  CHECK(rc.err.find("has no deployment 'Ghost'") != std::string::npos);
  CHECK(c.fingerprint() == before);
}

TEST_CASE("kill replica through troupectl - shutdown --nodes stops every node process") {
  Ctl c;
  const auto good = c.cluster.write("good.yaml", kGreeter);
  REQUIRE(c.cluster.ctl({"deploy", good, "--wait"}).exit_code == 0);
  auto dep = c.status()["applications"]["greeter"]["deployments"]["Hello"];
  auto victim = dep["replicas"][0]["id"].get<std::string>();
  auto k = c.cluster.ctl({"kill", "replica", victim});
  CHECK(k.exit_code == 0);
  CHECK(wait_until(
      [&] {
        auto d = c.status()["applications"]["greeter"]["deployments"]["Hello"];
        if (d.value("status", "") != "HEALTHY" || d["replicas"].size() != 2)
          return false;
        for (const auto& r : d["replicas"]) {
          if (r["id"] == victim)
            return false;
        }
        return true;
      },
      20s, 100ms));
  auto bad_kind = c.cluster.ctl({"kill", "thing", "x"});
  CHECK(bad_kind.exit_code == 2);
  auto unknown = c.cluster.ctl({"kill", "replica", "no-such-replica"});
  CHECK(unknown.exit_code == 1);
  CHECK(unknown.err.find("no replica 'no-such-replica'") != std::string::npos);

  auto s = c.cluster.ctl({"shutdown", "--nodes"});
  CHECK(s.exit_code == 0);
  for (auto& [id, proc] : c.cluster.nodes) {
    CAPTURE(id);
    auto code = proc.wait_exit(20s);
    REQUIRE(code.has_value());
    CHECK(*code == 0);
  }
}

TEST_CASE("limits: a config over the cluster's replica caps is refused - naming the cap") {
  Cluster cluster;
  cluster.start({}, {"--max-replicas-per-deployment", "5", "--max-replicas-total", "8"});
  auto big = cluster.ctl({"deploy", cluster.write("big.yaml", R"(applications:
  - name: big
    route_prefix: /big
    import_path: libtroupe_examples.so:Echo
    deployments:
      - name: Echo
        num_replicas: 6
)")});
  CHECK(big.exit_code == 1);
  CHECK(big.err.find("asks for 6 replicas; the cluster allows at most 5 per deployment") !=
        std::string::npos);
  auto many = cluster.ctl({"deploy", cluster.write("many.yaml", R"(applications:
  - name: a
    route_prefix: /a
    import_path: libtroupe_examples.so:Echo
    deployments:
      - name: Echo
        num_replicas: 5
  - name: b
    route_prefix: /b
    import_path: libtroupe_examples.so:Echo
    deployments:
      - name: Echo
        num_replicas: 4
)")});
  CHECK(many.exit_code == 1);
  CHECK(many.err.find("asks for 9 replicas in all; the cluster allows at most 8") !=
        std::string::npos);
  auto status = cluster.status();
  REQUIRE(status.is_object());
  CHECK(status.at("applications").empty());
}

namespace {

const char* kShop = R"(applications:
  - name: shop
    route_prefix: /shop
    import_path: libtroupe_examples.so:Hello
    deployments:
      - name: Hello
        num_replicas: 1
      - name: Counter
        import_path: libtroupe_examples.so:Counter
        num_replicas: 1
      - name: Auto
        import_path: libtroupe_examples.so:Echo
        autoscaling_config: {min_replicas: 1, max_replicas: 2}
)";

// RUNNING replicas of shop/<deployment>; -1 when it is not in the status.
int running(Ctl& c, const std::string& deployment) {
  auto deps = c.status()["applications"]["shop"]["deployments"];
  if (!deps.contains(deployment))
    return -1;
  int n = 0;
  for (const auto& r : deps[deployment]["replicas"])
    n += r["state"] == "RUNNING" ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("scale - delete APP/DEPLOYMENT - deploy --if-generation work and refuse what they must") {
  Ctl c;
  const auto file = c.cluster.write("shop.yaml", kShop);
  auto deployed = c.cluster.ctl({"deploy", file, "--wait"});
  CAPTURE(deployed.err);
  REQUIRE(deployed.exit_code == 0);
  const uint64_t g = c.status().at("generation").get<uint64_t>();

  // scale: written, then reconciled.
  auto scaled = c.cluster.ctl({"scale", "shop/Counter", "3"});
  CAPTURE(scaled.err);
  REQUIRE(scaled.exit_code == 0);
  CHECK(scaled.out == "accepted: shop/Counter has 3 replicas as its target (generation " +
                          std::to_string(g + 1) + ")\n");
  CHECK(wait_until([&] { return running(c, "Counter") == 3; }, 30s, 100ms));
  CHECK(c.status().at("generation") == g + 1);
  auto again = c.cluster.ctl({"scale", "shop/Counter", "3"});
  CHECK(again.exit_code == 0);
  CHECK(again.out.rfind("unchanged: ", 0) == 0);

  // Every refusal: exit 1, one line naming the argument or the rule,
  // nothing changed.
  auto before = c.fingerprint();
  struct Refused {
    std::vector<std::string> args;
    std::string fragment;
  };
  const std::string g1 = std::to_string(g + 1);
  std::vector<Refused> cases = {
      {{"scale", "shop/Auto", "2"},
       "applications[shop].deployments[Auto].num_replicas: the deployment is autoscaled"},
      {{"scale", "nope/Counter", "2"}, "applications[nope]: \"nope\" is not a known application"},
      {{"scale", "shop/Nope", "2"},
       "applications[shop].deployments[Nope]: \"Nope\" is not a known deployment"},
      {{"scale", "shop", "2"}, "APP/DEPLOYMENT: \"shop\" must name an application"},
      {{"scale", "shop/Counter", "lots"}, "N: \"lots\" must be a whole number from 0 to 100000"},
      {{"scale", "shop/Counter", "100001"}, "N: \"100001\" must be a whole number"},
      {{"delete", "shop/Hello"}, "\"Hello\" is the ingress and cannot be deleted alone"},
      {{"delete", "shop/Nope"}, "\"Nope\" is not a known deployment"},
      {{"delete", "nope/Counter"}, "\"nope\" is not a known application"},
      {{"delete", "shop/"}, "APP/DEPLOYMENT: \"shop/\": the deployment name \"\""},
      {{"deploy", file, "--if-generation", std::to_string(g)},
       "if_generation: " + std::to_string(g) + " is not the current generation " + g1},
      {{"deploy", file, "--if-generation", "soon"},
       "--if-generation: \"soon\" must be a whole number"},
  };
  for (const auto& k : cases) {
    CAPTURE(k.args);
    auto r = c.cluster.ctl(k.args);
    CAPTURE(r.err);
    CHECK(r.exit_code == 1);
    CHECK(r.err.rfind("troupectl: error: ", 0) == 0);
    CHECK(r.err.find(k.fragment) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
  CHECK(c.fingerprint() == before);
  CHECK(c.status().at("generation") == g + 1);

  // --if-generation at the current generation: accepted (the file's one
  // Counter replica replaces the scaled three).
  auto current = c.cluster.ctl({"deploy", file, "--if-generation", g1});
  CAPTURE(current.err);
  REQUIRE(current.exit_code == 0);
  CHECK(current.out.find("accepted (generation " + std::to_string(g + 2) + ")") !=
        std::string::npos);
  CHECK(wait_until([&] { return running(c, "Counter") == 1; }, 30s, 100ms));

  // delete APP/DEPLOYMENT: that one goes, the application stays.
  auto del = c.cluster.ctl({"delete", "shop/Counter"});
  CAPTURE(del.err);
  REQUIRE(del.exit_code == 0);
  CHECK(del.out == "deployment shop/Counter is being deleted\n");
  CHECK(wait_until([&] { return running(c, "Counter") == -1; }, 30s, 100ms));
  CHECK(running(c, "Hello") == 1);
  auto config = c.cluster.ctl({"config"});
  REQUIRE(config.exit_code == 0);
  CHECK(config.out.find("Counter") == std::string::npos);
  CHECK(config.out.find("Auto") != std::string::npos);
}

TEST_CASE("global options are taken after the subcommand too - each at most once") {
  Ctl c;
  auto ctl = bin("troupectl");
  auto file = c.cluster.write("greeter.yaml", kGreeter);
  // After the subcommand and its own flags, as an operator types them.
  auto deployed =
      run({ctl, "deploy", file, "--wait", "--timeout", "60", "--address", c.cluster.address}, 90s);
  CAPTURE(deployed.err);
  REQUIRE(deployed.exit_code == 0);
  CHECK(deployed.out.find("all applications are RUNNING") != std::string::npos);
  CHECK(c.status().at("applications").contains("greeter"));

  // The address given after the subcommand is the one asked, not the default.
  auto nowhere = "127.0.0.1:" + std::to_string(free_port());
  auto unreachable = run({ctl, "nodes", "--json", "--address", nowhere, "--timeout", "1"});
  CAPTURE(unreachable.err);
  CHECK(unreachable.exit_code == 1);
  CHECK(unreachable.err.find("cannot reach the controller at " + nowhere) != std::string::npos);

  // Its value is checked as before the subcommand.
  auto bad = run({ctl, "status", "--address", c.cluster.address, "--timeout", "0"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("--timeout must be > 0 seconds") != std::string::npos);

  // Given before and after: bad usage, naming the option; nothing is asked.
  auto twice = run({ctl, "--address", c.cluster.address, "delete", "greeter", "--address",
                    c.cluster.address});
  CAPTURE(twice.err);
  CHECK(twice.exit_code == 2);
  CHECK(twice.err.find("--address") != std::string::npos);
  CHECK(c.status().at("applications").contains("greeter"));
}

TEST_CASE("leader: a single head names itself - an address list skips heads it cannot reach") {
  Ctl c;
  auto ctl = bin("troupectl");
  auto line = run({ctl, "--address", c.cluster.address, "leader"});
  CAPTURE(line.err);
  REQUIRE(line.exit_code == 0);
  auto as_json = run({ctl, "--address", c.cluster.address, "leader", "--json"});
  REQUIRE(as_json.exit_code == 0);
  auto j = nlohmann::json::parse(as_json.out);
  CHECK(j["ha"] == false);
  CHECK(j["leading"] == true);
  CHECK(j["leader"]["address"] == c.cluster.address);
  CHECK(j["leader"]["term"] == 0);
  auto id = j["leader"]["node_id"].get<std::string>();
  REQUIRE(!id.empty());
  // The node id first on the line, then since when.
  CHECK(line.out.rfind(id + " since ", 0) == 0);
  CHECK(line.out.find("a single head") != std::string::npos);

  // A list: an unreachable head first is skipped, the head answers.
  auto nowhere = "127.0.0.1:" + std::to_string(free_port());
  auto listed = run({ctl, "--address", nowhere + "," + c.cluster.address, "--timeout", "2",
                     "nodes", "--json"});
  CAPTURE(listed.err);
  CHECK(listed.exit_code == 0);
  CHECK(listed.out.find("\"ALIVE\"") != std::string::npos);
  // None reachable: one error naming every head tried and why.
  auto nowhere2 = "127.0.0.1:" + std::to_string(free_port());
  auto none = run({ctl, "--address", nowhere + "," + nowhere2, "--timeout", "1", "status"});
  CHECK(none.exit_code == 1);
  CHECK(none.err.find("no head of " + nowhere + "," + nowhere2 + " leads") != std::string::npos);
  CHECK(none.err.find("cannot reach the controller at " + nowhere2) != std::string::npos);
  // A malformed list is bad usage, naming the entry.
  auto bad = run({ctl, "--address", c.cluster.address + ",nohost", "status"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("--address: 'nohost'") != std::string::npos);
}

namespace {

const char* kStreamsAndModels = R"(applications:
  - name: stream
    route_prefix: /stream
    import_path: libtroupe_examples.so:Ticker
    deployments:
      - name: Ticker
        autoscaling_config: {min_replicas: 1, max_replicas: 1, metrics_interval_s: 0.2}
  - name: models
    route_prefix: /models
    import_path: libtroupe_examples.so:ModelHost
    deployments:
      - name: ModelHost
        max_num_models_per_replica: 2
        autoscaling_config: {min_replicas: 1, max_replicas: 1, metrics_interval_s: 0.2}
)";

// A client that sends one request and reads nothing until it closes.
struct OpenRequest {
  int fd = -1;
  OpenRequest(uint16_t port, const std::string& target) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    std::string req = "GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    REQUIRE(::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size()));
  }
  ~OpenRequest() { close(); }
  void close() {
    if (fd >= 0)
      ::close(fd);
    fd = -1;
  }
};

}  // namespace

TEST_CASE("status lists each replica's models and the streams in flight - text and --json") {
  Ctl c;
  auto deployed = c.cluster.ctl({"deploy", c.cluster.write("apps.yaml", kStreamsAndModels),
                                 "--wait", "--timeout", "60"});
  CAPTURE(deployed.out);
  CAPTURE(deployed.err);
  REQUIRE(deployed.exit_code == 0);
  const uint16_t port = c.cluster.http_ports.at("head");
  auto deployment = [&](const std::string& app, const std::string& name) {
    return c.status()["applications"][app]["deployments"][name];
  };

  // A request that names model m3 loads it: the replica holds it.
  auto loaded = http_request(port, "GET", "/models/", "", 30, {{"serve_multiplexed_model_id", "m3"}});
  REQUIRE(loaded);
  CHECK(loaded->status == 200);
  json dep;
  CHECK(wait_until(
      [&] {
        dep = deployment("models", "ModelHost");
        return dep["replicas"].size() == 1 &&
               dep["replicas"][0].value("models", json::array()) == json::array({"m3"});
      },
      20s, 100ms));
  CAPTURE(dep.dump());
  RunResult text;
  CHECK(wait_until(
      [&] {
        text = c.cluster.ctl({"status", "models"});
        return text.exit_code == 0 && text.out.find("models: m3") != std::string::npos;
      },
      10s, 100ms));
  CAPTURE(text.out);

  // A stream of 60 s held open by a client: one stream in flight at the
  // deployment and its replica, as its next reports say.
  {
    OpenRequest open(port, "/stream/?n=600&ms=100");
    CHECK(wait_until(
        [&] {
          dep = deployment("stream", "Ticker");
          return dep.value("streams", 0) == 1 && dep["replicas"].size() == 1 &&
                 dep["replicas"][0].value("streams", 0) == 1 &&
                 dep.value("in_flight", 0.0) > 0.5;
        },
        20s, 100ms));
    CAPTURE(dep.dump());
    // The deployment's load line, and the replica's (its id first).
    auto line_of = [](const std::string& out, const std::string& needle) {
      std::istringstream lines(out);
      for (std::string line; std::getline(lines, line);) {
        if (line.find(needle) != std::string::npos)
          return line;
      }
      return std::string();
    };
    CHECK(wait_until(
        [&] {
          text = c.cluster.ctl({"status", "stream"});
          auto load = line_of(text.out, " req/s  ");
          auto replica = line_of(text.out, "    stream#Ticker#");
          return text.exit_code == 0 && load.find("  streams 1  restarts 0") != std::string::npos &&
                 replica.size() > 9 && replica.substr(replica.size() - 9) == "streams 1";
        },
        10s, 100ms));
    CAPTURE(text.out);
    // The client leaves: the stream ends at the replica.
    open.close();
    CHECK(wait_until(
        [&] {
          dep = deployment("stream", "Ticker");
          return dep.value("streams", -1) == 0 && dep["replicas"][0].value("streams", -1) == 0;
        },
        20s, 100ms));
  }
  text = c.cluster.ctl({"status", "stream"});
  CHECK(text.out.find("  streams 0  restarts 0") != std::string::npos);
}
