// The node agent's session with the controller, as plain C++: whether an
// attempt to reach it is under way, whether the node is registered on the
// current link, the backoff between attempts and the incarnation the
// controller gave the node. The agent (node/node_agent.cpp) does the talking
// over CAF and tells the session what happened; the session says what to do
// next. Tested without actors or time: tests/node/controller_session_test.cpp.
//
// Links: every controller reached (a first connect, a reconnect, a
// restarted controller) is a new link with a higher number. An answer to a
// request made on an older link is stale and changes nothing: a slow
// registration answer from a controller that died must not mark the node
// registered with its successor.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

namespace troupe::node {

class ControllerSession {
 public:
  struct Options {
    double initial_backoff_s = 0.1;
    // Attempts stay at most this far apart (see AgentOptions::max_backoff_s).
    double max_backoff_s = 1.0;
  };

  // `jitter`: a factor in [0.8, 1.2] drawn for each delay, so that a
  // restarted head is not hit by every node at once.
  ControllerSession(Options options, std::function<double()> jitter);
  ControllerSession() : ControllerSession(Options{}, nullptr) {}

  // -- reaching the controller ----------------------------------------------

  // Start an attempt now: not stopping, none under way, not connected.
  bool should_connect() const;
  void connect_started();
  // The attempt failed (unreachable; no controller on this head yet): the
  // delay before the next one, or nullopt while stopping.
  std::optional<double> connect_failed();
  // A controller was reached: a new link, not registered yet. Returns the
  // link's number.
  uint64_t connected();
  // The controller went away (its down message): the delay before the next
  // attempt, or nullopt while stopping.
  std::optional<double> lost();

  // -- registration and heartbeats ------------------------------------------

  enum class Registered {
    stale,  // the answer of an older link: ignore it
    first,  // registered on this link (worth a log line)
    again   // registered again on this link (after a heartbeat's not_found)
  };
  Registered registered(uint64_t link, uint64_t incarnation);
  // The registration failed on `link`: the delay before trying again (a new
  // attempt to reach the controller), or nullopt when stale or stopping.
  std::optional<double> register_failed(uint64_t link);
  // The head asked is a candidate that does not lead (errc::not_leader):
  // the next head is asked after the initial backoff, not a grown one. A
  // follower answering means an election is under way or over; the new
  // leader must hear from this node within its recovery window.
  std::optional<double> register_refused_by_follower(uint64_t link);

  // Heartbeat now: registered on a live link, and not past the shutdown's
  // deregistration.
  bool heartbeat_due() const;
  enum class HeartbeatFailure {
    ignore,      // stale, or stopping
    reregister,  // the controller does not know this node: register again
    report       // anything else: log it, the next heartbeat tries again
  };
  HeartbeatFailure heartbeat_failed(uint64_t link, bool not_found);

  // -- stopping -------------------------------------------------------------

  // The node is stopping: no more attempts to reach a controller.
  void stop() { stopping_ = true; }
  bool stopping() const { return stopping_; }
  // The node has deregistered (or gave up doing so): no more heartbeats.
  void deregistered() { registered_ = false; }

  bool connected_now() const { return connected_; }
  bool is_registered() const { return registered_ && connected_; }
  uint64_t link() const { return link_; }
  uint64_t incarnation() const { return incarnation_; }
  double backoff_s() const { return backoff_s_; }

 private:
  double next_delay();

  Options options_;
  std::function<double()> jitter_;
  bool connecting_ = false;
  bool connected_ = false;
  bool registered_ = false;
  bool stopping_ = false;
  double backoff_s_ = 0;
  uint64_t link_ = 0;
  uint64_t incarnation_ = 0;
};

}  // namespace troupe::node
