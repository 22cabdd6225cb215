// CafPath (paths.hpp): requests over CAF, through the io thread's companion.
// The way every request can go (the others decline what they cannot carry),
// and the way streamed answers of in-process replicas come back. Its
// answers, errors and stream pieces go into the call state machine like
// those of the other transports (transport.hpp).
#include <string>

#include <caf/all.hpp>

#include "proxy/call.hpp"
#include "proxy/core.hpp"
#include "proxy/paths.hpp"

namespace troupe::proxy {

bool CafPath::send(const CallPtr& c) {
  t_.core->metrics.sent(false);
  auto id = await(c);
  c->slot->handle->enqueue(t_.companion->ctrl(), id,
                           caf::make_message(handle_atom::value, c->request),
                           t_.companion->context());
  return true;
}

caf::message_id CafPath::await(const CallPtr& c) {
  // What mixin::requester does (actor_companion has no request()): a request
  // id, a response handler with an error branch, and a timeout. The timeout
  // is the io thread's sweep (see sweep()), not CAF's clock: the clock thread
  // would be woken twice per request (set and cancel), two context switches
  // per request on the data path. The client gets its 504 from the call's
  // timer at the deadline; the replica slot stays taken until the replica
  // answers (it still works on the request), bounded by max_request_time_s.
  auto* self = t_.companion;
  auto id = self->new_request_id(caf::message_priority::normal);
  uint64_t key = c->key;
  c->via = this;
  c->sent_at = Clock::now();
  responses_[key] = id.response_id();
  t_.track(c.get());
  self->add_multiplexed_response_handler(
      id.response_id(),
      caf::behavior{
          [this, c, key, handle = c->slot->handle](HttpResponse& answer) {
            if (responses_.erase(key) == 0) {
              // Forgotten: retried after a down. A stream of it is not wanted.
              if (answer.stream != 0)
                caf::anon_send(handle, cancel_atom::value, answer.stream, false);
              return;
            }
            if (answer.stream != 0) {
              streams_[key] = Stream{c, 0};
              return on_stream_head(c, answer);
            }
            if (c->done)
              return late_answer(c, Outcome::answered);
            on_answer(c, answer);
          },
          [this, c, key](caf::error& err) {
            if (responses_.erase(key) == 0)
              return;
            if (c->done)
              return late_answer(c, Outcome::abandoned);
            on_error(c, err);
          },
      });
  return id;
}

void CafPath::credit(const CallPtr& c, uint64_t bytes) {
  if (c->slot && streams_.count(c->key) != 0)
    caf::anon_send(c->slot->handle, credit_atom::value, c->key, bytes);
}

void CafPath::cancel(const CallPtr& c, bool deadline_passed) {
  if (c->slot && c->slot->handle)
    caf::anon_send(c->slot->handle, cancel_atom::value, c->key, deadline_passed);
}

void CafPath::forget(const CallPtr& c) {
  streams_.erase(c->key);
  auto it = responses_.find(c->key);
  if (it == responses_.end())
    return;
  // Its response handler in the companion would wait for an answer that
  // does not come: end it now. The handler ignores it, the attempt being
  // forgotten here.
  auto id = it->second;
  responses_.erase(it);
  t_.companion->enqueue(nullptr, id, caf::make_message(caf::make_error(caf::sec::request_timeout)),
                        t_.unit.get());
}

void CafPath::expire(const CallPtr& c) {
  auto it = responses_.find(c->key);
  if (it == responses_.end())
    return;
  // Its handler fails the call with request_timeout.
  t_.companion->enqueue(nullptr, it->second,
                        caf::make_message(caf::make_error(caf::sec::request_timeout)),
                        t_.unit.get());
}

void CafPath::chunk(uint64_t key, uint64_t seq, std::string& data) {
  auto it = streams_.find(key);
  if (it == streams_.end())
    return;  // given up here (replica lost, stalled) or cancelled
  CallPtr c = it->second.call;
  if (seq != it->second.next_seq) {
    // CAF delivers in order; a gap means pieces were lost with a connection.
    t_.core->log->warn("request {}: stream piece {} arrived where {} was expected; ending it",
                       c->request.request_id, seq, it->second.next_seq);
    cancel_at_replica(c);
    on_stream_end(c, false, "pieces of the stream were lost");
    return;
  }
  ++it->second.next_seq;
  on_stream_chunk(c, std::move(data));
}

void CafPath::end(uint64_t key, uint64_t seq, bool complete, const std::string& why) {
  auto it = streams_.find(key);
  if (it == streams_.end())
    return;
  CallPtr c = it->second.call;
  bool whole = complete && seq == it->second.next_seq;
  on_stream_end(c, whole, whole || !complete ? why : "pieces of the stream were lost");
}

void CafPath::clear() {
  responses_.clear();
  streams_.clear();
}

}  // namespace troupe::proxy
