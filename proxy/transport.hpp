// The ways an attempt of a call travels to its replica and back (internal to
// proxy/), and the one path their answers take into the call state machine
// (call.hpp). Each io thread has one object of each kind (paths.hpp), and
// send() offers the attempt to them in this order:
//   InlinePath  (inline_path.cpp)  an in-process replica's non-blocking
//                                  handler, run on the io thread
//   ChannelPath (channel_path.cpp) a replica process's data channel
//   PeerClient  (peer_client.cpp)  another worker's data port
//   CafPath     (caf_path.cpp)     a CAF request through the io thread's
//                                  companion; always takes it
// A transport keeps the state of the attempts it carries (a lane, a data
// port connection, a CAF response id, credit it still owes); the call only
// knows which transport has its current attempt (Call::via). Whatever comes
// back goes the same way for every transport: the frames of the data channel
// and of the data port through on_answer_frame(), a lost connection or
// replica through attempt_lost(), into on_answer(), on_error() and the
// stream functions (streams.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "proxy/router.hpp"
#include "runtime/data_channel.hpp"

namespace troupe::proxy {

struct Call;
using CallPtr = std::shared_ptr<Call>;

class Transport {
 public:
  virtual ~Transport() = default;
  // Sends the call's current attempt (its slot, key and request are set);
  // false when this way cannot take it, and the next one is tried.
  virtual bool send(const CallPtr& c) = 0;
  // The client took `bytes` more of the call's stream: room for as many more
  // at its replica.
  virtual void credit(const CallPtr& c, uint64_t bytes) = 0;
  // Tells the replica to stop working on the attempt: its client left, or
  // (`deadline_passed`) its deadline passed. Best effort.
  virtual void cancel(const CallPtr& c, bool deadline_passed) = 0;
  // The attempt is over here (answered, ended, failed over, given up): what
  // this transport keeps of it goes, and nothing of it reaches the call any
  // more. The replica is not told (cancel() does that).
  virtual void forget(const CallPtr& c) = 0;
  // The replica has not answered within max_request_time_s: the attempt
  // fails with request_timeout (on_error, or late_answer() when the client
  // had its answer).
  virtual void expire(const CallPtr& c) = 0;
};

// The calls whose current attempt went as a frame (over a data channel or a
// data port), by their key, with the connection that carries each: a
// transport's own table. Only the connection a request went to may answer
// it.
class FrameCalls {
 public:
  void add(const CallPtr& c, const void* conn);
  // The call of `key` when `conn` carries it; null when it is not in flight
  // here (failed over, timed out or cancelled meanwhile: a stale frame).
  // `stranger` is set when another connection carries it.
  CallPtr find(uint64_t key, const void* conn, bool& stranger) const;
  // The call of `key`, whichever connection carries it (null: none).
  CallPtr get(uint64_t key) const;
  // Takes the call of `key` out (its attempt ended); false when it was not in.
  bool remove(uint64_t key);
  // Takes out and returns every call `conn` carries (it closed).
  std::vector<CallPtr> take(const void* conn);
  void clear() { calls_.clear(); }

 private:
  struct Entry {
    CallPtr call;
    const void* conn = nullptr;
  };
  std::unordered_map<uint64_t, Entry> calls_;
};

// A frame that came back for a call of `calls` over `conn` (`sender` names
// it in log lines and answers: "replica X", "node N"): an answer, a refusal
// or a failure ends the attempt (on_answer, on_error, late_answer); a
// stream's head, chunks and end go to the stream functions. `payload` is the
// whole of it (an answer in several frames is joined by its transport).
// False when the sender broke the protocol: it answered a request it was not
// sent, sent a second head, a piece before the head, a head that does not
// decode, or a kind that is not an answer; its transport closes it then.
bool on_answer_frame(FrameCalls& calls, const void* conn, const std::string& sender,
                     const channel::FrameHeader& h, const void* payload, size_t bytes);

// The call's attempt is lost with its replica or with the connection that
// carried it (its transport has forgotten it): a stream ends early, a call
// whose client had its answer only gives its slot back, any other is retried
// (retry(): `crash` counts it as a crash of the request). `what` says what
// became of the replica ("replica r1 died").
void attempt_lost(const CallPtr& c, Outcome outcome, const std::string& what, bool crash);

// The call's attempt over a frame transport had no answer within
// max_request_time_s (its transport has forgotten it): it fails with
// request_timeout, or only gives its slot back when the client had its
// answer.
void attempt_expired(const CallPtr& c);

}  // namespace troupe::proxy
