// The Open Inference Protocol (docs/inference.md) against the XGBoost example
// on a real cluster, with clients nobody here wrote: curl for REST on the
// HTTP ingress, and Python's grpcio (tests/integration/oip_client.py, its
// code generated at test time from schemas/grpc_predict_v2.proto) on the gRPC
// port. Every prediction must equal XGBoost's own for the same row from the
// same model file, computed here. Real troupe-node processes on loopback;
// every wait is a condition with a deadline; the Cluster stops every process
// it started, also when a check fails.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"
#include "tests/support/xgboost_reference.hpp"

using namespace troupe::testing;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

constexpr size_t kFeatures = 30;
const std::string kSource = TROUPE_SOURCE_DIR;

// The XGBoost example as a model (batching on, so that calls' rows share
// predictions), Echo declared a model by mistake, and Echo as a plain
// application.
const char* kApps = R"(http_options: {request_timeout_s: 60}
applications:
  - name: xgboost
    route_prefix: /xgboost
    open_inference: true
    import_path: libtroupe_xgboost.so:XGBoostModel
    args: {nthread: 1}
    deployments:
      - name: XGBoostModel
        num_replicas: 2
        max_ongoing_requests: 16
        max_batch_size: 8
        batch_wait_timeout_s: 0.002
  - name: notamodel
    route_prefix: /notamodel
    open_inference: true
    import_path: libtroupe_examples.so:Echo
    deployments:
      - name: Echo
        num_replicas: 1
  - name: echo
    route_prefix: /echo
    import_path: libtroupe_examples.so:Echo
    deployments:
      - name: Echo
        num_replicas: 1
@MORE@)";

// A model whose replicas never start: its model file does not exist.
const char* kBroken = R"(  - name: broken
    route_prefix: /broken
    open_inference: true
    import_path: libtroupe_xgboost.so:XGBoostModel
    args: {model_path: /nonexistent/model.json}
    deployments:
      - name: XGBoostModel
        num_replicas: 1
)";

std::string apps(const std::string& more = "") {
  std::string text = kApps;
  text.replace(text.find("@MORE@"), 6, more);
  return text;
}

struct Answer {
  int status = 0;
  json body;
};

struct OipCluster {
  Cluster cluster;
  std::map<std::string, uint16_t> grpc;
  std::vector<float> rows;
  std::vector<float> expected;

  explicit OipCluster(size_t n_rows = 12) {
    grpc["head"] = free_port();
    grpc["w1"] = free_port();
    cluster.start({"w1"}, {"--grpc-port", std::to_string(grpc["head"])},
                  {{"w1", {"--grpc-port", std::to_string(grpc["w1"])}}});
    cluster.deploy_yaml("apps.yaml", apps());
    REQUIRE(cluster.wait_all_answer("head", {"/xgboost", "/echo/"}));
    REQUIRE(cluster.wait_all_answer("w1", {"/xgboost", "/echo/"}));
    std::mt19937 rng(46);
    std::uniform_real_distribution<float> value(-1.5f, 1.5f);
    rows.resize(n_rows * kFeatures);
    for (auto& v : rows)
      v = value(rng);
    expected = xgboost_reference(TROUPE_TEST_XGBOOST_MODEL, rows, n_rows, kFeatures);
  }

  // Rows [from, to) as a JSON list of lists.
  json row_list(size_t from, size_t to) const {
    json out = json::array();
    for (size_t r = from; r < to; ++r)
      out.push_back(std::vector<float>(rows.begin() + long(r * kFeatures),
                                       rows.begin() + long((r + 1) * kFeatures)));
    return out;
  }

  // curl against `node`'s HTTP ingress.
  Answer curl(const std::string& node, const std::string& path, const std::string& body = "") {
    std::vector<std::string> argv = {"/usr/bin/curl", "-sS", "-o", "-", "-w", "\n%{http_code}"};
    if (!body.empty()) {
      argv.insert(argv.end(), {"-H", "Content-Type: application/json", "--data-binary",
                               "@" + cluster.write("body.json", body)});
    }
    argv.push_back("http://127.0.0.1:" + std::to_string(cluster.http_ports.at(node)) + path);
    auto r = run(argv, 30s);
    CAPTURE(r.err);
    REQUIRE(r.exit_code == 0);
    auto cut = r.out.rfind('\n');
    REQUIRE(cut != std::string::npos);
    Answer a;
    a.status = std::stoi(r.out.substr(cut + 1));
    a.body = json::parse(r.out.substr(0, cut), nullptr, false);
    return a;
  }

  // One call of oip_client.py through `node`'s gRPC port: its JSON line.
  json call(const std::string& node, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"/usr/bin/python3",
                                     kSource + "/tests/integration/oip_client.py",
                                     "--port",
                                     std::to_string(grpc.at(node)),
                                     "--proto",
                                     kSource + "/schemas/grpc_predict_v2.proto",
                                     "--gen",
                                     cluster.dir / "pygen"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto r = run(argv, 60s);
    CAPTURE(r.err);
    CAPTURE(r.out);
    REQUIRE(r.exit_code == 0);
    auto out = json::parse(r.out, nullptr, false);
    REQUIRE(out.is_object());
    return out;
  }

  // A REST inference body of rows [from, to).
  std::string infer_body(size_t from, size_t to) const {
    json data = json::array();
    for (size_t i = from * kFeatures; i < to * kFeatures; ++i)
      data.push_back(rows[i]);
    return json{{"id", "rest-" + std::to_string(from)},
                {"inputs",
                 {{{"name", "features"},
                   {"datatype", "FP32"},
                   {"shape", {to - from, kFeatures}},
                   {"data", data}}}}}
        .dump();
  }

  // The predictions of an answer's one output equal the reference's for
  // rows [from, to).
  void check_predictions(const json& outputs, size_t from, size_t to) const {
    REQUIRE(outputs.size() == 1);
    CHECK(outputs[0]["name"] == "predictions");
    CHECK(outputs[0]["datatype"] == "FP32");
    CHECK(outputs[0]["shape"] == json{to - from});
    REQUIRE(outputs[0]["data"].size() == to - from);
    for (size_t r = from; r < to; ++r) {
      CAPTURE(r);
      CHECK(outputs[0]["data"][r - from].get<float>() == expected[r]);
    }
  }
};

}  // namespace

TEST_CASE(
    "oip: the XGBoost example over REST with curl and over gRPC with grpcio - live ready metadata "
    "and infer equal to XGBoost's own predictions") {
  OipCluster c;
  for (const std::string node : {"head", "w1"}) {
    CAPTURE(node);
    // The server's own calls.
    auto live = c.curl(node, "/v2/health/live");
    CHECK(live.status == 200);
    CHECK(live.body["live"] == true);
    auto ready = c.curl(node, "/v2/health/ready");
    CHECK(ready.status == 200);
    auto server = c.curl(node, "/v2");
    CHECK(server.body["name"] == "troupe");
    CHECK(c.call(node, {"live"})["live"] == true);
    CHECK(c.call(node, {"ready"})["ready"] == true);
    CHECK(c.call(node, {"server-meta"})["name"] == "troupe");

    // The model's metadata and readiness, from its replicas.
    auto meta = c.curl(node, "/v2/models/xgboost");
    REQUIRE(meta.status == 200);
    CHECK(meta.body["name"] == "xgboost");
    CHECK(meta.body["platform"] == "xgboost");
    CHECK(meta.body["versions"] == json{"1"});
    CHECK(meta.body["inputs"] ==
          json{{{"name", "features"}, {"datatype", "FP32"}, {"shape", {-1, 30}}}});
    CHECK(meta.body["outputs"] ==
          json{{{"name", "predictions"}, {"datatype", "FP32"}, {"shape", {-1}}}});
    auto gmeta = c.call(node, {"model-meta", "xgboost"});
    CHECK(gmeta["code"] == "OK");
    CHECK(gmeta["inputs"] == meta.body["inputs"]);
    CHECK(gmeta["versions"] == json{"1"});
    CHECK(c.curl(node, "/v2/models/xgboost/ready").status == 200);
    CHECK(c.curl(node, "/v2/models/xgboost/versions/1/ready").status == 200);
    CHECK(c.call(node, {"model-ready", "xgboost"})["ready"] == true);

    // Inference over REST: one row, then several.
    auto one = c.curl(node, "/v2/models/xgboost/infer", c.infer_body(0, 1));
    REQUIRE(one.status == 200);
    CHECK(one.body["model_name"] == "xgboost");
    CHECK(one.body["id"] == "rest-0");
    c.check_predictions(one.body["outputs"], 0, 1);
    auto several = c.curl(node, "/v2/models/xgboost/versions/1/infer", c.infer_body(1, 6));
    REQUIRE(several.status == 200);
    CHECK(several.body["model_version"] == "1");
    c.check_predictions(several.body["outputs"], 1, 6);

    // Over gRPC: typed contents answer typed, raw contents answer raw.
    auto file = c.cluster.write("rows.json", c.row_list(6, 12).dump());
    auto typed = c.call(node, {"infer", "xgboost", file});
    REQUIRE(typed["code"] == "OK");
    CHECK(typed["model_name"] == "xgboost");
    CHECK(typed["id"] == "oip-client");
    CHECK(typed["outputs"][0]["raw"] == false);
    c.check_predictions(typed["outputs"], 6, 12);
    auto raw = c.call(node, {"infer", "xgboost", file, "--raw", "--version", "1"});
    REQUIRE(raw["code"] == "OK");
    CHECK(raw["outputs"][0]["raw"] == true);
    CHECK(raw["model_version"] == "1");
    c.check_predictions(raw["outputs"], 6, 12);
  }

  // Bad input: a REST 400/404/405 or a gRPC status naming the problem.
  auto bad_shape = c.curl("head", "/v2/models/xgboost/infer",
                          R"({"inputs": [{"name": "features", "datatype": "FP32",
                                "shape": [2, 30], "data": [1, 2, 3]}]})");
  CHECK(bad_shape.status == 400);
  CHECK(bad_shape.body["error"] ==
        "input 'features' has shape [2, 30], which holds 60 elements, and 3 elements of data");
  auto wrong_type = c.curl("w1", "/v2/models/xgboost/infer",
                           R"({"inputs": [{"name": "features", "datatype": "INT32",
                                 "shape": [1, 1], "data": [1]}]})");
  CHECK(wrong_type.status == 400);
  CHECK(wrong_type.body["error"] == "input 'features' is INT32; the model takes FP32");
  auto not_json = c.curl("head", "/v2/models/xgboost/infer", "{features");
  CHECK(not_json.status == 400);
  CHECK(not_json.body["error"] == "the body is not JSON");
  auto unknown_model = c.curl("head", "/v2/models/nope/infer", c.infer_body(0, 1));
  CHECK(unknown_model.status == 404);
  CHECK(unknown_model.body["error"] == "no model named 'nope' is served here");
  auto unknown_version = c.curl("head", "/v2/models/xgboost/versions/7/infer", c.infer_body(0, 1));
  CHECK(unknown_version.status == 404);
  CHECK(unknown_version.body["error"] == "model 'xgboost' has no version '7'");
  auto plain = c.curl("head", "/v2/models/echo");
  CHECK(plain.status == 404);
  CHECK(plain.body["error"].get<std::string>().find("does not declare open_inference") !=
        std::string::npos);
  auto mistaken = c.curl("w1", "/v2/models/notamodel/infer", c.infer_body(0, 1));
  CHECK(mistaken.status == 501);
  CHECK(mistaken.body["error"].get<std::string>().find("troupe::InferenceModel") !=
        std::string::npos);
  CHECK(c.curl("head", "/v2/models/xgboost/explain").status == 404);
  CHECK(c.curl("head", "/v2/models/xgboost/infer").status == 405);  // a GET

  auto file = c.cluster.write("rows.json", c.row_list(0, 2).dump());
  auto g_shape = c.call("w1", {"infer", "xgboost", file, "--shape", "3,30"});
  CHECK(g_shape["code"] == "INVALID_ARGUMENT");
  CHECK(g_shape["details"] ==
        "input 'features' has shape [3, 30], which holds 90 elements, and 60 elements of data");
  auto g_raw_short = c.call("w1", {"infer", "xgboost", file, "--raw", "--shape", "3,30"});
  CHECK(g_raw_short["code"] == "INVALID_ARGUMENT");
  CHECK(g_raw_short["details"] ==
        "input 'features' has 240 bytes of raw contents; its shape and datatype FP32 make 360");
  auto g_type = c.call("head", {"infer", "xgboost", file, "--datatype", "FP64"});
  CHECK(g_type["code"] == "INVALID_ARGUMENT");
  CHECK(g_type["details"] == "input 'features' is FP64; the model takes FP32");
  auto g_unknown = c.call("head", {"infer", "nope", file});
  CHECK(g_unknown["code"] == "NOT_FOUND");
  CHECK(c.call("head", {"infer", "xgboost", file, "--version", "7"})["code"] == "NOT_FOUND");
  CHECK(c.call("head", {"model-ready", "nope"})["code"] == "NOT_FOUND");
  auto g_garbage = c.call("head", {"raw-infer", "ffffff"});
  CHECK(g_garbage["code"] == "INVALID_ARGUMENT");
  CHECK(g_garbage["details"] == "the request is not a ModelInferRequest message");
  CHECK(c.call("w1", {"infer", "notamodel", file})["code"] == "UNIMPLEMENTED");
  // The metrics say what the clients saw, after the node's conversions.
  CHECK(metric_value(
            c.cluster.admin_ports.at("w1"),
            R"(troupe_grpc_requests_total{application="notamodel",code="UNIMPLEMENTED"})") == 1.0);
  CHECK(metric_value(c.cluster.admin_ports.at("w1"),
                     R"(troupe_grpc_requests_total{application="notamodel",code="OK"})") ==
        std::nullopt);

  // 100 MB in one message: refused at the node's body limit, before any
  // replica sees it.
  auto big = c.call("w1", {"big", "xgboost", "100"});
  CHECK(big["code"] == "RESOURCE_EXHAUSTED");
  CHECK(big["details"].get<std::string>().find("body limit") != std::string::npos);
  std::string huge = c.infer_body(0, 1);
  huge.insert(huge.rfind(']'), std::string(100u << 20, ' '));
  CHECK(c.curl("head", "/v2/models/xgboost/infer", huge).status == 413);

  // The applications' own paths are untouched (a client cannot mark its own
  // request as the protocol's), and every node lives on.
  CHECK(c.curl("head", "/xgboost").body["n_trees"] == 200);
  auto marked =
      run({"/usr/bin/curl", "-sS", "-H", "troupe-oip: metadata", "-H", "troupe-oip-model: xgboost",
           "http://127.0.0.1:" + std::to_string(c.cluster.http_ports.at("w1")) + "/xgboost"},
          30s);
  CHECK(json::parse(marked.out, nullptr, false)["n_trees"] == 200);
  CHECK(c.curl("w1", "/echo/").status == 200);
  CHECK(c.cluster.stop_all().empty());
}

TEST_CASE(
    "oip: concurrent inference calls through both nodes are batched - each gets its own row's "
    "prediction") {
  constexpr size_t kClients = 32;
  constexpr size_t kPerClient = 6;
  OipCluster c(kClients * kPerClient);
  std::vector<std::string> failures;
  std::mutex mutex;
  std::vector<std::thread> clients;
  for (size_t k = 0; k < kClients; ++k) {
    clients.emplace_back([&, k] {
      const std::string node = k % 2 ? "w1" : "head";
      for (size_t i = 0; i < kPerClient; ++i) {
        const size_t row = k * kPerClient + i;
        auto r = http_request(c.cluster.http_ports.at(node), "POST", "/v2/models/xgboost/infer",
                              c.infer_body(row, row + 1), 30);
        std::string problem;
        if (!r || r->status != 200) {
          problem = "row " + std::to_string(row) + ": " +
                    (r ? std::to_string(r->status) + " " + r->body : "no answer");
        } else {
          auto j = json::parse(r->body, nullptr, false);
          if (j.is_discarded() || j["outputs"][0]["data"][0].get<float>() != c.expected[row] ||
              j["id"] != "rest-" + std::to_string(row))
            problem = "row " + std::to_string(row) + ": answered " + r->body;
        }
        if (!problem.empty()) {
          std::lock_guard<std::mutex> lock(mutex);
          failures.push_back(problem);
        }
      }
    });
  }
  for (auto& t : clients)
    t.join();
  CHECK(failures.empty());
  for (const auto& f : failures)
    MESSAGE(f);
  // The replicas ran calls together: fewer batches than calls. (Each node
  // reports its replica processes' histograms on its metrics page, once a
  // second: wait until they count every call.)
  double batches = 0;
  double calls = 0;
  auto read_metrics = [&] {
    batches = calls = 0;
    for (const std::string node : {"head", "w1"}) {
      auto page = http_get(c.cluster.admin_ports.at(node), "/-/metrics", 5);
      if (!page || page->status != 200)
        return false;
      std::istringstream lines(page->body);
      std::string line;
      while (std::getline(lines, line)) {
        if (line.find("application=\"xgboost\"") == std::string::npos)
          continue;
        if (line.rfind("troupe_deployment_batch_size_count{", 0) == 0)
          batches += std::stod(line.substr(line.rfind(' ') + 1));
        if (line.rfind("troupe_deployment_batch_size_sum{", 0) == 0)
          calls += std::stod(line.substr(line.rfind(' ') + 1));
      }
    }
    return calls >= double(kClients * kPerClient);
  };
  CHECK(wait_until(read_metrics, 20s));
  CAPTURE(batches);
  CAPTURE(calls);
  CHECK(batches > 0);
  CHECK(batches < calls);
  CHECK(c.cluster.stop_all().empty());
}

TEST_CASE(
    "oip: a model with no healthy replica answers not ready - and so does the node until every "
    "model is ready") {
  OipCluster c(1);
  // Declared with the others, without waiting: its replicas never start.
  auto file = c.cluster.write("broken.yaml", apps(kBroken));
  auto deployed = c.cluster.ctl({"deploy", file});
  CAPTURE(deployed.err);
  REQUIRE(deployed.exit_code == 0);
  // Every node knows the model (its route) but has no replica of it.
  for (const std::string node : {"head", "w1"}) {
    CAPTURE(node);
    REQUIRE(wait_until([&] { return c.curl(node, "/v2/models/broken/ready").status == 400; }, 30s));
    auto ready = c.curl(node, "/v2/models/broken/ready");
    CHECK(ready.body["ready"] == false);
    CHECK(c.call(node, {"model-ready", "broken"})["ready"] == false);
    CHECK(c.curl(node, "/v2/health/ready").status == 400);
    CHECK(c.call(node, {"ready"})["ready"] == false);
    // The other model is ready and answers; the node is live.
    CHECK(c.curl(node, "/v2/models/xgboost/ready").status == 200);
    CHECK(c.call(node, {"model-ready", "xgboost"})["ready"] == true);
    CHECK(c.curl(node, "/v2/health/live").status == 200);
    auto one = c.curl(node, "/v2/models/xgboost/infer", c.infer_body(0, 1));
    REQUIRE(one.status == 200);
    c.check_predictions(one.body["outputs"], 0, 1);
  }
  // Without the broken model, every node is ready again.
  c.cluster.deploy_yaml("apps.yaml", apps());
  for (const std::string node : {"head", "w1"}) {
    CAPTURE(node);
    CHECK(wait_until([&] { return c.curl(node, "/v2/health/ready").status == 200; }, 30s));
    CHECK(c.call(node, {"ready"})["ready"] == true);
    CHECK(c.curl(node, "/v2/models/broken/ready").status == 404);
  }
  CHECK(c.cluster.stop_all().empty());
}
