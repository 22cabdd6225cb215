// Every atom and message type that crosses the wire between troupe processes,
// registered in one place (register_wire_types) shared by every binary.
//
// Compatibility rule: the handshake messages (hello, register) carry
// kProtocolVersion using only built-in types, so two binaries of different
// versions can always decode them and refuse each other with a clear message
// instead of CAF silently dropping messages of unknown types.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "runtime/status.hpp"

namespace caf {
class actor_system_config;
}

namespace troupe {

// Bump on any change of a wire type or of a message's meaning.
// 6: model multiplexing (ReplicaSpec, ReplicaEndpoint, the models report),
//    the declared http timeouts in snapshots and the apply message without
//    its separate timeout, HttpRequest::timeout_s (deadlines across calls),
//    RouteEntry::shadow.
// 7: streaming answers and cancellation (HttpRequest::call_key,
//    HttpResponse::stream, the chunk, credit and cancel messages).
// 8: RoutingSnapshot::draining_nodes.
// 9: a stopping node's leave request (leave_atom), the requests a replica
//    finished in its metrics report, the dashboard query.
// 10: direct connections between workers: NodeInfo::peer_port,
//     RoutingSnapshot::peers, the peer actor (PeerActor); a proxy answers
//     every snapshot pushed to it (ok_atom).
// 11: deltas replica by replica (DeploymentEndpoints::partial,
//     removed_replicas).
// 12: a replica process's metrics registry in its metrics reports, and
//     `troupectl logs` (logs_atom to the controller and the node agents).
// 14: the data port between workers (PeerActor answers data_port_atom; a
//     data port request frame names its replica).
// 15: ReplicaSpec::health_check_timeout_s, health_check_period_s and
//     health_check_failure_threshold (a replica's start-up health checks,
//     run before it reports ready).
// 16: highly available heads: the controller answers leader_atom, a head
//     candidate that does not lead answers every request errc::not_leader.
// 17: NodeInfo::head_mode (one cluster never mixes a single head with head
//     candidates).
// 18: a replica's metrics report is a ReplicaLoad (errors, streams in
//     progress, the interval's p99 of handler time).
// 19: a proxy that lost its direct connection to a node subscribes naming
//     it (its replicas again, not the whole view); NodeStatus::state
//     UNREACHABLE.
// 22: RouteEntry::open_inference.
constexpr uint32_t kProtocolVersion = 22;
// CAF's BASP handshake identifier; equal on every node of a cluster.
constexpr const char* kAppIdentifier = "troupe";

// -- atoms (at most 10 characters) -------------------------------------------
using hello_atom = caf::atom_constant<caf::atom("hello")>;
using register_atom = caf::atom_constant<caf::atom("register")>;
using deregister_atom = caf::atom_constant<caf::atom("deregister")>;
using heartbeat_atom = caf::atom_constant<caf::atom("heartbeat")>;
using nodes_atom = caf::atom_constant<caf::atom("nodes")>;
using drain_atom = caf::atom_constant<caf::atom("drain")>;
// Who leads the cluster's control plane (troupectl leader): a JSON object.
using leader_atom = caf::atom_constant<caf::atom("leader")>;
// The head's dashboard (/-/dashboard) asks the controller what to show.
using dashboard_atom = caf::atom_constant<caf::atom("dashboard")>;
// A node that is stopping asks the controller to move its replicas first.
using leave_atom = caf::atom_constant<caf::atom("leave")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using reconnect_atom = caf::atom_constant<caf::atom("reconnect")>;
// Can a TCP connection be opened (runtime/tcp_probe.hpp)?
using probe_atom = caf::atom_constant<caf::atom("tcpprobe")>;
// A keeper's own message: the restart policy's delay passed, start the
// actor it keeps again.
using restart_atom = caf::atom_constant<caf::atom("restart")>;
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;
// Replica lifecycle (controller -> node agent -> replica) and data path.
using spawn_replica_atom = caf::atom_constant<caf::atom("spawnrep")>;
using list_replicas_atom = caf::atom_constant<caf::atom("listrep")>;
using kill_replica_atom = caf::atom_constant<caf::atom("killrep")>;
// A replica process and its node agent (node/replica_gate.hpp): the process
// proves it was started by the agent with a one-time secret.
using replica_hello_atom = caf::atom_constant<caf::atom("rephello")>;
using replica_attach_atom = caf::atom_constant<caf::atom("repattach")>;
using replica_exit_atom = caf::atom_constant<caf::atom("repexit")>;
using initialize_atom = caf::atom_constant<caf::atom("init")>;
using reconfigure_atom = caf::atom_constant<caf::atom("reconfig")>;
using health_atom = caf::atom_constant<caf::atom("health")>;
using version_atom = caf::atom_constant<caf::atom("version")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using handle_atom = caf::atom_constant<caf::atom("handle")>;
// A deployment handle's call to a proxy (replica process -> its node's proxy keeper).
using call_atom = caf::atom_constant<caf::atom("call")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using metrics_atom = caf::atom_constant<caf::atom("metrics")>;
// The models a replica holds (model multiplexing): replica -> its node agent
// -> the controller, which pushes them to proxies with the replica sets.
using models_atom = caf::atom_constant<caf::atom("models")>;
// Operator calls (troupectl -> controller).
using deploy_atom = caf::atom_constant<caf::atom("deploy")>;
using delete_atom = caf::atom_constant<caf::atom("delete")>;
using status_atom = caf::atom_constant<caf::atom("status")>;
using recover_atom = caf::atom_constant<caf::atom("recover")>;
using apply_atom = caf::atom_constant<caf::atom("apply")>;
using config_atom = caf::atom_constant<caf::atom("config")>;
using kill_atom = caf::atom_constant<caf::atom("kill")>;
using stop_node_atom = caf::atom_constant<caf::atom("stopnode")>;
// Route table and replica sets, pulled or pushed to subscribers (proxies).
using snapshot_atom = caf::atom_constant<caf::atom("snapshot")>;
using subscribe_atom = caf::atom_constant<caf::atom("subscribe")>;
// Per-deployment operations and the traffic split (troupectl -> controller).
using scale_atom = caf::atom_constant<caf::atom("scale")>;
using traffic_atom = caf::atom_constant<caf::atom("traffic")>;
// Streaming answers and cancellation on the data path (replica/streams.hpp):
// a replica sends the pieces of a streamed answer to whoever sent the request
// (chunk), the proxy grants it room for more (credit) and cancels requests
// whose client left or whose deadline passed (cancel).
using chunk_atom = caf::atom_constant<caf::atom("chunk")>;
using credit_atom = caf::atom_constant<caf::atom("credit")>;
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;
// `troupectl logs`: a replica's log lines (troupectl -> controller -> the
// node agent that has them).
using logs_atom = caf::atom_constant<caf::atom("logs")>;
// Deployment libraries pinned by their SHA-256 (runtime/libraries.hpp):
// troupectl uploads them to the controller in pieces (upload), node agents
// ask for their size and fetch them in pieces (library).
using upload_atom = caf::atom_constant<caf::atom("upload")>;
using library_atom = caf::atom_constant<caf::atom("library")>;

// -- wire types --------------------------------------------------------------

// How a node found the controller it registers with: one cluster never
// mixes a single head with highly available head candidates (a worker
// given both kinds could register with either, and the two would each run
// the cluster). NodeInfo::head_mode.
struct HeadMode {
  static constexpr uint8_t one_head = 0;     // a worker given one head's address
  static constexpr uint8_t head_list = 1;    // a worker given several: head candidates
  static constexpr uint8_t candidate = 2;    // a head candidate's own agent (--ha-etcd)
  static constexpr uint8_t single_head = 3;  // a single head's own agent
};

// What a node agent tells the controller about itself when registering.
struct NodeInfo {
  std::string id;
  std::string host;        // address the node's services bind to
  uint16_t http_port = 0;  // where the node's HTTP proxy serves
  std::string resources;   // canonical text form, see parse_resources
  int32_t pid = 0;
  uint32_t protocol_version = kProtocolVersion;
  // A worker's peer listener (on `host`): other workers connect there to
  // reach its replicas directly, not through the head. 0: none (the head,
  // which every node is connected to already).
  uint16_t peer_port = 0;
  uint8_t head_mode = HeadMode::one_head;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, NodeInfo& x) {
  return f(caf::meta::type_name("troupe.NodeInfo"), x.id, x.host, x.http_port, x.resources, x.pid,
           x.protocol_version, x.peer_port, x.head_mode);
}

// One row of `troupectl nodes`.
struct NodeStatus {
  std::string id;
  std::string address;  // host:http_port
  std::string state;    // ALIVE, DRAINING, UNREACHABLE or DEAD
  std::string resources;
  int64_t last_heartbeat_age_ms = 0;
  std::string reason;  // why the node is in its state ("missed heartbeats for 5.2 s")
  int32_t pid = 0;
  std::string proxy;  // its proxy: STARTING, HEALTHY, UNHEALTHY or NONE
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, NodeStatus& x) {
  return f(caf::meta::type_name("troupe.NodeStatus"), x.id, x.address, x.state, x.resources,
           x.last_heartbeat_age_ms, x.reason, x.pid, x.proxy);
}

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// A replica's request batching (the deployment's max_batch_size and
// batch_wait_timeout_s; replica/batcher.hpp): set when it starts, changed in
// place by a reconfigure.
struct BatchSettings {
  uint32_t max_batch_size = 1;  // 1: off
  double wait_s = 0.01;
  bool adaptive = false;  // batch_wait_timeout_s: auto (wait_s unused)

  friend bool operator==(const BatchSettings& a, const BatchSettings& b) {
    return a.max_batch_size == b.max_batch_size && a.wait_s == b.wait_s && a.adaptive == b.adaptive;
  }
  friend bool operator!=(const BatchSettings& a, const BatchSettings& b) { return !(a == b); }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, BatchSettings& x) {
  return f(caf::meta::type_name("troupe.BatchSettings"), x.max_batch_size, x.wait_s, x.adaptive);
}

// Everything a node agent needs to run one replica.
struct ReplicaSpec {
  std::string replica_id;
  std::string app;
  std::string deployment;
  std::string import_path;  // "libfoo.so:ClassName"
  std::string init_args;    // JSON text
  std::string code_version;
  std::string user_config;  // JSON text; "" means none
  uint32_t max_ongoing_requests = 5;
  double metrics_interval_s = 10.0;
  std::string isolation = "process";  // "process" or "in_process"
  uint64_t memory_limit_bytes = 0;    // per replica process; 0: none
  // The health check fails when every request slot has been busy this long
  // with no request finished (the controller resolves the deployment's
  // stuck_after_s to this); 0: never.
  double stuck_after_s = 0;
  // ReplicaContext::max_num_models_per_replica: what a ModelCache of the
  // replica holds at most; -1: no limit.
  int32_t max_num_models_per_replica = -1;
  // The start-up gate: after its constructor and reconfigure (and after
  // every later reconfigure) the replica runs check_health() before it
  // reports ready, again every health_check_period_s while it fails; the
  // start fails after health_check_failure_threshold failed checks in a
  // row, or when one gives no answer within health_check_timeout_s.
  double health_check_timeout_s = 30.0;
  double health_check_period_s = 10.0;
  uint32_t health_check_failure_threshold = 3;
  BatchSettings batch;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReplicaSpec& x) {
  return f(caf::meta::type_name("troupe.ReplicaSpec"), x.replica_id, x.app, x.deployment,
           x.import_path, x.init_args, x.code_version, x.user_config, x.max_ongoing_requests,
           x.metrics_interval_s, x.isolation, x.memory_limit_bytes, x.stuck_after_s,
           x.max_num_models_per_replica, x.health_check_timeout_s, x.health_check_period_s,
           x.health_check_failure_threshold, x.batch);
}

// What an initialized replica reports about itself.
struct ReplicaMetadata {
  std::string replica_id;
  std::string node_id;
  int32_t pid = 0;
  std::string code_version;
  std::string user_config;
  double start_time = 0;  // seconds since the Unix epoch
  BatchSettings batch;    // what it batches with now
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReplicaMetadata& x) {
  return f(caf::meta::type_name("troupe.ReplicaMetadata"), x.replica_id, x.node_id, x.pid,
           x.code_version, x.user_config, x.start_time, x.batch);
}

// An HTTP request as a replica sees it: the path is relative to the
// application's route prefix.
struct HttpRequest {
  std::string method;
  std::string path;
  std::string query;
  HeaderList headers;
  std::string body;
  std::string request_id;
  // The time the request had left when it was sent, in seconds (0: no
  // deadline). Relative, not a point in time, so clocks of different hosts
  // need not agree; the replica's handle calls inherit what remains of it.
  double timeout_s = 0;
  // The sender's name for this attempt of the request, unique per proxy
  // (0: none): credits and cancellation name the request by it, and the
  // pieces of a streamed answer carry it.
  uint64_t call_key = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, HttpRequest& x) {
  return f(caf::meta::type_name("troupe.HttpRequest"), x.method, x.path, x.query, x.headers, x.body,
           x.request_id, x.timeout_s, x.call_key);
}

struct HttpResponse {
  int32_t status = 200;
  HeaderList headers;
  std::string body;
  // Not 0: the head of a streamed answer (the request's call_key); the body
  // follows as (chunk, key, seq, data) messages and ends with (chunk, key,
  // seq, complete, error), each of which the receiver acknowledges with
  // (credit, key, bytes) once it passed the bytes on (replica/streams.hpp).
  uint64_t stream = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, HttpResponse& x) {
  return f(caf::meta::type_name("troupe.HttpResponse"), x.status, x.headers, x.body, x.stream);
}

// -- the replica's interface -------------------------------------------------
// (Declared here, before the wire types that carry replica handles; the
// other actors' interfaces are at the end of this file.)

// What the controller, node agents, proxies and deployment handles send a
// replica (replica/replica_actor.hpp; the handle is an actor pool, see
// there). Failures answer with an error of category "troupe".
using ReplicaActor = caf::typed_actor<
    // Runs the constructor and reconfigure(user_config); idempotent.
    caf::replies_to<initialize_atom>::with<ReplicaMetadata>,
    // In place, no restart: the user_config (reconfigure() runs when it
    // differs from the replica's) and the batching.
    caf::replies_to<reconfigure_atom, std::string, BatchSettings>::with<ReplicaMetadata>,
    // An error: unhealthy.
    caf::replies_to<health_atom>::with<caf::ok_atom>,
    // What it runs now.
    caf::replies_to<version_atom>::with<ReplicaMetadata>,
    // errc::overloaded at max_ongoing_requests, errc::unavailable before init
    // or while stopping.
    caf::replies_to<handle_atom, HttpRequest>::with<HttpResponse>,
    // Room for `bytes` more of the streamed answer to request `key`.
    caf::reacts_to<credit_atom, uint64_t /*key*/, uint64_t /*bytes*/>,
    // Request `key` is cancelled: its client left, or (true) its deadline
    // passed.
    caf::reacts_to<cancel_atom, uint64_t /*key*/, bool /*deadline_passed*/>,
    // Stop accepting, finish what is in flight (at most timeout_s), exit.
    caf::replies_to<stop_atom, double>::with<caf::ok_atom>>;

// A replica's load, reported every metrics_interval_s by the replica to its
// node agent, and by the agent to the controller (autoscaling, `troupectl
// status`, the dashboard).
struct ReplicaLoad {
  std::string replica_id;
  double ongoing = 0;     // average requests in flight over the interval
  uint64_t finished = 0;  // requests finished since the replica started
  uint64_t errors = 0;    // of those, answered with a status >= 500 (exceptions included)
  uint32_t streams = 0;   // streamed answers in progress now
  double p99_s = -1;      // 99th percentile of handler time in the interval; < 0: none finished
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReplicaLoad& x) {
  return f(caf::meta::type_name("troupe.ReplicaLoad"), x.replica_id, x.ongoing, x.finished,
           x.errors, x.streams, x.p99_s);
}

// How a node agent health-checks a replica (node/health_checks.hpp): the
// deployment's health_check_period_s and health_check_timeout_s, the
// controller's failure threshold and the period's jitter.
struct HealthSettings {
  double period_s = 10.0;
  double timeout_s = 30.0;
  uint32_t threshold = 3;
  double jitter = 0.1;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, HealthSettings& x) {
  return f(caf::meta::type_name("troupe.HealthSettings"), x.period_s, x.timeout_s, x.threshold,
           x.jitter);
}

// A replica a node agent is to health-check, under the controller's watch
// id: an id new for the replica starts its counts afresh with a check at
// once; the same id again changes the settings.
struct HealthWatch {
  std::string replica_id;
  uint64_t watch = 0;
  HealthSettings settings;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, HealthWatch& x) {
  return f(caf::meta::type_name("troupe.HealthWatch"), x.replica_id, x.watch, x.settings);
}

// What a node agent's checks of one replica came to, since the controller
// watched it (`watch`): checks passed (counted up to the threshold), failed
// checks in a row, and what the last failure said ("" when none).
struct HealthReport {
  std::string replica_id;
  uint64_t watch = 0;
  uint32_t passed = 0;
  uint32_t failures = 0;
  std::string failure;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, HealthReport& x) {
  return f(caf::meta::type_name("troupe.HealthReport"), x.replica_id, x.watch, x.passed, x.failures,
           x.failure);
}

// A deployment's requests queued and in flight as one proxy (or handle)
// sees them: the signal of autoscaling (and of a cold start from zero).
struct DeploymentLoad {
  std::string app;
  std::string deployment;
  double queued_and_inflight = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DeploymentLoad& x) {
  return f(caf::meta::type_name("troupe.DeploymentLoad"), x.app, x.deployment,
           x.queued_and_inflight);
}

// The model ids a replica holds (ModelCache), numbered by the replica: a
// list with a lower seq than the one the controller has is stale.
struct ReplicaModels {
  std::string replica_id;
  uint64_t seq = 0;
  std::vector<std::string> model_ids;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReplicaModels& x) {
  return f(caf::meta::type_name("troupe.ReplicaModels"), x.replica_id, x.seq, x.model_ids);
}

// A replica a node agent hosts, as listed for a (recovering) controller.
struct HostedReplicaInfo {
  std::string replica_id;
  std::string app;
  std::string deployment;
  std::string code_version;
  std::string user_config;
  bool stopping = false;
  ReplicaActor handle;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, HostedReplicaInfo& x) {
  return f(caf::meta::type_name("troupe.HostedReplicaInfo"), x.replica_id, x.app, x.deployment,
           x.code_version, x.user_config, x.stopping, x.handle);
}
// An application's traffic split: (deployment, weight) pairs, sorted by
// deployment; the weights sum to 1. Also the argument of (traffic, ...).
using TrafficWeights = std::vector<std::pair<std::string, double>>;

struct RouteEntry {
  std::string prefix;
  std::string app;
  std::string ingress;  // deployment that receives the application's requests
  // The traffic split; empty: everything to `ingress`.
  TrafficWeights traffic = {};
  // With a split: the header whose value picks the deployment; "": random.
  std::string traffic_key_header = {};
  // Shadow traffic: (deployment, probability) pairs sorted by deployment;
  // each gets a copy of a request with its probability. Empty: no copies.
  TrafficWeights shadow = {};
  // The application is also served by the Open Inference Protocol
  // (ApplicationSpec::open_inference): /v2/models/<app>/... and
  // inference.GRPCInferenceService.
  bool open_inference = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RouteEntry& x) {
  return f(caf::meta::type_name("troupe.RouteEntry"), x.prefix, x.app, x.ingress, x.traffic,
           x.traffic_key_header, x.shadow, x.open_inference);
}

struct ReplicaEndpoint {
  std::string replica_id;
  std::string node_id;
  uint32_t max_ongoing_requests = 0;
  ReplicaActor handle;
  // Model multiplexing: the models the replica reported holding, and the
  // number of that report (the replica's, grows with every change; 0: none
  // yet). A router keeps the newer of this and what the replica's answers
  // told it (runtime/multiplex.hpp).
  std::vector<std::string> model_ids = {};
  uint64_t model_ids_seq = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReplicaEndpoint& x) {
  return f(caf::meta::type_name("troupe.ReplicaEndpoint"), x.replica_id, x.node_id,
           x.max_ongoing_requests, x.handle, x.model_ids, x.model_ids_seq);
}

struct DeploymentEndpoints {
  std::string app;
  std::string deployment;
  std::vector<ReplicaEndpoint> replicas;  // RUNNING ones, sorted by id
  int32_t max_queued_requests = -1;       // per router; -1: no limit
  // Only in a delta: `replicas` are those that came or changed and
  // `removed_replicas` the ids of those that left; the rest of the
  // subscriber's set stays. Otherwise `replicas` is the whole set.
  bool partial = false;
  std::vector<std::string> removed_replicas = {};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DeploymentEndpoints& x) {
  return f(caf::meta::type_name("troupe.DeploymentEndpoints"), x.app, x.deployment, x.replicas,
           x.max_queued_requests, x.partial, x.removed_replicas);
}

// A versioned view of the data path: see controller/core/snapshot.hpp for
// how a subscriber applies it (full replacement or delta; `withheld`
// deployments are recovering and keep their previous replica set).
// Where a worker's peer listener is (NodeInfo::peer_port).
struct PeerEndpoint {
  std::string node_id;
  std::string host;
  uint16_t port = 0;
  friend bool operator==(const PeerEndpoint& a, const PeerEndpoint& b) {
    return a.node_id == b.node_id && a.host == b.host && a.port == b.port;
  }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PeerEndpoint& x) {
  return f(caf::meta::type_name("troupe.PeerEndpoint"), x.node_id, x.host, x.port);
}

// The bytes of one RoutingSnapshot as CAF's binary serializer writes them,
// made by the first send that serializes the snapshot and copied by every
// other (runtime/wire.cpp). The controller pushes one snapshot to many
// proxies, and CAF serializes a message once per connection it leaves on:
// this makes that a copy of bytes instead of a walk over every replica.
class SnapshotEncoding;

// How many snapshots this process serialized through a SnapshotEncoding, and
// how many sends copied such bytes instead of serializing again.
struct SnapshotEncodingCounts {
  uint64_t serialized = 0;
  uint64_t copied = 0;
};
SnapshotEncodingCounts snapshot_encoding_counts();

// A RoutingSnapshot's SnapshotEncoding, which belongs to that one object: a
// copy or an assignment starts without one (its content may then change),
// and none is ever on the wire.
struct EncodingSlot {
  std::shared_ptr<SnapshotEncoding> encoding;
  EncodingSlot() = default;
  EncodingSlot(const EncodingSlot&) noexcept {}
  EncodingSlot& operator=(const EncodingSlot&) noexcept {
    encoding.reset();
    return *this;
  }
};

struct RoutingSnapshot {
  uint64_t epoch = 0;
  uint64_t seq = 0;
  bool full = false;
  bool routes_changed = false;
  std::vector<RouteEntry> routes;
  std::vector<DeploymentEndpoints> deployments;
  HeaderList removed;            // (app, deployment) pairs
  HeaderList withheld;           // (app, deployment) pairs
  double request_timeout_s = 0;  // from the deployed http_options; 0: none
  // Every node the controller holds DEAD when it sends this (a frozen or lost
  // peer). Their replicas are gone from the deployments; requests a
  // subscriber still has in flight on them will never be answered, so it
  // fails them over to other replicas instead of waiting for its timeout.
  // (A replica that merely left the set, e.g. stopping gracefully, still
  // answers what it took.)
  std::vector<std::string> dead_nodes;
  // Every node an operator drained (`troupectl drain`), in every snapshot:
  // its proxy reports itself not ready (/-/readyz 503), so that a load
  // balancer in front of the nodes stops sending it traffic.
  std::vector<std::string> draining_nodes;
  // From the deployed http_options: the proxy's idle timeout for keep-alive
  // connections between requests; 0: none declared (the node's own).
  double keep_alive_timeout_s = 0;
  // The peer listeners of the nodes that host a replica of `deployments`
  // (those that have one): a subscriber connects to them directly, so that
  // its requests to their replicas do not pass through the head.
  std::vector<PeerEndpoint> peers;
  // Set (share_encoding) on a snapshot that is sent to many subscribers
  // unchanged; empty: serialized field by field like any other value.
  EncodingSlot wire;
};

template <class Inspector>
typename Inspector::result_type inspect_fields(Inspector& f, RoutingSnapshot& x) {
  return f(caf::meta::type_name("troupe.RoutingSnapshot"), x.epoch, x.seq, x.full, x.routes_changed,
           x.routes, x.deployments, x.removed, x.withheld, x.request_timeout_s, x.dead_nodes,
           x.draining_nodes, x.keep_alive_timeout_s, x.peers);
}

// Reading, printing, and serializing a snapshot without an encoding.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RoutingSnapshot& x) {
  return inspect_fields(f, x);
}

// Serializing (a message's element on its way to another process): with an
// encoding, the bytes the first such call made, written as they are; they
// are what inspect_fields writes, so the receiving side reads them as usual.
caf::error inspect(caf::serializer& f, RoutingSnapshot& x);

// Gives `x` an encoding of its own: from now on it must not change while
// any send of it may still be serialized (it is const in a caf::message).
void share_encoding(RoutingSnapshot& x);

// Proof of who sends a write request (see runtime/security/credentials.hpp):
// the caller's certificate and its signature over the request. Empty when
// the cluster runs without TLS.
struct Credential {
  std::string certificate_pem;
  int64_t timestamp = 0;
  std::string signature;
  bool empty() const { return certificate_pem.empty(); }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Credential& x) {
  return f(caf::meta::type_name("troupe.Credential"), x.certificate_pem, x.timestamp, x.signature);
}

// -- actor interfaces ----------------------------------------------------------
// Every message that crosses between troupe's actors, checked by the
// compiler at both ends: a handler whose arguments or answer differ from
// these does not build, nor does a request for a message the receiver does
// not take. (ReplicaActor is declared above, before the types that carry
// its handle.) An actor's messages to itself (timers, deadlines) are not
// part of its interface: its implementation extends the interface with them
// in its own file.
//
// Handles of remote actors arrive untyped (CAF's connect) and are cast to
// these after the hello handshake (runtime/address.hpp): CAF's typed
// remote_actor would refuse a peer of another version before the handshake
// could say so.

// Where replicas send their metrics (the node agent's keeper): every
// metrics_interval_s the replica's load (ReplicaLoad).
// And the models it holds, when they change (rate-limited) and with every
// metrics report: (models, replica_id, seq, model ids).
// A replica process also sends its whole metrics registry with every report
// (runtime/metrics.hpp, encode()), which its node serves at /-/metrics.
using MetricsSinkActor = caf::typed_actor<
    caf::reacts_to<metrics_atom, ReplicaLoad>,
    caf::reacts_to<metrics_atom, std::string /*replica_id*/, std::string /*registry*/>,
    caf::reacts_to<models_atom, std::string /*replica_id*/, uint64_t, std::vector<std::string>>>;

// Whoever takes a deployment handle's call from another process (a proxy
// or, usually, its keeper; replica/handle_transport.hpp): (app, deployment,
// request, timeout_s) -> the answer, the proxy's error answers included.
using HandleCallActor = caf::typed_actor<
    caf::replies_to<call_atom, std::string, std::string, HttpRequest, double>::with<HttpResponse>,
    // The same with the answer streamed when the callee streams it (true):
    // the head is the response (HttpResponse::stream), the pieces follow as
    // (chunk, ...) messages from the proxy's io thread, which takes (credit,
    // key, bytes) and (cancel, key) from the caller.
    caf::replies_to<call_atom, std::string, std::string, HttpRequest, double,
                    bool>::with<HttpResponse>,
    // The caller gave up on its call whose HttpRequest::call_key was `key`
    // (the request that made it was cancelled, or a stream's reader left).
    caf::reacts_to<cancel_atom, uint64_t>>;

// A node's HTTP proxy actor (proxy/proxy.hpp), as the controller sees it.
using ProxyActor = HandleCallActor::extend<
    // The route table and replica sets, full or a delta (see RoutingSnapshot),
    // answered once applied: the controller sends a subscriber its next
    // snapshot only then (one push in flight per subscriber).
    caf::replies_to<snapshot_atom, RoutingSnapshot>::with<caf::ok_atom>,
    // Healthy while every io thread runs.
    caf::replies_to<health_atom>::with<caf::ok_atom>>;

// A worker's peer actor, published on its peer port (NodeInfo::peer_port):
// what another worker connecting there gets. It answers the node's id, so
// that the connecting side knows it reached the node it meant; the
// connection it rides on is what matters (CAF routes messages to the node's
// actors over it instead of through the head).
// It also answers where this worker's data port is (proxy/peer_server.cpp):
// its port (0: none, as with TLS) and the token a connection must present
// there, so only a member of the cluster that reached this actor can.
using data_port_atom = caf::atom_constant<caf::atom("dataport")>;
using PeerActor =
    caf::typed_actor<caf::replies_to<hello_atom>::with<std::string>,
                     caf::replies_to<data_port_atom>::with<uint16_t, std::string>>;

// A node agent (node/node_agent.hpp), as the controller sees it.
using AgentActor = caf::typed_actor<
    // Spawns the replica (not yet initialized); idempotent per id.
    caf::replies_to<spawn_replica_atom, ReplicaSpec>::with<ReplicaActor>,
    caf::replies_to<list_replicas_atom>::with<std::vector<HostedReplicaInfo>>,
    // Graceful stop (replica_id, timeout_s); the agent kills the replica
    // after the timeout, even if the controller is gone.
    caf::replies_to<stop_atom, std::string, double>::with<caf::ok_atom>,
    // Terminate at once.
    caf::replies_to<kill_replica_atom, std::string>::with<caf::ok_atom>,
    // Health-check replicas this node hosts (HealthWatch), those of one
    // reconcile in one message. The agent sends what changed (health,
    // below).
    caf::reacts_to<health_atom, std::vector<HealthWatch>>,
    // `troupectl shutdown --nodes`: stop the node process.
    caf::reacts_to<stop_node_atom>,
    // The log of a replica this node runs or ran (replica id, offset: where
    // the last read ended, or UINT64_MAX for the last `tail` lines) ->
    // (whole lines, the offset to read on from); errc::not_found when this
    // node has none (node/replica_logs.hpp).
    caf::replies_to<logs_atom, std::string, uint64_t, uint32_t>::with<std::string, uint64_t>,
    // A deployment library in this node's cache (sha256) -> its size, 0:
    // none; (sha256, offset) -> up to libraries::kChunkBytes of it. A
    // controller that cannot serve a pinned library (a new leader of highly
    // available heads: it was uploaded to another head) takes it back so.
    caf::replies_to<library_atom, std::string>::with<uint64_t>,
    caf::replies_to<library_atom, std::string, uint64_t>::with<std::string>>;

// The controller (controller/controller_actor.hpp). Write requests end with
// a Credential, checked when the cluster runs with TLS.
using ControllerActor = caf::typed_actor<
    // (version) -> (hello, the controller's version, "controller"), or
    // errc::version_mismatch.
    caf::replies_to<hello_atom, uint32_t>::with<hello_atom, uint32_t, std::string>,
    // A node agent registers with the replicas it hosts -> its incarnation.
    // The agent's handle travels untyped (an AgentActor): like hello, this
    // handshake uses only types every version decodes, so a controller
    // refuses an agent of another version by the version in its NodeInfo.
    caf::replies_to<register_atom, NodeInfo, caf::actor, std::vector<HostedReplicaInfo>,
                    Credential>::with<uint64_t>,
    // A node agent's heartbeat, carrying the load reports its replicas made
    // since the last one (node/replica_reports.hpp): one message per node
    // per interval, however many replicas it hosts.
    caf::replies_to<heartbeat_atom, std::string /*node_id*/, std::vector<ReplicaLoad>,
                    Credential>::with<caf::ok_atom>,
    caf::replies_to<deregister_atom, std::string /*node_id*/, Credential>::with<caf::ok_atom>,
    caf::replies_to<nodes_atom>::with<std::vector<NodeStatus>>,
    caf::replies_to<drain_atom, std::string /*node_id*/, Credential>::with<caf::ok_atom>,
    // A node that is stopping (SIGTERM): DRAINING at once; answered when its
    // replicas run elsewhere, or cannot move (no node has room), with what
    // happened in a sentence.
    caf::replies_to<leave_atom, std::string /*node_id*/, Credential>::with<std::string>,
    // One application (a Cap'n Proto record) -> (changed, generation).
    caf::replies_to<deploy_atom, std::string, Credential>::with<bool, uint64_t>,
    // Declarative: exactly these applications and http settings (a Cap'n
    // Proto TargetState record), one commit -> a JSON summary.
    caf::replies_to<apply_atom, std::string, Credential>::with<std::string>,
    // The deployed target state (a Cap'n Proto record).
    caf::replies_to<config_atom>::with<std::string>,
    // Declarative with optimistic concurrency (deploy --if-generation):
    // refused, naming the current generation, unless it is `if_generation`.
    caf::replies_to<apply_atom, std::string, uint64_t /*if_generation*/,
                    Credential>::with<std::string>,
    caf::replies_to<delete_atom, std::string /*app*/, Credential>::with<caf::ok_atom>,
    // One deployment (not the ingress, not one that carries traffic weight).
    caf::replies_to<delete_atom, std::string /*app*/, std::string /*deployment*/,
                    Credential>::with<caf::ok_atom>,
    // One deployment's replica count -> (changed, generation); refused for an
    // autoscaled deployment.
    caf::replies_to<scale_atom, std::string, std::string, uint32_t, Credential>::with<bool,
                                                                                      uint64_t>,
    // Replaces an application's traffic split; pushed to proxies at once ->
    // the new generation.
    caf::replies_to<traffic_atom, std::string, TrafficWeights, Credential>::with<uint64_t>,
    // Deletes every application; `nodes`: then stops every node process.
    caf::replies_to<shutdown_atom, bool /*nodes*/, Credential>::with<caf::ok_atom>,
    // The chaos primitive: an exit(kill) to a replica, agent, proxy or the
    // controller (kind, id).
    caf::replies_to<kill_atom, std::string, std::string, Credential>::with<caf::ok_atom>,
    // JSON, see docs/architecture.md.
    caf::replies_to<status_atom>::with<std::string>,
    // Who leads: {"node_id", "name", "address", "term", "since_unix_ms",
    // "ha"} (docs/architecture.md, "High availability"); a head candidate
    // that does not lead answers the same question with "leading": false.
    caf::replies_to<leader_atom>::with<std::string>,
    // A replica's log (replica id, offset, tail) -> (whole lines, the offset
    // to read on from), asked of the node that has it; see AgentActor.
    caf::replies_to<logs_atom, std::string, uint64_t, uint32_t>::with<std::string, uint64_t>,
    // A deployment library (sha256) -> its size; 0: the controller has none.
    caf::replies_to<library_atom, std::string>::with<uint64_t>,
    // (sha256, offset) -> up to libraries::kChunkBytes of it from offset.
    caf::replies_to<library_atom, std::string, uint64_t>::with<std::string>,
    // A piece of a library troupectl uploads (sha256, total size, offset,
    // bytes); pieces come in order from offset 0 -> the bytes received so
    // far. The library is kept once the last piece is in and its content
    // hashes to sha256.
    caf::replies_to<upload_atom, std::string, uint64_t, uint64_t, std::string,
                    Credential>::with<uint64_t>,
    // Pull: what changed since (epoch, seq).
    caf::replies_to<snapshot_atom, uint64_t, uint64_t>::with<RoutingSnapshot>,
    // Push: a proxy (holding epoch, seq) of a node gets every change.
    caf::reacts_to<subscribe_atom, ProxyActor, uint64_t, uint64_t, std::string /*node_id*/>,
    // The same from a proxy that lost its direct connection to `lost_node`
    // (its handles of that node's actors died with it): every change, and
    // that node's replicas again, reached through the head.
    caf::reacts_to<subscribe_atom, ProxyActor, uint64_t, uint64_t, std::string /*node_id*/,
                   std::string /*lost_node*/>,
    // The head's dashboard: ControllerLogic::dashboard()'s JSON.
    caf::replies_to<dashboard_atom>::with<std::string>,
    // From proxies: (reporter, every deployment's queued + in flight), one
    // message per proxy per second however many deployments it routes.
    caf::reacts_to<metrics_atom, std::string, std::vector<DeploymentLoad>>,
    // From node agents: (node, the health reports of its replicas that
    // changed; all of them after each registration).
    caf::reacts_to<health_atom, std::string, std::vector<HealthReport>>,
    // From node agents: (node, the model lists of its replicas that changed
    // within a short window), one message for all of them.
    caf::reacts_to<models_atom, std::string, std::vector<ReplicaModels>>>;

// The keeper of a node's proxy (proxy/proxy.hpp): the handle that stays
// valid across restarts of the proxy actor, held by the node agent and by
// replica processes for their deployment handles.
using ProxyKeeperActor = HandleCallActor::extend<
    // After each registration of the node: subscribe the current proxy actor.
    caf::reacts_to<subscribe_atom, ControllerActor>>;

// What a replica process sends its node (node/replica_gate.hpp), with the
// one-time secret the agent gave it: what to run, and that it is ready.
using ReplicaGateActor = caf::typed_actor<
    caf::replies_to<replica_hello_atom, std::string /*replica_id*/, std::string /*secret*/>::with<
        ReplicaSpec, MetricsSinkActor, ProxyKeeperActor>,
    caf::replies_to<replica_attach_atom, std::string, std::string, ReplicaActor>::with<caf::ok_atom>>;

// What a node's own parts send its agent, through the agent's keeper
// (node/node_agent.hpp), which forwards it to the current agent: the gate's
// calls, the replicas' metrics and exits, the shutdown.
using AgentLocalActor = ReplicaGateActor::extend_with<MetricsSinkActor>::extend<
    // Stops every replica gracefully (grace_s), then deregisters.
    caf::replies_to<shutdown_atom, double>::with<caf::ok_atom>,
    // The node is stopping: the controller moves its replicas to other nodes
    // (waiting at most budget_s) -> what happened, in a sentence.
    caf::replies_to<leave_atom, double /*budget_s*/>::with<std::string>,
    // From the process supervisor: (replica_id, pid, cause, clean).
    caf::reacts_to<replica_exit_atom, std::string, int32_t, std::string, bool>>;

// The keeper of a node agent, as the node process sees it.
using AgentKeeperActor =
    AgentLocalActor::extend<caf::replies_to<caf::get_atom>::with<AgentActor>>;  // current agent

// Registers every type above with CAF, and sets the app identifier. Call once
// on every actor_system_config before the system starts.
void register_wire_types(caf::actor_system_config& cfg);

// -- errors across the wire --------------------------------------------------

// troupe::Status travels as a caf::error of this category; the code is the
// errc value and the context holds the message.
constexpr caf::atom_value kErrorCategory = caf::atom("troupe");

caf::error to_caf_error(const Status& status);
// Maps any caf::error (ours, or CAF's own such as request_timeout) to a Status
// a user can read.
Status from_caf_error(const caf::error& err);

}  // namespace troupe
