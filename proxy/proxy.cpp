#include "proxy/proxy.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <shared_mutex>
#include <unordered_map>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <spdlog/spdlog.h>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/status.hpp>
#include <caf/actor_companion.hpp>
#include <caf/all.hpp>
#include <caf/scoped_execution_unit.hpp>
#include <nlohmann/json.hpp>

#include "proxy/metrics.hpp"
#include "proxy/router.hpp"
#include "runtime/data_channel.hpp"
#include "runtime/log.hpp"
#include "runtime/wire.hpp"

namespace troupe::proxy {

namespace http = boost::beast::http;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

struct Worker;

// One request on its way through the data path. Lives on its worker's io
// thread: every member is touched only there.
struct Call : std::enable_shared_from_this<Call> {
  ExchangePtr exchange;
  Worker* worker = nullptr;
  const Route* route = nullptr;
  std::shared_ptr<const RouteTable> routes;  // keeps `route` alive
  // A deployment handle's call: its target, which `route` points to.
  std::shared_ptr<const Route> handle_route;
  HttpRequest request;
  std::vector<std::string> tried;  // replica ids that refused or died
  SlotPtr slot;
  uint32_t attempt = 0;  // answers of an earlier attempt are ignored
  uint32_t sends = 0;
  uint32_t deaths = 0;    // replicas lost with this request (crashed or not)
  uint32_t crashes = 0;   // replicas that died while they had it (see retry())
  uint32_t refusals = 0;  // replicas that refused it (at their limit, stopping)
  std::unique_ptr<asio::steady_timer> backoff;
  Clock::time_point sent_at;       // of the current attempt
  caf::message_id response_id;     // of the current attempt (over CAF)
  uint64_t channel_call = 0;       // of the current attempt over a data channel
  size_t active_index = SIZE_MAX;  // in worker->active while a replica has it
  Clock::time_point start;
  Clock::time_point deadline = Clock::time_point::max();
  std::unique_ptr<asio::steady_timer> timer;
  uint64_t ticket = 0;
  bool queued = false;
  bool done = false;
};
using CallPtr = std::shared_ptr<Call>;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

// Everything the proxy shares between its io threads and its actor.
struct Proxy::Core : public Handler {
  caf::actor_system* sys = nullptr;
  ProxyOptions options;
  Router router;
  Metrics metrics;
  std::unique_ptr<HttpServer> server;
  std::vector<std::unique_ptr<Worker>> workers;
  std::shared_ptr<spdlog::logger> log = troupe::log::get("proxy");
  std::atomic<double> snapshot_timeout_s{0};
  std::string id_prefix;

  // Every post to an io thread from another thread (the proxy actor, CAF's
  // threads answering, a slot freed elsewhere) holds this shared and checks
  // io_closed: stop() closes it (exclusively) before the io_contexts go, so
  // nothing is posted to a destroyed io_context. (A down message handled by
  // the proxy actor while stop() destroyed the server did exactly that: a
  // SIGSEGV at shutdown.)
  std::shared_mutex io_mutex;
  bool io_closed = false;
  template <class F>
  bool post(asio::io_context* io, F&& f) {
    std::shared_lock<std::shared_mutex> lock(io_mutex);
    if (io_closed)
      return false;
    asio::post(*io, std::forward<F>(f));
    return true;
  }

  mutable std::mutex actor_mutex;
  caf::actor actor;       // the current proxy actor
  caf::actor keeper;      // restarts it
  caf::actor controller;  // last one that pushed a snapshot
  bool stopped = false;

  explicit Core(ProxyOptions o) : options(std::move(o)), router(router_options(options)) {}

  static RouterOptions router_options(const ProxyOptions& o) {
    RouterOptions r;
    r.local_node = o.node_id;
    if (o.channels) {
      r.channel_of = [channels = o.channels](const std::string& replica_id) {
        return channels->find(replica_id);
      };
    }
    return r;
  }

  void on_request(ExchangePtr exchange) override;
  void on_rejected(int status) override { metrics.observe("", status, 0); }
  // A deployment handle's call (Proxy::caller()).
  void call(const std::string& app, const std::string& deployment, HttpRequest request,
            double timeout_s, CallDone done);
  std::atomic<size_t> next_call_worker{0};

  void run(std::vector<std::function<void()>>& ready) {
    for (auto& f : ready)
      f();
  }
  // `link_lost`: it went down with the connection to its node.
  void replica_down(const caf::actor_addr& addr, bool link_lost);
  // Router::Applied::lost: replicas on nodes declared DEAD.
  void replicas_lost(const std::vector<SlotPtr>& lost);
  // The connection to the controller's node dropped. Every node connects to
  // the head only, and reaches the other nodes through it: requests in
  // flight on any remote replica are lost with it (neither answered nor
  // bounced, and the handles of other nodes' replicas do not go down).
  void hub_lost();
  // (metrics, reporter, app, deployment, queued + in flight) to the
  // controller, for autoscaling.
  void report_load(const std::string& app, const std::string& deployment, double value) {
    caf::actor to;
    {
      std::lock_guard<std::mutex> lock(actor_mutex);
      to = controller;
    }
    if (to)
      caf::anon_send(to, metrics_atom::value, reporter_id(), app, deployment, value);
  }
  std::string reporter_id() const { return options.node_id + "/proxy"; }
  double request_timeout_s() const {
    double t = snapshot_timeout_s.load(std::memory_order_relaxed);
    return t > 0 ? t : options.request_timeout_s;
  }
};

namespace {

// This io thread's answer lane of one replica process's data channel: the
// io thread reads the answers of its requests to that process here, on its
// own event loop.
struct Lane {
  channel::ChannelPtr channel;
  asio::posix::stream_descriptor fd;  // a dup of the lane's node end
  // Answers that come in several frames, by call id: the payload so far.
  struct Partial {
    std::vector<uint64_t> words;
    size_t bytes = 0;
  };
  std::unordered_map<uint64_t, Partial> partial;
  Lane(channel::ChannelPtr ch, asio::io_context& io, int dup) : channel(std::move(ch)), fd(io, dup) {}
};

// Per io thread: the companion actor that sends requests to replicas and
// receives their answers on this thread, and the calls in flight here.
struct Worker {
  Proxy::Core* core = nullptr;
  size_t index = 0;
  asio::io_context* io = nullptr;
  caf::actor companion_handle;
  caf::actor_companion* companion = nullptr;
  std::unique_ptr<caf::scoped_execution_unit> unit;
  std::vector<Call*> active;
  uint64_t next_id = 0;
  // Data channels: the lanes this io thread reads, the calls in flight on
  // them by call id, and a buffer for one frame.
  std::unordered_map<const channel::Channel*, std::unique_ptr<Lane>> lanes;
  std::unordered_map<uint64_t, CallPtr> pending;
  uint64_t next_call = 0;
  std::vector<uint64_t> frame;
  std::unique_ptr<asio::steady_timer> sweeper;
  // When this io thread last ran its sweep (steady clock, ns): the proxy's
  // health check tells a stalled io thread by it.
  std::atomic<int64_t> last_sweep_ns{0};

  void track(Call* c) {
    c->active_index = active.size();
    active.push_back(c);
  }
  void untrack(Call* c) {
    if (c->active_index == SIZE_MAX)
      return;
    Call* last = active.back();
    active[c->active_index] = last;
    last->active_index = c->active_index;
    active.pop_back();
    c->active_index = SIZE_MAX;
  }
};

Response json_error(http::status status, const std::string& message, const std::string& id) {
  Response r{status, 11};
  r.set(http::field::content_type, "application/json");
  r.body() = json{{"error", message}, {"request_id", id}}.dump();
  return r;
}

std::string_view target_of(Call& c) {
  auto t = c.exchange->request().target();
  return {t.data(), t.size()};
}

// The path of the request as the client sent it, without the query (for log
// lines: never the query's or the body's content).
std::string_view path_of(Call& c) {
  auto t = target_of(c);
  return t.substr(0, t.find('?'));
}

void finish(const CallPtr& c, Response&& r) {
  if (c->done)
    return;
  c->done = true;
  auto* core = c->worker->core;
  if (c->timer)
    c->timer->cancel();
  if (c->queued)
    core->router.cancel(c->route->key, c->ticket);
  int status = r.result_int();
  double elapsed = std::chrono::duration<double>(Clock::now() - c->start).count();
  core->metrics.observe(c->route->app, status, elapsed);
  core->metrics.request_finished();
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
  auto ready = c->worker->core->router.release(slot, outcome);
  c->worker->core->run(ready);
}

void dispatch(const CallPtr& c);

void on_answer(const CallPtr& c, HttpResponse& answer) {
  c->worker->untrack(c.get());
  release(c, Outcome::answered);
  if (answer.status < 100 || answer.status > 999) {
    finish(c, json_error(http::status::bad_gateway,
                         "replica answered with invalid status " + std::to_string(answer.status),
                         c->request.request_id));
    return;
  }
  Response r{static_cast<http::status>(answer.status), 11};
  for (auto& [name, value] : answer.headers) {
    auto field = http::string_to_field(name);
    if (field == http::field::content_length || field == http::field::transfer_encoding ||
        field == http::field::connection || boost::beast::iequals(name, "X-Request-Id"))
      continue;
    r.insert(name, value);
  }
  r.body() = std::move(answer.body);
  finish(c, std::move(r));
}

void give_up(const CallPtr& c, const std::string& why) {
  auto r = json_error(http::status::service_unavailable,
                      "no replica of " + c->route->app + "/" + c->route->deployment +
                          " could take the request after " + std::to_string(c->sends) +
                          " attempts; last: " + why,
                      c->request.request_id);
  r.set(http::field::retry_after, "1");
  finish(c, std::move(r));
}

// A request that crashed kMaxCrashes replicas (a "query of death"): it is
// never sent anywhere again. 502, a warning naming it, and a metric.
void crashed(const CallPtr& c, const std::string& why) {
  auto* core = c->worker->core;
  const auto& id = c->request.request_id;
  std::string where = c->route->app + "/" + c->route->deployment;
  core->metrics.crashed(c->route->app);
  core->log->warn(
      "request {} {} {} crashed {} replicas of {} (last: {}); answering 502, it is not retried "
      "again",
      id, c->request.method, path_of(*c), c->crashes, where, why);
  finish(c, json_error(http::status::bad_gateway,
                       "request " + id + " crashed " + std::to_string(c->crashes) +
                           " replicas of " + where + "; it is not retried again",
                       id));
}

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
// at most max_attempts replicas in all, then 503.
constexpr uint32_t kMaxCrashes = 2;

void retry(const CallPtr& c, const std::string& why, bool crash) {
  auto* core = c->worker->core;
  if (c->slot)
    c->tried.push_back(c->slot->replica_id);
  if (crash && ++c->crashes >= kMaxCrashes) {
    crashed(c, why);
    return;
  }
  if (++c->deaths >= core->options.max_attempts) {
    give_up(c, why);
    return;
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
// request timeout, or kMaxRefusals refusals: 503).
constexpr uint32_t kMaxRefusals = 40;

void refused(const CallPtr& c, const std::string& why) {
  auto* core = c->worker->core;
  if (++c->refusals > kMaxRefusals) {
    give_up(c, why);
    return;
  }
  core->metrics.retried(c->route->app);
  core->log->debug("request {}: refused ({}); placing it again", c->request.request_id, why);
  if (c->refusals == 1) {
    dispatch(c);
    return;
  }
  auto delay = std::chrono::milliseconds(
      std::min<uint32_t>(50, 1u << std::min<uint32_t>(c->refusals - 2, 6)));
  if (!c->backoff)
    c->backoff = std::make_unique<asio::steady_timer>(*c->worker->io);
  c->backoff->expires_after(delay);
  c->backoff->async_wait([c](const boost::system::error_code& ec) {
    if (!ec && !c->done)
      dispatch(c);
  });
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
  if (err == caf::exit_reason::remote_link_unreachable) {
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
  if (err == caf::sec::request_receiver_down || err == caf::sec::unexpected_response ||
      err == caf::exit_reason::kill || err.category() == caf::atom("exit")) {
    bool crash = err != caf::sec::unexpected_response;
    std::string why = "replica " + (c->slot ? c->slot->replica_id : std::string()) +
                      (crash ? " died" : " is gone");
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

// The client already got its answer (504); the replica finished only now, so
// only now does its slot become free.
void late_answer(const CallPtr& c, Outcome outcome) {
  c->worker->untrack(c.get());
  release(c, outcome);
}

// --- data channels to replica processes (runtime/data_channel.hpp) -------------

// An answer larger than this (in several frames) ends the lane: no replica
// answer is that large, a runaway one must not exhaust the node's memory.
constexpr size_t kMaxChannelAnswer = size_t{1} << 30;

void arm(Worker* w, Lane* lane);

// The lane's replica process closed its end (it exited) or broke the
// protocol: its requests in flight on this io thread will never be answered
// here. Each is a crash of the request, as when the replica's handle goes
// down (see retry()); the first of the two signals to arrive fails it over.
// Later requests to that replica take the CAF path.
void lane_closed(Worker* w, Lane* lane, const std::string& why) {
  auto ch = lane->channel;
  ch->set_broken();
  std::vector<CallPtr> victims;
  for (auto& [id, c] : w->pending) {
    if (c->slot && c->slot->channel == ch)
      victims.push_back(c);
  }
  w->lanes.erase(ch.get());  // `lane` is gone from here on
  auto* core = w->core;
  if (!victims.empty() || why != "closed") {
    core->log->info("data channel of replica {}: {} ({} requests in flight here)",
                    ch->replica_id(), why, victims.size());
  }
  for (auto& c : victims) {
    w->pending.erase(c->channel_call);
    c->channel_call = 0;
    w->untrack(c.get());
    if (c->done) {
      release(c, Outcome::died);
      continue;
    }
    std::string what = "replica " + c->slot->replica_id + " died";
    c->tried.push_back(c->slot->replica_id);
    release(c, Outcome::died);
    retry(c, what, true);
  }
}

// One frame from a lane, in w->frame (`size` bytes). False when the replica
// broke the protocol (the lane is closed then).
bool on_frame(Worker* w, Lane* lane, size_t size) {
  auto* core = w->core;
  if (size < sizeof(channel::FrameHeader) || size > w->frame.size() * sizeof(uint64_t))
    return false;
  channel::FrameHeader h = *reinterpret_cast<const channel::FrameHeader*>(w->frame.data());
  if (h.version != channel::kVersion ||
      (h.kind != channel::Kind::answer && h.kind != channel::Kind::refusal))
    return false;
  const void* payload = w->frame.data() + 2;
  size_t bytes = size - sizeof(channel::FrameHeader);
  auto part = lane->partial.find(h.call);
  if ((h.flags & channel::kMore) != 0 || part != lane->partial.end()) {
    if (part == lane->partial.end())
      part = lane->partial.emplace(h.call, Lane::Partial{}).first;
    auto& p = part->second;
    if (p.bytes % sizeof(uint64_t) != 0 || p.bytes + bytes > kMaxChannelAnswer)
      return false;
    p.words.resize((p.bytes + bytes + 7) / 8);
    std::memcpy(reinterpret_cast<char*>(p.words.data()) + p.bytes, payload, bytes);
    p.bytes += bytes;
    if ((h.flags & channel::kMore) != 0)
      return true;
  }
  Lane::Partial whole;
  if (part != lane->partial.end()) {
    whole = std::move(part->second);
    lane->partial.erase(part);
    payload = whole.words.data();
    bytes = whole.bytes;
  }
  auto it = w->pending.find(h.call);
  if (it == w->pending.end())
    return true;  // failed over or timed out meanwhile
  CallPtr c = it->second;
  if (!c->slot || c->slot->channel != lane->channel) {
    // Only the replica a request went to answers it.
    core->log->warn("replica {} answered a request it was not sent; closing its data channel",
                    lane->channel->replica_id());
    return false;
  }
  w->pending.erase(it);
  c->channel_call = 0;
  if (h.kind == channel::Kind::refusal) {
    bool overloaded = false;
    std::string message;
    auto st = channel::decode_refusal(payload, bytes, overloaded, message);
    if (!st)
      message = st.message();
    if (c->done) {
      late_answer(c, Outcome::refused);
      return true;
    }
    on_error(c, to_caf_error(Status(overloaded ? errc::overloaded : errc::unavailable, message)));
    return true;
  }
  HttpResponse answer;
  auto st = channel::decode_answer(payload, bytes, answer);
  if (c->done) {
    late_answer(c, Outcome::answered);
    return true;
  }
  if (!st) {
    core->log->warn("replica {}: {}", lane->channel->replica_id(), st.message());
    answer = HttpResponse{};
    answer.status = 502;
    answer.headers = {{"Content-Type", "application/json"}};
    answer.body = json{{"error", "replica " + lane->channel->replica_id() + " sent " +
                                     st.message()},
                       {"request_id", c->request.request_id}}
                      .dump();
  }
  on_answer(c, answer);
  return true;
}

// Reads what the lane has (a bounded batch, so that one busy replica does
// not starve the others on this io thread), then waits for more.
void read_lane(Worker* w, Lane* lane) {
  int fd = lane->fd.native_handle();
  size_t capacity = w->frame.size() * sizeof(uint64_t);
  for (int i = 0; i < 64; ++i) {
    ssize_t n = ::recv(fd, w->frame.data(), capacity, MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      break;
    if (n <= 0)
      return lane_closed(w, lane, n == 0 ? "closed" : std::strerror(errno));
    if (!on_frame(w, lane, static_cast<size_t>(n)))
      return lane_closed(w, lane, "protocol error (a malformed frame)");
  }
  arm(w, lane);
}

void arm(Worker* w, Lane* lane) {
  lane->fd.async_wait(asio::posix::descriptor_base::wait_read,
                      [w, lane](const boost::system::error_code& ec) {
                        if (!ec)
                          read_lane(w, lane);
                      });
}

// This io thread's lane of `ch`, opened on first use; null when it cannot be.
Lane* lane_of(Worker* w, const channel::ChannelPtr& ch) {
  auto it = w->lanes.find(ch.get());
  if (it != w->lanes.end())
    return it->second.get();
  if (w->index >= ch->lanes())
    return nullptr;
  int fd = ::fcntl(ch->answer_fd(w->index), F_DUPFD_CLOEXEC, 0);
  if (fd < 0)
    return nullptr;
  if (w->frame.size() * sizeof(uint64_t) < ch->max_frame())
    w->frame.resize((ch->max_frame() + 7) / 8);
  auto lane = std::make_unique<Lane>(ch, *w->io, fd);
  auto* raw = lane.get();
  w->lanes.emplace(ch.get(), std::move(lane));
  arm(w, raw);
  return raw;
}

// Sends the call's request over its replica's data channel; false when it
// has none (or a broken one), the request does not fit in a frame or the
// channel is full: then it goes over CAF.
bool send_channel(const CallPtr& c) {
  auto* w = c->worker;
  const auto& ch = c->slot->channel;
  if (!ch || ch->broken() || !lane_of(w, ch))
    return false;
  uint64_t id = ++w->next_call;
  auto sent = channel::send_request(ch->request_fd(), id, static_cast<uint8_t>(w->index),
                                    c->request, ch->max_frame());
  if (sent == channel::Sent::closed)
    ch->set_broken();
  if (sent != channel::Sent::sent)
    return false;
  c->channel_call = id;
  c->sent_at = Clock::now();
  w->pending.emplace(id, c);
  w->track(c.get());
  return true;
}

void send(const CallPtr& c, SlotPtr slot) {
  auto* w = c->worker;
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
  uint32_t attempt = ++c->attempt;
  ++c->sends;
  if (send_channel(c)) {
    w->core->metrics.sent(true);
    return;
  }
  w->core->metrics.sent(false);
  // What mixin::requester does (actor_companion has no request()): a request
  // id, a response handler with an error branch, and a timeout. The timeout
  // is the worker's sweep (see sweep()), not CAF's clock: the clock thread
  // would be woken twice per request (set and cancel), two context switches
  // per request on the data path. The client gets its 504 from the call's
  // timer at the deadline; the replica slot stays taken until the replica
  // answers (it still works on the request), bounded by max_request_time_s.
  auto* self = w->companion;
  auto id = self->new_request_id(caf::message_priority::normal);
  c->sent_at = Clock::now();
  c->response_id = id.response_id();
  w->track(c.get());
  self->add_multiplexed_response_handler(id.response_id(),
                                         caf::behavior{
                                             [c, attempt](HttpResponse& answer) {
                                               if (attempt != c->attempt)
                                                 return;  // superseded: retried after a down
                                               if (c->done)
                                                 return late_answer(c, Outcome::answered);
                                               on_answer(c, answer);
                                             },
                                             [c, attempt](caf::error& err) {
                                               if (attempt != c->attempt)
                                                 return;
                                               if (c->done)
                                                 return late_answer(c, Outcome::abandoned);
                                               on_error(c, err);
                                             },
                                         });
  c->slot->handle->enqueue(self->ctrl(), id, caf::make_message(handle_atom::value, c->request),
                           self->context());
}

// Every second on each io thread: a request whose replica has not answered
// within max_request_time_s gets CAF's request_timeout error, delivered the
// way CAF's clock would (so its response handler runs and is removed).
void sweep(Worker* w) {
  auto limit = seconds(w->core->options.max_request_time_s);
  auto now = Clock::now();
  w->last_sweep_ns.store(
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count(),
      std::memory_order_relaxed);
  std::vector<CallPtr> expired;  // over a data channel
  for (Call* c : w->active) {
    if (now - c->sent_at < limit)
      continue;
    if (c->channel_call != 0) {
      expired.push_back(c->shared_from_this());
      continue;
    }
    w->companion->enqueue(nullptr, c->response_id,
                          caf::make_message(caf::make_error(caf::sec::request_timeout)),
                          w->unit.get());
  }
  for (auto& c : expired) {
    w->pending.erase(c->channel_call);
    c->channel_call = 0;
    if (c->done)
      late_answer(c, Outcome::abandoned);
    else
      on_error(c, caf::make_error(caf::sec::request_timeout));
  }
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
  auto admission = core->router.admit(c->route->key, c->tried, [c](SlotPtr slot) {
    // Runs where the slot was freed: continue on the call's own thread.
    c->worker->core->post(c->worker->io,
                          [c, slot = std::move(slot)]() mutable { resumed(c, std::move(slot)); });
  });
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
        core->report_load(c->route->app, c->route->deployment,
                          static_cast<double>(admission.queued));
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
  finish(c, json_error(http::status::gateway_timeout, "request timed out", c->request.request_id));
}

// Arms the call's deadline (`timeout_s` after `start`; none when 0) and
// routes it: the common start of HTTP requests and handle calls.
void start_call(const CallPtr& c, Worker* w, Clock::time_point start, double timeout_s) {
  if (timeout_s > 0) {
    c->deadline = start + seconds(timeout_s);
    c->timer = std::make_unique<asio::steady_timer>(*w->io, c->deadline);
    c->timer->async_wait([c](const boost::system::error_code& ec) {
      if (!ec)
        on_timeout(c);
    });
  }
  dispatch(c);
}

bool valid_request_id(boost::beast::string_view id) {
  if (id.empty() || id.size() > 128)
    return false;
  for (char ch : id) {
    if (ch <= 0x20 || ch >= 0x7f)
      return false;
  }
  return true;
}

json routes_json(const Router& router) {
  json routes = json::array();
  for (const auto& r : router.routes()->routes()) {
    routes.push_back({{"prefix", r.prefix}, {"application", r.app}, {"deployment", r.deployment}});
  }
  json deployments = json::array();
  for (const auto& d : router.deployments()) {
    json replicas = json::array();
    for (const auto& r : d.replicas) {
      replicas.push_back({{"id", r.replica_id},
                          {"node", r.node_id},
                          {"local", r.local},
                          {"in_flight", r.in_flight},
                          {"max_ongoing_requests", r.max_ongoing}});
    }
    deployments.push_back({{"application", d.app},
                           {"deployment", d.deployment},
                           {"max_queued_requests", d.max_queued},
                           {"queued", d.queued},
                           {"replicas", replicas}});
  }
  return {{"epoch", router.epoch()},
          {"seq", router.seq()},
          {"routes", routes},
          {"deployments", deployments}};
}

}  // namespace

void Proxy::Core::on_request(ExchangePtr exchange) {
  auto start = Clock::now();
  metrics.request_started();
  auto* w = workers[exchange->thread()].get();
  auto& req = exchange->request();
  boost::beast::string_view target = req.target();
  auto qpos = target.find('?');
  boost::beast::string_view path = target.substr(0, qpos);
  std::string id;
  if (auto it = req.find("X-Request-Id"); it != req.end() && valid_request_id(it->value())) {
    id = std::string(it->value());
  } else {
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%s%02zx%012llx", id_prefix.c_str(), w->index,
                  static_cast<unsigned long long>(++w->next_id));
    id = buf;
  }
  auto answer_local = [&](Response&& r) {
    metrics.observe("", r.result_int(),
                    std::chrono::duration<double>(Clock::now() - start).count());
    metrics.request_finished();
    r.set("X-Request-Id", id);
    exchange->respond(std::move(r));
  };
  if (path.size() >= 3 && path.substr(0, 3) == "/-/") {
    Response r{http::status::ok, 11};
    if (path == "/-/healthz") {
      bool ok = router.has_routes();
      r.result(ok ? http::status::ok : http::status::service_unavailable);
      r.set(http::field::content_type, "text/plain");
      r.body() = ok ? "success" : "no route table yet";
    } else if (path == "/-/routes") {
      r.set(http::field::content_type, "application/json");
      r.body() = routes_json(router).dump();
    } else if (path == "/-/metrics") {
      r.set(http::field::content_type, "text/plain; version=0.0.4");
      r.body() = metrics.render(router.deployments());
    } else {
      answer_local(json_error(http::status::not_found, "no such endpoint", id));
      return;
    }
    answer_local(std::move(r));
    return;
  }
  auto table = router.routes();
  auto match = table->match(std::string_view(path.data(), path.size()));
  if (!match.route) {
    if (!router.has_routes()) {
      // A node that just started has no route table yet: that is not a 404
      // (the path may well be served a moment later); ask the client to retry.
      auto r = json_error(http::status::service_unavailable,
                          "this node has no route table yet; retry shortly", id);
      r.set(http::field::retry_after, "1");
      answer_local(std::move(r));
      return;
    }
    answer_local(json_error(http::status::not_found,
                            "no application serves path '" + std::string(path) + "'", id));
    return;
  }
  auto c = std::make_shared<Call>();
  c->exchange = std::move(exchange);
  c->worker = w;
  c->route = match.route;
  c->routes = std::move(table);
  c->start = start;
  auto& hr = c->request;
  hr.method = std::string(req.method_string());
  hr.path = std::string(match.rest);
  if (qpos != boost::beast::string_view::npos)
    hr.query = std::string(target.substr(qpos + 1));
  hr.headers.reserve(std::distance(req.begin(), req.end()));
  for (const auto& f : req)
    hr.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
  hr.body = std::move(req.body());
  hr.request_id = std::move(id);
  start_call(c, w, start, request_timeout_s());
}

namespace {

// On the worker's io thread: the requests in flight there on a replica that
// `gone` selects will never be answered; retry each on another replica now,
// not at its timeout. `crash`: the replica died with them (see retry()).
template <class Pred>
void fail_over(Worker* w, Pred gone, const char* what, bool crash,
               Outcome outcome = Outcome::died) {
  std::vector<CallPtr> victims;
  for (Call* c : w->active) {
    if (c->slot && gone(*c->slot))
      victims.push_back(c->shared_from_this());
  }
  for (auto& c : victims) {
    w->untrack(c.get());
    // Its response handler in the companion would wait for an answer that
    // does not come: end it now. The handler ignores it, being of an
    // attempt superseded here (the retry may wait in the queue before it
    // sends a new one). Over a data channel: a late answer finds no call.
    ++c->attempt;
    if (c->channel_call != 0) {
      w->pending.erase(c->channel_call);
      c->channel_call = 0;
    } else {
      w->companion->enqueue(nullptr, c->response_id,
                            caf::make_message(caf::make_error(caf::sec::request_timeout)),
                            w->unit.get());
    }
    if (c->done) {
      release(c, outcome);
      continue;
    }
    std::string why = "replica " + c->slot->replica_id + " " + what;
    c->tried.push_back(c->slot->replica_id);
    release(c, outcome);
    retry(c, why, crash);
  }
}

}  // namespace

void Proxy::Core::replica_down(const caf::actor_addr& addr, bool link_lost) {
  router.mark_dead(addr, link_lost);
  // A replica that died counts as a crash of the requests it had in flight,
  // also when its handle went down with the connection to its process (which
  // is what a crash of user code looks like once it takes its process down).
  // Except when that connection leads to the controller's node: then this
  // node lost its connection to the head (hub_lost(), whose down message may
  // come a little later), which is not the requests' fault.
  bool crash = true;
  if (link_lost) {
    // Every other handle of that node died with the same connection: none of
    // them may take a request failed over from this one.
    router.mark_node_lost(addr.node());
    std::lock_guard<std::mutex> lock(actor_mutex);
    crash = !(controller && controller.node() == addr.node());
  }
  for (auto& w : workers) {
    post(w->io, [w = w.get(), addr, crash] {
      // A remote replica's node may be gone and never answer.
      fail_over(
          w, [&](const ReplicaSlot& s) { return s.handle && s.handle.address() == addr; },
          crash ? "died" : "was lost with the connection to the head", crash);
    });
  }
}

void Proxy::Core::hub_lost() {
  log->warn(
      "lost the connection to the controller's node; failing over requests in flight on "
      "remote replicas");
  auto here = sys->node();
  for (auto& w : workers) {
    post(w->io, [w = w.get(), here] {
      fail_over(
          w, [&](const ReplicaSlot& s) { return s.handle && s.handle.node() != here; },
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

namespace {

// The Exchange of a deployment handle's call: no socket; the answer goes to
// the caller's callback. Destroyed unanswered (the proxy stopped with the
// call queued or in flight), it answers 503 so the caller never waits forever.
class HandleExchange : public Exchange {
 public:
  explicit HandleExchange(Proxy::CallDone done) : done_(std::move(done)) {}
  ~HandleExchange() override {
    if (done_) {
      HttpResponse r;
      r.status = 503;
      r.headers = {{"Content-Type", "application/json"}, {"Retry-After", "1"}};
      r.body =
          json{{"error", "the proxy of this node stopped before the call was answered"}}.dump();
      answer(std::move(r));
    }
  }
  void bind(size_t thread, asio::io_context* io) {
    thread_ = thread;
    io_ = io;
  }
  Request& request() override { return request_; }
  void respond(Response&& response) override {
    HttpResponse r;
    r.status = response.result_int();
    for (const auto& f : response)
      r.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    r.body = std::move(response.body());
    answer(std::move(r));
  }
  size_t thread() const override { return thread_; }
  asio::io_context& io() override { return *io_; }

 private:
  void answer(HttpResponse r) {
    auto done = std::move(done_);
    done_ = nullptr;
    if (done)
      done(std::move(r));
  }
  Proxy::CallDone done_;
  Request request_;  // method and target, for log lines
  size_t thread_ = 0;
  asio::io_context* io_ = nullptr;
};

}  // namespace

void Proxy::Core::call(const std::string& app, const std::string& deployment, HttpRequest request,
                       double timeout_s, CallDone done) {
  auto start = Clock::now();
  auto ex = std::make_shared<HandleExchange>(std::move(done));
  Worker* w = nullptr;
  {
    // Under the mutex stop() takes first: nothing is posted to an io_context
    // that is going away.
    std::lock_guard<std::mutex> lock(actor_mutex);
    if (stopped || workers.empty())
      return;  // `ex` answers 503 as it goes
    w = workers[next_call_worker.fetch_add(1, std::memory_order_relaxed) % workers.size()].get();
    ex->bind(w->index, w->io);
    metrics.request_started();
    asio::post(*w->io, [this, w, ex, app, deployment, request = std::move(request), timeout_s,
                        start]() mutable {
      auto c = std::make_shared<Call>();
      c->handle_route = std::make_shared<Route>(
          Route{std::string(), app, deployment, deployment_key(app, deployment)});
      c->route = c->handle_route.get();
      c->worker = w;
      c->start = start;
      if (request.method.empty())
        request.method = "GET";
      if (request.path.empty() || request.path[0] != '/')
        request.path = "/" + request.path;
      if (!valid_request_id(request.request_id)) {
        char buf[40];
        std::snprintf(buf, sizeof(buf), "%s%02zx%012llx", id_prefix.c_str(), w->index,
                      static_cast<unsigned long long>(++w->next_id));
        request.request_id = buf;
      }
      auto& shown = ex->request();
      shown.method_string(request.method);
      shown.target("handle:" + deployment + request.path);
      c->exchange = std::move(ex);
      c->request = std::move(request);
      if (!router.has_routes()) {
        auto r =
            json_error(http::status::service_unavailable,
                       "this node has no route table yet; retry shortly", c->request.request_id);
        r.set(http::field::retry_after, "1");
        finish(c, std::move(r));
        return;
      }
      start_call(c, w, start, timeout_s > 0 ? timeout_s : request_timeout_s());
    });
  }
}

namespace {

using core_ptr = std::shared_ptr<Proxy::Core>;

constexpr auto kReportInterval = std::chrono::seconds(1);
// An io thread whose once-a-second sweep has not run for this long is
// reported by the health check.
constexpr double kIoStallLimit = 5.0;

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

  // Once; from any thread.
  void send(HttpResponse answer) {
    auto msg = caf::make_message(std::move(answer));
    if (!stages_.empty()) {
      // Forwarded with stages left: the next stage receives the answer as the
      // request (what response_promise::deliver does).
      auto next = std::move(stages_.back());
      stages_.pop_back();
      next->enqueue(
          caf::make_mailbox_element(std::move(sender_), mid_, std::move(stages_), std::move(msg)),
          nullptr);
      return;
    }
    if (sender_ && mid_.is_request())
      sender_->enqueue(nullptr, mid_.response_id(), std::move(msg), nullptr);
    sender_ = nullptr;
  }

 private:
  caf::strong_actor_ptr sender_;
  caf::message_id mid_;
  caf::mailbox_element::forwarding_stack stages_;
};

// The proxy actor: applies snapshots, monitors replicas, answers health.
caf::behavior proxy_actor(caf::event_based_actor* self, core_ptr core) {
  // The controller this actor monitors: its handle going down with the
  // connection means this node lost its route to every other node.
  auto watched = std::make_shared<caf::actor_addr>();
  auto watch = [self, watched](const caf::actor& controller) {
    if (!controller || controller.address() == *watched)
      return;
    *watched = controller.address();
    self->monitor(controller);
  };
  self->set_down_handler([core, watched](caf::down_msg& dm) {
    bool link_lost = dm.reason == caf::exit_reason::remote_link_unreachable;
    if (dm.source == *watched) {
      *watched = caf::actor_addr();
      if (link_lost)
        core->hub_lost();
      return;
    }
    core->replica_down(dm.source, link_lost);
  });
  // A restarted proxy: watch the replicas it already knows, and ask the last
  // controller for what changed since the snapshot it holds.
  for (const auto& h : core->router.handles())
    self->monitor(h);
  caf::actor controller;
  {
    std::lock_guard<std::mutex> lock(core->actor_mutex);
    controller = core->controller;
  }
  if (controller) {
    watch(controller);
    self->send(controller, subscribe_atom::value, caf::actor_cast<caf::actor>(self),
               core->router.epoch(), core->router.seq(), core->options.node_id);
  }
  self->delayed_send(self, kReportInterval, tick_atom::value);
  return {
      [=](snapshot_atom, RoutingSnapshot snap) {
        // CAF deserializes the handle of an actor of this node that is
        // already gone as an empty one: a replica here that died while the
        // snapshot naming it was on its way. It is not routable; the next
        // snapshot that names it with a handle brings it back.
        for (auto& d : snap.deployments) {
          d.replicas.erase(std::remove_if(d.replicas.begin(), d.replicas.end(),
                                          [](const ReplicaEndpoint& ep) { return !ep.handle; }),
                           d.replicas.end());
        }
        if (auto sender = caf::actor_cast<caf::actor>(self->current_sender())) {
          watch(sender);
          std::lock_guard<std::mutex> lock(core->actor_mutex);
          core->controller = sender;
        }
        bool first = !core->router.has_routes();
        auto applied = core->router.apply(snap);
        core->snapshot_timeout_s.store(snap.request_timeout_s, std::memory_order_relaxed);
        for (const auto& h : applied.added)
          self->monitor(h);
        core->run(applied.ready);
        core->replicas_lost(applied.lost);
        auto level = first || snap.full ? spdlog::level::info : spdlog::level::debug;
        core->log->log(level, "route table {}.{} ({}; {} routes, {} deployments changed)",
                       snap.epoch, snap.seq, snap.full ? "full" : "delta",
                       core->router.routes()->routes().size(), snap.deployments.size());
      },
      // Healthy while every io thread runs its sweep (at least once a
      // second): a stalled event loop serves nobody.
      [=](health_atom) -> caf::result<caf::ok_atom> {
        auto now =
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
                .count();
        for (const auto& w : core->workers) {
          int64_t last = w->last_sweep_ns.load(std::memory_order_relaxed);
          double stalled_s = (now - last) / 1e9;
          if (last != 0 && stalled_s > kIoStallLimit) {
            return to_caf_error(Status(
                errc::unavailable, "io thread " + std::to_string(w->index) + " has not run for " +
                                       fmt::format("{:.1f}", stalled_s) + " s"));
          }
        }
        return caf::ok_atom::value;
      },
      [=](tick_atom) {
        // Every deployment's queued + in-flight requests as this proxy sees
        // them (the controller averages each reporter's samples).
        for (const auto& d : core->router.deployments()) {
          double load = static_cast<double>(d.queued);
          for (const auto& r : d.replicas)
            load += r.in_flight;
          core->report_load(d.app, d.deployment, load);
        }
        self->delayed_send(self, kReportInterval, tick_atom::value);
      },
      // A deployment handle's call from another process (a replica process:
      // replica/handle_transport.hpp, make_remote_proxy_call), usually
      // delegated by the keeper: Core::call, exactly as Proxy::caller(). Its
      // bounds are Core::call's (the call's timeout, retries, 503 when the
      // proxy stops: `done` always runs once); the caller's request carries a
      // timeout of its own. The answer is sent from the io thread that gets
      // it, see ReplyTo.
      [=](call_atom, std::string& app, std::string& deployment, HttpRequest& request,
          double timeout_s) -> caf::result<HttpResponse> {
        auto reply = std::make_shared<ReplyTo>(*self->current_mailbox_element());
        core->call(app, deployment, std::move(request), timeout_s,
                   [reply](HttpResponse answer) { reply->send(std::move(answer)); });
        return caf::delegated<HttpResponse>{};
      },
  };
}

// Restarts the proxy actor when it dies of anything but a shutdown.
caf::behavior keeper_actor(caf::event_based_actor* self, core_ptr core) {
  self->set_down_handler([=](caf::down_msg& dm) {
    std::lock_guard<std::mutex> lock(core->actor_mutex);
    if (core->stopped || dm.source != core->actor.address())
      return;
    if (dm.reason == caf::exit_reason::user_shutdown)
      return;
    core->log->error("proxy actor died ({}); restarting it", self->home_system().render(dm.reason));
    core->actor = self->spawn(proxy_actor, core);
    self->monitor(core->actor);
  });
  return {
      [=](caf::actor& proxy) { self->monitor(proxy); },
      // From the node agent after each (re-)registration: subscribe the
      // current proxy actor (a restarted one too) for a full snapshot.
      [=](subscribe_atom, const caf::actor& controller) {
        caf::actor current;
        {
          std::lock_guard<std::mutex> lock(core->actor_mutex);
          current = core->actor;
        }
        if (controller && current) {
          self->send(controller, subscribe_atom::value, current, uint64_t{0}, uint64_t{0},
                     core->options.node_id);
        }
      },
      // A deployment handle's call from another process: the keeper is the
      // handle that stays valid across restarts of the proxy actor, so callers
      // hold it; delegated to the current proxy actor, which answers the
      // caller directly. (One that died and is not restarted yet bounces it:
      // the caller gets request_receiver_down.)
      [=](call_atom, std::string& app, std::string& deployment, HttpRequest& request,
          double timeout_s) -> caf::result<HttpResponse> {
        caf::actor current;
        {
          std::lock_guard<std::mutex> lock(core->actor_mutex);
          if (!core->stopped)
            current = core->actor;
        }
        if (!current)
          return to_caf_error(Status(errc::unavailable, "the proxy of this node is stopped"));
        self->delegate(current, call_atom::value, std::move(app), std::move(deployment),
                       std::move(request), timeout_s);
        return caf::delegated<HttpResponse>{};
      },
  };
}

}  // namespace

Result<std::unique_ptr<Proxy>> Proxy::start(caf::actor_system& sys, ProxyOptions options) {
  auto core = std::make_shared<Core>(std::move(options));
  core->sys = &sys;
  {
    std::random_device rd;
    char buf[16];
    std::snprintf(buf, sizeof(buf), "%06x", rd() & 0xffffff);
    core->id_prefix = buf;
  }
  core->server = std::make_unique<HttpServer>(core->options.server, *core);
  if (auto st = core->server->listen(); !st)
    return st;
  for (size_t i = 0; i < core->server->threads(); ++i) {
    auto w = std::make_unique<Worker>();
    w->core = core.get();
    w->index = i;
    w->io = &core->server->io(i);
    w->unit = std::make_unique<caf::scoped_execution_unit>(&sys);
    w->companion_handle = sys.spawn<caf::actor_companion>();
    w->companion = static_cast<caf::actor_companion*>(
        caf::actor_cast<caf::abstract_actor*>(w->companion_handle));
    w->companion->context(w->unit.get());
    // Without a behavior the companion would terminate after its first
    // answer; it receives nothing but answers and timeouts.
    w->companion->become(caf::behavior{[](caf::ok_atom) {}});
    w->companion->set_default_handler(caf::drop);
    Worker* raw = w.get();
    w->companion->on_enqueue([raw](caf::mailbox_element_ptr m) {
      raw->core->post(raw->io, [raw, m = std::shared_ptr<caf::mailbox_element>(std::move(m))] {
        raw->companion->activate(raw->unit.get(), *m);
      });
    });
    w->sweeper = std::make_unique<asio::steady_timer>(*w->io);
    asio::post(*w->io, [raw] { sweep(raw); });
    core->workers.push_back(std::move(w));
  }
  core->actor = sys.spawn(proxy_actor, core);
  core->keeper = sys.spawn(keeper_actor, core);
  caf::anon_send(core->keeper, core->actor);
  core->server->run();
  core->log->info("proxy listening on {}:{} ({} io threads)", core->options.server.bind,
                  core->server->port(), core->server->threads());
  return std::unique_ptr<Proxy>(new Proxy(core));
}

caf::actor Proxy::keeper() const {
  return core_->keeper;
}

Proxy::Caller Proxy::caller() const {
  return [weak = std::weak_ptr<Core>(core_)](const std::string& app, const std::string& deployment,
                                             HttpRequest request, double timeout_s, CallDone done) {
    if (auto core = weak.lock()) {
      core->call(app, deployment, std::move(request), timeout_s, std::move(done));
      return;
    }
    HttpResponse r;
    r.status = 503;
    r.headers = {{"Content-Type", "application/json"}, {"Retry-After", "1"}};
    r.body = json{{"error", "the proxy of this node is gone"}}.dump();
    done(std::move(r));
  };
}

caf::actor Proxy::actor() const {
  std::lock_guard<std::mutex> lock(core_->actor_mutex);
  return core_->actor;
}

uint16_t Proxy::port() const {
  return core_->server->port();
}

size_t Proxy::io_threads() const {
  return core_->workers.size();
}

void Proxy::stop() {
  auto& core = *core_;
  {
    std::lock_guard<std::mutex> lock(core.actor_mutex);
    if (core.stopped)
      return;
    core.stopped = true;
  }
  {
    std::unique_lock<std::shared_mutex> lock(core.io_mutex);
    core.io_closed = true;
  }
  core.server->stop();
  // No io thread runs now: the companions can be taken down from here. Their
  // pending answers (and the calls they hold) go with them.
  for (auto& w : core.workers) {
    w->companion->on_enqueue(nullptr);
    w->companion->cleanup(caf::exit_reason::user_shutdown, w->unit.get());
  }
  caf::actor proxy_actor;
  {
    std::lock_guard<std::mutex> lock(core.actor_mutex);
    proxy_actor = core.actor;  // not restarted any more: `stopped` is set
  }
  {
    // Both are gone before anything they use is destroyed.
    caf::scoped_actor self{*core.sys};
    self->send_exit(core.keeper, caf::exit_reason::user_shutdown);
    if (proxy_actor)
      self->send_exit(proxy_actor, caf::exit_reason::user_shutdown);
    self->wait_for(core.keeper, proxy_actor);
  }
  // Queued calls hold exchanges, and timers belong to io_contexts: drop them
  // before the io_contexts go.
  core.router.clear();
  for (auto& w : core.workers) {
    w->sweeper.reset();
    w->pending.clear();
    w->lanes.clear();
  }
  core.server.reset();
  for (auto& w : core.workers) {
    w->active.clear();
    w->companion = nullptr;
    w->companion_handle = nullptr;
  }
}

Proxy::~Proxy() {
  stop();
}

}  // namespace troupe::proxy
