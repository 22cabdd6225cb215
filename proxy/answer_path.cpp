// The one path answers take back into the call state machine, whichever
// transport carried the request (transport.hpp): the frames of data channels
// and data ports, and attempts lost with their replica or their connection.
#include <string>
#include <vector>

#include "proxy/call.hpp"
#include "proxy/core.hpp"
#include "proxy/peer_frames.hpp"
#include "proxy/transport.hpp"

namespace troupe::proxy {

void FrameCalls::add(const CallPtr& c, const void* conn) {
  calls_[c->key] = Entry{c, conn};
}

CallPtr FrameCalls::find(uint64_t key, const void* conn, bool& stranger) const {
  stranger = false;
  auto it = calls_.find(key);
  if (it == calls_.end())
    return nullptr;
  stranger = it->second.conn != conn;
  return it->second.call;
}

CallPtr FrameCalls::get(uint64_t key) const {
  auto it = calls_.find(key);
  return it == calls_.end() ? nullptr : it->second.call;
}

bool FrameCalls::remove(uint64_t key) {
  return calls_.erase(key) != 0;
}

std::vector<CallPtr> FrameCalls::take(const void* conn) {
  std::vector<CallPtr> out;
  for (auto it = calls_.begin(); it != calls_.end();) {
    if (it->second.conn == conn) {
      out.push_back(std::move(it->second.call));
      it = calls_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

namespace {

// An answer, a refusal or a failure: the attempt ends.
void ended(const CallPtr& c, const std::string& sender, const channel::FrameHeader& h,
           const void* payload, size_t bytes) {
  const auto* text = static_cast<const char*>(payload);
  if (h.kind == channel::Kind::answer) {
    HttpResponse answer;
    auto st = channel::decode_answer(payload, bytes, answer);
    if (c->done)
      return late_answer(c, Outcome::answered);
    if (!st) {
      c->worker->core->log->warn("{}: {}", sender, st.message());
      answer = malformed_answer(c, sender, st.message());
    }
    return on_answer(c, answer);
  }
  if (h.kind == channel::Kind::refusal) {
    bool overloaded = false;
    std::string message;
    if (auto st = channel::decode_refusal(payload, bytes, overloaded, message); !st)
      message = st.message();
    if (c->done)
      return late_answer(c, Outcome::refused);
    return on_error(
        c, to_caf_error(Status(overloaded ? errc::overloaded : errc::unavailable, message)));
  }
  auto err = error_of(h.amount, text, bytes);
  if (c->done)
    return late_answer(c, Outcome::answered);
  on_error(c, err);
}

}  // namespace

bool on_answer_frame(FrameCalls& calls, const void* conn, const std::string& sender,
                     const channel::FrameHeader& h, const void* payload, size_t bytes) {
  bool stranger = false;
  CallPtr c = calls.find(h.call, conn, stranger);
  if (!c)
    return true;  // failed over, timed out or cancelled meanwhile
  if (stranger) {
    c->worker->core->log->warn("{} answered a request it was not sent; closing its connection",
                               sender);
    return false;
  }
  switch (h.kind) {
    case channel::Kind::answer:
    case channel::Kind::refusal:
    case channel::Kind::failed:
      calls.remove(h.call);
      ended(c, sender, h, payload, bytes);
      return true;
    case channel::Kind::head: {
      if (c->streaming)
        return false;  // a second head
      HttpResponse head;
      if (auto st = channel::decode_answer(payload, bytes, head); !st) {
        c->worker->core->log->warn("{}: {}", sender, st.message());
        return false;
      }
      on_stream_head(c, head);
      return true;
    }
    case channel::Kind::chunk:
      if (!c->streaming)
        return false;  // a chunk before the head
      on_stream_chunk(c, std::string(static_cast<const char*>(payload), bytes));
      return true;
    case channel::Kind::end:
      if (!c->streaming)
        return false;  // an end before the head
      calls.remove(h.call);
      on_stream_end(c, (h.flags & channel::kComplete) != 0,
                    std::string(static_cast<const char*>(payload), bytes));
      return true;
    default:
      return false;
  }
}

void attempt_lost(const CallPtr& c, Outcome outcome, const std::string& what, bool crash) {
  c->worker->untrack(c.get());
  if (c->streaming)
    return stream_lost(c, outcome, what + " mid-stream");
  if (c->done)
    return release(c, outcome);
  c->tried.push_back(c->slot->replica_id);
  release(c, outcome);
  retry(c, what, crash);
}

void attempt_expired(const CallPtr& c) {
  if (c->done)
    late_answer(c, Outcome::abandoned);
  else
    on_error(c, caf::make_error(caf::sec::request_timeout));
}

}  // namespace troupe::proxy
