// The replica actor: the lifecycle of one replica (init, reconfigure, health,
// stop, metrics). Its parts: dispatch.hpp (the handle's admission),
// control_worker.hpp (constructor, reconfigure, health on a thread of their
// own), request_workers.hpp (the request threads).
#include "replica/replica_actor.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include <caf/all.hpp>
#include <caf/scoped_execution_unit.hpp>

#include "replica/batching.hpp"
#include "replica/control_worker.hpp"
#include "replica/dispatch.hpp"
#include "replica/inline_replica.hpp"
#include "replica/instance.hpp"
#include "replica/plugin/plugin_loader.hpp"
#include "replica/replica_metrics.hpp"
#include "replica/request_workers.hpp"
#include "runtime/log.hpp"
#include "runtime/metrics.hpp"
#include "runtime/time.hpp"

namespace troupe::replica {

namespace {

using Clock = std::chrono::steady_clock;

double unix_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

struct ReplicaState {
  ReplicaOptions options;
  DispatchPtr dispatch;
  caf::actor control;
  bool initialized = false;
  std::optional<caf::typed_response_promise<caf::ok_atom>> stop_promise;
  std::vector<caf::typed_response_promise<ReplicaMetadata>> init_waiters;
  bool init_running = false;
  // The start-up gate's next check, due at its gate_atom.
  std::function<void()> gate_retry;
  std::string user_config;  // what it runs now
  BatchSettings batch;      // what it batches with now
  double start_time = 0;
  Clock::time_point window_start = Clock::now();
  // Model multiplexing: the last list sent to the metrics sink, when, and
  // whether a delayed send is due (ModelReport::kMinReportGap apart).
  uint64_t models_sent_seq = 0;
  Clock::time_point models_sent_at;
  bool models_flush_due = false;
  std::shared_ptr<spdlog::logger> log = troupe::log::get("replica");
  static inline const char* name = "troupe.replica";
};

// Its own messages besides its interface: a request thread finished the last
// request of a stopping replica; the graceful stop's deadline passed; time
// to report metrics; the ModelCache's list changed (models_atom, from
// ModelReport, or a delayed send of its own); time to send the process's
// metrics registry.
using stop_due_atom = caf::atom_constant<caf::atom("stopdue")>;
using report_atom = caf::atom_constant<caf::atom("report")>;
using registry_atom = caf::atom_constant<caf::atom("registry")>;
using gate_atom = caf::atom_constant<caf::atom("gate")>;
using ReplicaImpl = ReplicaActor::extend<caf::reacts_to<done_atom>, caf::reacts_to<stop_due_atom>,
                                         caf::reacts_to<report_atom>, caf::reacts_to<models_atom>,
                                         caf::reacts_to<registry_atom>, caf::reacts_to<gate_atom>>;
using replica_actor = ReplicaImpl::stateful_base<ReplicaState>;

ReplicaMetadata metadata(const ReplicaState& st) {
  ReplicaMetadata m;
  m.replica_id = st.options.spec.replica_id;
  m.node_id = st.options.node_id;
  m.pid = static_cast<int32_t>(::getpid());
  m.code_version = st.options.spec.code_version;
  m.user_config = st.user_config;
  m.batch = st.batch;
  m.start_time = st.start_time;
  return m;
}

// Sends the models the replica's ModelCache holds to the metrics sink, when
// there is anything new (or `always`, the periodic report), unless the last
// send was less than kMinReportGap ago: then once when the gap has passed.
void report_models(replica_actor* self, bool always) {
  auto& st = self->state;
  if (!st.options.metrics_sink || !st.dispatch->models)
    return;
  auto held = st.dispatch->models->held();
  if (held.seq == 0 || (!always && held.seq == st.models_sent_seq))
    return;
  auto now = Clock::now();
  auto next = st.models_sent_at + ModelReport::kMinReportGap;
  if (!always && now < next) {
    if (!st.models_flush_due) {
      st.models_flush_due = true;
      self->delayed_send(self, std::chrono::duration_cast<caf::timespan>(next - now),
                         models_atom::value);
    }
    return;
  }
  st.models_sent_seq = held.seq;
  st.models_sent_at = now;
  self->send(st.options.metrics_sink, models_atom::value, st.options.spec.replica_id, held.seq,
             std::move(held.model_ids));
}

// Deployment::nonblocking(), which should only return a constant; one that
// throws declares nothing.
bool declares_nonblocking(const Deployment& instance) {
  try {
    return instance.nonblocking();
  } catch (...) {
    return false;
  }
}

// The node's proxy may call this replica's handler on its io threads from
// now on (runtime/local_replicas.hpp). When the replica actor exits, the
// registration goes, and close() waits for the calls in progress, so that
// no io thread is in the instance when the request threads let it go.
void register_inline(replica_actor* self, const Instance& instance) {
  auto& st = self->state;
  const bool blocking = !declares_nonblocking(*instance);
  auto entry = std::make_shared<InlineReplica>(instance, st.dispatch, blocking);
  auto registry = st.options.local_replicas;
  registry->add(entry);
  st.dispatch->inline_replica = entry;
  self->attach_functor([registry, entry](const caf::error&) {
    registry->remove(entry);
    entry->close();
  });
  if (blocking) {
    st.log->info(
        "replica {} of {}/{}: this node's proxy calls its handler inline while its calls "
        "are short, else through its request threads",
        st.options.spec.replica_id, st.options.spec.app, st.options.spec.deployment);
  } else {
    st.log->info(
        "replica {} of {}/{}: handler declared non-blocking; this node's proxy calls it "
        "inline",
        st.options.spec.replica_id, st.options.spec.app, st.options.spec.deployment);
  }
}

void finish_stop(replica_actor* self) {
  auto& st = self->state;
  if (st.stop_promise)
    st.stop_promise->deliver(caf::ok_atom::value);
  st.stop_promise.reset();
  self->quit(caf::exit_reason::user_shutdown);
}

// The start-up gate, on the control thread: the user's check_health() after
// the constructor and reconfigure, and after every reconfigure, before the
// replica reports ready (Ray Serve's replica checks once in
// initialize_and_get_metadata). A failing check is tried again every
// health_check_period_s, so a replica that warms up within a few periods
// passes; health_check_failure_threshold failures in a row, or a check
// without an answer within health_check_timeout_s (user code still blocked
// in it), fail the start. `passed` or `failed` runs on the replica actor; a
// failure names the check's last message, so the controller's status says
// why the start failed.
template <class Passed, class Failed>
void gate(replica_actor* self, std::string when, Passed passed, Failed failed,
          uint32_t failures = 0) {
  auto& st = self->state;
  const ReplicaSpec& spec = st.options.spec;
  const double timeout_s = spec.health_check_timeout_s > 0 ? spec.health_check_timeout_s : 30.0;
  self->request(st.control, seconds_as<caf::timespan>(timeout_s), health_atom::value)
      .then([=](caf::ok_atom) mutable { passed(); },
            [=](caf::error& err) mutable {
              auto& st = self->state;
              const ReplicaSpec& spec = st.options.spec;
              Status why = from_caf_error(err);
              const uint32_t threshold = std::max<uint32_t>(1, spec.health_check_failure_threshold);
              const bool timed_out = why.code() == errc::timeout;
              if (!timed_out && failures + 1 < threshold) {
                st.log->info("replica {}: initial health check{} failed ({} of {}): {}",
                             spec.replica_id, when, failures + 1, threshold, why.message());
                self->delayed_send(self, seconds_as<caf::timespan>(spec.health_check_period_s),
                                   gate_atom::value);
                st.gate_retry = [=]() mutable { gate(self, when, passed, failed, failures + 1); };
                return;
              }
              std::string text = timed_out ? "no answer within health_check_timeout_s (" +
                                                 fmt::format("{:g}", timeout_s) + " s)"
                                           : why.message();
              Status s(
                  errc::internal,
                  "the initial health check" + when + " failed" +
                      (timed_out ? "" : " " + std::to_string(failures + 1) + " times in a row") +
                      ": " + text);
              st.log->warn("replica {}: {}", spec.replica_id, s.message());
              failed(to_caf_error(s));
            });
}

// The replica passed its gate: request threads start and every caller of
// initialize gets the metadata.
void become_ready(replica_actor* self, const Instance& instance) {
  auto& st = self->state;
  st.init_running = false;
  auto& d = *st.dispatch;
  size_t n = std::max<uint32_t>(1, st.options.spec.max_ongoing_requests);
  d.limit = static_cast<uint32_t>(n);
  // A class that implements handle_batch() gets its batcher now, also while
  // max_batch_size is 1: a redeploy may turn batching on in place.
  if (auto factory = st.options.loader->resolve(st.options.spec.import_path);
      factory && (*factory)->batches) {
    d.batcher = std::make_shared<ReplicaBatcher>(instance, st.batch, d.metrics, d.models);
  }
  if (d.channel) {
    // Plain threads; they end with the process. A non-blocking handler
    // needs no pool: one loop serves (max_ongoing_requests still bounds
    // what it admits).
    if (declares_nonblocking(*instance))
      std::thread(channel_loop, instance, st.dispatch).detach();
    else
      std::thread(channel_blocking_loop, instance, st.dispatch, n).detach();
    std::thread(lane_reader, st.dispatch).detach();
  } else {
    d.busy = std::make_unique<std::atomic<bool>[]>(n);
    for (size_t i = 0; i < n; ++i) {
      d.busy[i].store(false);
      d.workers.push_back(
          self->home_system().spawn<caf::detached>(request_worker, instance, st.dispatch, i));
    }
  }
  if (!d.channel && st.options.local_replicas)
    register_inline(self, instance);
  d.ready.store(true, std::memory_order_release);
  st.initialized = true;
  st.start_time = unix_now();
  st.log->info("replica {} of {}/{} ready ({} request threads)", st.options.spec.replica_id,
               st.options.spec.app, st.options.spec.deployment, n);
  for (auto& w : st.init_waiters)
    w.deliver(metadata(st));
  st.init_waiters.clear();
}

void fail_init(replica_actor* self, const caf::error& err) {
  auto& st = self->state;
  st.init_running = false;
  st.log->warn("replica {} failed to start: {}", st.options.spec.replica_id,
               from_caf_error(err).message());
  for (auto& w : st.init_waiters)
    w.deliver(caf::error(err));
  st.init_waiters.clear();
}

caf::result<ReplicaMetadata> on_initialize(replica_actor* self) {
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
            // The gate: a replica whose first check fails never reports
            // ready, so it takes no traffic and counts as a start failure
            // (the old version keeps serving).
            gate(
                self, "", [=] { become_ready(self, instance); },
                [=](const caf::error& err) { fail_init(self, err); });
          },
          [=](caf::error& err) { fail_init(self, err); });
  return rp;
}

caf::result<ReplicaMetadata> on_reconfigure(replica_actor* self, const std::string& user_config,
                                            const BatchSettings& batch) {
  auto& st = self->state;
  if (!st.initialized)
    return to_caf_error(Status(errc::unavailable, "replica not initialized"));
  if (batch != st.batch) {
    const bool batches = st.dispatch->batcher != nullptr;
    if (auto s = check_batching(batch, batches, st.options.spec.import_path); !s)
      return to_caf_error(s);
    if (batches)
      st.dispatch->batcher->apply(batch);
    st.batch = batch;
    st.log->info("replica {}: batching now max_batch_size {}, batch_wait_timeout_s {}",
                 st.options.spec.replica_id, batch.max_batch_size,
                 batch.adaptive ? std::string("auto") : fmt::format("{:g}", batch.wait_s));
  }
  // Only the batching changed: the user's reconfigure() has nothing new.
  if (user_config == st.user_config)
    return metadata(st);
  auto rp = self->make_response_promise<ReplicaMetadata>();
  self->request(self->state.control, caf::infinite, reconfigure_atom::value, user_config)
      .then(
          [=](caf::ok_atom) mutable {
            self->state.user_config = user_config;
            gate(
                self, " after reconfigure", [=]() mutable { rp.deliver(metadata(self->state)); },
                [=](const caf::error& err) mutable { rp.deliver(err); });
          },
          [=](caf::error& err) mutable { rp.deliver(err); });
  return rp;
}

// Checked here, not by user code: a replica whose handlers never return may
// still pass its own check_health(), and it answers no request any more.
// Failing the check makes the controller replace it (and kill it, when its
// graceful stop times out).
caf::result<caf::ok_atom> on_health(replica_actor* self) {
  auto& st = self->state;
  auto stuck_after = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(st.options.spec.stuck_after_s));
  if (auto progress = st.dispatch->check_progress(stuck_after); !progress) {
    st.dispatch->metrics->set_healthy(false);
    st.log->warn("replica {} reports unhealthy: {}", st.options.spec.replica_id,
                 progress.message());
    return to_caf_error(progress);
  }
  self->delegate(st.control, health_atom::value);
  return caf::delegated<caf::ok_atom>{};
}

caf::result<caf::ok_atom> on_stop(replica_actor* self, double timeout_s) {
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
  self->delayed_send(self, seconds_as(timeout_s), stop_due_atom::value);
  return rp;
}

// Every metrics_interval_s: the load since the last report, and the models.
void report_load(replica_actor* self) {
  auto& st = self->state;
  auto now = Clock::now();
  ReplicaLoad load;
  load.replica_id = st.options.spec.replica_id;
  load.ongoing = st.dispatch->take_average(st.window_start, now);
  load.finished = st.dispatch->finished();
  st.window_start = now;
  if (st.dispatch->metrics) {
    auto taken = st.dispatch->metrics->load().take();
    load.errors = taken.errors;
    load.streams = taken.streams;
    load.p99_s = taken.p99_s;
  }
  self->send(st.options.metrics_sink, metrics_atom::value, std::move(load));
  report_models(self, true);
  self->delayed_send(self, seconds_as(st.options.spec.metrics_interval_s), report_atom::value);
}

ReplicaImpl::behavior_type replica(replica_actor* self, ReplicaOptions o, DispatchPtr dispatch) {
  auto& st = self->state;
  st.options = o;
  st.dispatch = dispatch;
  st.user_config = o.spec.user_config;
  st.batch = o.spec.batch;
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
    self->delayed_send(self, seconds_as(o.spec.metrics_interval_s), report_atom::value);
  }
  if (o.metrics_sink && o.report_registry && o.registry_interval_s > 0)
    self->send(self, registry_atom::value);
  return {
      [=](initialize_atom) { return on_initialize(self); },
      [=](reconfigure_atom, const std::string& user_config, const BatchSettings& batch) {
        return on_reconfigure(self, user_config, batch);
      },
      [=](health_atom) { return on_health(self); },
      [=](version_atom) -> caf::result<ReplicaMetadata> {
        auto& st = self->state;
        if (!st.initialized) {
          return to_caf_error(Status(errc::unavailable, "replica not initialized"));
        }
        return metadata(st);
      },
      // Requests reach the replica actor only while it is not ready (the
      // dispatch sends them to request threads afterwards).
      [=](handle_atom, const HttpRequest&) -> caf::result<HttpResponse> {
        auto& st = self->state;
        if (st.dispatch->stopping.load()) {
          return to_caf_error(
              Status(errc::unavailable, "replica " + st.options.spec.replica_id + " is stopping"));
        }
        return to_caf_error(
            Status(errc::unavailable, "replica " + st.options.spec.replica_id + " is not ready"));
      },
      // Normally applied by the dispatch policy before they get here.
      [=](credit_atom, uint64_t key, uint64_t bytes) {
        self->state.dispatch->inflight.grant(key, bytes);
      },
      [=](cancel_atom, uint64_t key, bool deadline_passed) {
        self->state.dispatch->inflight.cancel(key, deadline_passed);
      },
      [=](done_atom) {
        // The last request of a stopping replica ended.
        auto& st = self->state;
        if (st.dispatch->stopping.load() && st.dispatch->in_flight() == 0)
          finish_stop(self);
      },
      [=](stop_atom, double timeout_s) { return on_stop(self, timeout_s); },
      [=](stop_due_atom) {
        // The graceful timeout expired with requests still in flight.
        self->state.log->warn("replica {} did not finish in time; exiting with {} in flight",
                              self->state.options.spec.replica_id,
                              self->state.dispatch->in_flight());
        finish_stop(self);
      },
      [=](report_atom) { report_load(self); },
      [=](gate_atom) {
        if (auto retry = std::move(self->state.gate_retry)) {
          self->state.gate_retry = nullptr;
          retry();
        }
      },
      [=](registry_atom) {
        auto& st = self->state;
        self->send(st.options.metrics_sink, metrics_atom::value, st.options.spec.replica_id,
                   st.options.registry->encode());
        self->delayed_send(self, seconds_as(st.options.registry_interval_s), registry_atom::value);
      },
      [=](models_atom) {
        // From ModelReport (the list changed) or our own delayed send.
        self->state.models_flush_due = false;
        report_models(self, false);
      },
  };
}

}  // namespace

ReplicaActor spawn_replica(caf::actor_system& sys, ReplicaOptions options) {
  auto dispatch = std::make_shared<Dispatch>();
  dispatch->replica_id = options.spec.replica_id;
  dispatch->channel = options.channel;
  if (!options.models)
    options.models = std::make_shared<ModelReport>();
  dispatch->models = options.models;
  if (!options.registry)
    options.registry = std::make_shared<metrics::Registry>();
  options.replica_metrics = ReplicaMetrics::make(options.registry, options.spec.app,
                                                 options.spec.deployment, options.spec.replica_id);
  dispatch->metrics = options.replica_metrics;
  auto actor = caf::actor_cast<caf::actor>(sys.spawn(replica, std::move(options), dispatch));
  dispatch->replica = caf::actor_cast<caf::weak_actor_ptr>(actor);
  dispatch->models->set_replica(dispatch->replica);
  // The handle everyone gets. Its only member is the replica actor: when that
  // exits the handle goes with it, and an exit sent to the handle reaches it.
  caf::scoped_execution_unit context{&sys};
  auto pool = caf::actor_pool::make(
      &context, 1, [&] { return actor; }, dispatch_policy(dispatch));
  // The handle ends with the replica actor's own exit reason, not the pool's
  // `out_of_workers`: whoever watches the handle (the proxies, the agent, the
  // controller) tells a requested stop (user_shutdown) from a fault. Attached
  // after the pool's own monitor, so it runs first when the actor exits
  // (CAF runs attachables newest first), and the pool takes this exit
  // message before the down message that would end it otherwise.
  actor->attach_functor([pool = caf::actor_cast<caf::weak_actor_ptr>(pool),
                         source = actor.address()](const caf::error& reason) {
    if (auto strong = pool.lock()) {
      strong->enqueue(nullptr, caf::make_message_id(caf::message_priority::high),
                      caf::make_message(caf::exit_msg{source, reason}), nullptr);
    }
  });
  return caf::actor_cast<ReplicaActor>(std::move(pool));
}

}  // namespace troupe::replica
