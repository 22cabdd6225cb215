// The replicas a node hosts and their lifecycle, as plain C++: what the node
// agent (node/node_agent.cpp) decides when a replica process says hello or
// attaches, when its connection is lost, when it exits, when a deadline
// passes, when the controller stops it, and what a restarted agent must
// watch again. The agent does the acting (CAF messages, signals, logs); this
// class holds the table and says what to do. Time is passed in. Tested
// without actors or time: tests/node/hosted_replicas_test.cpp (handles are
// empty there: nothing here sends to them).
//
// A replica process goes through: started (no handle: it has not attached,
// runs no user code yet) -> attached (a handle everyone holds) ->
// [detached (its connection lost while it runs) -> attached again]* ->
// stopping -> exited. An in-process replica is attached from the start.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/forwarder.hpp"
#include "runtime/status.hpp"
#include "runtime/wire.hpp"

namespace troupe::node {

struct Hosted {
  ReplicaSpec spec;
  // What everyone else holds: the replica's own handle (in process), or the
  // forwarding handle made when its process attached (empty before).
  ReplicaActor handle;
  bool attached = false;  // `handle` is set
  bool stopping = false;
  // When stopping: when the agent kills it if it has not exited by then.
  std::chrono::steady_clock::time_point kill_at;
  // A replica process:
  bool process = false;
  pid_t pid = 0;
  // Written to the process's stdin. It attaches with it once; after that it
  // is accepted again only while the connection to the process is lost (it
  // attaches again with it, see `detached`).
  std::string secret;
  ReplicaActor remote;  // its replica actor, in the process
  // Where `handle` forwards to: `remote`, and the next remote handle when
  // the process attaches again.
  std::shared_ptr<ForwardTarget> target;
  // The connection to the process was lost while it runs (a frozen node
  // dropped it at its BASP connection timeout, say): the process connects
  // again and attaches its replica actor again, within
  // AgentOptions::reattach_timeout_s, or it is killed. `detaches` counts
  // the losses (which one a deadline is for).
  bool detached = false;
  uint32_t detaches = 0;
  // Spawn requests answered when the process attaches.
  std::vector<caf::typed_response_promise<ReplicaActor>> waiting;
};

class HostedReplicas {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using duration = std::chrono::steady_clock::duration;

  Hosted* find(const std::string& id);
  size_t size() const { return table_.size(); }
  bool empty() const { return table_.empty(); }
  std::map<std::string, Hosted>& all() { return table_; }

  // What the node reports to the controller: every replica with a handle.
  std::vector<HostedReplicaInfo> list() const;

  // -- starting -------------------------------------------------------------

  // A replica process was started (pid), waiting for it to attach.
  Hosted& add_process(const ReplicaSpec& spec, pid_t pid, std::string secret,
                      std::vector<caf::typed_response_promise<ReplicaActor>> waiting);
  // An in-process replica runs (attached from the start).
  Hosted& add_in_process(const ReplicaSpec& spec, ReplicaActor handle);

  // A process that says hello or attaches with `secret`: it may when it is a
  // replica process of this node that has not attached, or whose connection
  // was lost, and the secret is its own. Otherwise: why not ("no such replica
  // process", "it has attached already", "wrong secret").
  Result<Hosted*> admit(const std::string& id, const std::string& secret);

  enum class Attach {
    first,  // make its handle and answer the spawn requests
    again   // point its handle at the new remote actor
  };
  // An admitted process attached its replica actor.
  Attach attach(Hosted& h, ReplicaActor remote);
  // Its handle was made (first attach): the spawn requests to answer.
  std::vector<caf::typed_response_promise<ReplicaActor>> attached(Hosted& h, ReplicaActor handle);

  // -- losing, exiting, deadlines -------------------------------------------

  enum class Lost {
    ignore,         // not a process of this node, or not the connection's loss
    kill,           // it is stopping: of no use any more
    wait_reattach,  // it may still run: it has reattach_timeout_s to attach again
  };
  // The remote replica actor of `id` went down; `unreachable`: because its
  // connection dropped. With wait_reattach, `detaches()` names the deadline.
  Lost connection_lost(const std::string& id, bool unreachable);

  // Deadlines: true when the process must be killed now.
  bool attach_overdue(const std::string& id, pid_t pid) const;
  bool reattach_overdue(const std::string& id, pid_t pid, uint32_t detach) const;

  enum class Exit {
    ignore,          // not this process (an older pid, or gone already)
    stopped,         // a clean exit on request: end its handle normally
    crashed,         // anything else: end its handle with the cause
    never_attached,  // no user code ran: its spawn requests fail; removed
  };
  // A process's exit report. With never_attached, the spawn requests are in
  // `failed_waiting`.
  Exit process_exited(const std::string& id, pid_t pid, bool clean,
                      std::vector<caf::typed_response_promise<ReplicaActor>>* failed_waiting);

  struct HandleEnded {
    bool known = false;
    bool process = false;     // its process must not run on: kill it
    bool expected = false;    // it was stopping
    ReplicaActor remote;      // no longer watched
  };
  // The handle of `id` ended (the replica is gone): removed.
  HandleEnded handle_ended(const std::string& id);

  // -- stopping -------------------------------------------------------------

  struct Stop {
    bool kill_now = false;     // not attached, or detached: it cannot be told
    bool send_stop = false;    // the first stop: tell the replica
    duration grace{};          // else: kill it if it has not exited by then
  };
  // The controller (or the node's shutdown) stops `h` within timeout_s.
  Stop stop(Hosted& h, double timeout_s, time_point now);

  // A restarted agent: what to watch again.
  struct Watch {
    std::string id;
    bool await_attach = false;  // a process that has not attached: its deadline again
    pid_t pid = 0;
    ReplicaActor handle;
    ReplicaActor remote;  // may be empty
    std::optional<duration> kill_in;  // stopping: its kill deadline, from `now`
  };
  // Also drops the spawn requests of the dead agent (they time out at the
  // controller).
  std::vector<Watch> adopt(time_point now);

 private:
  std::map<std::string, Hosted> table_;
};

// Compares in time independent of where the strings differ.
bool same_secret(const std::string& a, const std::string& b);

}  // namespace troupe::node
