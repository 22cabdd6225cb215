#include "replica/replica_actor.hpp"

#include <unistd.h>

#include <chrono>
#include <deque>
#include <exception>
#include <optional>

#include <caf/all.hpp>
#include <troupe/deployment.hpp>

#include "replica/handle_transport.hpp"
#include "replica/plugin/plugin_loader.hpp"
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

caf::behavior request_worker(caf::event_based_actor* self, Instance instance, caf::actor replica,
                             uint32_t index) {
  return {
      [=](handle_atom, HttpRequest& req) -> HttpResponse {
        auto out = run_handler(*instance, req);
        self->send(replica, done_atom::value, index);
        return out;
      },
  };
}

// --- the replica actor ----------------------------------------------------------

struct ReplicaState {
  ReplicaOptions options;
  caf::actor control;
  // Shared with the exit hook, which runs when the state may be gone.
  std::shared_ptr<std::vector<caf::actor>> workers = std::make_shared<std::vector<caf::actor>>();
  std::deque<uint32_t> idle;
  bool initialized = false;
  bool stopping = false;
  std::optional<caf::response_promise> stop_promise;
  std::vector<caf::response_promise> init_waiters;
  bool init_running = false;
  std::string user_config;  // what it runs now
  double start_time = 0;
  uint32_t ongoing = 0;
  // Time-weighted integral of `ongoing` since the last metrics report.
  double ongoing_area = 0;
  Clock::time_point last_change = Clock::now();
  Clock::time_point window_start = Clock::now();
  std::shared_ptr<spdlog::logger> log = troupe::log::get("replica");
  static inline const char* name = "troupe.replica";
};

using replica_actor = caf::stateful_actor<ReplicaState>;

void account(ReplicaState& st) {
  auto now = Clock::now();
  st.ongoing_area += st.ongoing * std::chrono::duration<double>(now - st.last_change).count();
  st.last_change = now;
}

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

caf::behavior replica(replica_actor* self, ReplicaOptions o) {
  auto& st = self->state;
  st.options = o;
  st.user_config = o.spec.user_config;
  st.control = self->home_system().spawn<caf::detached>(control_worker, o);
  // Helpers die with the replica (a thread blocked in user code ends when the
  // call returns).
  self->attach_functor([control = st.control, workers = st.workers](const caf::error&) {
    caf::anon_send_exit(control, caf::exit_reason::kill);
    for (auto& w : *workers)
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
                  uint32_t n = std::max<uint32_t>(1, st.options.spec.max_ongoing_requests);
                  for (uint32_t i = 0; i < n; ++i) {
                    st.workers->push_back(self->home_system().spawn<caf::detached>(
                        request_worker, instance, caf::actor_cast<caf::actor>(self), i));
                    st.idle.push_back(i);
                  }
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
      [=](handle_atom, HttpRequest& req) -> caf::result<caf::message> {
        auto& st = self->state;
        if (!st.initialized) {
          return to_caf_error(
              Status(errc::unavailable, "replica " + st.options.spec.replica_id + " is not ready"));
        }
        if (st.stopping) {
          return to_caf_error(
              Status(errc::unavailable, "replica " + st.options.spec.replica_id + " is stopping"));
        }
        if (st.idle.empty()) {
          return to_caf_error(Status(errc::overloaded, "replica " + st.options.spec.replica_id +
                                                           " is at max_ongoing_requests (" +
                                                           std::to_string(st.workers->size()) +
                                                           ")"));
        }
        account(st);
        ++st.ongoing;
        auto index = st.idle.front();
        st.idle.pop_front();
        return self->delegate((*st.workers)[index], handle_atom::value, std::move(req));
      },
      [=](done_atom, uint32_t index) {
        auto& st = self->state;
        account(st);
        --st.ongoing;
        st.idle.push_back(index);
        if (st.stopping && st.ongoing == 0)
          finish_stop(self);
      },
      [=](stop_atom, double timeout_s) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        if (!st.stopping) {
          st.log->info("replica {} stopping ({} in flight, timeout {:.1f} s)",
                       st.options.spec.replica_id, st.ongoing, timeout_s);
        }
        st.stopping = true;
        if (st.ongoing == 0) {
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
                              self->state.options.spec.replica_id, self->state.ongoing);
        finish_stop(self);
      },
      [=](metrics_atom) {
        auto& st = self->state;
        account(st);
        auto now = Clock::now();
        double window = std::chrono::duration<double>(now - st.window_start).count();
        double average = window > 0 ? st.ongoing_area / window : st.ongoing;
        st.ongoing_area = 0;
        st.window_start = now;
        self->send(st.options.metrics_sink, metrics_atom::value, st.options.spec.replica_id,
                   average);
        self->delayed_send(self, seconds(st.options.spec.metrics_interval_s), metrics_atom::value);
      },
  };
}

}  // namespace

caf::actor spawn_replica(caf::actor_system& sys, ReplicaOptions options) {
  return sys.spawn(replica, std::move(options));
}

}  // namespace troupe::replica
