// The node agent: one per troupe-node process. It registers the node with the
// controller (sending its own handle and the replicas it hosts), heartbeats,
// reconnects with exponential backoff whenever the controller goes away, and
// spawns, lists and stops the replicas of its node.
//
// Its interface is AgentActor (runtime/wire.hpp): spawnrep (spawns a replica,
// not yet initialized; idempotent per id), listrep, stop (graceful, the agent
// kills the replica after the timeout even if the controller is gone),
// killrep and stopnode. What the node's own parts send it goes through its
// keeper (AgentLocalActor): the gate's calls, the replicas' metrics
// (forwarded to the controller with the node id), their processes' exits and
// the shutdown (stops every replica gracefully, then deregisters).
//
// Replicas of `isolation: process` run in troupe-replica processes that the
// agent starts through its ProcessSupervisor. Such a process connects to the
// node's replica gate (node/replica_gate.hpp) on loopback and, with the
// one-time secret the agent wrote to its stdin, asks what to run (rephello)
// and says that its replica actor is ready (repattach). Everyone else holds
// a handle the agent makes in this process for it: an actor pool that
// forwards every message to the remote replica actor in the sender's context (no extra hop; answers go straight back). The supervisor
// reports the process's exit at once (pidfd); the agent then ends that handle
// with an error naming the cause ("replica X exited: killed by SIGSEGV"), so
// the controller and every proxy see the replica go down with that reason.
#pragma once

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/address.hpp"
#include "runtime/keeper.hpp"
#include "runtime/security/credentials.hpp"
#include "runtime/wire.hpp"

namespace troupe {

// Where a head node's agent gets the controller of its own process (the head
// supervisor, node/head_supervisor.hpp): the current one, or an error while
// none runs.
using ControllerSourceActor =
    caf::typed_actor<caf::replies_to<caf::get_atom>::with<ControllerActor>>;

namespace node {
class ProcessSupervisor;
}
namespace metrics {
class Registry;
}
namespace channel {
class Registry;
}

class HandleTransport;
class PluginLoader;

struct AgentOptions {
  NodeInfo info;
  // Exactly one of: the head's controller supervisor in this process (asked
  // for the current controller with `get`), or where the controller is
  // published (worker node): the head, or the head candidates of a highly
  // available cluster, tried in turn until the leader is found
  // (runtime/head_list.hpp).
  ControllerSourceActor local_supervisor;
  std::vector<Endpoint> controller_endpoints;
  double heartbeat_interval_s = 1.0;
  double request_timeout_s = 2.0;
  double initial_backoff_s = 0.1;
  // Attempts to reach a controller that is gone stay at most ~1 s apart
  // (+-20 % jitter): a head back after a long outage sees every node again
  // within its recovery window (3 s by default), so the restarted controller
  // adopts their replicas instead of starting new ones (a TCP connect per
  // node per second costs a down head nothing).
  double max_backoff_s = 1.0;
  // Resolves import paths for the replicas of this node.
  std::shared_ptr<PluginLoader> loader;
  // The keeper of this node's HTTP proxy (may be empty). Every time the node
  // registers, the agent sends it (subscribe, controller), and the keeper
  // subscribes the current proxy actor, so the proxy gets a full snapshot
  // after every controller restart, also after a restart of the proxy actor.
  ProxyKeeperActor proxy;
  // With TLS: this node's certificate, to sign register/heartbeat/deregister.
  std::optional<security::Identity> identity;
  // Given to every replica for its deployment handles (through this node's
  // proxy, see replica/handle_transport.hpp). May be empty.
  std::shared_ptr<const HandleTransport> handles;

  // Replica processes (`isolation: process`, the default). Without a
  // supervisor such replicas are refused (never silently run in process).
  std::shared_ptr<node::ProcessSupervisor> processes;
  std::string replica_binary;  // the troupe-replica executable
  // The user they run as (node/replica_user.hpp); -1: the node's own.
  int64_t replica_uid = -1;
  int64_t replica_gid = -1;
  std::vector<std::string> plugin_path;  // handed to replica processes
  // Pinned libraries (runtime/libraries.hpp): fetched into this directory
  // before a replica that needs one starts; handed to replica processes.
  std::string library_cache;
  // Cached libraries no replica of the node uses are removed once they are
  // this old, looked for at this interval.
  double library_cache_retention_s = 3600;
  double library_cache_prune_interval_s = 600;
  std::string log_level = "info";
  std::string log_format = "text";
  // A replica process that has not attached by then is killed and its start
  // fails (it hangs before running any user code).
  double attach_timeout_s = 30;
  // A replica process whose connection to this node was lost while both run
  // (this node frozen past its BASP connection timeout, say) connects again
  // and attaches its replica actor again; one that has not by then is killed
  // (and replaced by the controller).
  double reattach_timeout_s = 10;
  // Data channels (runtime/data_channel.hpp): the agent makes one for every
  // replica process it starts, with `channel_lanes` answer lanes (one per
  // proxy io thread), hands the process its ends and registers the node's
  // ends here, where this node's proxy finds them; removed when the process
  // exits. Empty or 0 lanes: requests reach replica processes over CAF only.
  std::shared_ptr<channel::Registry> channels;
  size_t channel_lanes = 0;
  // The node's metrics (runtime/metrics.hpp): its in-process replicas'
  // series, the replica processes' reports and troupe_replica_starts_total.
  // May be empty.
  std::shared_ptr<metrics::Registry> registry;
  // This node's own log file, where the lines of its in-process replicas
  // are (`troupectl logs`); "" when it writes none.
  std::string node_log_file;
  // How the keeper restarts an agent that died (not when stopped): at most
  // restart_policy.max_restarts within its window, at least min_interval
  // apart. Then it gives up: it logs the message (naming the agent and its
  // last exit reason), calls `on_give_up` with it (from the keeper's thread;
  // troupe-node then stops and exits with an error) and quits.
  RestartPolicy restart_policy;
  std::function<void(const std::string&)> on_give_up;
};

// Spawns the agent under a keeper and returns the keeper: when the agent
// actor dies of anything but a requested stop (e.g. `troupectl kill agent`),
// the keeper starts a new one with the replicas the old one hosted (they keep
// running; the new agent monitors them, registers and reports them, so the
// controller adopts them). The keeper takes (shutdown, grace_s) -> (ok) and
// forwards it to the current agent; an exit message to the keeper stops the
// agent too; (get) -> the current agent (tests).
AgentKeeperActor spawn_node_agent(caf::actor_system& sys, const AgentOptions& options);

}  // namespace troupe
