// The controller's table of nodes and their liveness: plain C++ driven with an
// explicit `now`, so tests step it without clocks or sleeps.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "controller/core/commands.hpp"  // NodeState, shared with the reconciler
#include "runtime/resources.hpp"
#include "runtime/status.hpp"

namespace troupe::controller {

struct NodeRecord {
  std::string id;
  std::string host;
  uint16_t http_port = 0;
  uint16_t peer_port = 0;  // its peer listener on `host`; 0: none
  Resources resources;
  int32_t pid = 0;
  NodeState state = NodeState::alive;
  double registered_at = 0;   // seconds on the controller's clock
  double last_heartbeat = 0;  // idem
  std::string reason;         // why the node is in its state
  uint64_t incarnation = 0;   // bumped on every (re-)registration
  bool drained = false;       // an operator asked to drain it; kept across reconnects
  // Its connection dropped while the controller was paused (Membership::
  // resumed): not DEAD before this time (seconds on the controller's clock),
  // by which it must have registered again.
  double reconnect_by = 0;
  // When it turned DEAD or UNREACHABLE (seconds on the controller's clock);
  // -1 while it is ALIVE or DRAINING.
  double lost_at = -1;
};

// How the membership judges nodes lost at about the same time. One node
// lost is DEAD at once and its replicas move. But when more than `share` of
// the nodes (and at least `min_nodes`) are lost within one node timeout, the
// controller is the likely fault (its own network, a partition around it),
// as in Kubernetes' node lifecycle controller: those nodes turn UNREACHABLE,
// their replicas stay where they are, and they turn DEAD only when they stay
// lost for `unreachable_timeout_s` or an operator drains them.
//
// A node counts as lost within the window when it is timing out or dropped
// its connection now, turned DEAD or UNREACHABLE within the last node
// timeout, is UNREACHABLE, or is silent for more than half the node timeout
// (so that nodes cut off together are judged together although their last
// heartbeats were a little apart; this needs a heartbeat interval below
// half the node timeout, as troupe-node's defaults are). Out of: every node
// but those DEAD before the window.
struct LossJudgement {
  double share = 0.5;  // more than this share of the nodes; >= 1: never
  uint32_t min_nodes = 2;
  double unreachable_timeout_s = 60.0;
};

// A change of state the caller should log and react to.
struct NodeTransition {
  std::string id;
  NodeState from;
  NodeState to;
  std::string reason;
};

class Membership {
 public:
  // `node_timeout_s`: a node that sent no heartbeat for longer is DEAD.
  explicit Membership(double node_timeout_s, LossJudgement judgement = {})
      : node_timeout_s_(node_timeout_s), judgement_(judgement) {}

  // Adds a node or re-registers a known one (a restarted process, or one that
  // was declared DEAD and came back). A DRAINING node stays DRAINING: drain is
  // an operator's decision that outlives reconnects. Returns the incarnation.
  uint64_t register_node(NodeRecord node, double now);
  // Grows with every registration (what a node says of itself may change).
  uint64_t registrations() const { return next_incarnation_; }

  // Records a heartbeat. A node that is unknown, DEAD or UNREACHABLE must
  // register again (with the replicas it hosts): that is errc::not_found,
  // and the agent reacts by re-registering.
  Status heartbeat(const std::string& id, double now);

  // Declares lost every node whose last heartbeat is older than the timeout:
  // DEAD, or UNREACHABLE when the loss is a mass loss (LossJudgement). An
  // UNREACHABLE node lost for longer than the unreachable timeout is DEAD.
  std::vector<NodeTransition> check(double now);

  // The connection to the node's agent dropped. `incarnation` guards against
  // a late notice about an older connection after the node re-registered.
  // Not while the controller resumes from a pause (resumed()): a node whose
  // connection dropped then has until the grace ends to register again.
  std::vector<NodeTransition> connection_lost(const std::string& id, uint64_t incarnation,
                                              double now);
  // The controller made no progress for a while (its process was stopped,
  // starved or migrated) and runs again at `now`. Every node heard from
  // before is judged from now on, not by the controller's own silence: its
  // heartbeat deadline is re-armed, and for `grace_s` a dropped connection
  // (what the pause did to the nodes' connections) leaves the node ALIVE
  // until it registers again or the grace ends.
  void resumed(double now, double grace_s);
  // Within the grace of the last resumed().
  bool in_pause_grace(double now) const { return now < grace_until_; }

  // An operator's drain. An UNREACHABLE node turns DEAD at once (its
  // replicas are replaced elsewhere) and stays DRAINING when it registers
  // again.
  Status drain(const std::string& id);
  // The node is stopping (SIGTERM) and asks to leave: DRAINING, so that its
  // replicas are replaced elsewhere before they stop. Unlike drain() it is
  // not kept across a registration: a node that registers again is back.
  Status leave(const std::string& id);
  // A node leaving on purpose (graceful shutdown) is removed from the table.
  Status deregister(const std::string& id);

  const std::map<std::string, NodeRecord>& nodes() const { return nodes_; }
  double node_timeout_s() const { return node_timeout_s_; }
  const LossJudgement& judgement() const { return judgement_; }
  NodeState state(const std::string& id) const;  // DEAD when unknown

 private:
  // Whether losing `newly` now (besides the nodes lost already) is a mass
  // loss; `why` gets "K of N nodes lost within one node timeout".
  bool mass_loss(const std::vector<std::string>& newly, double now, std::string& why) const;
  // Moves `node` to `to` (DEAD or UNREACHABLE) for `reason`, lost from now.
  NodeTransition turn(NodeRecord& node, NodeState to, std::string reason, double now);
  // Turns `node` DEAD or UNREACHABLE for `cause`.
  NodeTransition lose(NodeRecord& node, bool mass, const std::string& cause, const std::string& why,
                      double now);

  double node_timeout_s_;
  LossJudgement judgement_;
  std::map<std::string, NodeRecord> nodes_;
  uint64_t next_incarnation_ = 1;
  double grace_until_ = 0;
};

}  // namespace troupe::controller
