// The gRPC ingress (troupe-node --grpc-port, proxy/grpc_server.hpp), checked
// with a client nobody here wrote: Python's grpcio, through
// tests/integration/grpc_client.py, whose protobuf and gRPC code is generated
// at test time from examples/grpc/greeter.proto. The Greeter example answers
// (examples/grpc/greeter.cpp); the Echo example shows what a deployment gets.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <set>
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
  - name: greeter
    route_prefix: /greeter
    import_path: libtroupe_grpc_example.so:Greeter
    deployments:
      - name: Greeter
        num_replicas: @REPLICAS@
        max_ongoing_requests: 100
  - name: echo
    route_prefix: /echo
    import_path: libtroupe_examples.so:Echo
    deployments:
      - name: Echo
        num_replicas: 1
  - name: models
    route_prefix: /models
    import_path: libtroupe_examples.so:ModelHost
    deployments:
      - name: ModelHost
        num_replicas: 3
        max_num_models_per_replica: 2
)";

const std::string kSource = TROUPE_SOURCE_DIR;

// A head and a worker, each with a gRPC port, running kApps with
// `replicas` Greeters.
struct GrpcCluster {
  Cluster cluster;
  std::map<std::string, uint16_t> grpc;

  explicit GrpcCluster(int replicas = 2) {
    std::string apps = kApps;
    apps.replace(apps.find("@REPLICAS@"), 10, std::to_string(replicas));
    grpc["head"] = free_port();
    grpc["w1"] = free_port();
    cluster.start({"w1"}, {"--grpc-port", std::to_string(grpc["head"])},
                  {{"w1", {"--grpc-port", std::to_string(grpc["w1"])}}});
    cluster.deploy_yaml("apps.yaml", apps);
    REQUIRE(cluster.wait_all_answer("head", {"/greeter/stats", "/echo/"}));
    REQUIRE(cluster.wait_all_answer("w1", {"/greeter/stats", "/echo/"}));
  }

  // One call of grpc_client.py through `node`'s gRPC port: its JSON line.
  json call(const std::string& node, const std::vector<std::string>& args,
            std::chrono::milliseconds timeout = 60s) {
    std::vector<std::string> argv = {"/usr/bin/python3",
                                     kSource + "/tests/integration/grpc_client.py",
                                     "--port",
                                     std::to_string(grpc.at(node)),
                                     "--proto",
                                     kSource + "/examples/grpc/greeter.proto",
                                     "--gen",
                                     cluster.dir / "pygen"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = run(argv, timeout);
    CAPTURE(r.err);
    CAPTURE(r.out);
    REQUIRE(r.exit_code == 0);
    auto out = json::parse(r.out, nullptr, false);
    REQUIRE(out.is_object());
    return out;
  }

  json stats(const std::string& node) {
    auto r = http_get(cluster.http_ports.at(node), "/greeter/stats");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    return json::parse(r->body);
  }
};

// The bytes of a hex string.
std::string unhex(const std::string& hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    bytes.push_back(char(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return bytes;
}

}  // namespace

TEST_CASE(
    "grpc: a grpcio client calls unary and server-streaming methods through every node's gRPC port "
    "- routed by its application metadata") {
  GrpcCluster g;
  for (const std::string node : {"head", "w1"}) {
    CAPTURE(node);
    auto said = g.call(node, {"--app", "greeter", "say", "troupe"});
    CHECK(said["code"] == "OK");
    REQUIRE(said["replies"].size() == 1);
    CHECK(said["replies"][0]["message"] == "Hello, troupe!");
    CHECK(said["replies"][0]["replica_id"].get<std::string>().size() > 0);
    // The proxy's request id comes back as initial metadata.
    CHECK(said["metadata"].contains("x-request-id"));

    auto counted = g.call(node, {"--app", "greeter", "count", "stream", "5", "0"});
    CHECK(counted["code"] == "OK");
    REQUIRE(counted["replies"].size() == 5);
    for (int i = 0; i < 5; ++i) {
      CHECK(counted["replies"][i]["index"] == i);
      CHECK(counted["replies"][i]["message"] == "Hello, stream!");
    }
  }

  // Without the metadata, with two applications: refused, naming the key.
  auto unnamed = g.call("head", {"say", "x"});
  CHECK(unnamed["code"] == "INVALID_ARGUMENT");
  CHECK(unnamed["details"].get<std::string>().find("'application'") != std::string::npos);
  auto unknown = g.call("head", {"--app", "nope", "say", "x"});
  CHECK(unknown["code"] == "NOT_FOUND");
  CHECK(unknown["details"].get<std::string>().find("'nope'") != std::string::npos);

  // What the deployment gets: POST to the method's full name, the metadata
  // as headers, the message's bytes as the body (Echo answers them as JSON).
  auto echoed = g.call("w1", {"--app", "echo", "--meta", "x-user=alice", "raw",
                              "/some.Service/Method", "0a03616263"});
  REQUIRE(echoed["code"] == "OK");
  auto seen = json::parse(unhex(echoed["raw"].get<std::string>()));
  CHECK(seen["method"] == "POST");
  CHECK(seen["path"] == "/some.Service/Method");
  CHECK(seen["headers"]["x-user"] == "alice");
  CHECK(seen["headers"]["application"] == "echo");
  CHECK(seen["headers"]["content-type"] == "application/grpc");
  CHECK(seen["body"] ==
        "\n\x03"
        "abc");

  // A message that is not the method's: INVALID_ARGUMENT from the
  // deployment; a method it does not have: its own UNIMPLEMENTED.
  auto malformed =
      g.call("head", {"--app", "greeter", "raw", "/troupe.examples.Greeter/SayHello", "ffffffff"});
  CHECK(malformed["code"] == "INVALID_ARGUMENT");
  CHECK(malformed["details"].get<std::string>().find("HelloRequest") != std::string::npos);
  auto missing = g.call("head", {"--app", "greeter", "raw", "/troupe.examples.Greeter/Nope", ""});
  CHECK(missing["code"] == "UNIMPLEMENTED");

  // Many calls on one channel: every one answered right, by both replicas.
  auto many = g.call("w1", {"--app", "greeter", "many", "load", "400", "8"});
  CHECK(many["codes"] == json{{"OK", 400}});
  CHECK(many["replicas"].size() == 2);

  // Each node counts its calls by gRPC status: the deployment's own
  // UNIMPLEMENTED too, and the refusals the proxy answered itself.
  auto count = [&](const std::string& node, const std::string& labels) {
    return metric_value(g.cluster.admin_ports.at(node),
                        "troupe_grpc_requests_total{" + labels + "}")
        .value_or(-1);
  };
  CHECK(count("w1", R"(application="greeter",code="OK")") >= 402);
  CHECK(count("head", R"(application="greeter",code="UNIMPLEMENTED")") == 1);
  CHECK(count("head", R"(application="greeter",code="INVALID_ARGUMENT")") == 1);
  CHECK(count("head", R"(application="",code="INVALID_ARGUMENT")") == 1);
  CHECK(count("head", R"(application="",code="NOT_FOUND")") == 1);
}

TEST_CASE(
    "grpc: serve_multiplexed_model_id metadata sends calls to the replica that holds the model") {
  GrpcCluster g;
  auto out = g.call("w1", {"--app", "models", "--meta", "serve_multiplexed_model_id=m7", "raw",
                           "/any.Models/Predict", "", "--repeat", "12"});
  REQUIRE(out["code"] == "OK");
  REQUIRE(out["raws"].size() == 12);
  std::set<std::string> replicas;
  int hits = 0;
  for (const auto& hex : out["raws"]) {
    auto a = json::parse(unhex(hex.get<std::string>()));
    CHECK(a["model_id"] == "m7");
    replicas.insert(a["replica_id"].get<std::string>());
    hits += a["hit"].get<bool>() ? 1 : 0;
  }
  // The first call loads the model; every later one finds it where it is.
  CHECK(replicas.size() == 1);
  CHECK(hits == 11);
}

TEST_CASE(
    "grpc: a deadline ends the call DEADLINE_EXCEEDED and the handler sees it - a cancelled call "
    "is seen within 100 ms") {
  // One Greeter: its /stats counts every call.
  GrpcCluster g(1);
  const auto cancelled_before = g.stats("head")["cancelled"].get<int64_t>();
  auto late = g.call("head", {"--app", "greeter", "--timeout", "0.5", "wait", "20000"});
  CHECK(late["code"] == "DEADLINE_EXCEEDED");
  // The node enforces grpc-timeout itself: curl has no deadline of its own,
  // and gets DEADLINE_EXCEEDED from the node at 300 ms, not before. (The
  // message: a HelloRequest with interval_ms 20000, framed.)
  auto own = run({"/bin/sh", "-c",
                  "printf '\\0\\0\\0\\0\\4\\30\\240\\234\\1' | /usr/bin/curl -sS "
                  "--http2-prior-knowledge -o /dev/null -D - -w 'took %{time_total}\\n' "
                  "-H 'content-type: application/grpc' -H 'grpc-timeout: 300m' "
                  "-H 'application: greeter' --data-binary @- http://127.0.0.1:" +
                      std::to_string(g.grpc.at("w1")) + "/troupe.examples.Greeter/Wait"},
                 30s);
  CAPTURE(own.out);
  CHECK(own.out.find("grpc-status: 4") != std::string::npos);
  const auto took_at = own.out.find("took ");
  REQUIRE(took_at != std::string::npos);
  const double took = std::stod(own.out.substr(took_at + 5));
  CHECK(took >= 0.3);
  CHECK(took < 10);

  // The client cancels a unary call while its handler waits, and a stream
  // after three messages. The margin: the cancellation crosses the proxy's
  // io thread and the replica's data channel on loopback (a few ms); 100 ms
  // leaves room for a loaded 2-core machine.
  auto cancel_ns = [&](const json& out) { return out["cancel_ns"].get<int64_t>(); };
  auto waited = g.call("w1", {"--app", "greeter", "--cancel-after", "0.3", "wait", "20000"});
  CHECK(waited["code"] == "CANCELLED");
  auto streamed = g.call("head", {"--app", "greeter", "--take", "3", "count", "s", "100000", "20"});
  CHECK(streamed["replies"].size() == 3);

  // Both cancellations and both deadlines reached the handler.
  json stats;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while ((stats = g.stats("head"))["cancelled"].get<int64_t>() < cancelled_before + 4 &&
         std::chrono::steady_clock::now() < deadline) {
  }
  CHECK(stats["cancelled"].get<int64_t>() == cancelled_before + 4);
  // The last one noticed (the stream's) within the margin of its cancel.
  const int64_t last = stats["last_cancel_ns"].get<int64_t>();
  CHECK(last >= cancel_ns(streamed));
  CHECK(last - cancel_ns(streamed) < 100'000'000);
  CHECK(cancel_ns(waited) > 0);
}

TEST_CASE(
    "grpc: a query of death is refused UNAVAILABLE after one retry - and bad input gets a status "
    "naming it - the nodes live on") {
  GrpcCluster g;
  auto crashed = g.call("head", {"--app", "greeter", "crash"});
  CHECK(crashed["code"] == "UNAVAILABLE");
  // The other calls go on.
  auto said = g.call("head", {"--app", "greeter", "say", "after"});
  CHECK(said["code"] == "OK");

  // Over the node's body limit (16 MiB by default): RESOURCE_EXHAUSTED.
  auto big = g.call("w1", {"--app", "greeter", "big", "20"});
  CHECK(big["code"] == "RESOURCE_EXHAUSTED");
  CHECK(big["details"].get<std::string>().find("body limit") != std::string::npos);
  // A grpc-timeout that is not one: INVALID_ARGUMENT naming the header.
  // (curl sends an empty HelloRequest: a 5-byte prefix of length 0.)
  auto r = run({"/bin/sh", "-c",
                "printf '\\0\\0\\0\\0\\0' | /usr/bin/curl -sS --http2-prior-knowledge "
                "-o /dev/null -D - -H 'content-type: application/grpc' -H 'grpc-timeout: soon' "
                "-H 'application: greeter' --data-binary @- http://127.0.0.1:" +
                    std::to_string(g.grpc.at("head")) + "/troupe.examples.Greeter/SayHello"},
               30s);
  CAPTURE(r.out);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("grpc-status: 3") != std::string::npos);
  CHECK(r.out.find("grpc-timeout") != std::string::npos);
  // Not gRPC at all: 405 for a GET, 415 for a POST of something else.
  const std::string url = "http://127.0.0.1:" + std::to_string(g.grpc.at("head")) + "/x";
  auto get = run({"/usr/bin/curl", "-sS", "--http2-prior-knowledge", "-o", "/dev/null", "-w",
                  "%{http_code}", url},
                 30s);
  CHECK(get.out == "405");
  auto form = run({"/usr/bin/curl", "-sS", "--http2-prior-knowledge", "-o", "/dev/null", "-w",
                   "%{http_code}", "-d", "a=b", url},
                  30s);
  CHECK(form.out == "415");
  auto after = g.call("w1", {"--app", "greeter", "say", "still"});
  CHECK(after["code"] == "OK");
}
