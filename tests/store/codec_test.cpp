#include "controller/store/codec.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "tests/store/store_test_support.hpp"

using namespace troupe;
using namespace troupe::controller;
using troupe::controller::testing::full_autoscaling;
using troupe::controller::testing::full_deployment;
using troupe::controller::testing::full_state;

namespace {

bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

// Application "a" at /a with one deployment "D" (its ingress), all defaults.
ApplicationSpec one_deployment_app() {
  ApplicationSpec app;
  app.name = "a";
  app.route_prefix = "/a";
  app.ingress = "D";
  app.deployments.resize(1);
  app.deployments[0].name = "D";
  return app;
}

}  // namespace

// The structured bindings below stop compiling when model.hpp gains or loses
// a field: then add it to schemas/target_state.capnp, the codec and
// full_state() (with a non-default value), and extend the binding here.
TEST_CASE("full_state sets every model field to a non-default value") {
  {
    const auto full = full_autoscaling();
    const AutoscalingConfig def;
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10] = full;
    const auto& [d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10] = def;
    CHECK(a0 != d0);
    CHECK(a1 != d1);
    CHECK(a2 != d2);
    CHECK(a3 != d3);
    CHECK(a4 != d4);
    CHECK(a5 != d5);
    CHECK(a6 != d6);
    CHECK(a7 != d7);
    CHECK(a8 != d8);
    CHECK(a9 != d9);
    CHECK(a10 != d10);
  }
  const auto dep = full_deployment("x");
  {
    const DeploymentConfig def;
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17,
                 a18] = dep.config;
    const auto& [d0, d1, d2, d3, d4, d5, d6, d7, d8, d9, d10, d11, d12, d13, d14, d15, d16, d17,
                 d18] = def;
    CHECK(a0 != d0);
    CHECK(a1 != d1);
    CHECK(a2 != d2);
    CHECK(a3 != d3);
    CHECK(a4 != d4);
    CHECK(a5 != d5);
    CHECK(a6 != d6);
    CHECK(a7 != d7);
    CHECK(a8 != d8);
    CHECK(a9 != d9);
    CHECK(a10 != d10);
    CHECK(a11 != d11);
    CHECK(a12 != d12);
    CHECK(a13 != d13);
    CHECK(a14 != d14);
    CHECK(a15 != d15);
    CHECK(a16 != d16);
    CHECK(a17 != d17);
    CHECK(a18 != d18);
  }
  {
    const DeploymentSpec def;
    const auto& [a0, a1, a2, a3, a4, a5] = dep;
    const auto& [d0, d1, d2, d3, d4, d5] = def;
    CHECK(a0 != d0);
    CHECK(a1 != d1);
    CHECK(a2 != d2);
    CHECK(a3 != d3);
    CHECK(a4 != d4);
    CHECK(a5 != d5);
  }
  const auto state = full_state();
  {
    const ApplicationSpec def;
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7] = state.applications.at("shop");
    const auto& [d0, d1, d2, d3, d4, d5, d6, d7] = def;
    CHECK(a0 != d0);
    CHECK(a1 != d1);
    CHECK(a2 != d2);
    CHECK(a3 != d3);
    CHECK(a4 != d4);
    CHECK(a5 != d5);
    CHECK(a6 != d6);
    CHECK(a7 != d7);
  }
  {
    const TargetState def;
    const auto& [a0, a1, a2, a3, a4, a5, a6] = state;
    const auto& [d0, d1, d2, d3, d4, d5, d6] = def;
    CHECK(a0 != d0);
    CHECK(a1 != d1);
    CHECK(a2 != d2);
    CHECK(a3 != d3);
    CHECK(a4 != d4);
    CHECK(a5 != d5);
    CHECK(a6 != d6);
  }
  {
    const RunningDeclaration def;
    const auto& [a0, a1] = state.last_running.at("search");
    const auto& [d0, d1] = def;
    CHECK(a0 != d0);
    CHECK(a1 != d1);
  }
  {
    const HttpSettings def;
    const auto& [a0, a1] = state.http;
    const auto& [d0, d1] = def;
    CHECK(a0 != d0);
    CHECK(a1 != d1);
  }
  {
    const Resources def;
    const auto& [a0] = dep.config.resources;
    const auto& [d0] = def;
    CHECK(a0 != d0);
  }
}

TEST_CASE("a target state setting every field round-trips exactly") {
  const auto state = full_state();
  const auto bytes = encode_target_state(state);
  auto decoded = decode_target_state(bytes);
  REQUIRE_MESSAGE(decoded.has_value(), decoded.status().to_string());
  CHECK(*decoded == state);

  // Spot checks that the optionals kept absent vs present apart.
  const auto& search = decoded->applications.at("search");
  CHECK_FALSE(search.deployments[0].config.autoscaling_config.has_value());
  REQUIRE(search.deployments[1].config.autoscaling_config.has_value());
  CHECK_FALSE(search.deployments[1].config.autoscaling_config->initial_replicas.has_value());
  CHECK(
      decoded->applications.at("shop").deployments[0].config.autoscaling_config->initial_replicas ==
      4u);
  CHECK(decoded->target_capacity == 62.5);

  // Deterministic: encoding the decoded state gives the same bytes.
  CHECK(encode_target_state(*decoded) == bytes);
}

TEST_CASE("last good declarations: an application's own is written as current - a small head") {
  const auto state = full_state();
  // The head of a state whose every application runs its declaration is
  // about the size of one without last good declarations: names and
  // generations only.
  TargetState running = state;
  running.last_running.clear();
  const auto bare = encode_head(running, 3).size();
  for (const auto& [name, app] : running.applications)
    running.last_running[name] = RunningDeclaration{app, 9};
  const auto head = encode_head(running, 3);
  CHECK(head.size() < bare + 3 * 48);
  CHECK(head.size() * 4 < encode_target_state(running).size());

  auto decoded = decode_head(head);
  REQUIRE_MESSAGE(decoded.has_value(), decoded.status().to_string());
  CHECK(decoded->state.last_running.empty());
  CHECK(decoded->last_running_current ==
        std::map<std::string, uint64_t>{{"empty", 9}, {"search", 9}, {"shop", 9}});
  decoded->state.applications = running.applications;
  REQUIRE(resolve_current(decoded->state, decoded->last_running_current).is_ok());
  CHECK(decoded->state.last_running == running.last_running);

  // An older declaration is written out, and read back as it was.
  auto mixed = decode_head(encode_head(state, 3));
  REQUIRE(mixed.has_value());
  CHECK(mixed->state.last_running.size() == 1);
  CHECK(mixed->state.last_running.at("search") == state.last_running.at("search"));
  CHECK(mixed->last_running_current ==
        std::map<std::string, uint64_t>{{"shop", 0x0123456789abcdefULL}});

  // `current` for an application that is not there: corrupt, naming it.
  TargetState orphan;
  orphan.applications["shop"] = state.applications.at("shop");
  orphan.last_running["shop"] = state.last_running.at("shop");
  auto bytes = encode_target_state(orphan);
  REQUIRE(decode_target_state(bytes).has_value());
  auto lost = decode_head(encode_head(orphan, 1));
  REQUIRE(lost.has_value());
  lost->state.applications.clear();
  auto st = resolve_current(lost->state, lost->last_running_current);
  CHECK(st.code() == errc::corrupt);
  CHECK(st.message() ==
        "the last good declaration of 'shop' is its current one, but there is no application "
        "'shop'");
}

TEST_CASE("isolation and memory limit round-trip - an unknown isolation value is refused") {
  ApplicationSpec app = one_deployment_app();
  for (auto isolation : {Isolation::process, Isolation::in_process}) {
    for (uint64_t limit : {uint64_t{0}, uint64_t{32} << 20, ~uint64_t{0}}) {
      CAPTURE(to_string(isolation));
      CAPTURE(limit);
      app.deployments[0].config.isolation = isolation;
      app.deployments[0].config.memory_limit_bytes = limit;
      auto decoded = decode_application(encode_application(app));
      REQUIRE_MESSAGE(decoded.has_value(), decoded.status().to_string());
      CHECK(decoded->deployments[0].config.isolation == isolation);
      CHECK(decoded->deployments[0].config.memory_limit_bytes == limit);
      CHECK(*decoded == app);
    }
  }

  // A newer binary's enumerant: the two encodings differ only in the
  // isolation value (0 vs 1); a 7 there is refused, not guessed at.
  app.deployments[0].config.memory_limit_bytes = 0;
  app.deployments[0].config.isolation = Isolation::process;
  const auto plain = encode_application(app);
  app.deployments[0].config.isolation = Isolation::in_process;
  auto bytes = encode_application(app);
  REQUIRE(bytes.size() == plain.size());
  std::vector<size_t> differ;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != plain[i])
      differ.push_back(i);
  }
  REQUIRE(differ.size() == 1);
  CHECK(bytes[differ[0]] == 1);
  bytes[differ[0]] = 7;
  auto r = decode_application(bytes);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().code() == errc::corrupt);
  CHECK(r.status().message() ==
        "application record is malformed: isolation has an unknown value 7");
}

TEST_CASE("edge values round-trip: empty state - absent capacity - zero capacity - odd text") {
  TargetState empty;
  auto decoded = decode_target_state(encode_target_state(empty));
  REQUIRE(decoded.has_value());
  CHECK(*decoded == empty);
  CHECK_FALSE(decoded->target_capacity.has_value());

  TargetState zero;
  zero.target_capacity = 0.0;  // present and zero is not absent
  zero.generation = UINT64_MAX;
  auto z = decode_target_state(encode_target_state(zero));
  REQUIRE(z.has_value());
  CHECK(z->target_capacity == 0.0);
  CHECK(z->generation == UINT64_MAX);

  TargetState odd;
  ApplicationSpec app;
  app.name = std::string("nul\0inside", 10);
  app.route_prefix = "/\xc3\xa9t\xc3\xa9";
  DeploymentSpec d;
  d.name = "d";
  d.config.max_queued_requests = INT32_MIN;
  d.config.num_replicas = UINT32_MAX;
  d.config.autoscaling_config = AutoscalingConfig{};  // present with all defaults
  d.config.autoscaling_config->upscale_smoothing_factor = 0.0;
  app.deployments.push_back(d);
  odd.applications.emplace(app.name, app);
  auto o = decode_target_state(encode_target_state(odd));
  REQUIRE(o.has_value());
  CHECK(*o == odd);
}

TEST_CASE("application and head records round-trip") {
  const auto state = full_state();
  for (const auto& [name, app] : state.applications) {
    auto decoded = decode_application(encode_application(app));
    REQUIRE(decoded.has_value());
    CHECK(*decoded == app);
  }
  auto head = decode_head(encode_head(state, 3));
  REQUIRE(head.has_value());
  CHECK(head->application_count == 3);
  CHECK(head->state.applications.empty());
  CHECK(head->state.generation == state.generation);
  CHECK(head->state.target_capacity == state.target_capacity);
  CHECK(head->state.http == state.http);
}

TEST_CASE("http settings round-trip - each alone - and absent reads as none") {
  for (int i = 0; i < 4; ++i) {
    CAPTURE(i);
    TargetState s;
    if (i & 1)
      s.http.request_timeout_s = 0.25;
    if (i & 2)
      s.http.keep_alive_timeout_s = 86400;
    auto decoded = decode_target_state(encode_target_state(s));
    REQUIRE_MESSAGE(decoded.has_value(), decoded.status().to_string());
    CHECK(decoded->http == s.http);
    auto head = decode_head(encode_head(s, 0));
    REQUIRE_MESSAGE(head.has_value(), head.status().to_string());
    CHECK(head->state.http == s.http);
  }
}

TEST_CASE("every truncation of a valid encoding is corrupt - never a crash") {
  const auto bytes = encode_target_state(full_state());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto r = decode_target_state(std::string_view(bytes.data(), n));
    REQUIRE_MESSAGE(!r.has_value(), "prefix of " << n << " bytes decoded");
    CHECK(r.status().code() == errc::corrupt);
  }
  auto r = decode_target_state(bytes.substr(0, 5));
  CHECK(contains(r.status().message(), "shorter than the 8-byte header"));
  auto odd = decode_target_state(bytes + "xyz");
  REQUIRE_FALSE(odd.has_value());
  CHECK(odd.status().code() == errc::corrupt);
  CHECK(contains(odd.status().message(), "is not a whole number of 8-byte words"));
  auto longer = decode_target_state(bytes + std::string(16, 'x'));
  REQUIRE_FALSE(longer.has_value());
  CHECK(longer.status().code() == errc::corrupt);
  CHECK(contains(longer.status().message(), "16 stray bytes after its message"));
}

TEST_CASE("garbage bytes are corrupt with a message - never a crash") {
  CHECK(decode_target_state("").status().code() == errc::corrupt);
  CHECK(contains(decode_target_state("not a checkpoint at all").status().message(),
                 "does not start with the checkpoint magic"));

  std::mt19937 rng(12345);  // fixed seed: the same inputs every run
  std::uniform_int_distribution<int> byte(0, 255);
  const auto valid = encode_target_state(full_state());
  const std::string header = valid.substr(0, kEnvelopeSize);
  for (int i = 0; i < 2000; ++i) {
    // Mostly whole words, so the Cap'n Proto reader itself sees the garbage.
    std::string body(static_cast<size_t>(i % 2 == 0 ? (i % 64) * 8 : i % 300), '\0');
    for (auto& c : body) {
      c = static_cast<char>(byte(rng));
    }
    // Behind a valid header, so the envelope checks pass.
    auto r = decode_target_state(header + body);
    if (!r.has_value()) {  // garbage may happen to be a well-formed message
      CHECK(r.status().code() == errc::corrupt);
      CHECK_FALSE(r.status().message().empty());
    }
    CHECK(decode_application(body).status().code() == errc::corrupt);
  }
  // Flipping bytes of a valid record: any outcome but a crash or exception.
  for (size_t i = kEnvelopeSize; i < valid.size(); ++i) {
    auto flipped = valid;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x5a);
    auto r = decode_target_state(flipped);
    CHECK((r.has_value() || r.status().code() == errc::corrupt));
  }
}

TEST_CASE("a record of a newer format version is refused with a clear message") {
  auto bytes = encode_target_state(full_state());
  const uint16_t newer = kFormatVersion + 1;
  bytes[4] = static_cast<char>(newer & 0xff);
  bytes[5] = static_cast<char>(newer >> 8);
  auto r = decode_target_state(bytes);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().code() == errc::version_mismatch);
  CHECK(contains(r.status().message(),
                 "format version " + std::to_string(kFormatVersion + 1) + ", newer than the " +
                     std::to_string(kFormatVersion) + " this binary reads"));

  bytes[4] = 0;
  bytes[5] = 0;
  CHECK(decode_target_state(bytes).status().code() == errc::corrupt);
}

TEST_CASE("a record is written with the lowest format version that carries it") {
  auto version = [](const std::string& bytes) {
    return static_cast<unsigned>(static_cast<unsigned char>(bytes[4]) |
                                 (static_cast<unsigned char>(bytes[5]) << 8));
  };
  // The records below without library pins (version 4) nor open_inference
  // (version 5), both checked last.
  auto unpinned = [](ApplicationSpec app) {
    for (auto& d : app.deployments)
      d.library_sha256.clear();
    app.open_inference = false;
    return app;
  };
  auto unpinned_state = [&](TargetState s) {
    for (auto& [name, app] : s.applications)
      app = unpinned(app);
    return s;
  };
  // Without a traffic split: version 1, which older binaries read.
  auto plain = unpinned(full_state().applications.at("search"));
  REQUIRE(plain.traffic.empty());
  CHECK(version(encode_application(plain)) == 1);
  TargetState without;
  without.applications.emplace("search", plain);
  CHECK(version(encode_target_state(without)) == 1);
  CHECK(version(encode_head(without, 1)) == 1);
  // A split (or only its key header): version 2, which a version-1 binary
  // refuses instead of sending every request to the ingress.
  auto split = unpinned(full_state().applications.at("shop"));
  split.shadow.clear();
  CHECK(version(encode_application(split)) == 2);
  auto key_only = split;
  key_only.traffic.clear();
  CHECK(version(encode_application(key_only)) == 2);
  without.applications.emplace("shop", split);
  CHECK(version(encode_target_state(without)) == 2);
  // Http settings (either one): version 3, which a version-2 binary refuses
  // instead of running without the request timeout.
  CHECK(version(encode_head(unpinned_state(full_state()), 3)) == 3);
  TargetState http;
  http.http.keep_alive_timeout_s = 30;
  CHECK(version(encode_target_state(http)) == 3);
  CHECK(version(encode_head(http, 0)) == 3);
  http.http = HttpSettings{};
  http.http.request_timeout_s = 30;
  CHECK(version(encode_head(http, 0)) == 3);
  // Shadow traffic: version 3 too, which a version-2 binary refuses instead
  // of silently stopping the copies.
  auto shadowed = unpinned(full_state().applications.at("shop"));
  CHECK(version(encode_application(shadowed)) == 3);
  CHECK(version(encode_target_state(unpinned_state(full_state()))) == 3);
  // A deployment pinned to its library's SHA-256: version 4, which a
  // version-3 binary refuses instead of looking an uploaded library up by a
  // path on the operator's machine.
  auto pinned = plain;
  pinned.deployments[0].library_sha256 = std::string(64, 'e');
  CHECK(version(encode_application(pinned)) == 4);
  auto pinned_state = full_state();
  pinned_state.applications.at("shop").open_inference = false;
  CHECK(version(encode_target_state(pinned_state)) == 4);
  CHECK(decode_application(encode_application(pinned)).value() == pinned);
  // Served by the Open Inference Protocol: version 5, which a version-4
  // binary refuses instead of silently dropping the /v2/models routes (and
  // writing the state back without them); alone or with everything else.
  auto inference = plain;
  inference.open_inference = true;
  CHECK(version(encode_application(inference)) == 5);
  CHECK(version(encode_application(full_state().applications.at("shop"))) == 5);
  CHECK(version(encode_target_state(full_state())) == 5);
  CHECK(version(encode_head(full_state(), 3)) == 3);  // the head has no applications
  CHECK(decode_application(encode_application(inference)).value() == inference);
  CHECK(decode_application(encode_application(inference)).value().open_inference);
  // Without it (every record above), it reads back false.
  CHECK_FALSE(decode_application(encode_application(pinned)).value().open_inference);
  auto shadow_only = plain;
  shadow_only.deployments[1].name = "mirror";
  shadow_only.shadow = {{"mirror", 1.0}};
  CHECK(version(encode_application(shadow_only)) == 3);
  // All read back; the version 1 and 2 records with an empty shadow.
  CHECK(decode_application(encode_application(plain)).value() == plain);
  CHECK(decode_application(encode_application(split)).value() == split);
  CHECK(decode_application(encode_application(split)).value().shadow.empty());
  CHECK(decode_application(encode_application(key_only)).value() == key_only);
  CHECK(decode_application(encode_application(shadowed)).value() == shadowed);
  CHECK(decode_application(encode_application(shadowed)).value().shadow ==
        std::map<std::string, double>{{"mirror", 0.375}});
  CHECK(decode_application(encode_application(shadow_only)).value() == shadow_only);
}

TEST_CASE("a record of another kind or with reserved bits set is refused") {
  auto app = encode_application(full_state().applications.begin()->second);
  auto r = decode_target_state(app);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().code() == errc::corrupt);
  CHECK(contains(r.status().message(), "expected a target state record, found record kind 3"));

  auto bytes = encode_target_state(TargetState{});
  bytes[7] = 1;
  CHECK(contains(decode_target_state(bytes).status().message(), "reserved"));
}

TEST_CASE("a few bytes claiming a million list elements are refused - not allocated") {
  // A hand-made application record: root ApplicationSpec (no data, four
  // pointers) whose deployments list claims 1,000,000 empty structs in zero
  // words. Under the default Cap'n Proto limit (8M words) the decoder would
  // build a million DeploymentSpecs from 56 bytes; the codec's size-bound
  // traversal limit refuses the record instead.
  const uint32_t count = 1'000'000;
  const uint64_t words[] = {
      0x0000000600000000ULL,              // segment table: 1 segment of 6 words
      0x0004000000000000ULL,              // root: struct, 0 data words, 4 pointers
      0,                                  // name: null
      0,                                  // routePrefix: null
      0,                                  // ingress: null
      0x0000000700000001ULL,              // deployments: inline-composite list, 0 words
      static_cast<uint64_t>(count) << 2,  // list tag: `count` structs of 0 words each
  };
  std::string bytes = encode_application(ApplicationSpec{}).substr(0, kEnvelopeSize);
  bytes.append(reinterpret_cast<const char*>(words), sizeof words);  // little endian host
  auto r = decode_application(bytes);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().code() == errc::corrupt);
  CHECK_MESSAGE(contains(r.status().message(), "traversal limit"), r.status().message());
}

TEST_CASE("batching fields round-trip - defaults and each non-default value") {
  // Request batching (issue 44): max_batch_size, batch_wait_timeout_s and
  // batch_wait_auto, alone and together.
  ApplicationSpec app = one_deployment_app();
  auto decoded = decode_application(encode_application(app));
  REQUIRE_MESSAGE(decoded.has_value(), decoded.status().to_string());
  CHECK(decoded->deployments[0].config.max_batch_size == 1u);
  CHECK(decoded->deployments[0].config.batch_wait_timeout_s == 0.01);
  CHECK_FALSE(decoded->deployments[0].config.batch_wait_auto);

  DeploymentConfig& c = app.deployments[0].config;
  c.max_ongoing_requests = 64;
  c.max_batch_size = 32;
  decoded = decode_application(encode_application(app));
  REQUIRE(decoded.has_value());
  CHECK(*decoded == app);
  c.batch_wait_timeout_s = 0;  // 0 is a value, not "unset"
  decoded = decode_application(encode_application(app));
  REQUIRE(decoded.has_value());
  CHECK(decoded->deployments[0].config.batch_wait_timeout_s == 0);
  CHECK(*decoded == app);
  c.batch_wait_timeout_s = 2.5;
  c.batch_wait_auto = true;
  decoded = decode_application(encode_application(app));
  REQUIRE(decoded.has_value());
  CHECK(decoded->deployments[0].config.max_batch_size == 32u);
  CHECK(decoded->deployments[0].config.batch_wait_timeout_s == 2.5);
  CHECK(decoded->deployments[0].config.batch_wait_auto);
  CHECK(*decoded == app);
  // Batching needs no newer format: an older binary ignores the fields.
  const std::string bytes = encode_application(app);
  CHECK(bytes[4] == 1);
  CHECK(bytes[5] == 0);
}

TEST_CASE("a number that is not finite is refused - it names the field") {
  // Found by tests/fuzz/checkpoint_fuzz.cpp: a NaN decoded into the state
  // (validate() refuses one at deploy time, so only a damaged or foreign
  // record holds one).
  ApplicationSpec app = one_deployment_app();
  app.deployments[0].config.health_check_period_s = std::nan("");
  auto r = decode_application(encode_application(app));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().code() == errc::corrupt);
  CHECK(r.status().message() ==
        "application record is malformed: healthCheckPeriodS is not a finite number");

  app.deployments[0].config.health_check_period_s = 10;
  app.traffic["D"] = std::numeric_limits<double>::infinity();
  r = decode_application(encode_application(app));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().message() ==
        "application record is malformed: a traffic weight is not a finite number");

  TargetState state;
  state.http.request_timeout_s = -std::numeric_limits<double>::infinity();
  auto head = decode_head(encode_head(state, 0));
  REQUIRE_FALSE(head.has_value());
  CHECK(head.status().code() == errc::corrupt);
  CHECK(contains(head.status().message(), "requestTimeoutS is not a finite number"));

  app.traffic.clear();
  app.deployments[0].config.batch_wait_timeout_s = std::nan("");
  r = decode_application(encode_application(app));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().message() ==
        "application record is malformed: batchWaitTimeoutS is not a finite number");

  // The fuzzer's input: a head record whose target capacity is a NaN.
  std::ifstream in(std::string(TROUPE_STORE_TEST_DIR) + "/../fuzz/corpus/checkpoint/regression-nan-head",
                   std::ios::binary);
  REQUIRE(in.good());
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() > 1);
  head = decode_head(std::string_view(bytes).substr(1));  // its first byte picks the decoder
  REQUIRE_FALSE(head.has_value());
  CHECK(contains(head.status().message(), "is not a finite number"));
}
