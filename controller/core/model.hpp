// The controller's target state: what users declare. This is the hard state
// that is checkpointed (write-ahead) and recovered; everything else the
// controller knows (replicas, health) is soft state rebuilt from the nodes.
//
// Plain value types, no CAF: the reconciler, the checkpoint codec, the YAML
// config loader and the tests all share them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/resources.hpp"

namespace troupe::controller {

// Ray Serve's autoscaling config; defaults are Ray Serve's.
struct AutoscalingConfig {
  uint32_t min_replicas = 1;
  uint32_t max_replicas = 1;
  std::optional<uint32_t> initial_replicas;
  double target_ongoing_requests = 2.0;
  double metrics_interval_s = 10.0;
  double look_back_period_s = 30.0;
  double smoothing_factor = 1.0;
  std::optional<double> upscale_smoothing_factor;
  std::optional<double> downscale_smoothing_factor;
  double upscale_delay_s = 30.0;
  double downscale_delay_s = 600.0;

  friend bool operator==(const AutoscalingConfig&, const AutoscalingConfig&);
  friend bool operator!=(const AutoscalingConfig& a, const AutoscalingConfig& b) { return !(a == b); }
};

// Where a deployment's replicas run.
enum class Isolation {
  // Each replica is its own OS process: a crash in user code kills only that
  // replica. The default.
  process,
  // Inside troupe-node: no isolation, so a crash in user code kills the whole
  // node. Trusted code only.
  in_process,
};

// "process" or "in_process": the spelling of the config file, the wire
// (ReplicaSpec::isolation) and the status.
const char* to_string(Isolation isolation);
// The inverse of to_string; nullopt for any other text.
std::optional<Isolation> parse_isolation(const std::string& text);

// The smallest memory limit other than 0 (none): a process needs some memory
// just to start and load its libraries.
constexpr uint64_t kMinMemoryLimitBytes = 32ULL * 1024 * 1024;

// Upper bound of DeploymentConfig::max_num_models_per_replica.
constexpr int32_t kMaxNumModelsPerReplica = 1000000;

// DeploymentConfig::stuck_after_s when left at 0: this many request timeouts,
// at least kMinStuckAfterS. Requests time out at the proxy after
// request_timeout_s, so a replica whose slots stayed busy three times that
// long with none finishing is held by requests nobody waits for any more; the
// minimum keeps short timeouts from replacing replicas that merely have a
// slow burst.
constexpr double kStuckAfterFactor = 3.0;
constexpr double kMinStuckAfterS = 30.0;

// The stuck threshold a replica starts with (ReplicaSpec::stuck_after_s):
// `configured` when positive, else derived from `request_timeout_s` as above;
// 0 (no check) when both are 0.
double effective_stuck_after_s(double configured, double request_timeout_s);

// Per-deployment options; defaults are Ray Serve's where it has the field.
struct DeploymentConfig {
  uint32_t num_replicas = 1;
  uint32_t max_ongoing_requests = 5;
  int32_t max_queued_requests = -1;  // -1: no limit
  // Opaque JSON text handed to the replica's reconfigure(); "" means none.
  std::string user_config;
  std::optional<AutoscalingConfig> autoscaling_config;
  double health_check_period_s = 10.0;
  double health_check_timeout_s = 30.0;
  double graceful_shutdown_wait_loop_s = 2.0;
  double graceful_shutdown_timeout_s = 20.0;
  Resources resources;                 // needed by each replica
  uint32_t max_replicas_per_node = 0;  // 0: no limit
  // Where replicas run: `process` (default; each replica is its own OS
  // process, so a crash in user code kills only that replica) or `in_process`
  // (inside troupe-node: no isolation; trusted code only).
  Isolation isolation = Isolation::process;
  // Per-replica memory limit in bytes (0: none); enforced on the replica
  // process, so it needs isolation `process`. 0 or >= kMinMemoryLimitBytes.
  uint64_t memory_limit_bytes = 0;
  // A replica whose every request slot has been busy this long, with no
  // request finished, fails its health check ("stuck: ...") and is replaced
  // like any unhealthy replica (with isolation `process` its process is
  // killed when the graceful stop times out, which frees the threads a
  // handler that never returns holds). 0 (default): derived when the replica
  // starts, kStuckAfterFactor x the request_timeout_s then in force, at least
  // kMinStuckAfterS; no stuck check when no request timeout is set (a request
  // may then rightly run for any time). A positive value is used as given
  // (no minimum). A change restarts the replicas.
  double stuck_after_s = 0;
  // Model multiplexing: how many models a replica's ModelCache holds at most
  // (ReplicaContext::max_num_models_per_replica); -1 (default): no limit, else
  // 1 to kMaxNumModelsPerReplica. Replicas read it when they start, so a
  // change restarts them (in Ray Serve it is an argument of
  // @serve.multiplexed, i.e. part of the code).
  int32_t max_num_models_per_replica = -1;
  // A replica that fails its health checks is killed at once instead of
  // stopped with graceful_shutdown_timeout_s (Ray Serve's
  // RAY_SERVE_FORCE_STOP_UNHEALTHY_REPLICAS, per deployment here): for a
  // replica whose requests cannot finish anyway, so that its replacement
  // need not wait for the grace period to free its resources. A change
  // applies in place, from the next replica found unhealthy.
  bool force_stop_unhealthy_replicas = false;
  // Request batching (Ray Serve's @serve.batch arguments, as deployment
  // fields here): a replica runs up to max_batch_size requests as one call
  // of the deployment's handle_batch(); a batch closes when it is full or
  // when its oldest request has waited batch_wait_timeout_s. 1 (default):
  // off. batch_wait_auto (`batch_wait_timeout_s: auto`): the wait follows
  // the measured arrival rate and batch latency (replica/batcher.hpp);
  // batch_wait_timeout_s is then ignored. Changes apply in place: running
  // replicas take the new values without a restart.
  uint32_t max_batch_size = 1;
  double batch_wait_timeout_s = 0.01;
  bool batch_wait_auto = false;

  friend bool operator==(const DeploymentConfig&, const DeploymentConfig&);
  friend bool operator!=(const DeploymentConfig& a, const DeploymentConfig& b) { return !(a == b); }
};

// One deployment of an application: a C++ class run as N replicas.
struct DeploymentSpec {
  std::string name;
  // "libtroupe_examples.so:Echo": shared library and registered class name.
  std::string import_path;
  // Opaque JSON text passed to the constructor.
  std::string init_args;
  // Changes of code_version, init_args, import_path, resources, isolation or
  // memory_limit_bytes restart replicas; a change of user_config reconfigures
  // them in place; a change of num_replicas or autoscaling_config only
  // rescales. The code version is set by the user, or derived from the spec
  // when empty.
  std::string code_version;
  DeploymentConfig config;
  // The SHA-256 of the library's content (runtime/libraries.hpp), set by the
  // controller when it has the library: uploaded by troupectl (the library
  // of import_path is then a path on the operator's machine) or found in the
  // head's plugin path. Part of the code identity: a rebuilt library
  // restarts the replicas. Empty: a library only the workers have, loaded by
  // name.
  std::string library_sha256;

  friend bool operator==(const DeploymentSpec&, const DeploymentSpec&);
  friend bool operator!=(const DeploymentSpec& a, const DeploymentSpec& b) { return !(a == b); }
};

struct ApplicationSpec {
  std::string name;
  std::string route_prefix;  // starts with '/'; unique among applications
  std::string ingress;       // name of the deployment that receives HTTP requests
  std::vector<DeploymentSpec> deployments;
  // The traffic split (Ray Serve's set_traffic): each named deployment of
  // this application receives that share of the application's HTTP requests
  // and of the handle calls to its ingress. Weights are >= 0 and sum to 1
  // (within kTrafficSumTolerance). Empty: everything goes to the ingress.
  std::map<std::string, double> traffic;
  // With a split: the request header whose value picks the deployment (by a
  // hash of it), so requests with the same value go to the same deployment
  // while the weights do not change. Empty: each request is picked at random.
  std::string traffic_key_header;
  // Shadow traffic: each named deployment of this application also receives,
  // with that probability (in [0, 1]) and independently of the others, a copy
  // of each of the application's HTTP requests and handle calls to its
  // ingress. The copy's answer is discarded: it never delays, fails or
  // changes the client's answer, and it is dropped (and counted) when the
  // shadow has no free slot. A shadow never receives real traffic: it is not
  // the ingress of an application without a split, nor carries weight in
  // `traffic` (validate.cpp). Empty: no copies.
  std::map<std::string, double> shadow;
  // The application is a model served by the Open Inference Protocol
  // (KServe v2, docs/inference.md): the application's name is the model's
  // name, and every node also serves it at /v2/models/<name>/... on the HTTP
  // ingress and through inference.GRPCInferenceService on its gRPC port. Its
  // ingress derives troupe::InferenceModel (include/troupe/inference.hpp).
  // Routing only, like traffic_key_header: pushed to every proxy, no replica
  // restarts when it changes.
  bool open_inference = false;

  friend bool operator==(const ApplicationSpec&, const ApplicationSpec&);
  friend bool operator!=(const ApplicationSpec& a, const ApplicationSpec& b) { return !(a == b); }
};

// Ray Serve's http_options that apply to every proxy of the cluster (host and
// port do not: each node's proxy listens where `troupe-node --bind
// --http-port` say). Pushed to every proxy with the routing snapshot.
struct HttpSettings {
  // End-to-end deadline of one HTTP request at the proxy (504 after it);
  // absent: the node's `--request-timeout` (0 by default: none).
  std::optional<double> request_timeout_s;
  // How long a proxy keeps an idle keep-alive connection open between two
  // requests; absent: the node's `--proxy-idle-timeout` (60 s by default).
  // Not Ray's 5 s: a client or load balancer in front that reuses a connection
  // the proxy has just closed sees a failed request, so the proxy should
  // wait at least as long as they do (60 s is e.g. AWS ALB's idle timeout);
  // an idle connection held longer only costs a socket.
  std::optional<double> keep_alive_timeout_s;

  friend bool operator==(const HttpSettings&, const HttpSettings&);
  friend bool operator!=(const HttpSettings& a, const HttpSettings& b) { return !(a == b); }
};

// An application's last good declaration (TargetState::last_running): the
// spec it had the last time it was RUNNING with every deployment HEALTHY,
// and the target state's generation when that was recorded (the declaration
// in force at that generation).
struct RunningDeclaration {
  ApplicationSpec spec;
  uint64_t generation = 0;

  friend bool operator==(const RunningDeclaration&, const RunningDeclaration&);
  friend bool operator!=(const RunningDeclaration& a, const RunningDeclaration& b) {
    return !(a == b);
  }
};

// Which way target_capacity last moved (Ray Serve's
// TargetCapacityDirection). While it rises, an autoscaled deployment with
// initial_replicas keeps at least initial_replicas (capacity-adjusted) instead
// of min_replicas, so a cluster brought back up gets its capacity before any
// load arrives.
enum class CapacityDirection { none, up, down };

const char* to_string(CapacityDirection d);

// Everything the controller must keep across a crash.
struct TargetState {
  std::map<std::string, ApplicationSpec> applications;  // by name
  // Cluster-wide scale in percent (0-100) applied to every deployment's
  // target and autoscaling bounds; absent means 100.
  std::optional<double> target_capacity;
  // Derived by next_capacity_direction() whenever target_capacity or the
  // set of applications changes, and checkpointed with them.
  CapacityDirection target_capacity_direction = CapacityDirection::none;
  // Increases with every accepted change; lets a client detect lost updates.
  uint64_t generation = 0;
  // The declared http_options (`troupectl deploy`); part of the signed,
  // checkpointed declaration, so a controller restart keeps them.
  HttpSettings http;
  // The autoscaler's replica counts, application -> deployment -> count,
  // written ahead of acting on them like Ray Serve's target_num_replicas, so
  // a restarted controller resumes them. Not part of a declaration: a
  // deploy keeps the entries of deployments that stay autoscaled and drops
  // the rest, and an autoscale decision changes neither the declaration nor
  // the generation.
  std::map<std::string, std::map<std::string, uint32_t>> autoscaled_replicas;
  // Each application's last good declaration, by application: what
  // `troupectl rollback` deploys again. Written ahead (same generation) when
  // an application becomes RUNNING with a declaration other than the one
  // recorded; dropped with the application. Not part of a declaration: a
  // deploy neither sets nor compares it.
  std::map<std::string, RunningDeclaration> last_running;

  friend bool operator==(const TargetState&, const TargetState&);
  friend bool operator!=(const TargetState& a, const TargetState& b) { return !(a == b); }
};

// Ray Serve's calculate_target_capacity_direction: the direction after the
// target state moves from `current` to `next`. With the same applications:
// the capacity unchanged keeps `current`'s direction, from none (100 %) to a
// value is down, to none is none, a rise is up, a fall down. With other
// applications: up when `next` has a capacity, else none.
CapacityDirection next_capacity_direction(const TargetState& current, const TargetState& next);


}  // namespace troupe::controller
