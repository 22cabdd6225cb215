#include "replica/request_workers.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <exception>
#include <string>

#include <caf/all.hpp>

#include "replica/handle_transport.hpp"
#include "runtime/data_channel.hpp"
#include "runtime/log.hpp"
#include "runtime/multiplex.hpp"
#include "runtime/status.hpp"

namespace troupe::replica {

HttpResponse run_handler(Deployment& d, HttpRequest& req, const ModelReport* models) {
  Request in{std::move(req.method), std::move(req.path), std::move(req.query),
             std::move(req.headers), std::move(req.body)};
  HttpResponse out;
  // Handle calls made by handle() carry this request's id and inherit what
  // is left of its deadline.
  RequestIdScope scope(req.request_id, req.timeout_s);
  try {
    Response r = d.handle(in);
    out.status = r.status;
    out.headers = std::move(r.headers);
    out.body = std::move(r.body);
  } catch (const std::exception& e) {
    out.status = 500;
    out.headers = {{"Content-Type", "application/json"}};
    out.body = Json{{"error", std::string("handler raised: ") + e.what()}}.dump();
  } catch (...) {
    out.status = 500;
    out.headers = {{"Content-Type", "application/json"}};
    out.body = Json{{"error", "handler raised a non-standard exception"}}.dump();
  }
  if (!req.request_id.empty())
    out.headers.emplace_back("X-Request-Id", req.request_id);
  if (models && models->active() && !in.multiplexed_model_id().empty())
    out.headers.emplace_back(multiplex::kHeldModelsHeader, multiplex::encode_held(models->held()));
  return out;
}

caf::behavior request_worker(caf::event_based_actor*, Instance instance, DispatchPtr dispatch,
                             size_t index) {
  return {
      [=](handle_atom, HttpRequest& req) -> HttpResponse {
        auto out = run_handler(*instance, req, dispatch->models.get());
        if (dispatch->release(index)) {
          if (auto replica = dispatch->replica.lock())
            caf::anon_send(caf::actor_cast<caf::actor>(replica), done_atom::value);
        }
        return out;
      },
  };
}

// A request thread of a replica with a data channel: blocks in recv() on the
// channel, where the kernel hands each frame to one idle thread, and runs
// the request it got (the thread that reads a request runs it: no hand-off),
// then writes the answer into the lane the request named. Requests that came
// over CAF arrive as `local` frames, and are answered over CAF. Returns when
// the node's end closes.
void channel_worker(Instance instance, DispatchPtr d) {
  auto& ch = *d->channel;
  auto log = troupe::log::get("replica");
  channel::FrameBuffer buffer(ch.max_frame());
  for (;;) {
    ssize_t n = ::recv(ch.request_fd(), buffer.data(), buffer.capacity(), MSG_TRUNC);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return;
    auto size = static_cast<size_t>(n);
    if (size < sizeof(channel::FrameHeader)) {
      log->warn("replica {}: dropped a channel frame of {} bytes", d->replica_id, size);
      continue;
    }
    channel::FrameHeader h = buffer.header();
    if (h.kind == channel::Kind::local) {
      auto m = d->take(h.call);
      if (!m)
        continue;
      HttpResponse out;
      if (m->content().match_elements<handle_atom, HttpRequest>())
        out = run_handler(*instance, m->content().get_mutable_as<HttpRequest>(1), d->models.get());
      d->finish();
      if (m->sender && m->mid.is_request()) {
        m->sender->enqueue(nullptr, m->mid.response_id(), caf::make_message(std::move(out)),
                           nullptr);
      }
      continue;
    }
    if (h.version != channel::kVersion || h.kind != channel::Kind::request ||
        h.lane >= ch.lanes()) {
      log->warn("replica {}: dropped a channel frame (version {}, kind {}, lane {})", d->replica_id,
                h.version, static_cast<int>(h.kind), h.lane);
      continue;
    }
    int answers = ch.answer_fd(h.lane);
    HttpRequest req;
    Status decoded =
        size > buffer.capacity()
            ? Status(errc::invalid_argument, "request frame of " + std::to_string(size) +
                                                 " bytes exceeds the channel's " +
                                                 std::to_string(buffer.capacity()))
            : channel::decode_request(buffer.payload(), size - sizeof(channel::FrameHeader), req);
    if (!decoded) {
      log->warn("replica {}: {}", d->replica_id, decoded.message());
      HttpResponse bad;
      bad.status = 500;
      bad.headers = {{"Content-Type", "application/json"}};
      bad.body = Json{{"error", "replica " + d->replica_id + ": " + decoded.message()}}.dump();
      channel::send_answer(answers, h.call, bad, ch.max_frame());
      continue;
    }
    if (d->stopping.load()) {
      channel::send_refusal(answers, h.call, false, "replica " + d->replica_id + " is stopping",
                            ch.max_frame());
      continue;
    }
    if (!d->admit()) {
      channel::send_refusal(answers, h.call, true,
                            "replica " + d->replica_id + " is at max_ongoing_requests (" +
                                std::to_string(d->limit) + ")",
                            ch.max_frame());
      continue;
    }
    auto out = run_handler(*instance, req, d->models.get());
    d->finish();
    channel::send_answer(answers, h.call, out, ch.max_frame());
  }
}

}  // namespace troupe::replica
