// The controller's directory of actor handles, as plain C++: which actor is
// which replica, node agent or route-table subscriber (a node's proxy), what
// a registering node's hosted replicas mean, which actor a `kill` targets,
// and what a down message was about. The actor shell owns one; it sends the
// messages and feeds the core, the directory only keeps the books.
//
// It holds CAF's handle types directly (the typed ones of runtime/wire.hpp)
// rather than being a template over a handle type: handles are value types (copyable,
// comparable, hashable, no actor system needed to hold them), the directory
// hands its handles on to CAF-typed code (render_snapshot's HandleOf, sends),
// and a down message names its actor by address, which a fake handle would
// have to mimic. Its tests spawn a few actors that end at once: their handles
// stay distinct values, and nothing depends on them running.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_addr.hpp>
#include <caf/error.hpp>

#include "controller/core/commands.hpp"
#include "controller/core/model.hpp"
#include "controller/core/snapshot.hpp"
#include "controller/shell/proxy_health.hpp"
#include "runtime/status.hpp"
#include "runtime/wire.hpp"

namespace troupe::controller {

// What a down message was about, see ActorDirectory::on_down.
enum class DownKind {
  unknown,          // no actor the directory tracks (e.g. a replica forgotten already)
  replica_stopped,  // a replica the controller had asked to stop (or kill)
  replica_crashed,  // any other replica: it crashed, was killed or lost its node
  agent_link_lost,  // a node agent, with the connection to its node: the node is gone
  agent_died,       // a node agent alone; its node still runs and starts a new one
  subscriber,       // a route-table subscriber (proxy)
};

const char* to_string(DownKind k);

struct DownEvent {
  DownKind kind = DownKind::unknown;
  // The replica's id; the agent's node id.
  std::string id;
  // replica_*: the node it ran on.
  std::string node;
  // replica_crashed: the troupe error a replica process's handle ends with
  // ("replica X exited: killed by SIGSEGV"), the deployment's status message;
  // empty for any other reason (the shell logs CAF's rendering of it).
  std::string cause;
  // agent_*: the registration the agent belonged to (Membership guards
  // against a late notice about an older connection with it).
  uint64_t incarnation = 0;
  // subscriber: its key, to forget its health record.
  ProxyHealthMonitor::Key subscriber = 0;
};

// The actor a `kill` reaches: an exit(kill) to `actor`, or, for the
// controller itself, a quit.
struct KillTarget {
  caf::actor actor;         // invalid for the controller
  bool controller = false;  // the controller kills itself
  std::string log_line;     // "killing replica X on operator request"
};

// A route-table subscriber and the last snapshot it was sent.
struct Subscriber {
  ProxyActor handle;
  SnapshotId last;
  // The push awaiting the subscriber's answer (ActorDirectory::mark_sent);
  // 0: none. No other push goes to it meanwhile, so a subscriber that falls
  // behind gets one delta of everything that changed since, not a queue of
  // them (a queue of whole replica sets grew with the square of the
  // replicas while a large deploy was pushed).
  uint64_t in_flight = 0;
  // The size of that push in replica entries (+1), counted against the
  // controller's budget of pushes in flight (ControllerOptions).
  size_t in_flight_weight = 0;
  // Nodes whose replicas its next push carries again: it lost its direct
  // connection to them, and with it its handles of their actors.
  std::set<std::string> refresh;
};

class ActorDirectory {
 public:
  using Key = ProxyHealthMonitor::Key;
  // Called for every handle the directory is given to track: the shell
  // monitors it, so that its down message comes back through on_down().
  using Monitor = std::function<void(const caf::actor&)>;
  // Called for an agent forgotten on purpose (its node deregistered): the
  // shell stops monitoring it.
  using Demonitor = std::function<void(const caf::actor_addr&)>;

  ActorDirectory(Monitor monitor, Demonitor demonitor)
      : monitor_(std::move(monitor)), demonitor_(std::move(demonitor)) {}

  // ------------------------------------------------------------ replicas

  // `handle` is replica `id` on `node` (monitored). An older, different
  // handle of the id is forgotten: its down message no longer counts.
  void remember_replica(const std::string& id, const std::string& node,
                        const ReplicaActor& handle);
  // Forgets the replica; nothing when unknown.
  void forget_replica(const std::string& id);
  // The replica's handle; invalid when unknown.
  ReplicaActor replica(const std::string& id) const;
  // The node of replica `id`; "" when it is not known (any more).
  std::string node_of(const std::string& id) const;
  // A stop or kill was sent: the replica's down message is then a stop, not
  // a crash. Nothing for an unknown replica.
  void mark_stopping(const std::string& id);
  // When the replica became ready (Unix seconds, as it reported); 0 when not
  // yet or unknown. Nothing is set for an unknown replica.
  void set_started_at(const std::string& id, double start_time);
  double started_at(const std::string& id) const;
  size_t replica_count() const { return replicas_.size(); }

  // Takes the replicas a (re-)registering node reports hosting: every one
  // whose handle is new is remembered (with its stopping flag); returned are
  // those for the core to adopt. That includes a replica whose handle is
  // known already (the core may have given it up while its node was DEAD,
  // and ignores the ones it still tracks), except while `recovering`, when a
  // known handle has been collected for the recovery already. Entries
  // without a handle are skipped.
  std::vector<HostedReplica> take_hosted(const std::string& node,
                                         const std::vector<HostedReplicaInfo>& hosted,
                                         bool recovering);

  // ------------------------------------------------------------ agents

  // `agent` is now the agent of `node` (monitored); an older agent of the
  // node is forgotten, so its down message no longer counts.
  void attach_agent(const std::string& node, const AgentActor& agent, uint64_t incarnation);
  // The agent of `node`; invalid when it has none.
  AgentActor agent(const std::string& node) const;
  // Every node's agent.
  std::vector<AgentActor> agents() const;
  // The node left on purpose: forgets (and demonitors) its agents.
  void detach_node(const std::string& node);

  // ------------------------------------------------------------ subscribers

  // Tracks `subscriber` (monitored) as having snapshot `last`, and returns
  // its key: a new key for a new subscriber, the same key when it subscribes
  // again (its health record stays). `lost_node`: it lost its direct
  // connection to that node; the node's replicas go into its next push
  // (with those of earlier such calls not pushed yet).
  Key add_subscriber(const ProxyActor& subscriber, SnapshotId last,
                     const std::string& lost_node = "");
  // The subscriber of `key`; invalid when unknown.
  ProxyActor subscriber(Key key) const;
  const std::map<Key, Subscriber>& subscribers() const { return subscribers_; }
  // A push of snapshot `id` is sent to `key` (with the replicas of the
  // nodes it asked to refresh): returns its number, which push_done() takes
  // (0 for an unknown key).
  uint64_t mark_sent(Key key, SnapshotId id, size_t weight = 1);
  // The weight of every push awaiting its answer.
  size_t in_flight_weight() const;
  // The answer to push `push` of `key`: the subscriber may get the next one.
  // When it failed (error or timeout: the push may be lost) the next push is
  // in full. Nothing for an unknown key or an older push.
  void push_done(Key key, uint64_t push, bool ok);
  // The http settings pushed with every snapshot (the target state's). A
  // snapshot is pushed only when the routes changed, so new settings make
  // every subscriber due for a full push at the next publish; the same
  // settings change nothing. A new subscriber gets a full push anyway.
  void set_http(const HttpSettings& http);

  // ------------------------------------------------------------ kill, down

  // The actor `troupectl kill KIND ID` reaches: kind replica (by replica
  // id), agent (by node id), proxy (by node id: the proxy `proxies` names
  // for it), or controller. errc::not_found naming what is missing, or
  // errc::invalid_argument for another kind.
  Result<KillTarget> kill_target(const std::string& kind, const std::string& id,
                                 const ProxyHealthMonitor& proxies) const;

  // What the down message of `source` with `reason` was about; forgets that
  // actor. Replicas are checked first, then subscribers, then agents.
  DownEvent on_down(const caf::actor_addr& source, const caf::error& reason);

 private:
  struct ReplicaRef {
    ReplicaActor handle;
    std::string node_id;
    bool stopping = false;  // a stop or kill was sent: its down is a stop, not a crash
    double started_at = 0;  // Unix seconds when it became ready; 0: not yet
  };
  struct AgentRef {
    std::string node_id;
    uint64_t incarnation = 0;
  };

  Monitor monitor_;
  Demonitor demonitor_;
  std::unordered_map<std::string, ReplicaRef> replicas_;  // replica id -> handle
  std::unordered_map<caf::actor_addr, std::string> replica_of_;
  std::unordered_map<caf::actor_addr, AgentRef> agents_;  // agent -> node
  std::unordered_map<std::string, AgentActor> agent_of_;  // node id -> agent
  std::map<Key, Subscriber> subscribers_;
  uint64_t next_push_ = 1;                 // by key: subscription order
  std::unordered_map<caf::actor_addr, Key> subscriber_of_;
  Key next_subscriber_key_ = 1;
  // The last http settings given to set_http: only to tell a change.
  HttpSettings http_;
};

}  // namespace troupe::controller
