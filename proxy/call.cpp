#include "proxy/call.hpp"

#include "proxy/grpc_fields.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include <boost/beast/http/field.hpp>
#include <caf/actor_cast.hpp>
#include <caf/monitorable_actor.hpp>
#include <nlohmann/json.hpp>

#include "proxy/core.hpp"
#include "proxy/handle_calls.hpp"
#include "runtime/multiplex.hpp"
#include "runtime/time.hpp"

namespace troupe::proxy {

using nlohmann::json;

Response json_error(http::status status, const std::string& message, const std::string& id) {
  Response r{status, 11};
  r.set(http::field::content_type, "application/json");
  r.body() = json{{"error", message}, {"request_id", id}}.dump();
  return r;
}

namespace {

std::string_view target_of(Call& c) {
  auto t = c.exchange->request().target();
  return {t.data(), t.size()};
}

}  // namespace

std::string_view path_of(Call& c) {
  auto t = target_of(c);
  return t.substr(0, t.find('?'));
}

void account_answer(const CallPtr& c, int status, double seconds, int grpc_code) {
  c->worker->core->metrics.observe_http(c->route->app, c->route->prefix, c->request.method, status,
                                        seconds);
  if (c->exchange && c->exchange->grpc()) {
    c->worker->core->metrics.observe_grpc(
        c->route->app, grpc_code >= 0 ? grpc_code : int(grpc::code_for_http(status)));
  }
  const auto& access = c->worker->core->options.access_log;
  if (!access || !access->wants(status))
    return;
  AccessEntry e;
  e.request_id = c->request.request_id;
  e.method = c->request.method;
  e.path = c->exchange ? path_of(*c) : std::string_view(c->request.path);
  e.status = status;
  e.seconds = seconds;
  e.app = c->route->app;
  e.deployment = c->route->deployment;
  if (const auto& slot = c->slot ? c->slot : c->last_slot)
    e.replica = slot->replica_id;
  access->add(e, c->worker->access_batch);
}

void finish(const CallPtr& c, Response&& r) {
  if (c->shadow) {
    end_shadow(c, std::to_string(r.result_int()));
    return;
  }
  if (c->done)
    return;
  if (c->streaming) {
    end_stream_early(c, r.result_int());
    return;
  }
  c->done = true;
  auto* core = c->worker->core;
  if (c->timer)
    c->timer->cancel();
  if (c->queued)
    core->router.cancel(c->route->key, c->ticket);
  c->exchange->shape_answer(r);
  int status = r.result_int();
  double elapsed = std::chrono::duration<double>(Clock::now() - c->start).count();
  core->metrics.observe(c->route->app, status, elapsed);
  core->metrics.first_byte(c->route->app, elapsed);
  core->metrics.request_finished();
  // A deployment may name its gRPC status itself (proxy/grpc_server.hpp).
  int grpc_code = -1;
  if (auto own = r.find("grpc-status"); own != r.end())
    grpc_code = grpc::own_code(std::string_view(own->value().data(), own->value().size()));
  account_answer(c, status, elapsed, grpc_code);
  if (status >= 500) {
    // The path only: a query may carry what does not belong in a log.
    core->log->warn("request {} {} {} -> {} after {:.1f} ms ({} attempts)", c->request.request_id,
                    c->request.method, path_of(*c), status, elapsed * 1000, c->sends);
  } else if (core->log->should_log(spdlog::level::debug)) {
    core->log->debug("request {} {} {} -> {} in {:.2f} ms", c->request.request_id,
                     c->request.method, target_of(*c), status, elapsed * 1000);
  }
  r.set("X-Request-Id", c->request.request_id);
  auto ex = std::move(c->exchange);
  ex->respond(std::move(r));
}

void release(const CallPtr& c, Outcome outcome) {
  if (!c->slot)
    return;
  auto slot = std::move(c->slot);
  c->last_slot = slot;
  auto ready = c->worker->core->router.release(slot, outcome);
  c->worker->core->run(ready);
}

namespace {

// Model multiplexing: an answer to a request that names a model says which
// models its replica holds now (multiplex::kHeldModelsHeader, never passed to
// the client). The router learns it at once, one answer after a load or an
// eviction instead of one controller round trip later.
void learn_held_models(const CallPtr& c, HttpResponse& answer) {
  auto it = std::find_if(answer.headers.begin(), answer.headers.end(), [](const auto& h) {
    return boost::beast::iequals(h.first, multiplex::kHeldModelsHeader);
  });
  if (it == answer.headers.end())
    return;
  multiplex::HeldModels held;
  if (!c->model_id.empty() && c->slot && multiplex::decode_held(it->second, held))
    c->worker->core->router.learn_models(c->slot, held.seq, std::move(held.model_ids));
  answer.headers.erase(it);
}

}  // namespace

std::optional<Response> client_head(const CallPtr& c, HttpResponse& answer) {
  learn_held_models(c, answer);
  if (answer.status < 100 || answer.status > 999)
    return std::nullopt;
  Response r{static_cast<http::status>(answer.status), 11};
  for (auto& [name, value] : answer.headers) {
    auto field = http::string_to_field(name);
    if (field == http::field::content_length || field == http::field::transfer_encoding ||
        field == http::field::connection || boost::beast::iequals(name, "X-Request-Id"))
      continue;
    r.insert(name, value);
  }
  return r;
}

Response invalid_status(const CallPtr& c, int status) {
  return json_error(http::status::bad_gateway,
                    "replica answered with invalid status " + std::to_string(status),
                    c->request.request_id);
}

HttpResponse malformed_answer(const CallPtr& c, const std::string& sender, const std::string& why) {
  HttpResponse answer;
  answer.status = 502;
  answer.headers = {{"Content-Type", "application/json"}};
  answer.body =
      json{{"error", sender + " sent " + why}, {"request_id", c->request.request_id}}.dump();
  return answer;
}

bool past_deadline(const CallPtr& c) {
  return c->deadline != Clock::time_point::max() && Clock::now() >= c->deadline;
}

void on_answer(const CallPtr& c, HttpResponse& answer) {
  c->worker->untrack(c.get());
  auto r = client_head(c, answer);
  release(c, Outcome::answered);
  if (past_deadline(c)) {
    // The deadline passed before the answer came (the timer did not fire
    // yet): the client gets the 504, not what a replica answered once its
    // own copy of the deadline passed (a handler that stopped, cancelled).
    on_timeout(c);
    return;
  }
  if (!r) {
    finish(c, invalid_status(c, answer.status));
    return;
  }
  r->body() = std::move(answer.body);
  finish(c, std::move(*r));
}

namespace {

void give_up(const CallPtr& c, const std::string& why) {
  auto r = json_error(http::status::service_unavailable,
                      "no replica of " + c->route->app + "/" + c->route->deployment +
                          " could take the request after " + std::to_string(c->sends) +
                          " attempts; last: " + why,
                      c->request.request_id);
  r.set(http::field::retry_after, "1");
  finish(c, std::move(r));
}

// A request that crashed Attempts::kMaxCrashes replicas (a "query of death"): it is
// never sent anywhere again. 502, a warning naming it, and a metric.
void crashed(const CallPtr& c, const std::string& why) {
  auto* core = c->worker->core;
  const auto& id = c->request.request_id;
  std::string where = c->route->app + "/" + c->route->deployment;
  core->metrics.crashed(c->route->app);
  core->log->warn(
      "request {} {} {} crashed {} replicas of {} (last: {}); answering 502, it is not retried "
      "again",
      id, c->request.method, path_of(*c), c->attempts.crashes(), where, why);
  finish(c, json_error(http::status::bad_gateway,
                       "request " + id + " crashed " + std::to_string(c->attempts.crashes()) +
                           " replicas of " + where + "; it is not retried again",
                       id));
}

}  // namespace

// The replica is gone before answering: send the request to another one.
//
// `crash`: the replica died while it had the request in flight (its handle
// went down, or the request failed with request_receiver_down or an exit
// reason). The request may be what killed it (user code that crashes on it,
// which takes its whole process down), so it is retried once, on another
// replica; a second crash answers 502 (crashed()): one poisoned request must
// not take down replica after replica. Otherwise (a bounce for lack of a route,
// the connection to the head lost, a node declared DEAD, a handle lost with
// the connection to the controller's node) it is not the request's fault:
// at most max_attempts replicas in all, then 503. The counts: Attempts.
void retry(const CallPtr& c, const std::string& why, bool crash) {
  if (c->streaming) {
    // Its first bytes may have reached the client: never sent again.
    stream_lost(c, Outcome::died, why);
    return;
  }
  if (c->shadow) {
    // A copy is never sent twice: lost with its replica, it ends as 502.
    finish(c, json_error(http::status::bad_gateway, why, c->request.request_id));
    return;
  }
  auto* core = c->worker->core;
  if (c->slot)
    c->tried.push_back(c->slot->replica_id);
  switch (c->attempts.lost(crash)) {
    case Attempts::Loss::crashed:
      crashed(c, why);
      return;
    case Attempts::Loss::give_up:
      give_up(c, why);
      return;
    case Attempts::Loss::retry:
      break;
  }
  core->metrics.retried(c->route->app);
  if (crash) {
    core->log->info("request {} {} {}: {} with it; retrying once on another replica",
                    c->request.request_id, c->request.method, path_of(*c), why);
  } else {
    core->log->info("request {}: retrying on another replica ({})", c->request.request_id, why);
  }
  dispatch(c);
}

// The replica refused (at its max_ongoing_requests because other proxies use
// it too, or stopping). The first time, another replica is tried at once;
// after that every replica may be busy with other routers' requests, so the
// request waits 1, 2, 4 ... 50 ms before it is placed again (until the
// request timeout, or Attempts::kMaxRefusals refusals: 503).
void refused(const CallPtr& c, const std::string& why) {
  if (c->shadow) {
    // Its replica is full (other proxies' requests): the copy is dropped,
    // never placed again.
    end_shadow(c, "dropped");
    return;
  }
  auto* core = c->worker->core;
  auto next = c->attempts.refused();
  if (next.kind == Attempts::Refusal::give_up) {
    give_up(c, why);
    return;
  }
  core->metrics.retried(c->route->app);
  core->log->debug("request {}: refused ({}); placing it again", c->request.request_id, why);
  if (next.kind == Attempts::Refusal::again) {
    dispatch(c);
    return;
  }
  if (!c->backoff)
    c->backoff = std::make_unique<asio::steady_timer>(*c->worker->io);
  c->backoff->expires_after(next.delay);
  c->backoff->async_wait([c](const boost::system::error_code& ec) {
    if (!ec && !c->done)
      dispatch(c);
  });
}

// The replica's handle has ended with user_shutdown: the replica stopped
// because it was told to (replica/replica_actor.cpp gives the handle its
// replica's exit reason). Read under the actor's lock; a live handle, or a
// remote one whose end this node has not heard of yet, says no.
bool stopped_on_request(const ReplicaActor& handle) {
  if (!handle)
    return false;
  auto* actor = caf::actor_cast<caf::abstract_actor*>(handle);
  return static_cast<caf::monitorable_actor*>(actor)->fail_state() ==
         caf::exit_reason::user_shutdown;
}

void on_error(const CallPtr& c, const caf::error& err) {
  c->worker->untrack(c.get());
  auto status = from_caf_error(err);
  if (err == caf::sec::request_timeout) {
    release(c, Outcome::abandoned);
    finish(c,
           json_error(http::status::gateway_timeout, "request timed out", c->request.request_id));
    return;
  }
  if (err.category() == kErrorCategory &&
      (status.code() == errc::overloaded || status.code() == errc::unavailable)) {
    std::string why = status.message();
    if (c->slot)
      c->tried.push_back(c->slot->replica_id);
    release(c, Outcome::refused);
    refused(c, why);
    return;
  }
  // CAF bounces a request it finds no route for with request_receiver_down,
  // the same error as a replica that died with the request (the BASP broker
  // answers so once the connection that leads to the replica's node dropped;
  // it kills the proxies of the directly connected node only, so a remote
  // replica reached through the head keeps a live handle and no down message
  // tells). Such a bounce from a remote replica while the connection to the
  // controller's node is gone is not the request's fault.
  bool bounced = err == caf::exit_reason::remote_link_unreachable ||
                 (err == caf::sec::request_receiver_down && c->slot && !c->slot->local &&
                  c->worker->core->hub_unreachable());
  if (bounced) {
    // Bounced: no route to the replica's node (its connection, or the one to
    // the head that leads there, dropped). The replica may be fine: the next
    // snapshot makes it eligible again.
    std::string why =
        "replica " + (c->slot ? c->slot->replica_id : std::string()) + " is unreachable";
    if (c->slot)
      c->tried.push_back(c->slot->replica_id);
    release(c, Outcome::unreachable);
    retry(c, why, false);
    return;
  }
  // A replica's handle (a CAF actor pool) whose replica has exited answers
  // with an empty message, which CAF reports as unexpected_response: the
  // replica was gone before the request reached it (it never had it in
  // flight), so that is not counted as a crash of the request. The others
  // are: the receiver went down with the request in its mailbox, or with it.
  // (Outcome::died marks the slot dead at once: the retry never goes back to
  // it, even before its down message arrives.)
  //
  // A replica that stopped because it was told to (its handle ended with
  // user_shutdown: a rolling update, a scale-down, a delete) did not crash
  // either: the request reached it after it stopped taking new ones (this
  // proxy's routes did not say so yet), or outlived its graceful stop.
  if (err == caf::sec::request_receiver_down || err == caf::sec::unexpected_response ||
      err == caf::exit_reason::kill || err.category() == caf::atom("exit")) {
    const bool stopped = err == caf::exit_reason::user_shutdown ||
                         (err == caf::sec::request_receiver_down && c->slot &&
                          stopped_on_request(c->slot->handle));
    bool crash = err != caf::sec::unexpected_response && !stopped;
    std::string why = "replica " + (c->slot ? c->slot->replica_id : std::string()) +
                      (stopped ? " has stopped" : crash ? " died" : " is gone");
    if (c->slot)
      c->tried.push_back(c->slot->replica_id);
    release(c, Outcome::died);
    retry(c, why, crash);
    return;
  }
  release(c, Outcome::answered);
  finish(c, json_error(http::status::bad_gateway, "replica failed: " + status.message(),
                       c->request.request_id));
}

void late_answer(const CallPtr& c, Outcome outcome) {
  c->worker->untrack(c.get());
  release(c, outcome);
}

void send(const CallPtr& c, SlotPtr slot) {
  auto* w = c->worker;
  c->via = nullptr;
  if (!slot->handle) {
    // Snapshots lose empty handles before the router sees them (see the
    // proxy actor); should one slip through, it is a replica that is gone.
    c->slot = std::move(slot);
    w->track(c.get());
    on_error(c, caf::make_error(caf::sec::request_receiver_down));
    return;
  }
  c->slot = std::move(slot);
  c->queued = false;
  // What is left of the deadline goes with the request (a retry sends less),
  // so the replica's handle calls inherit it.
  if (c->deadline != Clock::time_point::max()) {
    c->request.timeout_s = std::max(
        std::chrono::duration<double>(c->deadline - Clock::now()).count(), 1e-3);
  }
  ++c->sends;
  c->key = w->new_key();
  c->request.call_key = c->key;
  for (Transport* t : {static_cast<Transport*>(&w->inline_path),
                       static_cast<Transport*>(&w->channels), static_cast<Transport*>(&w->peers)}) {
    if (t->send(c))
      return;
  }
  w->caf.send(c);
}

void sweep(IoThread* w) {
  if (w->core->options.access_log) {
    w->core->options.access_log->pass_on(w->access_batch);
    w->core->metrics.access_log_dropped(w->core->options.access_log->dropped_lines());
  }
  auto limit = seconds_as<Clock::duration>(w->core->options.max_request_time_s);
  auto now = Clock::now();
  w->last_sweep_ns.store(
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count(),
      std::memory_order_relaxed);
  std::vector<CallPtr> expired;
  std::vector<CallPtr> stalled;  // streams
  for (Call* c : w->active) {
    if (now - c->sent_at < limit || !c->via)
      continue;
    (c->streaming ? stalled : expired).push_back(c->shared_from_this());
  }
  for (auto& c : stalled) {
    // No piece of the stream for max_request_time_s.
    cancel_at_replica(c);
    w->untrack(c.get());
    stream_lost(c, Outcome::abandoned, "the stream made no progress for max_request_time_s");
  }
  for (auto& c : expired)
    c->via->expire(c);
  forget_ended_handle_calls(w);
  w->sweeper->expires_after(std::min<Clock::duration>(std::chrono::seconds(1), limit / 4));
  w->sweeper->async_wait([w](const boost::system::error_code& ec) {
    if (!ec)
      sweep(w);
  });
}

void resumed(const CallPtr& c, SlotPtr slot) {
  if (c->done) {
    if (slot) {
      auto ready = c->worker->core->router.release(slot, Outcome::abandoned);
      c->worker->core->run(ready);
    }
    return;
  }
  c->queued = false;
  if (!slot) {
    auto r = json_error(http::status::service_unavailable,
                        "application " + c->route->app + " is no longer deployed",
                        c->request.request_id);
    r.set(http::field::retry_after, "1");
    finish(c, std::move(r));
    return;
  }
  send(c, std::move(slot));
}

void dispatch(const CallPtr& c) {
  auto* w = c->worker;
  auto* core = w->core;
  auto admission = core->router.admit(
      c->route->key, c->tried,
      [c](SlotPtr slot) {
        // Runs where the slot was freed: continue on the call's own thread.
        c->worker->core->post(
            c->worker->io, [c, slot = std::move(slot)]() mutable { resumed(c, std::move(slot)); });
      },
      c->model_id);
  switch (admission.kind) {
    case Router::Admit::assigned:
      send(c, std::move(admission.slot));
      return;
    case Router::Admit::queued:
      c->queued = true;
      c->ticket = admission.ticket;
      if (admission.no_replicas) {
        // The only signal that starts a deployment scaled to zero: report at
        // once, not at the next periodic report.
        core->report_load(
            {{c->route->app, c->route->deployment, static_cast<double>(admission.queued)}});
      }
      return;
    case Router::Admit::queue_full: {
      auto r =
          json_error(http::status::service_unavailable,
                     "too many requests queued for " + c->route->app + "/" + c->route->deployment,
                     c->request.request_id);
      r.set(http::field::retry_after, "1");
      finish(c, std::move(r));
      return;
    }
    case Router::Admit::no_deployment: {
      if (c->handle_route) {
        // A handle names the deployment itself: no such deployment.
        finish(c, json_error(
                      http::status::not_found,
                      "application " + c->route->app + " has no deployment " + c->route->deployment,
                      c->request.request_id));
        return;
      }
      auto r = json_error(
          http::status::service_unavailable,
          "application " + c->route->app + " has no running deployment " + c->route->deployment,
          c->request.request_id);
      r.set(http::field::retry_after, "1");
      finish(c, std::move(r));
      return;
    }
  }
}

void on_timeout(const CallPtr& c) {
  if (c->done)
    return;
  // The replica learns it (its RequestControl's on_cancel callbacks run).
  if (c->slot && !c->streaming)
    cancel_at_replica(c, true);
  finish(c, json_error(http::status::gateway_timeout, "request timed out", c->request.request_id));
}

void arm_deadline(const CallPtr& c, IoThread* w, Clock::time_point start, double timeout_s) {
  if (!(timeout_s > 0))
    return;
  c->deadline = start + seconds_as<Clock::duration>(timeout_s);
  c->timer = std::make_unique<asio::steady_timer>(*w->io, c->deadline);
  c->timer->async_wait([c](const boost::system::error_code& ec) {
    if (!ec)
      on_timeout(c);
  });
}

void start_call(const CallPtr& c, IoThread* w, Clock::time_point start, double timeout_s) {
  arm_deadline(c, w, start, timeout_s);
  c->attempts = Attempts(w->core->options.max_attempts);
  c->model_id = multiplex::model_id_of(c->request.headers);
  dispatch(c);
}

std::string IoThread::new_request_id() {
  // The node's prefix, then the io thread (2 hex digits) and the count (12
  // digits, lower-case hex). By hand: snprintf cost 1 % of the io thread.
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = core->id_prefix;
  const size_t at = id.size();
  id.resize(at + 14);
  const uint64_t n = ++next_id;
  const uint64_t i = index;
  for (size_t k = 0; k < 2; ++k)
    id[at + 1 - k] = kHex[(i >> (4 * k)) & 0xf];
  for (size_t k = 0; k < 12; ++k)
    id[at + 13 - k] = kHex[(n >> (4 * k)) & 0xf];
  return id;
}

// --- fail-over: replicas lost with requests in flight ---------------------------

void fail_over(IoThread* w, const std::function<bool(const ReplicaSlot&)>& gone, const char* what,
               bool crash, Outcome outcome) {
  std::vector<CallPtr> victims;
  for (Call* c : w->active) {
    if (c->slot && gone(*c->slot))
      victims.push_back(c->shared_from_this());
  }
  for (auto& c : victims) {
    // Its transport forgets the attempt: a late answer of it finds no call
    // (the retry may wait in the queue before it sends a new one).
    if (c->via)
      c->via->forget(c);
    attempt_lost(c, outcome, "replica " + c->slot->replica_id + " " + what, crash);
  }
}

void Proxy::Core::replica_down(const caf::actor_addr& addr, const caf::error& reason) {
  const bool link_lost = reason == caf::exit_reason::remote_link_unreachable;
  router.mark_dead(addr, link_lost);
  // A replica that died counts as a crash of the requests it had in flight,
  // also when its handle went down with the connection to its process (which
  // is what a crash of user code looks like once it takes its process down).
  // Except when that connection leads to another troupe-node: the
  // controller's (this node lost its connection to the head: hub_lost(),
  // whose down message may come a little later) or a peer's (the direct
  // connection to that worker dropped: peers.cpp), which is not the
  // requests' fault. And except a replica that stopped because it was told
  // to (a rolling update, a scale-down, a delete: its handle ends with
  // user_shutdown): a request that reached it after it stopped taking new
  // ones, or outlived its graceful stop, is lost with it, not its cause.
  bool crash = reason != caf::exit_reason::user_shutdown;
  const char* what = crash ? "died" : "stopped";
  if (link_lost) {
    // Every other handle of that node died with the same connection: none of
    // them may take a request failed over from this one.
    router.mark_node_lost(addr.node());
    std::lock_guard<std::mutex> lock(actor_mutex);
    crash = !(controller && controller.node() == addr.node()) && !is_peer_node(addr.node());
    what = crash ? "died" : "was lost with the connection to its node";
  }
  for (auto& w : workers) {
    post(w->io, [w = w.get(), addr, crash, what] {
      // A remote replica's node may be gone and never answer.
      fail_over(
          w, [&](const ReplicaSlot& s) { return s.handle && s.handle.address() == addr; }, what,
          crash);
    });
  }
}

bool Proxy::Core::hub_unreachable() {
  ControllerActor to;
  {
    std::lock_guard<std::mutex> lock(actor_mutex);
    to = controller;
  }
  if (!to || to.node() == sys->node())
    return false;
  // The controller's handle is a proxy of the head's node: CAF kills it, with
  // this reason, in the same step that drops the route (before any request
  // can bounce for lack of it). fail_state() reads it under the actor's lock.
  auto* actor = caf::actor_cast<caf::abstract_actor*>(to);
  return static_cast<caf::monitorable_actor*>(actor)->fail_state() ==
         caf::exit_reason::remote_link_unreachable;
}

void Proxy::Core::hub_lost(const std::set<caf::node_id>& direct) {
  log->warn(
      "lost the connection to the controller's node; failing over requests in flight on "
      "remote replicas reached through it ({} nodes connected directly)",
      direct.size());
  auto here = sys->node();
  for (auto& w : workers) {
    post(w->io, [w = w.get(), here, direct] {
      fail_over(
          w,
          [&](const ReplicaSlot& s) {
            return s.handle && s.handle.node() != here && direct.count(s.handle.node()) == 0;
          },
          "was reached through the lost connection", false, Outcome::unreachable);
    });
  }
}

void Proxy::Core::replicas_lost(const std::vector<SlotPtr>& lost) {
  if (lost.empty())
    return;
  log->warn("{} replicas are on nodes the controller declared DEAD; failing over their requests",
            lost.size());
  auto set = std::make_shared<std::vector<const ReplicaSlot*>>();
  for (const auto& s : lost)
    set->push_back(s.get());
  for (auto& w : workers) {
    post(w->io, [w = w.get(), set, lost] {
      fail_over(
          w,
          [&](const ReplicaSlot& s) {
            return std::find(set->begin(), set->end(), &s) != set->end();
          },
          "is on a DEAD node", false);
    });
  }
}

}  // namespace troupe::proxy
