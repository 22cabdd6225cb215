// Routing decisions of the data path, as plain C++ (no sockets, no actor
// calls): the route table (longest-prefix match), and per deployment the
// replica set with the in-flight count of every replica as this router sees
// it, power-of-two-choices placement preferring local replicas, the
// max_ongoing_requests cap, a bounded FIFO queue beyond it, and the retry
// exclusions.
//
// Thread-safe: every public member takes the router's mutex. Waiter callbacks
// run after the mutex is released, on the thread that freed the slot (the
// caller decides where to continue, e.g. by posting to its event loop).
//
// The proxy uses one Router per node; a deployment handle inside a replica can
// use one the same way (apply snapshots, admit, release).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_addr.hpp>
#include <caf/node_id.hpp>

#include "runtime/wire.hpp"

namespace troupe::channel {
class Channel;
}
namespace troupe::local {
class LocalReplica;
}

namespace troupe::proxy {

struct Route;

// One deployment of a traffic split: requests whose split point is below
// `upto` (and at or above the previous target's) go to `route`.
struct SplitTarget {
  double upto = 0;
  std::shared_ptr<const Route> route;  // prefix and app of its parent
};

// One shadow deployment of an application: each request to the application
// also goes, with `probability`, as a copy to `route` (answer discarded).
struct ShadowTarget {
  double probability = 0;
  std::shared_ptr<const Route> route;  // prefix and app of its parent
};

// One route of the table.
struct Route {
  std::string prefix;
  std::string app;
  std::string deployment;  // the application's ingress
  std::string key;         // deployment_key(app, deployment)
  // The application's traffic split (RouteEntry::traffic): the deployments
  // with weight > 0 by name, each with its cumulative weight; the last one's
  // is exactly 1. Empty: every request goes to `deployment`.
  std::vector<SplitTarget> split = {};
  // With a split: the header whose value picks the target; "": random.
  std::string split_key_header = {};
  // The application's shadow deployments (RouteEntry::shadow), by name.
  // Empty: no copies.
  std::vector<ShadowTarget> shadow = {};
  // The application is also served by the Open Inference Protocol
  // (RouteEntry::open_inference): /v2/models/<app>/... and
  // inference.GRPCInferenceService. Set on an application's route only, not
  // on its split or shadow targets.
  bool open_inference = false;
};

// Where a request on `route` goes: `route` itself without a split, else the
// target whose share of [0, 1) holds `point`. The same point picks the same
// target as long as the weights do not change; when they do, only points
// between the old and new boundaries move.
const Route& pick_target(const Route& route, double point);

// The split point of a key (a traffic_key_header's value): a stable hash
// (FNV-1a, 64 bits) mapped to [0, 1), equal on every node and process.
double key_point(std::string_view key);

// Per-thread pseudo-random split points: xorshift64*, one generator per
// thread (no lock, no shared state on the data path), seeded from
// std::random_device; or from `seed` for tests.
class SplitRandom {
 public:
  explicit SplitRandom(uint64_t seed);
  double next();  // in [0, 1)
  // This thread's generator.
  static SplitRandom& thread_local_instance();

 private:
  uint64_t state_;
};

// The shadows of `route` that get a copy of one request: each one
// independently, with its probability (one draw of `random` per shadow, so
// a seeded generator gives the same picks). Empty (no allocation) when the
// route has no shadow or none was picked.
std::vector<const Route*> pick_shadows(const Route& route, SplitRandom& random);

// An immutable route table; longest prefix wins. A prefix matches a path when
// it is equal to it, or is followed in the path by '/' (so "/echo" matches
// "/echo" and "/echo/x" but not "/echoes"); "/" matches every path.
class RouteTable {
 public:
  RouteTable() = default;
  explicit RouteTable(std::vector<Route> routes);

  struct Match {
    const Route* route = nullptr;
    // The path after the prefix, always starting with '/'.
    std::string_view rest;
  };
  // route == nullptr: no route for this path.
  Match match(std::string_view path) const;
  // Sorted by prefix.
  const std::vector<Route>& routes() const { return by_prefix_; }
  // The route of application `app`; nullptr when it has none.
  const Route* find_app(std::string_view app) const;

 private:
  std::vector<Route> by_prefix_;
  std::vector<const Route*> by_length_;  // longest first
};

// "app\0deployment": the key of a deployment in the router.
std::string deployment_key(std::string_view app, std::string_view deployment);

// A replica as the router sees it. Shared with in-flight requests, which hand
// it back to release().
struct ReplicaSlot {
  std::string replica_id;
  std::string node_id;
  uint32_t max_ongoing = 1;
  ReplicaActor handle;
  bool local = false;
  // A local replica process's data channel (RouterOptions::channel_of), set
  // when the slot is made and constant after (read without the mutex). The
  // node registers it before it starts the process, long before a snapshot
  // can name the replica.
  std::shared_ptr<channel::Channel> channel;
  // A local in-process replica whose handler the proxy may call inline
  // (RouterOptions::local_replica_of, runtime/local_replicas.hpp); set when
  // the slot is made and constant after, like `channel`.
  std::shared_ptr<local::LocalReplica> local_replica;
  // Guarded by the router's mutex.
  uint32_t in_flight = 0;
  bool dead = false;  // died, or left the replica set
  // Dead only because its node could not be reached; the replica may still
  // run. `unreachable`: the handle died with the connection to its node (CAF
  // kills the proxies of a node whose connection drops): a snapshot with a
  // new handle for it makes it live again. `no_route`: the handle lives but
  // a request found no route to its node (it goes through a connection that
  // dropped): any later snapshot listing it makes it live again (a snapshot
  // arrives only over a working connection to the controller, which is the
  // route to every node).
  bool unreachable = false;
  bool no_route = false;
  void* owner = nullptr;  // the deployment it belongs to; null once removed
  // Model multiplexing: the models the replica holds as far as this router
  // knows (from snapshots and from the replica's answers, whichever has the
  // higher `model_ids_seq`; plus the models of requests sent to it since,
  // which it is loading). Guarded by the router's mutex.
  std::vector<std::string> model_ids;
  uint64_t model_ids_seq = 0;
};
using SlotPtr = std::shared_ptr<ReplicaSlot>;

// Why a request gives a replica back.
enum class Outcome {
  answered,     // the replica answered (any HTTP status)
  refused,      // overloaded or unavailable: it never started the request
  died,         // the replica died (or its node went away) before answering
  unreachable,  // no route to its node, or lost with a dropped connection
  abandoned     // the caller gave up (timeout): the replica may still work on it
};

struct RouterOptions {
  std::string local_node;
  uint64_t seed = 0x9e3779b97f4a7c15ULL;
  // Used when a deployment's max_queued_requests is -1 (no limit in the
  // deployment's config); a safety net, not a tuning knob.
  size_t unlimited_queue_cap = 1u << 20;
  // The data channel of a replica of this node, by replica id (or null).
  std::function<std::shared_ptr<channel::Channel>(const std::string&)> channel_of = nullptr;
  // The inline-callable in-process replica of this node, by replica id (or
  // null).
  std::function<std::shared_ptr<local::LocalReplica>(const std::string&)> local_replica_of =
      nullptr;
};

class Router {
 public:
  explicit Router(RouterOptions options);

  // -- snapshots ---------------------------------------------------------------

  // Applies a push from the controller (full or delta, see
  // controller/core/snapshot.hpp). Returns the waiters that can proceed now
  // (new replicas) or must give up (their deployment is gone); the caller runs
  // them (outside any lock of its own). Also returns the replica handles that
  // appeared, so the caller can monitor them: a new replica, or a known one
  // reached through a new connection (after its node's connection dropped,
  // CAF hands out a new proxy for the same actor; the old one is dead, and so
  // was the slot: it is live again with the new handle).
  //
  // `lost`: the slots on a node the snapshot lists as DEAD (`dead_nodes`),
  // whether or not they are still in the set; they are never chosen again.
  // Requests in flight on them will not be answered: the caller fails them
  // over (like a replica that died). Slots that merely left the set are not
  // lost: a replica stopping gracefully still answers what it took.
  struct Applied {
    std::vector<std::function<void()>> ready;
    std::vector<ReplicaActor> added;
    std::vector<SlotPtr> lost;
  };
  Applied apply(const RoutingSnapshot& snapshot);
  // True once a snapshot was applied.
  bool has_routes() const;
  std::shared_ptr<const RouteTable> routes() const;
  uint64_t epoch() const;
  uint64_t seq() const;

  // -- placement ---------------------------------------------------------------

  // A request waiting for a slot is resumed with the slot, or with nullptr when
  // its deployment was deleted.
  using Waiter = std::function<void(SlotPtr)>;

  enum class Admit {
    assigned,       // `slot` is set; in_flight was incremented
    queued,         // `ticket` names the waiter; it will be called once
    queue_full,     // 503
    no_deployment,  // the deployment is unknown (deleted meanwhile)
  };
  struct Admission {
    Admit kind = Admit::no_deployment;
    SlotPtr slot;
    uint64_t ticket = 0;
    // queued: the deployment has no live replica at all (a cold start).
    bool no_replicas = false;
    size_t queued = 0;  // queue length after this admission
  };
  // `exclude`: replica ids already tried by this request; they are chosen only
  // when no other replica has room. Does not call `waiter` synchronously.
  // `model_id` (model multiplexing; "" for none): see choose_for_model().
  Admission admit(const std::string& key, const std::vector<std::string>& exclude, Waiter waiter,
                  const std::string& model_id = std::string());
  // A shadow copy's placement: a slot only when a replica has room now and
  // no request waits (assigned); never queued (queue_full: the copy is
  // dropped). So the copies in flight on a deployment never exceed its
  // replicas' max_ongoing_requests, and never take a slot a queued request
  // of that deployment waits for.
  Admission admit_if_free(const std::string& key);

  // Model multiplexing: `slot`'s replica said (in an answer) that it holds
  // `model_ids`, as its list number `seq`; kept unless the router knows a
  // newer one.
  void learn_models(const SlotPtr& slot, uint64_t seq, std::vector<std::string> model_ids);

  // Gives a slot back. Returns waiters to run (now admitted on a free slot).
  std::vector<std::function<void()>> release(const SlotPtr& slot, Outcome outcome);
  // The replica died (a down message): it is never chosen again, unless
  // `link_lost` (the connection to its node dropped, exit reason
  // remote_link_unreachable) and a later snapshot brings a new handle for it.
  void mark_dead(const caf::actor_addr& replica, bool link_lost = false);
  // The connection to `node` dropped (a handle of it went down with
  // remote_link_unreachable): CAF kills every proxy of that node at once, so
  // every replica handle on it is dead too, before its own down message
  // arrives. Marks them all like mark_dead(addr, true), so that a request
  // failed over from one of them is not placed on another of the same node.
  void mark_node_lost(const caf::node_id& node);
  // Removes a queued waiter (its deadline passed). False when it was already
  // resumed (its callback runs or ran).
  bool cancel(const std::string& key, uint64_t ticket);

  // -- introspection (metrics, /-/routes, tests) ----------------------------

  struct DeploymentView {
    std::string app;
    std::string deployment;
    int32_t max_queued = -1;
    size_t queued = 0;
    struct Replica {
      std::string replica_id;
      std::string node_id;
      uint32_t max_ongoing = 0;
      uint32_t in_flight = 0;
      bool local = false;
      std::vector<std::string> model_ids = {};
    };
    std::vector<Replica> replicas;
  };
  std::vector<DeploymentView> deployments() const;
  // Each deployment's queued and in-flight requests, sorted like
  // deployments(): the proxy's load report, once a second, without copying
  // every replica's view.
  std::vector<DeploymentLoad> loads() const;
  // Every replica handle held (to monitor them again after a restart).
  std::vector<ReplicaActor> handles() const;
  // The live slot of replica `replica_id` (null: none). A scan of every
  // slot: callers keep what it found (proxy/peer_client.cpp).
  SlotPtr find_replica(const std::string& replica_id) const;
  // True when deployment `key` (deployment_key(app, deployment)) is known
  // and has at least one replica that is not dead (busy or not): a request
  // to it would not wait for a cold start (e.g. a model's readiness).
  bool has_replica(const std::string& key) const;
  // Drops every deployment and queued waiter without calling it (shutdown).
  void clear();

 private:
  struct Queued {
    uint64_t ticket;
    std::vector<std::string> exclude;
    Waiter waiter;
    std::string model_id = {};
  };
  struct Deployment {
    std::string app;
    std::string name;
    int32_t max_queued = -1;
    std::vector<SlotPtr> replicas;
    std::deque<Queued> queue;
  };

  Deployment* find(const std::string& key);
  SlotPtr choose(Deployment& d, const std::vector<std::string>& exclude);
  // A slot now, when nothing waits in `d`'s queue and a replica has room
  // (choose_for_model): `out` is `assigned` and the slot's in_flight counted.
  bool assign_now(Deployment& d, const std::vector<std::string>& exclude,
                  const std::string& model_id, Admission& out);
  // Model multiplexing (`model_id` not empty): a replica with room that holds
  // the model, the least loaded of them (local first when equal); when none
  // does, among the replicas with room that hold the fewest models no other
  // replica holds, then the fewest models, the one rendezvous hashing of
  // (model, replica) ranks first, the same on every proxy (so a load
  // fills a free slot, or evicts a model that stays loaded elsewhere, before
  // it evicts the only copy of another); else choose(). The chosen replica
  // is noted as holding the model from now on (it loads it), so that the
  // next requests for it follow before its answer says so.
  SlotPtr choose_for_model(Deployment& d, const std::vector<std::string>& exclude,
                           const std::string& model_id);
  bool has_room(const ReplicaSlot& s) const { return !s.dead && s.in_flight < s.max_ongoing; }
  // The whole set of `d` becomes `endpoints`.
  void set_replicas(Deployment& d, const std::vector<ReplicaEndpoint>& endpoints,
                    std::vector<ReplicaActor>& added, std::vector<SlotPtr>& left);
  // A delta of the set (DeploymentEndpoints::partial): `endpoints` came or
  // changed, `removed` left, the others stay.
  void patch_replicas(Deployment& d, const std::vector<ReplicaEndpoint>& endpoints,
                      const std::vector<std::string>& removed, std::vector<ReplicaActor>& added,
                      std::vector<SlotPtr>& left);
  // The slot of `ep` in `d`: `slot` (its current one, or null for a new
  // replica) brought up to date.
  SlotPtr endpoint_slot(Deployment& d, SlotPtr slot, const ReplicaEndpoint& ep,
                        std::vector<ReplicaActor>& added);
  // `s` left `d`'s set: in-flight requests still release it.
  void leave(SlotPtr s, std::vector<SlotPtr>& left);
  void drain(Deployment& d, std::vector<std::function<void()>>& ready);
  void drop(Deployment& d, std::vector<std::function<void()>>& ready, std::vector<SlotPtr>& left);
  uint64_t next_random();

  RouterOptions options_;
  mutable std::mutex mutex_;
  std::shared_ptr<const RouteTable> routes_ = std::make_shared<RouteTable>();
  bool has_routes_ = false;
  uint64_t epoch_ = 0;
  uint64_t seq_ = 0;
  std::unordered_map<std::string, std::unique_ptr<Deployment>> deployments_;
  std::unordered_map<caf::actor_addr, SlotPtr> by_address_;
  uint64_t rng_;
  uint64_t next_ticket_ = 1;
};

}  // namespace troupe::proxy
