// Deployment handle calls from another process (internal to proxy/): the
// proxy actor answers a (call, ...) request from an io thread, see ReplyTo.
// Core::call itself is in handle_calls.cpp.
#pragma once

#include <caf/mailbox_element.hpp>

#include "proxy/proxy.hpp"
#include "runtime/wire.hpp"

namespace troupe::proxy {

struct IoThread;

// Where the answer of a (call) request goes: the reply address of the request
// message, taken in the actor that received it.
//
// Why not a response_promise: the answer of Core::call comes on an io thread
// (`done`), and response_promise::deliver sends as the promising actor, in that
// actor's execution context (CAF 0.17.6, response_promise::deliver_impl:
// profiled_send(self, ..., self->context(), ...)), which another thread may be
// using at that moment. Enqueueing a message to an actor is thread-safe from
// any thread with no execution unit (it is what anon_send does, and how a
// replica's handle refuses a request from the sender's context): the answer
// goes straight to the caller as an anonymous response to the request's id,
// with no hop back through the proxy actor, and still reaches the caller if
// the proxy actor is restarted meanwhile.
class ReplyTo {
 public:
  explicit ReplyTo(const caf::mailbox_element& m)
      : sender_(m.sender), mid_(m.mid), stages_(m.stages) {}

  // Once; from any thread. `from`: the sender the caller sees (none: anonymous).
  void send(HttpResponse answer, caf::strong_actor_ptr from = nullptr);
  const caf::strong_actor_ptr& caller() const { return sender_; }

 private:
  caf::strong_actor_ptr sender_;
  caf::message_id mid_;
  caf::mailbox_element::forwarding_stack stages_;
};

// A handle call from another process whose answer is relayed as the callee
// streams it: the head (or a whole answer) as the response to `m`, each
// piece as (chunk, key, seq, data) from the io thread's companion, released
// to the callee's replica (Exchange::write_chunk's `written`) only when the
// caller acknowledges it with (credit, key, bytes): the caller's reading
// paces the callee. (cancel, key) from the caller cancels the call.
void relay_call(Proxy::Core& core, const std::string& app, const std::string& deployment,
                HttpRequest request, double timeout_s, const caf::mailbox_element& m);
// The companion's handlers of those two messages, on the worker's io thread.
void relay_credit(IoThread* w, uint64_t key, uint64_t bytes);
void relay_cancel(IoThread* w, uint64_t key);
// From the io thread's sweep: handle calls that ended cannot be cancelled
// any more, and are forgotten.
void forget_ended_handle_calls(IoThread* w);

}  // namespace troupe::proxy
