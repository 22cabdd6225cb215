#include "replica/replica_actor.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <thread>
#include <unordered_map>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>

#include <caf/all.hpp>
#include <caf/scoped_execution_unit.hpp>
#include <troupe/deployment.hpp>

#include "replica/handle_transport.hpp"
#include "replica/plugin/plugin_loader.hpp"
#include "runtime/data_channel.hpp"
#include "runtime/log.hpp"

namespace troupe::replica {

namespace {

using Clock = std::chrono::steady_clock;

caf::timespan seconds(double s) {
  return std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(s));
}

double unix_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// The user's object, shared by the control and request threads.
using Instance = std::shared_ptr<Deployment>;

}  // namespace
}  // namespace troupe::replica

// Passed between the replica's own local actors only; never serialized.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::replica::Instance)

namespace troupe::replica {
namespace {

Status parse_json(const std::string& text, const char* what, Json& out) {
  if (text.empty()) {
    out = Json::object();
    return Status::ok();
  }
  try {
    out = Json::parse(text);
    return Status::ok();
  } catch (const std::exception& e) {
    return Status(errc::invalid_argument, std::string(what) + " is not valid JSON: " + e.what());
  }
}

// --- control thread: constructor, reconfigure, health ------------------------

struct ControlState {
  Instance instance;
  static inline const char* name = "troupe.replica.control";
};

caf::behavior control_worker(caf::stateful_actor<ControlState>* self, ReplicaOptions o) {
  return {
      [=](initialize_atom) -> caf::result<Instance> {
        auto& st = self->state;
        if (st.instance)
          return st.instance;
        auto factory = o.loader->resolve(o.spec.import_path);
        if (!factory)
          return to_caf_error(factory.status());
        Json args;
        if (auto s = parse_json(o.spec.init_args, "init args", args); !s)
          return to_caf_error(s);
        ReplicaContext ctx{o.spec.app, o.spec.deployment, o.spec.replica_id, o.node_id,
                           o.spec.code_version, o.handles};
        try {
          Instance made((*factory)->create(args, ctx));
          if (!o.spec.user_config.empty()) {
            Json config;
            if (auto s = parse_json(o.spec.user_config, "user_config", config); !s) {
              return to_caf_error(s);
            }
            made->reconfigure(config);
          }
          st.instance = std::move(made);
          return st.instance;
        } catch (const std::exception& e) {
          return to_caf_error(Status(
              errc::internal, "constructor of " + o.spec.import_path + " failed: " + e.what()));
        } catch (...) {
          return to_caf_error(Status(errc::internal, "constructor of " + o.spec.import_path +
                                                         " threw a non-standard exception"));
        }
      },
      [=](reconfigure_atom, const std::string& user_config) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        if (!st.instance)
          return to_caf_error(Status(errc::unavailable, "replica not initialized"));
        Json config;
        if (auto s = parse_json(user_config, "user_config", config); !s)
          return to_caf_error(s);
        try {
          st.instance->reconfigure(config);
          return caf::ok_atom::value;
        } catch (const std::exception& e) {
          return to_caf_error(
              Status(errc::internal, std::string("reconfigure failed: ") + e.what()));
        } catch (...) {
          return to_caf_error(Status(errc::internal, "reconfigure threw a non-standard exception"));
        }
      },
      [=](health_atom) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        if (!st.instance)
          return to_caf_error(Status(errc::unavailable, "replica not initialized"));
        try {
          st.instance->check_health();
          return caf::ok_atom::value;
        } catch (const std::exception& e) {
          return to_caf_error(Status(errc::internal, std::string("unhealthy: ") + e.what()));
        } catch (...) {
          return to_caf_error(Status(errc::internal, "unhealthy: non-standard exception"));
        }
      },
  };
}

// --- request threads ----------------------------------------------------------

HttpResponse run_handler(Deployment& d, HttpRequest& req) {
  Request in{std::move(req.method), std::move(req.path), std::move(req.query),
             std::move(req.headers), std::move(req.body)};
  HttpResponse out;
  // Handle calls made by handle() carry this request's id.
  RequestIdScope scope(req.request_id);
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
  return out;
}

// What the replica's public handle, its replica actor and its request threads
// share. The handle is an actor pool whose dispatch runs in the sender's
// context (CAF's actor_pool): a request goes from the sender straight to an
// idle request thread, and its answer straight back — no hop through the
// replica actor and no message back to it when a request ends.
struct Dispatch {
  std::string replica_id;
  // Written by the replica actor before `ready` is set, read-only after.
  std::vector<caf::actor> workers;
  std::unique_ptr<std::atomic<bool>[]> busy;
  // With a data channel (a replica process): its request threads, and
  // max_ongoing_requests; `workers` stays empty.
  std::shared_ptr<channel::ReplicaEnd> channel;
  uint32_t limit = 0;
  std::atomic<bool> ready{false};
  std::atomic<bool> stopping{false};
  // The replica actor, for everything but requests. Weak: the replica actor
  // holds this object.
  caf::weak_actor_ptr replica;

  // Requests in flight and the time-weighted integral of that number since
  // the last metrics report.
  std::mutex mutex;
  uint32_t ongoing = 0;
  double ongoing_area = 0;
  Clock::time_point last_change = Clock::now();

  void account_locked(Clock::time_point now) {
    ongoing_area += ongoing * std::chrono::duration<double>(now - last_change).count();
    last_change = now;
  }

  // Claims an idle request thread; false when all are busy.
  bool claim(size_t& index) {
    for (size_t i = 0; i < workers.size(); ++i) {
      bool idle = false;
      if (busy[i].load(std::memory_order_relaxed) == false &&
          busy[i].compare_exchange_strong(idle, true, std::memory_order_acq_rel)) {
        std::lock_guard<std::mutex> guard(mutex);
        account_locked(Clock::now());
        ++ongoing;
        index = i;
        return true;
      }
    }
    return false;
  }

  // With a data channel: admits a request unless max_ongoing_requests are
  // running.
  bool admit() {
    std::lock_guard<std::mutex> guard(mutex);
    if (ongoing >= limit)
      return false;
    account_locked(Clock::now());
    ++ongoing;
    return true;
  }

  // With a data channel: a request ended; tells a stopping replica actor
  // when it was the last.
  void finish() {
    bool last;
    {
      std::lock_guard<std::mutex> guard(mutex);
      account_locked(Clock::now());
      --ongoing;
      last = ongoing == 0;
    }
    if (last && stopping.load()) {
      if (auto r = replica.lock())
        caf::anon_send(caf::actor_cast<caf::actor>(r), done_atom::value);
    }
  }

  // Requests that came over CAF, queued into the channel as `local` frames:
  // the request threads take them by token.
  std::mutex tokens_mutex;
  std::unordered_map<uint64_t, caf::mailbox_element_ptr> tokens;
  uint64_t next_token = 0;

  uint64_t park(caf::mailbox_element_ptr m) {
    std::lock_guard<std::mutex> guard(tokens_mutex);
    uint64_t token = ++next_token;
    tokens.emplace(token, std::move(m));
    return token;
  }
  caf::mailbox_element_ptr take(uint64_t token) {
    std::lock_guard<std::mutex> guard(tokens_mutex);
    auto it = tokens.find(token);
    if (it == tokens.end())
      return nullptr;
    auto m = std::move(it->second);
    tokens.erase(it);
    return m;
  }

  // A request thread finished; true when it was the last one of a stopping
  // replica.
  bool release(size_t index) {
    bool last;
    {
      std::lock_guard<std::mutex> guard(mutex);
      account_locked(Clock::now());
      --ongoing;
      last = ongoing == 0;
    }
    busy[index].store(false, std::memory_order_release);
    return last && stopping.load();
  }

  uint32_t in_flight() {
    std::lock_guard<std::mutex> guard(mutex);
    return ongoing;
  }

  // Average requests in flight since the last call.
  double take_average(Clock::time_point window_start, Clock::time_point now) {
    std::lock_guard<std::mutex> guard(mutex);
    account_locked(now);
    double window = std::chrono::duration<double>(now - window_start).count();
    double average = window > 0 ? ongoing_area / window : ongoing;
    ongoing_area = 0;
    return average;
  }
};

using DispatchPtr = std::shared_ptr<Dispatch>;

// Answers a request in the sender's context with an error.
void refuse(caf::mailbox_element& m, const Status& why, caf::execution_unit* eu) {
  if (m.sender && m.mid.is_request())
    m.sender->enqueue(nullptr, m.mid.response_id(), caf::make_message(to_caf_error(why)), eu);
}

caf::actor_pool::policy dispatch_policy(DispatchPtr d) {
  return [d](caf::actor_system&, caf::actor_pool::uplock& guard, const caf::actor_pool::actor_vec&,
             caf::mailbox_element_ptr& m, caf::execution_unit* eu) {
    guard.unlock();
    if (d->ready.load(std::memory_order_acquire) &&
        m->content().match_elements<handle_atom, HttpRequest>()) {
      if (d->stopping.load()) {
        refuse(*m, Status(errc::unavailable, "replica " + d->replica_id + " is stopping"), eu);
        return;
      }
      if (d->channel) {
        if (!d->admit()) {
          refuse(*m,
                 Status(errc::overloaded, "replica " + d->replica_id +
                                              " is at max_ongoing_requests (" +
                                              std::to_string(d->limit) + ")"),
                 eu);
          return;
        }
        // Queued into the channel: the next idle request thread takes it.
        uint64_t token = d->park(std::move(m));
        if (channel::send_local(d->channel->inject_fd(), token) != channel::Sent::sent) {
          auto back = d->take(token);
          d->finish();
          if (back) {
            refuse(*back,
                   Status(errc::overloaded,
                          "replica " + d->replica_id + " cannot queue more requests"),
                   eu);
          }
        }
        return;
      }
      size_t index = 0;
      if (!d->claim(index)) {
        refuse(*m,
               Status(errc::overloaded, "replica " + d->replica_id +
                                            " is at max_ongoing_requests (" +
                                            std::to_string(d->workers.size()) + ")"),
               eu);
        return;
      }
      d->workers[index]->enqueue(std::move(m), eu);
      return;
    }
    // Control messages, and requests before the replica is ready.
    if (auto replica = d->replica.lock()) {
      replica->enqueue(std::move(m), eu);
      return;
    }
    refuse(*m, Status(errc::unavailable, "replica " + d->replica_id + " has exited"), eu);
  };
}

caf::behavior request_worker(caf::event_based_actor*, Instance instance, DispatchPtr dispatch,
                             size_t index) {
  return {
      [=](handle_atom, HttpRequest& req) -> HttpResponse {
        auto out = run_handler(*instance, req);
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
        out = run_handler(*instance, m->content().get_mutable_as<HttpRequest>(1));
      d->finish();
      if (m->sender && m->mid.is_request()) {
        m->sender->enqueue(nullptr, m->mid.response_id(), caf::make_message(std::move(out)),
                           nullptr);
      }
      continue;
    }
    if (h.version != channel::kVersion || h.kind != channel::Kind::request ||
        h.lane >= ch.lanes()) {
      log->warn("replica {}: dropped a channel frame (version {}, kind {}, lane {})",
                d->replica_id, h.version, static_cast<int>(h.kind), h.lane);
      continue;
    }
    int answers = ch.answer_fd(h.lane);
    HttpRequest req;
    Status decoded = size > buffer.capacity()
                         ? Status(errc::invalid_argument,
                                  "request frame of " + std::to_string(size) +
                                      " bytes exceeds the channel's " +
                                      std::to_string(buffer.capacity()))
                         : channel::decode_request(buffer.payload(),
                                                   size - sizeof(channel::FrameHeader), req);
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
      channel::send_refusal(answers, h.call, false, "replica " + d->replica_id + " is stopping");
      continue;
    }
    if (!d->admit()) {
      channel::send_refusal(answers, h.call, true,
                            "replica " + d->replica_id + " is at max_ongoing_requests (" +
                                std::to_string(d->limit) + ")");
      continue;
    }
    auto out = run_handler(*instance, req);
    d->finish();
    channel::send_answer(answers, h.call, out, ch.max_frame());
  }
}

// --- the replica actor ----------------------------------------------------------

struct ReplicaState {
  ReplicaOptions options;
  DispatchPtr dispatch;
  caf::actor control;
  bool initialized = false;
  std::optional<caf::response_promise> stop_promise;
  std::vector<caf::response_promise> init_waiters;
  bool init_running = false;
  std::string user_config;  // what it runs now
  double start_time = 0;
  Clock::time_point window_start = Clock::now();
  std::shared_ptr<spdlog::logger> log = troupe::log::get("replica");
  static inline const char* name = "troupe.replica";
};

using replica_actor = caf::stateful_actor<ReplicaState>;

ReplicaMetadata metadata(const ReplicaState& st) {
  ReplicaMetadata m;
  m.replica_id = st.options.spec.replica_id;
  m.node_id = st.options.node_id;
  m.pid = static_cast<int32_t>(::getpid());
  m.code_version = st.options.spec.code_version;
  m.user_config = st.user_config;
  m.start_time = st.start_time;
  return m;
}

void finish_stop(replica_actor* self) {
  auto& st = self->state;
  if (st.stop_promise)
    st.stop_promise->deliver(caf::ok_atom::value);
  st.stop_promise.reset();
  self->quit(caf::exit_reason::user_shutdown);
}

caf::behavior replica(replica_actor* self, ReplicaOptions o, DispatchPtr dispatch) {
  auto& st = self->state;
  st.options = o;
  st.dispatch = dispatch;
  st.user_config = o.spec.user_config;
  st.control = self->home_system().spawn<caf::detached>(control_worker, o);
  // Helpers die with the replica (a thread blocked in user code ends when the
  // call returns). The hook holds the dispatch: it runs when the state may be
  // gone, and after the replica's last message, so the workers are settled.
  self->attach_functor([control = st.control, dispatch](const caf::error&) {
    // Request threads of a channel refuse what still comes.
    dispatch->stopping.store(true);
    caf::anon_send_exit(control, caf::exit_reason::kill);
    for (auto& w : dispatch->workers)
      caf::anon_send_exit(w, caf::exit_reason::kill);
  });
  if (o.metrics_sink && o.spec.metrics_interval_s > 0) {
    self->delayed_send(self, seconds(o.spec.metrics_interval_s), metrics_atom::value);
  }
  return {
      [=](initialize_atom) -> caf::result<ReplicaMetadata> {
        auto& st = self->state;
        if (st.initialized)
          return metadata(st);
        auto rp = self->make_response_promise<ReplicaMetadata>();
        st.init_waiters.push_back(rp);
        if (st.init_running)
          return rp;
        st.init_running = true;
        self->request(st.control, caf::infinite, initialize_atom::value)
            .then(
                [=](Instance& instance) {
                  auto& st = self->state;
                  st.init_running = false;
                  auto& d = *st.dispatch;
                  size_t n = std::max<uint32_t>(1, st.options.spec.max_ongoing_requests);
                  d.limit = static_cast<uint32_t>(n);
                  if (d.channel) {
                    // Plain threads; they end with the process.
                    for (size_t i = 0; i < n; ++i)
                      std::thread(channel_worker, instance, st.dispatch).detach();
                  } else {
                    d.busy = std::make_unique<std::atomic<bool>[]>(n);
                    for (size_t i = 0; i < n; ++i) {
                      d.busy[i].store(false);
                      d.workers.push_back(self->home_system().spawn<caf::detached>(
                          request_worker, instance, st.dispatch, i));
                    }
                  }
                  d.ready.store(true, std::memory_order_release);
                  st.initialized = true;
                  st.start_time = unix_now();
                  st.log->info("replica {} of {}/{} ready ({} request threads)",
                               st.options.spec.replica_id, st.options.spec.app,
                               st.options.spec.deployment, n);
                  for (auto& w : st.init_waiters)
                    w.deliver(metadata(st));
                  st.init_waiters.clear();
                },
                [=](caf::error& err) {
                  auto& st = self->state;
                  st.init_running = false;
                  st.log->warn("replica {} failed to start: {}", st.options.spec.replica_id,
                               from_caf_error(err).message());
                  for (auto& w : st.init_waiters)
                    w.deliver(err);
                  st.init_waiters.clear();
                });
        return rp;
      },
      [=](reconfigure_atom, const std::string& user_config) -> caf::result<ReplicaMetadata> {
        auto rp = self->make_response_promise<ReplicaMetadata>();
        self->request(self->state.control, caf::infinite, reconfigure_atom::value, user_config)
            .then(
                [=](caf::ok_atom) mutable {
                  self->state.user_config = user_config;
                  rp.deliver(metadata(self->state));
                },
                [=](caf::error& err) mutable { rp.deliver(err); });
        return rp;
      },
      [=](health_atom) { return self->delegate(self->state.control, health_atom::value); },
      [=](version_atom) -> caf::result<ReplicaMetadata> {
        auto& st = self->state;
        if (!st.initialized) {
          return to_caf_error(Status(errc::unavailable, "replica not initialized"));
        }
        return metadata(st);
      },
      // Requests reach the replica actor only while it is not ready (the
      // dispatch sends them to request threads afterwards).
      [=](handle_atom, HttpRequest&) -> caf::result<caf::message> {
        auto& st = self->state;
        if (st.dispatch->stopping.load()) {
          return to_caf_error(
              Status(errc::unavailable, "replica " + st.options.spec.replica_id + " is stopping"));
        }
        return to_caf_error(
            Status(errc::unavailable, "replica " + st.options.spec.replica_id + " is not ready"));
      },
      [=](done_atom) {
        // The last request of a stopping replica ended.
        auto& st = self->state;
        if (st.dispatch->stopping.load() && st.dispatch->in_flight() == 0)
          finish_stop(self);
      },
      [=](stop_atom, double timeout_s) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        bool already = st.dispatch->stopping.exchange(true);
        uint32_t ongoing = st.dispatch->in_flight();
        if (!already) {
          st.log->info("replica {} stopping ({} in flight, timeout {:.1f} s)",
                       st.options.spec.replica_id, ongoing, timeout_s);
        }
        if (ongoing == 0) {
          self->quit(caf::exit_reason::user_shutdown);
          return caf::ok_atom::value;
        }
        auto rp = self->make_response_promise<caf::ok_atom>();
        st.stop_promise = rp;
        self->delayed_send(self, seconds(timeout_s), stop_atom::value);
        return rp;
      },
      [=](stop_atom) {
        // The graceful timeout expired with requests still in flight.
        self->state.log->warn("replica {} did not finish in time; exiting with {} in flight",
                              self->state.options.spec.replica_id,
                              self->state.dispatch->in_flight());
        finish_stop(self);
      },
      [=](metrics_atom) {
        auto& st = self->state;
        auto now = Clock::now();
        double average = st.dispatch->take_average(st.window_start, now);
        st.window_start = now;
        self->send(st.options.metrics_sink, metrics_atom::value, st.options.spec.replica_id,
                   average);
        self->delayed_send(self, seconds(st.options.spec.metrics_interval_s), metrics_atom::value);
      },
  };
}

}  // namespace

caf::actor spawn_replica(caf::actor_system& sys, ReplicaOptions options) {
  auto dispatch = std::make_shared<Dispatch>();
  dispatch->replica_id = options.spec.replica_id;
  dispatch->channel = options.channel;
  auto actor = sys.spawn(replica, std::move(options), dispatch);
  dispatch->replica = caf::actor_cast<caf::weak_actor_ptr>(actor);
  // The handle everyone gets. Its only member is the replica actor: when that
  // exits the handle goes with it, and an exit sent to the handle reaches it.
  caf::scoped_execution_unit context{&sys};
  return caf::actor_pool::make(&context, 1, [&] { return actor; }, dispatch_policy(dispatch));
}

}  // namespace troupe::replica
