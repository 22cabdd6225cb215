// One source of truth per config field: every field of an application and of
// its deployments is seen by operator==, survives the checkpoint codec
// (Cap'n Proto, controller/store/codec.hpp) and the config file (YAML,
// config/config.hpp).
//
// The list of fields lives in one place: fields() below, whose structured
// bindings stop compiling when a model struct (controller/core/model.hpp)
// gains or loses a field. The mutations below must then name the new field
// (one each, in field order: the test checks that mutation i changes exactly
// field i), and the test fails until operator==, the codec and the config
// file all carry it.
#include <doctest/doctest.h>

#include <cstddef>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "config/config.hpp"
#include "controller/core/model.hpp"
#include "controller/core/validate.hpp"
#include "controller/store/codec.hpp"

using namespace troupe;
using namespace troupe::controller;

namespace {

// --- the fields of each struct, in declaration order --------------------------

auto fields(const AutoscalingConfig& x) {
  const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10] = x;
  return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10);
}

auto fields(const DeploymentConfig& x) {
  const auto& [f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17,
               f18] = x;
  return std::tie(f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15, f16, f17,
                  f18);
}

auto fields(const DeploymentSpec& x) {
  const auto& [f0, f1, f2, f3, f4, f5] = x;
  return std::tie(f0, f1, f2, f3, f4, f5);
}

auto fields(const ApplicationSpec& x) {
  const auto& [f0, f1, f2, f3, f4, f5, f6, f7] = x;
  return std::tie(f0, f1, f2, f3, f4, f5, f6, f7);
}

auto fields(const HttpSettings& x) {
  const auto& [f0, f1] = x;
  return std::tie(f0, f1);
}

template <class T>
constexpr size_t field_count() {
  return std::tuple_size_v<decltype(fields(std::declval<const T&>()))>;
}

template <class Tuple, size_t... I>
std::vector<size_t> differing(const Tuple& a, const Tuple& b, std::index_sequence<I...>) {
  std::vector<size_t> out;
  ((std::get<I>(a) == std::get<I>(b) ? void() : out.push_back(I)), ...);
  return out;
}

// The indexes of the fields in which `a` and `b` differ (compared one by one,
// not through T's operator==).
template <class T>
std::vector<size_t> differing_fields(const T& a, const T& b) {
  return differing(fields(a), fields(b), std::make_index_sequence<field_count<T>()>{});
}

// --- one mutation per field: a non-default value the config accepts -----------

template <class T>
struct Mutation {
  const char* field;
  std::function<void(T&)> apply;
};

const std::vector<Mutation<AutoscalingConfig>>& autoscaling_mutations() {
  static const std::vector<Mutation<AutoscalingConfig>> m = {
      {"min_replicas", [](auto& x) { x.min_replicas = 2; }},
      {"max_replicas", [](auto& x) { x.max_replicas = 6; }},
      {"initial_replicas", [](auto& x) { x.initial_replicas = 3; }},
      {"target_ongoing_requests", [](auto& x) { x.target_ongoing_requests = 3.5; }},
      {"metrics_interval_s", [](auto& x) { x.metrics_interval_s = 2.5; }},
      {"look_back_period_s", [](auto& x) { x.look_back_period_s = 12.5; }},
      {"smoothing_factor", [](auto& x) { x.smoothing_factor = 0.5; }},
      {"upscale_smoothing_factor", [](auto& x) { x.upscale_smoothing_factor = 0.75; }},
      {"downscale_smoothing_factor", [](auto& x) { x.downscale_smoothing_factor = 0.25; }},
      {"upscale_delay_s", [](auto& x) { x.upscale_delay_s = 7.5; }},
      {"downscale_delay_s", [](auto& x) { x.downscale_delay_s = 45.5; }},
  };
  return m;
}

const std::vector<Mutation<DeploymentConfig>>& config_mutations() {
  static const std::vector<Mutation<DeploymentConfig>> m = {
      {"num_replicas", [](auto& x) { x.num_replicas = 3; }},
      {"max_ongoing_requests", [](auto& x) { x.max_ongoing_requests = 7; }},
      {"max_queued_requests", [](auto& x) { x.max_queued_requests = 11; }},
      {"user_config", [](auto& x) { x.user_config = R"({"threshold":0.5})"; }},
      {"autoscaling_config", [](auto& x) { x.autoscaling_config = AutoscalingConfig{}; }},
      {"health_check_period_s", [](auto& x) { x.health_check_period_s = 4.5; }},
      {"health_check_timeout_s", [](auto& x) { x.health_check_timeout_s = 9.5; }},
      {"graceful_shutdown_wait_loop_s", [](auto& x) { x.graceful_shutdown_wait_loop_s = 1.5; }},
      {"graceful_shutdown_timeout_s", [](auto& x) { x.graceful_shutdown_timeout_s = 12.5; }},
      {"resources",
       [](auto& x) {
         x.resources.amounts = {{"cpu", 2}, {"mem", 1 << 30}};
       }},
      {"max_replicas_per_node", [](auto& x) { x.max_replicas_per_node = 2; }},
      {"isolation", [](auto& x) { x.isolation = Isolation::in_process; }},
      {"memory_limit_bytes", [](auto& x) { x.memory_limit_bytes = 64ULL << 20; }},
      {"stuck_after_s", [](auto& x) { x.stuck_after_s = 45; }},
      {"max_num_models_per_replica", [](auto& x) { x.max_num_models_per_replica = 3; }},
      {"force_stop_unhealthy_replicas", [](auto& x) { x.force_stop_unhealthy_replicas = true; }},
      // At most max_ongoing_requests (5 by default), as validate() wants.
      {"max_batch_size", [](auto& x) { x.max_batch_size = 4; }},
      {"batch_wait_timeout_s", [](auto& x) { x.batch_wait_timeout_s = 0.25; }},
      {"batch_wait_auto", [](auto& x) { x.batch_wait_auto = true; }},
  };
  return m;
}

const std::vector<Mutation<DeploymentSpec>>& deployment_mutations() {
  static const std::vector<Mutation<DeploymentSpec>> m = {
      {"name", [](auto& x) { x.name = "Renamed"; }},
      {"import_path", [](auto& x) { x.import_path = "libother.so:Other"; }},
      {"init_args", [](auto& x) { x.init_args = R"({"layers":[1,2]})"; }},
      {"code_version", [](auto& x) { x.code_version = "v2"; }},
      {"config", [](auto& x) { x.config.max_ongoing_requests = 9; }},
      // Not a config file field: set by troupectl (an uploaded library) or
      // the controller (one in the head's plugin path), see kNotInConfigFile.
      {"library_sha256", [](auto& x) { x.library_sha256 = std::string(64, 'd'); }},
  };
  return m;
}

// Fields the config file does not declare: derived from the libraries when
// a config is deployed (controller/shell/library_store.hpp). Every other check
// covers them.
const std::vector<std::string> kNotInConfigFile = {"deployment.library_sha256"};

bool in_config_file(const std::string& field) {
  for (const auto& f : kNotInConfigFile) {
    if (f == field)
      return false;
  }
  return true;
}

const std::vector<Mutation<ApplicationSpec>>& application_mutations() {
  static const std::vector<Mutation<ApplicationSpec>> m = {
      {"name", [](auto& x) { x.name = "store"; }},
      {"route_prefix", [](auto& x) { x.route_prefix = "/store"; }},
      {"ingress", [](auto& x) { x.ingress = "B"; }},
      {"deployments",
       [](auto& x) {
         DeploymentSpec c;
         c.name = "C";
         c.import_path = "libshop.so:C";
         x.deployments.push_back(c);
       }},
      // A and S: B is renamed by a deployment mutation in every_field().
      {"traffic",
       [](auto& x) {
         x.traffic = {{"A", 0.75}, {"S", 0.25}};
       }},
      {"traffic_key_header", [](auto& x) { x.traffic_key_header = "X-User"; }},
      // M: the deployment that receives no traffic in any combination.
      {"shadow",
       [](auto& x) {
         x.shadow = {{"M", 0.5}};
       }},
      {"open_inference", [](auto& x) { x.open_inference = true; }},
  };
  return m;
}

// --- the applications the checks run on ---------------------------------------

// "shop": ingress A (all traffic to A), B (which the deployment and config
// mutations change: the
// config file names an ingress after its class, so renaming the ingress is
// not expressible) and S with an autoscaling_config (which the autoscaling
// mutations change), and M, which no traffic reaches (the shadow mutation
// names it).
ApplicationSpec base_app() {
  ApplicationSpec app;
  app.name = "shop";
  app.route_prefix = "/shop";
  app.ingress = "A";
  DeploymentSpec a;
  a.name = "A";
  a.import_path = "libshop.so:A";
  DeploymentSpec b;
  b.name = "B";
  b.import_path = "libshop.so:B";
  DeploymentSpec scaled;
  scaled.name = "S";
  scaled.import_path = "libshop.so:S";
  AutoscalingConfig scaling;
  scaling.max_replicas = 4;
  scaled.config.autoscaling_config = scaling;
  DeploymentSpec mirror;
  mirror.name = "M";
  mirror.import_path = "libshop.so:M";
  app.deployments = {a, b, scaled, mirror};
  // A split, so that the traffic_key_header mutation alone is a valid config
  // (a key header needs a split).
  app.traffic = {{"A", 1.0}};
  return app;
}

// Every mutation, each on a copy of base_app(): (field, application).
std::vector<std::pair<std::string, ApplicationSpec>> one_field_each() {
  std::vector<std::pair<std::string, ApplicationSpec>> out;
  for (auto& m : application_mutations()) {
    auto app = base_app();
    m.apply(app);
    out.emplace_back(std::string("application.") + m.field, app);
  }
  for (auto& m : deployment_mutations()) {
    auto app = base_app();
    m.apply(app.deployments[1]);
    out.emplace_back(std::string("deployment.") + m.field, app);
  }
  for (auto& m : config_mutations()) {
    auto app = base_app();
    m.apply(app.deployments[1].config);
    out.emplace_back(std::string("deployment.config.") + m.field, app);
  }
  for (auto& m : autoscaling_mutations()) {
    auto app = base_app();
    m.apply(*app.deployments[2].config.autoscaling_config);
    out.emplace_back(std::string("deployment.config.autoscaling_config.") + m.field, app);
  }
  return out;
}

// Every mutation at once (B gets the deployment and config ones, S the
// autoscaling ones; the ingress is C, the deployment the application
// mutation adds). `for_config_file`: without the two combinations
// the config file refuses (num_replicas beside an autoscaling_config, and a
// memory limit with isolation in_process), nor the one it cannot write
// (`batch_wait_timeout_s` is a number or `auto`, so batch_wait_auto drops
// the seconds); each is checked on its own above.
ApplicationSpec every_field(bool for_config_file) {
  auto app = base_app();
  for (auto& m : application_mutations())
    m.apply(app);
  for (auto& m : deployment_mutations()) {
    if (for_config_file && !in_config_file(std::string("deployment.") + m.field))
      continue;
    m.apply(app.deployments[1]);
  }
  for (auto& m : config_mutations()) {
    std::string field = m.field;
    if (for_config_file &&
        (field == "num_replicas" || field == "isolation" || field == "batch_wait_auto"))
      continue;
    m.apply(app.deployments[1].config);
  }
  for (auto& m : autoscaling_mutations())
    m.apply(*app.deployments[2].config.autoscaling_config);
  app.ingress = "C";
  return app;
}

config::DeployConfig as_config(const ApplicationSpec& app) {
  config::DeployConfig c;
  c.state.applications.emplace(app.name, app);
  return c;
}

template <class T>
void check_mutations_cover_every_field(const std::vector<Mutation<T>>& mutations, const T& base) {
  REQUIRE(mutations.size() == field_count<T>());
  for (size_t i = 0; i < mutations.size(); ++i) {
    CAPTURE(mutations[i].field);
    T changed = base;
    mutations[i].apply(changed);
    CHECK(differing_fields(base, changed) == std::vector<size_t>{i});
  }
}

void check_codec_round_trip(const ApplicationSpec& app) {
  auto decoded = decode_application(encode_application(app));
  INFO(decoded.status().to_string());
  REQUIRE(decoded.has_value());
  CHECK(*decoded == app);
}

void check_config_round_trip(const config::DeployConfig& c) {
  INFO(validate(c.state).to_string());
  REQUIRE(validate(c.state).is_ok());
  const std::string yaml = config::to_yaml(c);
  INFO(yaml);
  auto again = config::parse_config(yaml, "printed.yaml");
  INFO(again.status().to_string());
  REQUIRE(again.has_value());
  CHECK(*again == c);
}

}  // namespace

TEST_CASE("config fields: one mutation per model field - each changing exactly that field") {
  auto base = base_app();
  check_mutations_cover_every_field(application_mutations(), base);
  check_mutations_cover_every_field(deployment_mutations(), base.deployments[1]);
  check_mutations_cover_every_field(config_mutations(), base.deployments[1].config);
  check_mutations_cover_every_field(autoscaling_mutations(),
                                    *base.deployments[2].config.autoscaling_config);
  CHECK(one_field_each().size() == field_count<ApplicationSpec>() + field_count<DeploymentSpec>() +
                                       field_count<DeploymentConfig>() +
                                       field_count<AutoscalingConfig>());
}

TEST_CASE("config fields: operator== sees every field") {
  const auto base = base_app();
  CHECK(base == base_app());
  for (const auto& [field, app] : one_field_each()) {
    CAPTURE(field);
    CHECK(app != base);
    CHECK_FALSE(app == base);
    CHECK(app == ApplicationSpec(app));
  }
  CHECK(every_field(false) != base);
  CHECK(every_field(false) == every_field(false));
}

TEST_CASE("config fields: the checkpoint codec carries every field") {
  check_codec_round_trip(base_app());
  for (const auto& [field, app] : one_field_each()) {
    CAPTURE(field);
    check_codec_round_trip(app);
  }
  check_codec_round_trip(every_field(false));
}

TEST_CASE("config fields: the config file carries every field") {
  check_config_round_trip(as_config(base_app()));
  for (const auto& [field, app] : one_field_each()) {
    CAPTURE(field);
    if (!in_config_file(field))
      continue;
    auto c = as_config(app);
    // The config declares what was mutated (not the base) ...
    CHECK(c != as_config(base_app()));
    // ... and reads back exactly that.
    check_config_round_trip(c);
  }
  check_config_round_trip(as_config(every_field(true)));
}

TEST_CASE("config fields: every http setting is seen by operator== - the codec - the config file") {
  const std::vector<Mutation<HttpSettings>> mutations = {
      {"request_timeout_s", [](auto& x) { x.request_timeout_s = 2.5; }},
      {"keep_alive_timeout_s", [](auto& x) { x.keep_alive_timeout_s = 75; }},
  };
  check_mutations_cover_every_field(mutations, HttpSettings{});
  for (const auto& m : mutations) {
    CAPTURE(m.field);
    TargetState state;
    m.apply(state.http);
    CHECK(state != TargetState{});
    auto decoded = decode_target_state(encode_target_state(state));
    REQUIRE(decoded.has_value());
    CHECK(*decoded == state);
    config::DeployConfig c;
    c.state = state;
    check_config_round_trip(c);
  }
}
