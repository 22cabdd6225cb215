// Every atom and message type that crosses the wire between troupe processes,
// registered in one place (register_wire_types) shared by every binary.
//
// Compatibility rule: the handshake messages (hello, register) carry
// kProtocolVersion using only built-in types, so two binaries of different
// versions can always decode them and refuse each other with a clear message
// instead of CAF silently dropping messages of unknown types.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>

#include "runtime/status.hpp"

namespace caf {
class actor_system_config;
}

namespace troupe {

// Bump on any change of a wire type or of a message's meaning.
constexpr uint32_t kProtocolVersion = 5;
// CAF's BASP handshake identifier; equal on every node of a cluster.
constexpr const char* kAppIdentifier = "troupe";

// -- atoms (at most 10 characters) -------------------------------------------
using hello_atom = caf::atom_constant<caf::atom("hello")>;
using register_atom = caf::atom_constant<caf::atom("register")>;
using deregister_atom = caf::atom_constant<caf::atom("deregister")>;
using heartbeat_atom = caf::atom_constant<caf::atom("heartbeat")>;
using nodes_atom = caf::atom_constant<caf::atom("nodes")>;
using drain_atom = caf::atom_constant<caf::atom("drain")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using reconnect_atom = caf::atom_constant<caf::atom("reconnect")>;
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

// -- wire types --------------------------------------------------------------

// What a node agent tells the controller about itself when registering.
struct NodeInfo {
  std::string id;
  std::string host;        // address the node's services bind to
  uint16_t http_port = 0;  // where the node's HTTP proxy serves
  std::string resources;   // canonical text form, see parse_resources
  int32_t pid = 0;
  uint32_t protocol_version = kProtocolVersion;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, NodeInfo& x) {
  return f(caf::meta::type_name("troupe.NodeInfo"), x.id, x.host, x.http_port, x.resources, x.pid,
           x.protocol_version);
}

// One row of `troupectl nodes`.
struct NodeStatus {
  std::string id;
  std::string address;  // host:http_port
  std::string state;    // ALIVE, DRAINING or DEAD
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
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReplicaSpec& x) {
  return f(caf::meta::type_name("troupe.ReplicaSpec"), x.replica_id, x.app, x.deployment,
           x.import_path, x.init_args, x.code_version, x.user_config, x.max_ongoing_requests,
           x.metrics_interval_s, x.isolation, x.memory_limit_bytes);
}

// What an initialized replica reports about itself.
struct ReplicaMetadata {
  std::string replica_id;
  std::string node_id;
  int32_t pid = 0;
  std::string code_version;
  std::string user_config;
  double start_time = 0;  // seconds since the Unix epoch
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReplicaMetadata& x) {
  return f(caf::meta::type_name("troupe.ReplicaMetadata"), x.replica_id, x.node_id, x.pid,
           x.code_version, x.user_config, x.start_time);
}

// A replica a node agent hosts, as listed for a (recovering) controller.
struct HostedReplicaInfo {
  std::string replica_id;
  std::string app;
  std::string deployment;
  std::string code_version;
  std::string user_config;
  bool stopping = false;
  caf::actor handle;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, HostedReplicaInfo& x) {
  return f(caf::meta::type_name("troupe.HostedReplicaInfo"), x.replica_id, x.app, x.deployment,
           x.code_version, x.user_config, x.stopping, x.handle);
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
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, HttpRequest& x) {
  return f(caf::meta::type_name("troupe.HttpRequest"), x.method, x.path, x.query, x.headers, x.body,
           x.request_id);
}

struct HttpResponse {
  int32_t status = 200;
  HeaderList headers;
  std::string body;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, HttpResponse& x) {
  return f(caf::meta::type_name("troupe.HttpResponse"), x.status, x.headers, x.body);
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
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RouteEntry& x) {
  return f(caf::meta::type_name("troupe.RouteEntry"), x.prefix, x.app, x.ingress, x.traffic,
           x.traffic_key_header);
}

struct ReplicaEndpoint {
  std::string replica_id;
  std::string node_id;
  uint32_t max_ongoing_requests = 0;
  caf::actor handle;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ReplicaEndpoint& x) {
  return f(caf::meta::type_name("troupe.ReplicaEndpoint"), x.replica_id, x.node_id,
           x.max_ongoing_requests, x.handle);
}

struct DeploymentEndpoints {
  std::string app;
  std::string deployment;
  std::vector<ReplicaEndpoint> replicas;  // RUNNING ones, sorted by id
  int32_t max_queued_requests = -1;       // per router; -1: no limit
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, DeploymentEndpoints& x) {
  return f(caf::meta::type_name("troupe.DeploymentEndpoints"), x.app, x.deployment, x.replicas,
           x.max_queued_requests);
}

// A versioned view of the data path: see controller/core/snapshot.hpp for
// how a subscriber applies it (full replacement or delta; `withheld`
// deployments are recovering and keep their previous replica set).
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
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RoutingSnapshot& x) {
  return f(caf::meta::type_name("troupe.RoutingSnapshot"), x.epoch, x.seq, x.full, x.routes_changed,
           x.routes, x.deployments, x.removed, x.withheld, x.request_timeout_s, x.dead_nodes);
}

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
