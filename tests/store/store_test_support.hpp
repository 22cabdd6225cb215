// Shared by the store tests: a TargetState that sets every field of the
// model to a non-default value.
#pragma once

#include <string>

#include "controller/core/model.hpp"

namespace troupe::controller::testing {

inline AutoscalingConfig full_autoscaling() {
  AutoscalingConfig a;
  a.min_replicas = 2;
  a.max_replicas = 17;
  a.initial_replicas = 4;
  a.target_ongoing_requests = 3.5;
  a.metrics_interval_s = 2.25;
  a.look_back_period_s = 12.5;
  a.smoothing_factor = 0.75;
  a.upscale_smoothing_factor = 1.5;
  a.downscale_smoothing_factor = 0.25;
  a.upscale_delay_s = 7.0;
  a.downscale_delay_s = 123.0;
  return a;
}

inline DeploymentSpec full_deployment(const std::string& name) {
  DeploymentSpec d;
  d.name = name;
  d.import_path = "libtroupe_examples.so:" + name;
  d.init_args = R"({"model": "m\u00e9t\u00e9o", "layers": [1, 2, 3], "text": "line\nbreak \"q\""})";
  d.code_version = "v-" + name + "-42";
  d.library_sha256 = std::string(63, 'a') + std::to_string(name.size() % 10);
  d.config.num_replicas = 3;
  d.config.max_ongoing_requests = 9;
  d.config.max_queued_requests = 250;
  d.config.user_config = R"({"threshold": 0.5, "labels": ["a", "b"], "nested": {"k": null}})";
  d.config.autoscaling_config = full_autoscaling();
  d.config.health_check_period_s = 1.5;
  d.config.health_check_timeout_s = 4.5;
  d.config.graceful_shutdown_wait_loop_s = 0.5;
  d.config.graceful_shutdown_timeout_s = 9.5;
  d.config.resources.amounts = {{"cpu", 1.5}, {"gpu", 0.25}, {"mem", 2.0 * 1024 * 1024 * 1024}};
  d.config.max_replicas_per_node = 2;
  // Both non-default, a combination validate() refuses (a memory limit needs
  // isolation process); the codec stores it as it is.
  d.config.isolation = Isolation::in_process;
  d.config.memory_limit_bytes = 768ULL * 1024 * 1024 + 1;
  d.config.stuck_after_s = 42.5;
  d.config.force_stop_unhealthy_replicas = true;
  d.config.max_num_models_per_replica = 7;
  d.config.max_batch_size = 8;  // <= max_ongoing_requests (9), as validate() wants
  d.config.batch_wait_timeout_s = 0.125;
  d.config.batch_wait_auto = true;  // with a timeout too: the codec keeps both
  return d;
}

// Three applications: "shop" uses every field with every optional present;
// "search" has optionals absent (autoscaling absent, empty JSON text, no
// resources, autoscaling optionals absent in a second deployment);
// "empty" has no deployments at all. Shop's last good declaration is its
// own, search's an older one, empty has none.
inline TargetState full_state() {
  TargetState s;
  s.generation = 0x1234567890abcdefULL;
  s.target_capacity = 62.5;
  s.target_capacity_direction = CapacityDirection::down;
  s.http.request_timeout_s = 12.5;
  s.http.keep_alive_timeout_s = 75;
  s.autoscaled_replicas["shop"] = {{"cart", 7}, {"frontend", 0}};
  s.autoscaled_replicas["search"] = {{"index", 4294967295u}};

  ApplicationSpec shop;
  shop.name = "shop";
  shop.route_prefix = "/shop";
  shop.ingress = "frontend";
  shop.deployments = {full_deployment("frontend"), full_deployment("cart"),
                      full_deployment("mirror")};
  shop.traffic = {{"frontend", 0.875}, {"cart", 0.125}};
  shop.traffic_key_header = "X-User";
  shop.shadow = {{"mirror", 0.375}};
  shop.open_inference = true;
  s.applications.emplace(shop.name, shop);

  ApplicationSpec search;
  search.name = "search";
  search.route_prefix = "/";
  search.ingress = "query";
  DeploymentSpec plain;  // defaults everywhere except the name
  plain.name = "query";
  DeploymentSpec partial = full_deployment("rank");
  partial.config.autoscaling_config->initial_replicas.reset();
  partial.config.autoscaling_config->upscale_smoothing_factor.reset();
  partial.config.autoscaling_config->downscale_smoothing_factor.reset();
  partial.config.user_config.clear();
  partial.config.resources.amounts.clear();
  partial.config.isolation = Isolation::process;  // with its memory limit
  search.deployments = {plain, partial};
  s.applications.emplace(search.name, search);

  ApplicationSpec empty;
  empty.name = "empty";
  empty.route_prefix = "/empty";
  s.applications.emplace(empty.name, empty);

  // Last good declarations: shop's is its own (written as `current`),
  // search's an older one (written out).
  s.last_running["shop"] = RunningDeclaration{shop, 0x0123456789abcdefULL};
  ApplicationSpec older = search;
  older.deployments[1].code_version = "v-rank-41";
  older.traffic_key_header = "X-Older";
  s.last_running["search"] = RunningDeclaration{older, 3};
  return s;
}

}  // namespace troupe::controller::testing
