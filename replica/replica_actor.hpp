// A replica: one running instance of a user's deployment class.
//
// The replica actor (scheduled, never blocks) owns the lifecycle; user code
// runs only on the replica's own detached actors — one control thread
// (constructor, reconfigure, check_health) and max_ongoing_requests request
// threads — so a slow or blocking handler never delays the controller, the
// proxy, node heartbeats or another replica's health check, and a long
// request never delays this replica's own health check.
//
// spawn_replica() returns the replica's handle: a CAF actor pool whose
// dispatch runs in the sender's context. (With a data channel, see
// ReplicaOptions::channel, a request over CAF is queued into the channel
// instead, and taken by whichever request thread is idle.) A request goes straight to an idle
// request thread (admission: at most max_ongoing_requests, claimed with
// atomics) and its answer straight back to the sender; every other message
// goes to the replica actor. An exit sent to the handle reaches the replica
// actor, and the handle exits with it, with the replica actor's own exit
// reason (user_shutdown after a stop: the proxies tell it from a crash).
//
// Its interface is ReplicaActor (runtime/wire.hpp): init (runs the
// constructor and reconfigure(user_config); idempotent), reconfig (in place),
// health (fails with "stuck: ..." when every request thread has been busy
// for spec.stuck_after_s with none finished; else the user's check_health()),
// version, handle (errc::overloaded at max_ongoing_requests,
// errc::unavailable before init or while stopping) and stop (finish what is
// in flight, at most timeout_s, then exit).
// Every metrics_interval_s it sends (metrics, string replica_id, double
// average ongoing requests over the interval) to its metrics sink
// (MetricsSinkActor), and, once its ModelCache reported anything, (models,
// replica_id, seq, ids): with every metrics report (a restarted controller
// learns them again) and whenever they change, at most every
// ModelReport::kMinReportGap (10 ms).
#pragma once

#include <memory>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "runtime/wire.hpp"

namespace troupe {
class HandleTransport;
class PluginLoader;
namespace channel {
class ReplicaEnd;
}
namespace local {
class LocalReplicas;
}
namespace metrics {
class Registry;
}
}

namespace troupe::replica {

class ModelReport;
class ReplicaMetrics;

struct ReplicaOptions {
  ReplicaSpec spec;
  std::string node_id;
  std::shared_ptr<PluginLoader> loader;
  MetricsSinkActor metrics_sink;  // the node agent's keeper; may be empty
  // ReplicaContext::handles: deployment handles of the user's code (calls go
  // through this node's proxy). May be empty: every handle call answers 503.
  std::shared_ptr<const HandleTransport> handles;
  // A replica process's end of its data channel (runtime/data_channel.hpp):
  // then its max_ongoing_requests request threads are plain threads that
  // take requests from the channel (those that come over CAF are queued
  // into it too), instead of CAF detached actors. Empty: CAF only.
  std::shared_ptr<channel::ReplicaEnd> channel;
  // ReplicaContext::models (model multiplexing). Set by spawn_replica when
  // empty.
  std::shared_ptr<ModelReport> models;
  // An in-process replica (no channel) whose instance declares its handler
  // non-blocking (Deployment::nonblocking()) registers itself here once
  // built, so that the node's proxy calls it inline, and is closed and
  // removed when the replica actor exits (runtime/local_replicas.hpp). May be
  // empty.
  std::shared_ptr<local::LocalReplicas> local_replicas;
  // The registry of this process, where the replica's metrics go
  // (replica/replica_metrics.hpp). Empty: a registry of the replica's own.
  std::shared_ptr<metrics::Registry> registry;
  // A replica process's: send the whole registry (metrics::Registry::encode)
  // to the metrics sink every registry_interval_s, for the node to serve.
  bool report_registry = false;
  double registry_interval_s = 1.0;
  // An in-process replica's own log file (<state-dir>/logs/replicas/<id>.log,
  // where a replica process's output goes): its ctx.log() lines are written
  // there too, besides its node's log, for `troupectl logs`, also after it
  // ended. Empty: its node's log only (a replica process, whose output file
  // has them already).
  std::string log_file;
  // Set by spawn_replica: the replica's metrics in `registry`.
  std::shared_ptr<ReplicaMetrics> replica_metrics;
};

ReplicaActor spawn_replica(caf::actor_system& sys, ReplicaOptions options);

}  // namespace troupe::replica
