#include "controller/core/validate.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string_view>
#include <set>
#include <sstream>
#include <vector>

#include "runtime/printable.hpp"

namespace troupe::controller {

namespace {

std::string fmt(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// In double quotes, with control characters written as \xNN.
std::string quote(const std::string& s) {
  return "\"" + escape_control_characters(s) + "\"";
}

class Problems {
 public:
  void add(const std::string& path, const std::string& value, const std::string& rule) {
    items_.push_back(path + ": " + value + " " + rule);
  }
  Status status() const {
    if (items_.empty())
      return Status::ok();
    std::string msg;
    for (const auto& item : items_) {
      if (!msg.empty())
        msg += "; ";
      msg += item;
    }
    return Status(errc::invalid_argument, msg);
  }

  // Finite, > 0 and <= kMaxTimeoutS.
  void positive_seconds(const std::string& path, double v) {
    if (!std::isfinite(v) || v <= 0) {
      add(path, fmt(v), "must be > 0");
    } else if (v > kMaxTimeoutS) {
      add(path, fmt(v), "must be <= " + fmt(kMaxTimeoutS));
    }
  }
  void nonnegative_seconds(const std::string& path, double v) {
    if (!std::isfinite(v) || v < 0) {
      add(path, fmt(v), "must be >= 0");
    } else if (v > kMaxTimeoutS) {
      add(path, fmt(v), "must be <= " + fmt(kMaxTimeoutS));
    }
  }
  void positive(const std::string& path, double v) {
    if (!std::isfinite(v) || v <= 0)
      add(path, fmt(v), "must be > 0");
  }
  void replicas(const std::string& path, uint32_t v) {
    if (v > kMaxReplicas)
      add(path, std::to_string(v), "must be <= " + std::to_string(kMaxReplicas));
  }

 private:
  std::vector<std::string> items_;
};

void check_autoscaling(Problems& p, const std::string& path, const AutoscalingConfig& a) {
  p.replicas(path + ".min_replicas", a.min_replicas);
  p.replicas(path + ".max_replicas", a.max_replicas);
  if (a.max_replicas < 1)
    p.add(path + ".max_replicas", std::to_string(a.max_replicas), "must be >= 1");
  if (a.min_replicas > a.max_replicas) {
    p.add(path + ".min_replicas", std::to_string(a.min_replicas),
          "must be <= max_replicas (" + std::to_string(a.max_replicas) + ")");
  }
  if (a.initial_replicas &&
      (*a.initial_replicas < a.min_replicas || *a.initial_replicas > a.max_replicas)) {
    p.add(path + ".initial_replicas", std::to_string(*a.initial_replicas),
          "must be within [min_replicas, max_replicas] = [" + std::to_string(a.min_replicas) +
              ", " + std::to_string(a.max_replicas) + "]");
  }
  p.positive(path + ".target_ongoing_requests", a.target_ongoing_requests);
  p.positive_seconds(path + ".metrics_interval_s", a.metrics_interval_s);
  p.positive_seconds(path + ".look_back_period_s", a.look_back_period_s);
  p.positive(path + ".smoothing_factor", a.smoothing_factor);
  if (a.upscale_smoothing_factor) {
    p.positive(path + ".upscale_smoothing_factor", *a.upscale_smoothing_factor);
  }
  if (a.downscale_smoothing_factor) {
    p.positive(path + ".downscale_smoothing_factor", *a.downscale_smoothing_factor);
  }
  p.nonnegative_seconds(path + ".upscale_delay_s", a.upscale_delay_s);
  p.nonnegative_seconds(path + ".downscale_delay_s", a.downscale_delay_s);
}

void check_deployment(Problems& p, const std::string& path, const DeploymentSpec& d) {
  if (d.import_path.empty())
    p.add(path + ".import_path", "\"\"", "must not be empty");
  else if (has_control_character(d.import_path))
    p.add(path + ".import_path", quote(d.import_path), "must not contain control characters");
  if (!d.library_sha256.empty()) {
    bool hex = d.library_sha256.size() == 64;
    for (char c : d.library_sha256)
      hex = hex && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
    if (!hex) {
      p.add(path + ".library_sha256", quote(d.library_sha256),
            "must be a SHA-256 in lowercase hex (64 digits)");
    }
  }
  const DeploymentConfig& c = d.config;
  const std::string cp = path;
  p.replicas(cp + ".num_replicas", c.num_replicas);
  if (c.max_ongoing_requests < 1 || c.max_ongoing_requests > kMaxOngoingRequests) {
    p.add(cp + ".max_ongoing_requests", std::to_string(c.max_ongoing_requests),
          "must be within [1, " + std::to_string(kMaxOngoingRequests) + "]");
  }
  if (c.max_queued_requests < -1) {
    p.add(cp + ".max_queued_requests", std::to_string(c.max_queued_requests),
          "must be >= -1 (-1: no limit)");
  }
  p.positive_seconds(cp + ".health_check_period_s", c.health_check_period_s);
  p.positive_seconds(cp + ".health_check_timeout_s", c.health_check_timeout_s);
  p.positive_seconds(cp + ".graceful_shutdown_wait_loop_s", c.graceful_shutdown_wait_loop_s);
  p.positive_seconds(cp + ".graceful_shutdown_timeout_s", c.graceful_shutdown_timeout_s);
  for (const auto& [name, amount] : c.resources.amounts) {
    if (!std::isfinite(amount) || amount < 0) {
      p.add(cp + ".resources." + name, fmt(amount), "must be a finite amount >= 0");
    }
  }
  p.replicas(cp + ".max_replicas_per_node", c.max_replicas_per_node);
  if (c.isolation != Isolation::process && c.isolation != Isolation::in_process) {
    p.add(cp + ".isolation", std::to_string(static_cast<int>(c.isolation)),
          "must be process or in_process");
  }
  if (c.memory_limit_bytes != 0 && c.memory_limit_bytes < kMinMemoryLimitBytes) {
    p.add(cp + ".memory_limit_bytes", std::to_string(c.memory_limit_bytes),
          "must be 0 (no limit) or >= " + std::to_string(kMinMemoryLimitBytes) + " (32 MiB)");
  } else if (c.memory_limit_bytes != 0 && c.isolation == Isolation::in_process) {
    p.add(cp + ".memory_limit_bytes", std::to_string(c.memory_limit_bytes),
          "needs isolation: process (it is enforced on the replica process; isolation is "
          "in_process)");
  }
  if (!std::isfinite(c.stuck_after_s) || c.stuck_after_s < 0) {
    p.add(cp + ".stuck_after_s", fmt(c.stuck_after_s),
          "must be a finite number of seconds >= 0 (0: derived from request_timeout_s)");
  }
  if (c.max_num_models_per_replica != -1 &&
      (c.max_num_models_per_replica < 1 ||
       c.max_num_models_per_replica > kMaxNumModelsPerReplica)) {
    p.add(cp + ".max_num_models_per_replica", std::to_string(c.max_num_models_per_replica),
          "must be -1 (no limit) or within [1, " + std::to_string(kMaxNumModelsPerReplica) + "]");
  }
  if (c.max_batch_size < 1 || c.max_batch_size > kMaxBatchSize) {
    p.add(cp + ".max_batch_size", std::to_string(c.max_batch_size),
          "must be within [1, " + std::to_string(kMaxBatchSize) + "] (1: no batching)");
  } else if (c.max_batch_size > 1 && c.max_ongoing_requests >= 1 &&
             c.max_ongoing_requests < c.max_batch_size) {
    const std::string batch = std::to_string(c.max_batch_size);
    p.add(cp + ".max_ongoing_requests", std::to_string(c.max_ongoing_requests),
          "is below max_batch_size (" + batch +
              "): a replica holds at most max_ongoing_requests requests, so its batches could "
              "never fill; raise max_ongoing_requests to at least " +
              batch);
  }
  if (!std::isfinite(c.batch_wait_timeout_s) || c.batch_wait_timeout_s < 0 ||
      c.batch_wait_timeout_s > kMaxBatchWaitTimeoutS) {
    p.add(cp + ".batch_wait_timeout_s", fmt(c.batch_wait_timeout_s),
          "must be a number of seconds within [0, " + fmt(kMaxBatchWaitTimeoutS) + "]");
  }
  if (c.autoscaling_config)
    check_autoscaling(p, cp + ".autoscaling_config", *c.autoscaling_config);
}

// `name` (at `where`, in a traffic split or the shadows of `app`) must be a
// deployment of `app`; the error names the application it belongs to when
// it is another one of `all`.
void check_own_deployment(Problems& p, const std::string& where, const std::string& name,
                          const ApplicationSpec& app, const TargetState* all) {
  bool known = std::any_of(app.deployments.begin(), app.deployments.end(),
                           [&](const DeploymentSpec& d) { return d.name == name; });
  if (known)
    return;
  std::string other;
  if (all) {
    for (const auto& [key, a] : all->applications) {
      for (const auto& d : a.deployments) {
        if (key != app.name && d.name == name && other.empty())
          other = key;
      }
    }
  }
  p.add(where, quote(name),
        "must name a deployment of application " + quote(app.name) +
            (other.empty() ? std::string()
                           : " (it is a deployment of application " + quote(other) + ")"));
}

// `all`: the whole target state, when known, to name the application a
// misplaced traffic entry belongs to.
void check_traffic(Problems& p, const std::string& path, const ApplicationSpec& app,
                   const TargetState* all) {
  if (app.traffic.empty()) {
    if (!app.traffic_key_header.empty()) {
      p.add(path + ".traffic_key_header", quote(app.traffic_key_header),
            "needs a traffic split (traffic is empty)");
    }
    return;
  }
  double sum = 0;
  bool weights_ok = true;
  for (const auto& [name, weight] : app.traffic) {
    const std::string tpath = path + ".traffic[" + name + "]";
    check_own_deployment(p, tpath, name, app, all);
    if (!std::isfinite(weight) || weight < 0) {
      p.add(tpath, fmt(weight), "must be a weight >= 0");
      weights_ok = false;
    } else {
      sum += weight;
    }
  }
  if (weights_ok && !traffic_sum_is_one(sum)) {
    std::ostringstream text;
    text.precision(10);
    text << sum;
    p.add(path + ".traffic", "weights sum to " + text.str() + ",",
          "must sum to 1 (within " + fmt(kTrafficSumTolerance) + ")");
  }
  if (!app.traffic_key_header.empty() && !valid_header_name(app.traffic_key_header)) {
    p.add(path + ".traffic_key_header", quote(app.traffic_key_header),
          "must be an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)");
  }
}

// Shadow traffic: probabilities in [0, 1], deployments of this application
// that receive no real traffic (the rule: a deployment either serves the
// application's requests or gets copies of them, never both, so that its
// answers and metrics never mix the two).
void check_shadow(Problems& p, const std::string& path, const ApplicationSpec& app,
                  const TargetState* all) {
  for (const auto& [name, probability] : app.shadow) {
    const std::string spath = path + ".shadow[" + name + "]";
    check_own_deployment(p, spath, name, app, all);
    if (!std::isfinite(probability) || probability < 0 || probability > 1)
      p.add(spath, fmt(probability), "must be a probability from 0 to 1");
    if (app.traffic.empty() && name == app.ingress) {
      p.add(spath, quote(name),
            "is the ingress, which receives the application's requests (there is no traffic "
            "split); a shadow cannot also receive real traffic");
    }
    if (auto w = app.traffic.find(name); w != app.traffic.end() && w->second > 0) {
      p.add(spath, quote(name),
            "carries traffic (" + path + ".traffic[" + name + "] = " + fmt(w->second) +
                "); a shadow cannot also receive real traffic");
    }
  }
}

void check_app(Problems& p, const ApplicationSpec& app, const TargetState* all = nullptr) {
  const std::string path = "applications[" + app.name + "]";
  if (!valid_name(app.name)) {
    p.add(path + ".name", quote(app.name),
          "must be 1-100 characters without '#', '/', spaces or control characters");
  }
  if (app.route_prefix.empty() || app.route_prefix[0] != '/') {
    p.add(path + ".route_prefix", quote(app.route_prefix), "must start with '/'");
  } else if (has_control_character(app.route_prefix)) {
    p.add(path + ".route_prefix", quote(app.route_prefix), "must not contain control characters");
  }
  if (app.deployments.empty())
    p.add(path + ".deployments", "[]", "must not be empty");
  std::set<std::string> seen;
  bool ingress_found = false;
  for (const auto& d : app.deployments) {
    const std::string dpath = path + ".deployments[" + d.name + "]";
    if (!valid_name(d.name)) {
      p.add(dpath + ".name", quote(d.name),
            "must be 1-100 characters without '#', '/', spaces or control characters");
    }
    if (!seen.insert(d.name).second) {
      p.add(dpath + ".name", quote(d.name), "must be unique within the application (duplicate)");
    }
    if (d.name == app.ingress)
      ingress_found = true;
    check_deployment(p, dpath, d);
  }
  if (!ingress_found) {
    p.add(path + ".ingress", quote(app.ingress), "must name one of the application's deployments");
  }
  check_traffic(p, path, app, all);
  check_shadow(p, path, app, all);
}

}  // namespace

bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 100)
    return false;
  for (unsigned char c : name) {
    if (c == '#' || c == '/' || c <= ' ' || c == 0x7f)
      return false;
  }
  return true;
}

bool valid_header_name(const std::string& name) {
  if (name.empty() || name.size() > 100)
    return false;
  for (unsigned char c : name) {
    if (!std::isalnum(c) && std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) ==
                                std::string_view::npos)
      return false;
  }
  return true;
}

Status validate(const ApplicationSpec& app) {
  Problems p;
  check_app(p, app);
  return p.status();
}

Status validate(const TargetState& state) {
  Problems p;
  std::map<std::string, std::string> prefixes;  // prefix -> app
  for (const auto& [key, app] : state.applications) {
    if (key != app.name) {
      p.add("applications[" + key + "].name", quote(app.name), "must equal its key " + quote(key));
    }
    check_app(p, app, &state);
    auto [it, inserted] = prefixes.emplace(app.route_prefix, app.name);
    if (!inserted) {
      p.add("applications[" + app.name + "].route_prefix", quote(app.route_prefix),
            "must be unique (already used by application " + quote(it->second) + ")");
    }
  }
  if (state.target_capacity) {
    double tc = *state.target_capacity;
    if (!std::isfinite(tc) || tc < 0 || tc > 100) {
      p.add("target_capacity", fmt(tc), "must be within [0, 100]");
    }
  }
  if (state.http.request_timeout_s)
    p.positive_seconds("http_options.request_timeout_s", *state.http.request_timeout_s);
  if (state.http.keep_alive_timeout_s)
    p.positive_seconds("http_options.keep_alive_timeout_s", *state.http.keep_alive_timeout_s);
  return p.status();
}

}  // namespace troupe::controller
