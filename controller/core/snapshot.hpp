// The versioned view that the controller publishes to proxies and handles:
// the route table and the RUNNING replicas of every deployment.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "controller/core/deployment_status.hpp"

namespace troupe::controller {

// Snapshot ids increase by one with every tick that changed the published
// view. `epoch` names the controller incarnation that issued them.
struct SnapshotId {
  uint64_t epoch = 0;
  uint64_t seq = 0;  // 0: "I have nothing"

  friend bool operator==(const SnapshotId& a, const SnapshotId& b) {
    return a.epoch == b.epoch && a.seq == b.seq;
  }
  friend bool operator!=(const SnapshotId& a, const SnapshotId& b) { return !(a == b); }
};

struct Route {
  std::string prefix;
  std::string app;
  std::string ingress;  // deployment name
  // The application's traffic split (ApplicationSpec::traffic); empty:
  // everything to the ingress.
  std::map<std::string, double> traffic = {};
  std::string traffic_key_header = {};
  // The application's shadow deployments and their probabilities
  // (ApplicationSpec::shadow); empty: no copies.
  std::map<std::string, double> shadow = {};
  // Also served by the Open Inference Protocol
  // (ApplicationSpec::open_inference).
  bool open_inference = false;

  friend bool operator==(const Route& a, const Route& b) {
    return a.prefix == b.prefix && a.app == b.app && a.ingress == b.ingress &&
           a.traffic == b.traffic && a.traffic_key_header == b.traffic_key_header &&
           a.shadow == b.shadow && a.open_inference == b.open_inference;
  }
};

struct RunningReplicaInfo {
  std::string replica_id;
  std::string node_id;
  uint32_t max_ongoing_requests = 0;
  // Model multiplexing: the models it reported holding, and the replica's
  // number of that report (0: none). A change is a change of the set: it is
  // pushed as a delta like a replica that came or went.
  std::vector<std::string> model_ids = {};
  uint64_t model_ids_seq = 0;

  friend bool operator==(const RunningReplicaInfo& a, const RunningReplicaInfo& b) {
    return a.replica_id == b.replica_id && a.node_id == b.node_id &&
           a.max_ongoing_requests == b.max_ongoing_requests && a.model_ids == b.model_ids &&
           a.model_ids_seq == b.model_ids_seq;
  }
};

struct DeploymentReplicas {
  DeploymentId id;
  std::vector<RunningReplicaInfo> replicas;  // sorted by replica id
  // A delta of the set (only in a delta snapshot): `replicas` are the ones
  // that came or changed, `removed_replicas` the ids of those that left;
  // the others are unchanged. Otherwise `replicas` is the whole set.
  bool partial = false;
  std::vector<std::string> removed_replicas = {};
};

// What changed since the id the subscriber presented.
//
//   full == false: apply as a delta. `routes` is meaningful only when
//     routes_changed (it is then the whole table); every deployment in
//     `deployments` replaces the subscriber's set, or, when `partial`, changes
//     it replica by replica (so that a change to one replica costs the same
//     bytes however many replicas the deployment has); those in `removed`
//     are gone; anything not mentioned is unchanged.
//   full == true (unknown epoch, seq 0, or a seq from the future): the
//     subscriber replaces its routes and its deployments with these, except
//     the deployments listed in `withheld`: they are still recovering after a
//     controller restart, and the subscriber keeps what it has for them (this
//     is how an empty set is never pushed during recovery).
struct SnapshotDelta {
  SnapshotId id;  // the subscriber's new "last snapshot id"
  bool full = false;
  bool routes_changed = false;
  std::vector<Route> routes;  // sorted by prefix
  std::vector<DeploymentReplicas> deployments;
  std::vector<DeploymentId> removed;
  std::vector<DeploymentId> withheld;
};

}  // namespace troupe::controller
