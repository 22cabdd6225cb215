// Backward compatibility: records written with an older, smaller schema
// (target_state_v0.capnp) decode with the current codec and store, and the
// fields the old schema did not have take the model's defaults.
#include <capnp/dynamic.h>
#include <capnp/message.h>
#include <capnp/schema-parser.h>
#include <capnp/serialize.h>
#include <doctest/doctest.h>
#include <kj/filesystem.h>
#include <rocksdb/db.h>

#include <memory>
#include <string>

#include "controller/store/codec.hpp"
#include "controller/store/rocks_checkpoint_store.hpp"
#include "tests/store/store_test_support.hpp"
#include "tests/support/temp_dir.hpp"

using namespace troupe;
using namespace troupe::controller;
using troupe::testing::TempDir;

namespace {

// The v0 schema, parsed at run time: compiling it would clash with the
// compiled-in current schema, which has the same IDs.
class V0Schema {
 public:
  V0Schema() : fs_(kj::newDiskFilesystem()) {
    auto path = fs_->getCurrentPath().eval(TROUPE_STORE_TEST_DIR "/target_state_v0.capnp");
    file_ = parser_.parseFromDirectory(fs_->getRoot(), kj::mv(path), nullptr);
  }
  capnp::StructSchema get(const char* name) const { return file_.getNested(name).asStruct(); }

 private:
  kj::Own<kj::Filesystem> fs_;
  capnp::SchemaParser parser_;
  capnp::ParsedSchema file_;
};

capnp::DynamicStruct::Builder child(capnp::DynamicStruct::Builder s, const char* field) {
  return s.get(field).as<capnp::DynamicStruct>();
}

// The codec's envelope (codec.hpp), format version 1, around the message.
std::string frame(RecordKind kind, capnp::MessageBuilder& message) {
  auto words = capnp::messageToFlatArray(message);
  auto body = words.asBytes();
  std::string out(kCheckpointMagic, sizeof kCheckpointMagic);
  out += std::string{'\x01', '\x00', static_cast<char>(kind), '\x00'};
  out.append(reinterpret_cast<const char*>(body.begin()), body.size());
  return out;
}

// Fills a v0 ApplicationSpec: "shop" with two deployments, one with a full
// v0 config (autoscaling present), one without any config at all.
void fill_v0_app(capnp::DynamicStruct::Builder app) {
  app.set("name", "shop");
  app.set("routePrefix", "/shop");
  app.set("ingress", "frontend");
  auto deployments = app.init("deployments", 2).as<capnp::DynamicList>();
  auto d0 = deployments[0].as<capnp::DynamicStruct>();
  d0.set("name", "frontend");
  d0.set("importPath", "libtroupe_examples.so:Frontend");
  d0.set("initArgs", R"({"a": 1})");
  d0.set("codeVersion", "v7");
  auto cfg = d0.init("config").as<capnp::DynamicStruct>();
  cfg.set("numReplicas", 3);
  cfg.set("maxOngoingRequests", 8);
  cfg.set("maxQueuedRequests", 100);
  cfg.set("userConfig", R"({"t": 0.5})");
  auto autoscaling = child(cfg, "autoscaling").init("config").as<capnp::DynamicStruct>();
  autoscaling.set("minReplicas", 2);
  autoscaling.set("maxReplicas", 9);
  child(autoscaling, "initialReplicas").set("value", 4);
  autoscaling.set("targetOngoingRequests", 1.5);
  auto d1 = deployments[1].as<capnp::DynamicStruct>();
  d1.set("name", "cart");
  d1.set("importPath", "libtroupe_examples.so:Cart");
}

// What fill_v0_app() must decode to with today's model.
ApplicationSpec expected_app() {
  ApplicationSpec app;
  app.name = "shop";
  app.route_prefix = "/shop";
  app.ingress = "frontend";
  DeploymentSpec d0;
  d0.name = "frontend";
  d0.import_path = "libtroupe_examples.so:Frontend";
  d0.init_args = R"({"a": 1})";
  d0.code_version = "v7";
  d0.config.num_replicas = 3;
  d0.config.max_ongoing_requests = 8;
  d0.config.max_queued_requests = 100;
  d0.config.user_config = R"({"t": 0.5})";
  AutoscalingConfig autoscaling;  // fields after targetOngoingRequests: defaults
  autoscaling.min_replicas = 2;
  autoscaling.max_replicas = 9;
  autoscaling.initial_replicas = 4;
  autoscaling.target_ongoing_requests = 1.5;
  d0.config.autoscaling_config = autoscaling;
  DeploymentSpec d1;  // no config in v0 record: every config field a default
  d1.name = "cart";
  d1.import_path = "libtroupe_examples.so:Cart";
  app.deployments = {d0, d1};
  return app;
}

}  // namespace

TEST_CASE("a target state written with the v0 schema decodes with defaults for new fields") {
  V0Schema v0;
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<capnp::DynamicStruct>(v0.get("TargetState"));
  fill_v0_app(root.init("applications", 1).as<capnp::DynamicList>()[0].as<capnp::DynamicStruct>());

  auto decoded = decode_target_state(frame(RecordKind::target_state, message));
  REQUIRE_MESSAGE(decoded.has_value(), decoded.status().to_string());

  TargetState expected;  // generation 0, target_capacity absent: not in v0
  expected.applications.emplace("shop", expected_app());
  CHECK(*decoded == expected);

  // The defaults are the model's, spelled out for the fields v0 lacks.
  const auto& d0 = decoded->applications.at("shop").deployments[0];
  CHECK(d0.config.health_check_period_s == 10.0);
  CHECK(d0.config.graceful_shutdown_timeout_s == 20.0);
  CHECK(d0.config.resources.empty());
  CHECK(d0.config.max_replicas_per_node == 0u);
  CHECK(d0.config.isolation == Isolation::process);
  CHECK(d0.config.memory_limit_bytes == 0u);
  CHECK(d0.config.stuck_after_s == 0);
  CHECK(d0.config.max_num_models_per_replica == -1);
  CHECK(d0.config.max_batch_size == 1u);  // batching off
  CHECK(d0.config.batch_wait_timeout_s == 0.01);
  CHECK_FALSE(d0.config.batch_wait_auto);
  CHECK(d0.config.autoscaling_config->downscale_delay_s == 600.0);
  CHECK_FALSE(d0.config.autoscaling_config->upscale_smoothing_factor.has_value());
  const auto& d1 = decoded->applications.at("shop").deployments[1];
  CHECK(d1.config.max_queued_requests == -1);
  CHECK_FALSE(d1.config.autoscaling_config.has_value());
  CHECK(d1.config.isolation == Isolation::process);
  CHECK(d1.config.memory_limit_bytes == 0u);
  CHECK(decoded->applications.at("shop").traffic.empty());
  CHECK(decoded->applications.at("shop").shadow.empty());
  CHECK_FALSE(decoded->applications.at("shop").open_inference);
  CHECK_FALSE(decoded->target_capacity.has_value());
  // A checkpoint from before http settings: no timeouts declared (each
  // proxy uses its node's own).
  CHECK_FALSE(decoded->http.request_timeout_s.has_value());
  CHECK_FALSE(decoded->http.keep_alive_timeout_s.has_value());
  // From before last good declarations: none (no rollback until an
  // application runs its declaration again).
  CHECK(decoded->last_running.empty());
}

TEST_CASE("a checkpoint database written by a v0 binary loads with the current store") {
  V0Schema v0;
  TempDir dir;
  const auto path = dir / "checkpoint";
  {
    // What a v0 controller would have left: head + one key per application.
    rocksdb::Options options;
    options.create_if_missing = true;
    rocksdb::DB* raw = nullptr;
    REQUIRE(rocksdb::DB::Open(options, path, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);

    capnp::MallocMessageBuilder head;
    auto h = head.initRoot<capnp::DynamicStruct>(v0.get("CheckpointHead"));
    h.init("state");
    h.set("applicationCount", 1);
    capnp::MallocMessageBuilder app;
    fill_v0_app(app.initRoot<capnp::DynamicStruct>(v0.get("ApplicationSpec")));

    rocksdb::WriteOptions sync;
    sync.sync = true;
    REQUIRE(db->Put(sync, "head", frame(RecordKind::head, head)).ok());
    REQUIRE(db->Put(sync, "app/shop", frame(RecordKind::application, app)).ok());
    REQUIRE(db->Close().ok());
  }
  auto store = RocksCheckpointStore::open(path);
  REQUIRE_MESSAGE(store.has_value(), store.status().to_string());
  auto loaded = (*store)->load();
  REQUIRE_MESSAGE(loaded.has_value(), loaded.status().to_string());
  REQUIRE(loaded->has_value());
  TargetState expected;
  expected.applications.emplace("shop", expected_app());
  CHECK(**loaded == expected);
  CHECK((*loaded)->http == HttpSettings{});  // the head had none
  CHECK((*loaded)->last_running.empty());    // nor last good declarations

  // Saving with the current binary upgrades the records in place; the head
  // then carries the http settings.
  expected.generation = 2;
  expected.http.request_timeout_s = 1;
  expected.http.keep_alive_timeout_s = 90;
  expected.last_running["shop"] = RunningDeclaration{expected.applications.at("shop"), 2};
  REQUIRE((*store)->save(expected).is_ok());
  store->reset();
  auto reopened = RocksCheckpointStore::open(path);
  REQUIRE(reopened.has_value());
  auto again = (*reopened)->load();
  REQUIRE(again.has_value());
  CHECK(again->value() == expected);
}
