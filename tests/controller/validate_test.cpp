// Bad input is rejected with the field, the value and the rule; version
// semantics decide restart / reconfigure / rescale.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "controller/core/validate.hpp"
#include "controller/core/version.hpp"
#include "tests/controller/fakes.hpp"

using namespace troupe;
using namespace troupe::controller;
using namespace troupe::controller::testing;

namespace {

ApplicationSpec greeter() {
  return make_app("greeter", "/greet", {make_deployment("Hello", 2)});
}

std::string error_of(const ApplicationSpec& app) {
  Status s = validate(app);
  REQUIRE_FALSE(s.is_ok());
  CHECK(s.code() == errc::invalid_argument);
  return s.message();
}

}  // namespace

TEST_CASE("validate: a well-formed application passes") {
  CHECK(validate(greeter()).is_ok());
}

TEST_CASE("validate: absurd replica count names field - value and rule") {
  auto app = greeter();
  app.deployments[0].config.num_replicas = static_cast<uint32_t>(-1);
  CHECK(error_of(app) ==
        "applications[greeter].deployments[Hello].num_replicas: 4294967295 must be <= 100000");
}

TEST_CASE("validate: zero and negative timeouts") {
  auto app = greeter();
  app.deployments[0].config.health_check_period_s = 0;
  app.deployments[0].config.graceful_shutdown_timeout_s = -5;
  CHECK(error_of(app) ==
        "applications[greeter].deployments[Hello].health_check_period_s: 0 must be > 0; "
        "applications[greeter].deployments[Hello].graceful_shutdown_timeout_s: -5 must be > 0");
}

TEST_CASE("validate: min_replicas > max_replicas") {
  auto app = greeter();
  AutoscalingConfig a;
  a.min_replicas = 5;
  a.max_replicas = 2;
  app.deployments[0].config.autoscaling_config = a;
  CHECK(error_of(app) ==
        "applications[greeter].deployments[Hello].autoscaling_config.min_replicas: 5 must be <= "
        "max_replicas (2)");
}

TEST_CASE("validate: other numeric rules") {
  auto app = greeter();
  auto& c = app.deployments[0].config;
  c.max_ongoing_requests = 0;
  c.max_queued_requests = -2;
  c.resources.amounts["cpu"] = -1;
  CHECK(error_of(app) ==
        "applications[greeter].deployments[Hello].max_ongoing_requests: 0 must be within [1, "
        "1000000]; applications[greeter].deployments[Hello].max_queued_requests: -2 must be >= -1 "
        "(-1: no limit); applications[greeter].deployments[Hello].resources.cpu: -1 must be a "
        "finite amount >= 0");
}

TEST_CASE("validate: memory_limit_bytes is 0 or at least 32 MiB - and needs isolation process") {
  auto app = greeter();
  auto& c = app.deployments[0].config;
  CHECK(c.isolation == Isolation::process);
  CHECK(c.memory_limit_bytes == 0u);
  c.memory_limit_bytes = kMinMemoryLimitBytes;  // the smallest limit
  CHECK(validate(app).is_ok());
  c.memory_limit_bytes = 512ULL << 20;
  CHECK(validate(app).is_ok());
  c.memory_limit_bytes = kMinMemoryLimitBytes - 1;
  CHECK(error_of(app) ==
        "applications[greeter].deployments[Hello].memory_limit_bytes: 33554431 must be 0 (no "
        "limit) or >= 33554432 (32 MiB)");
  c.memory_limit_bytes = 1;
  CHECK(error_of(app) ==
        "applications[greeter].deployments[Hello].memory_limit_bytes: 1 must be 0 (no limit) or "
        ">= 33554432 (32 MiB)");

  // in_process: allowed without a limit, refused with one.
  c.isolation = Isolation::in_process;
  c.memory_limit_bytes = 0;
  CHECK(validate(app).is_ok());
  c.memory_limit_bytes = 512ULL << 20;
  CHECK(error_of(app) ==
        "applications[greeter].deployments[Hello].memory_limit_bytes: 536870912 needs isolation: "
        "process (it is enforced on the replica process; isolation is in_process)");
}

TEST_CASE("isolation: to_string and parse_isolation are inverses") {
  CHECK(std::string(to_string(Isolation::process)) == "process");
  CHECK(std::string(to_string(Isolation::in_process)) == "in_process");
  CHECK(parse_isolation("process") == Isolation::process);
  CHECK(parse_isolation("in_process") == Isolation::in_process);
  CHECK_FALSE(parse_isolation("thread").has_value());
  CHECK_FALSE(parse_isolation("Process").has_value());
  CHECK_FALSE(parse_isolation("").has_value());
}

TEST_CASE("validate: duplicate deployment names and unknown ingress") {
  auto app = greeter();
  app.deployments.push_back(make_deployment("Hello", 1));
  app.ingress = "Missing";
  CHECK(error_of(app) ==
        "applications[greeter].deployments[Hello].name: \"Hello\" must be unique within the "
        "application (duplicate); applications[greeter].ingress: \"Missing\" must name one of the "
        "application's deployments");
}

TEST_CASE("validate: route prefix must start with / and be unique across applications") {
  auto app = greeter();
  app.route_prefix = "greet";
  CHECK(error_of(app) == "applications[greeter].route_prefix: \"greet\" must start with '/'");

  TargetState state;
  state.applications["a"] = make_app("a", "/x", {make_deployment("D", 1)});
  state.applications["b"] = make_app("b", "/x", {make_deployment("D", 1)});
  Status s = validate(state);
  CHECK(s.message() ==
        "applications[b].route_prefix: \"/x\" must be unique (already used by application \"a\")");
}

TEST_CASE("validate: an import path or route prefix with a control character is refused - shown escaped") {
  // Found by tests/fuzz/config_fuzz.cpp: a NUL in an import path (a C
  // string to dlopen) was accepted.
  auto app = greeter();
  app.deployments[0].import_path = std::string("liba\0b.so:Hello", 15);
  CHECK(error_of(app) == "applications[greeter].deployments[Hello].import_path: "
                         "\"liba\\x00b.so:Hello\" must not contain control characters");
  app = greeter();
  app.route_prefix = "/gr\teet";
  CHECK(error_of(app) ==
        "applications[greeter].route_prefix: \"/gr\\x09eet\" must not contain control characters");
}

TEST_CASE("validate: names and target capacity") {
  auto app = greeter();
  app.name = "bad name";
  CHECK(error_of(app).find("applications[bad name].name: \"bad name\" must be 1-100 characters") ==
        0);
  TargetState state;
  state.target_capacity = 150;
  CHECK(validate(state).message() == "target_capacity: 150 must be within [0, 100]");
}

TEST_CASE("validate: the manager rejects bad input and writes nothing") {
  Harness h;
  auto app = greeter();
  app.deployments[0].config.health_check_timeout_s = 0;
  auto r = h.core->deploy_application(app);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().message() ==
        "applications[greeter].deployments[Hello].health_check_timeout_s: 0 must be > 0");
  CHECK(h.store->saves == 0);
  CHECK(h.core->target_state().applications.empty());

  // Collision with an existing application's route prefix.
  REQUIRE(h.core->deploy_application(greeter()).has_value());
  auto other = make_app("other", "/greet", {make_deployment("X", 1)});
  auto r2 = h.core->deploy_application(other);
  REQUIRE_FALSE(r2.has_value());
  CHECK(r2.status().message() ==
        "applications[other].route_prefix: \"/greet\" must be unique (already used by application "
        "\"greeter\")");
  CHECK(h.store->saves == 1);
  CHECK(h.core->target_state().applications.size() == 1);

  // Unknown names.
  CHECK(h.core->delete_application("nope").code() == errc::not_found);
  CHECK(h.core->delete_application("nope").message() ==
        "applications[nope]: \"nope\" is not a known application");
  CHECK(h.core->delete_deployment("greeter", "Nope").message() ==
        "applications[greeter].deployments[Nope]: \"Nope\" is not a known deployment");
  CHECK(h.core->deploy_deployment("nope", make_deployment("X", 1)).status().code() ==
        errc::not_found);
  CHECK(h.core->set_target_capacity(-1).message() == "target_capacity: -1 must be within [0, 100]");
  CHECK(h.store->saves == 1);
}

TEST_CASE("version: what a change of the spec does to running replicas") {
  auto a = make_deployment("D", 3);
  auto b = a;
  CHECK(classify_change(a, b) == ChangeKind::unchanged);
  b.config.num_replicas = 7;
  CHECK(classify_change(a, b) == ChangeKind::scaled);
  b.config.autoscaling_config = AutoscalingConfig{};
  CHECK(classify_change(a, b) == ChangeKind::scaled);
  b = a;
  b.config.user_config = "{\"greeting\":\"hi\"}";
  CHECK(classify_change(a, b) == ChangeKind::reconfigure);
  b = a;
  b.config.health_check_period_s = 3;
  CHECK(classify_change(a, b) == ChangeKind::config_only);
  b = a;
  b.code_version = "v2";
  CHECK(classify_change(a, b) == ChangeKind::restart);
  b = a;
  b.init_args = "{\"x\":1}";
  CHECK(classify_change(a, b) == ChangeKind::restart);
  b = a;
  b.config.resources.amounts["cpu"] = 1;
  CHECK(classify_change(a, b) == ChangeKind::restart);
  // The code identity is stable and names the user's version.
  CHECK(code_identity(a) == code_identity(make_deployment("D", 9)));
  CHECK(code_identity(a).rfind("v1-", 0) == 0);
  CHECK(effective_code_version(a) == "v1");
  a.code_version.clear();
  CHECK(effective_code_version(a) == code_identity(a));
  CHECK(effective_code_version(a).size() == 16);
}

TEST_CASE("version: batching is applied in place - its key is empty at the defaults") {
  auto a = make_deployment("D", 3);
  CHECK(version_of(a).batch.empty());
  CHECK(batch_key(a.config).empty());
  auto b = a;
  b.config.max_ongoing_requests = 32;
  b.config.max_batch_size = 32;
  CHECK(classify_change(a, b) == ChangeKind::reconfigure);
  CHECK(code_identity(a) == code_identity(b));  // no restart
  CHECK(version_of(b).batch == "max=32 wait=0.01");
  CHECK(version_of(b) != version_of(a));
  auto c = b;
  c.config.batch_wait_timeout_s = 0.005;
  CHECK(classify_change(b, c) == ChangeKind::reconfigure);
  CHECK(version_of(c).batch == "max=32 wait=0.0050000000000000001");
  auto d = c;
  d.config.batch_wait_auto = true;
  CHECK(classify_change(c, d) == ChangeKind::reconfigure);
  CHECK(version_of(d).batch == "max=32 wait=auto");
  // The wait alone, batching off: still a change the replicas take.
  auto e = a;
  e.config.batch_wait_timeout_s = 0.05;
  CHECK(classify_change(a, e) == ChangeKind::reconfigure);
  CHECK(batch_key(1, 0.01, false).empty());
}

TEST_CASE("version: the library's content is part of the code identity") {
  const auto a = make_deployment("D", 3);
  auto b = a;
  b.library_sha256 = std::string(64, 'a');
  // Unknown before: a pin is a restart (the replicas may run another build).
  CHECK(classify_change(a, b) == ChangeKind::restart);
  auto c = b;
  c.library_sha256 = std::string(64, 'b');  // a rebuild
  CHECK(classify_change(b, c) == ChangeKind::restart);
  CHECK(code_identity(b) != code_identity(c));
  auto same = b;
  CHECK(classify_change(b, same) == ChangeKind::unchanged);
  // Without a pin the identity is what it was before pins existed.
  CHECK(code_identity(a) == code_identity(make_deployment("D", 3)));

  // What the replica is started with: the pinned file name.
  c.import_path = "./build/libm.so:Model";
  CHECK(replica_import_path(c) == "libm.so@" + std::string(64, 'b') + ":Model");
  auto plain = a;
  plain.import_path = "libm.so:Model";
  CHECK(replica_import_path(plain) == "libm.so:Model");
  auto app = greeter();
  app.deployments[0].library_sha256 = "not-hex";
  CHECK(error_of(app).find("library_sha256") != std::string::npos);
}

TEST_CASE("version: a change of isolation or memory_limit_bytes restarts replicas") {
  const auto a = make_deployment("D", 3);
  auto b = a;
  b.config.isolation = Isolation::in_process;
  CHECK(classify_change(a, b) == ChangeKind::restart);
  CHECK(classify_change(b, a) == ChangeKind::restart);
  CHECK(version_of(a) != version_of(b));
  b = a;
  b.config.memory_limit_bytes = 512ULL << 20;
  CHECK(classify_change(a, b) == ChangeKind::restart);
  CHECK(classify_change(b, a) == ChangeKind::restart);
  auto c = b;
  c.config.memory_limit_bytes = 1ULL << 30;
  CHECK(classify_change(b, c) == ChangeKind::restart);
  // Each field has its own place in the identity.
  CHECK(code_identity(b) != code_identity(c));
  // Together with a scaling change it is still a restart.
  c.config.num_replicas = 5;
  CHECK(classify_change(a, c) == ChangeKind::restart);
  // Specs that leave both at their defaults keep the identity they had before
  // the fields existed, so replicas adopted after an upgrade are not replaced.
  CHECK(code_identity(a) == "v1-4706b5a7da7ad2ae");
}

TEST_CASE("version: max_replicas_per_node is part of the version (Ray Serve's)") {
  const auto a = make_deployment("D", 3);
  auto b = a;
  b.config.max_replicas_per_node = 1;
  // A new limit replaces the replicas (a rolling update places them under it).
  CHECK(classify_change(a, b) == ChangeKind::restart);
  CHECK(classify_change(b, a) == ChangeKind::restart);
  CHECK(version_of(a) != version_of(b));
  auto c = b;
  c.config.max_replicas_per_node = 2;
  CHECK(classify_change(b, c) == ChangeKind::restart);
  // Together with a new count it is still a restart, not a scale.
  c.config.num_replicas = 5;
  CHECK(classify_change(b, c) == ChangeKind::restart);
  // Without a limit the identity is the one from before the field counted.
  CHECK(code_identity(a) == "v1-4706b5a7da7ad2ae");
}

TEST_CASE("validate: max_num_models_per_replica is -1 or from 1 to 1000000") {
  auto app = greeter();
  for (int32_t ok : {-1, 1, 2, 1000000}) {
    app.deployments[0].config.max_num_models_per_replica = ok;
    CHECK(validate(app).is_ok());
  }
  app.deployments[0].config.max_num_models_per_replica = 0;
  CHECK(error_of(app) ==
        "applications[greeter].deployments[Hello].max_num_models_per_replica: 0 must be -1 (no "
        "limit) or within [1, 1000000]");
  app.deployments[0].config.max_num_models_per_replica = -2;
  CHECK(error_of(app).find("max_num_models_per_replica: -2 must be") != std::string::npos);
}

TEST_CASE("validate: max_batch_size is from 1 to 10000 - batch_wait_timeout_s from 0 to 3600 s") {
  auto app = greeter();
  DeploymentConfig& c = app.deployments[0].config;
  c.max_ongoing_requests = kMaxBatchSize;  // room for any batch
  for (uint32_t ok : {1u, 2u, 32u, kMaxBatchSize}) {
    c.max_batch_size = ok;
    CHECK(validate(app).is_ok());
  }
  c.max_batch_size = 0;
  CHECK(error_of(app) ==
        "applications[greeter].deployments[Hello].max_batch_size: 0 must be within [1, 10000] "
        "(1: no batching)");
  c.max_batch_size = kMaxBatchSize + 1;
  CHECK(error_of(app) ==
        "applications[greeter].deployments[Hello].max_batch_size: 10001 must be within [1, "
        "10000] (1: no batching)");
  c.max_batch_size = 8;
  for (double ok : {0.0, 0.01, 1.0, 3600.0}) {
    c.batch_wait_timeout_s = ok;
    CHECK(validate(app).is_ok());
  }
  c.batch_wait_timeout_s = -0.5;
  CHECK(error_of(app) ==
        "applications[greeter].deployments[Hello].batch_wait_timeout_s: -0.5 must be a number of "
        "seconds within [0, 3600]");
  c.batch_wait_timeout_s = 3601;
  CHECK(error_of(app).find("batch_wait_timeout_s: 3601 must be a number of seconds within [0, "
                           "3600]") != std::string::npos);
  c.batch_wait_timeout_s = std::nan("");
  CHECK(error_of(app).find("batch_wait_timeout_s: nan must be") != std::string::npos);
  c.batch_wait_timeout_s = std::numeric_limits<double>::infinity();
  CHECK(error_of(app).find("batch_wait_timeout_s: inf must be") != std::string::npos);
  // `auto` does not excuse a bad number (the codec keeps both).
  c.batch_wait_auto = true;
  CHECK(error_of(app).find("batch_wait_timeout_s: inf must be") != std::string::npos);
  c.batch_wait_timeout_s = 0.01;
  CHECK(validate(app).is_ok());
}

TEST_CASE("validate: with batching max_ongoing_requests must hold a whole batch") {
  auto app = greeter();
  DeploymentConfig& c = app.deployments[0].config;
  c.max_ongoing_requests = 5;
  c.max_batch_size = 32;
  CHECK(error_of(app) ==
        "applications[greeter].deployments[Hello].max_ongoing_requests: 5 is below "
        "max_batch_size (32): a replica holds at most max_ongoing_requests requests, so its "
        "batches could never fill; raise max_ongoing_requests to at least 32");
  c.max_ongoing_requests = 31;
  CHECK(error_of(app).find("max_ongoing_requests: 31 is below max_batch_size (32)") !=
        std::string::npos);
  c.max_ongoing_requests = 32;
  CHECK(validate(app).is_ok());
  c.max_ongoing_requests = 1000;
  CHECK(validate(app).is_ok());
  // Without batching any max_ongoing_requests will do.
  c.max_batch_size = 1;
  c.max_ongoing_requests = 1;
  CHECK(validate(app).is_ok());
  // An out-of-range max_ongoing_requests is named once, by its own rule.
  c.max_batch_size = 4;
  c.max_ongoing_requests = 0;
  CHECK(error_of(app) ==
        "applications[greeter].deployments[Hello].max_ongoing_requests: 0 must be within [1, "
        "1000000]");
}

TEST_CASE("version: a change of max_num_models_per_replica restarts replicas") {
  const auto a = make_deployment("D", 3);
  auto b = a;
  b.config.max_num_models_per_replica = 2;
  CHECK(classify_change(a, b) == ChangeKind::restart);
  auto c = b;
  c.config.max_num_models_per_replica = 3;
  CHECK(classify_change(b, c) == ChangeKind::restart);
  CHECK(classify_change(c, a) == ChangeKind::restart);
  // The default keeps the identity it had before the field existed.
  CHECK(code_identity(a) == "v1-4706b5a7da7ad2ae");
}
