#include "node/node_agent.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <unordered_map>

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>

#include "node/controller_session.hpp"
#include "node/health_checks.hpp"
#include "node/hosted_replicas.hpp"
#include "node/library_fetcher.hpp"
#include "node/process_supervisor.hpp"
#include "node/replica_logs.hpp"
#include "node/replica_reports.hpp"
#include "replica/replica_actor.hpp"
#include "runtime/auth.hpp"
#include "runtime/data_channel.hpp"
#include "runtime/doorbell.hpp"
#include "runtime/forwarder.hpp"
#include "runtime/head_list.hpp"
#include "runtime/keeper_actor.hpp"
#include "runtime/libraries.hpp"
#include "runtime/log.hpp"
#include "runtime/metrics.hpp"
#include "runtime/security/tls.hpp"
#include "runtime/tcp_probe.hpp"
#include "runtime/time.hpp"

namespace troupe {

namespace {

// Long enough for a SYN lost once (the kernel sends it again after 1 s) on
// a slow link.
constexpr std::chrono::milliseconds kProbeTimeout{2000};

// The agent's own messages besides its interface: a replica process must
// have attached by now (id, pid); a replica's graceful stop deadline passed
// (id); a replica process whose connection was lost must have attached
// again by now (id, pid, which loss of its connection); the replicas'
// model lists that wait (ReplicaReports::kModelsWindow) go to the
// controller now.
using models_due_atom = caf::atom_constant<caf::atom("modelsdue")>;
// The replicas' health checks: some are due, or time out (HealthChecks).
using checks_due_atom = caf::atom_constant<caf::atom("checksdue")>;
// The health checks' changes of the last kReportsWindow go to the controller.
using reports_due_atom = caf::atom_constant<caf::atom("reportsdue")>;
constexpr auto kReportsWindow = std::chrono::milliseconds(50);
using attach_deadline_atom = caf::atom_constant<caf::atom("attachdl")>;
using stop_due_atom = caf::atom_constant<caf::atom("stopdue")>;
using reattach_deadline_atom = caf::atom_constant<caf::atom("reattdl")>;
using AgentImpl = AgentActor::extend_with<AgentLocalActor>::extend<
    caf::reacts_to<reconnect_atom>, caf::reacts_to<tick_atom>,
    caf::reacts_to<attach_deadline_atom, std::string, int32_t>,
    caf::reacts_to<reattach_deadline_atom, std::string, int32_t, uint32_t>,
    caf::reacts_to<stop_due_atom, std::string>, caf::reacts_to<models_due_atom>,
    caf::reacts_to<checks_due_atom>, caf::reacts_to<reports_due_atom>>;

// troupe_replica_starts_total: a replica this node was asked to start.
void count_start(const AgentOptions& o, const ReplicaSpec& spec) {
  if (!o.registry)
    return;
  prometheus::BuildCounter()
      .Name("troupe_replica_starts_total")
      .Help("Replicas this node was asked to start (the failed starts included).")
      .Register(o.registry->prom())
      .Add({{"application", spec.app}, {"deployment", spec.deployment}})
      .Increment();
}

// troupe_library_cache_events_total: what the library cache did that a
// Note reports (node/library_fetcher.hpp).
void count_library_event(const std::shared_ptr<metrics::Registry>& registry,
                         node::LibraryFetcher::Note::Event event) {
  using Event = node::LibraryFetcher::Note::Event;
  if (!registry || event == Event::none)
    return;
  prometheus::BuildCounter()
      .Name("troupe_library_cache_events_total")
      .Help("Libraries this node fetched whole from the controller (fetched), and cached copies "
            "it refused because their content no longer hashed to their pin "
            "(cached_copy_refused).")
      .Register(registry->prom())
      .Add({{"event", event == Event::fetched ? "fetched" : "cached_copy_refused"}})
      .Increment();
}

using node::Hosted;
// The replicas of this node (node/hosted_replicas.hpp). They outlive the
// agent actor (they are not linked to it): owned by the current agent, and
// handed to the next one when the keeper restarts it, so the new agent
// reports them to the controller (which adopts them) instead of forgetting
// them.
using node::HostedReplicas;

struct AgentState {
  std::shared_ptr<HostedReplicas> hosted;
  // The controller of the current link (node/controller_session.hpp), or
  // empty while none is reached.
  ControllerActor controller;
  node::ControllerSession session;
  // A worker's heads: the one tried now, the next after a failure.
  std::optional<HeadList> heads;
  std::unordered_map<caf::actor_addr, std::string> replica_ids;
  // Replica actors in processes, by the address of their remote handle.
  std::unordered_map<caf::actor_addr, std::string> remote_ids;
  // Answered once every replica is gone and the node has deregistered.
  std::optional<caf::typed_response_promise<caf::ok_atom>> shutdown_promise;
  // Replicas whose library is being fetched, with the spawn requests that
  // wait for them.
  std::map<std::string, std::vector<caf::typed_response_promise<ReplicaActor>>> starting;
  // The node's library cache (node/library_fetcher.hpp).
  std::unique_ptr<node::LibraryFetcher> libraries;
  // The node's metrics (AgentOptions::registry; may be null).
  std::shared_ptr<metrics::Registry> registry;
  // The replicas' load reports and model lists, gathered for the
  // controller (loads go with the next heartbeat).
  node::ReplicaReports reports;
  // The replicas' health checks, as the controller asked for them, and when
  // the next checks_due message is sent for (none: none is pending).
  node::HealthChecks checks{
      [this](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); }};
  std::optional<double> checks_timer_at;
  bool reports_due = false;  // a reports_due message is on its way
  std::minstd_rand rng{std::random_device{}()};
  // The node is stopping (session.stopping(), kept here for the replicas).
  bool stopping() const { return session.stopping(); }
  std::shared_ptr<spdlog::logger> log = troupe::log::get("agent");
  static inline const char* name = "troupe.agent";
};

using agent_actor = AgentImpl::stateful_base<AgentState>;

std::vector<HostedReplicaInfo> hosted_list(const AgentState& st) {
  return st.hosted->list();
}

void schedule_reconnect(agent_actor* self, std::optional<double> delay_s) {
  if (delay_s)
    self->delayed_send(self, seconds_as(*delay_s), reconnect_atom::value);
}

// The head asked refused this node in a way another head of the list may
// not (a follower, a head of the other kind): on to the next one.
void to_next_head(agent_actor* self, const Status& refusal, std::optional<double> retry_s) {
  auto& st = self->state;
  self->demonitor(st.controller.address());
  st.controller = nullptr;
  st.heads->failed(refusal.message());
  schedule_reconnect(self, retry_s);
}

void send_register(agent_actor* self, const AgentOptions& o) {
  auto& st = self->state;
  auto controller = st.controller;
  auto link = st.session.link();
  self->request(controller, seconds_as(o.request_timeout_s), register_atom::value, o.info,
                caf::actor_cast<caf::actor>(self), hosted_list(st),
                sign_request(o.identity, Operation::register_node, {o.info.id}))
      .then(
          [=](uint64_t incarnation) {
            auto& st = self->state;
            auto registered = st.session.registered(link, incarnation);
            if (registered == node::ControllerSession::Registered::stale)
              return;  // superseded by a reconnect
            if (registered == node::ControllerSession::Registered::first) {
              st.log->info("registered with the controller as {} ({} replicas hosted)", o.info.id,
                           st.hosted->size());
            }
            if (o.proxy)
              self->send(o.proxy, subscribe_atom::value, controller);
            // The health checks start over: the controller sends the
            // watches of this node's RUNNING replicas again (a new one
            // after adopting them), each with a check at once, as it
            // checked a node back from a cut or a restart before. What was
            // reported meanwhile may have been lost.
            st.checks.clear();
            st.checks_timer_at.reset();
          },
          [=](caf::error& err) {
            auto& st = self->state;
            auto status = from_caf_error(err);
            if (status.code() == errc::not_leader && st.heads) {
              // A head candidate that does not lead: on to the one it names.
              auto retry = st.session.register_refused_by_follower(link);
              if (!retry)
                return;
              st.log->info("{} does not lead ({}); trying another head",
                           st.heads->current().to_string(), status.message());
              return to_next_head(self, status, retry);
            }
            auto retry = st.session.register_failed(link);
            if (!retry)
              return;
            if (status.code() == errc::conflict && st.heads && st.heads->heads().size() > 1) {
              // A head of the other kind in the list (a single head among
              // candidates): the cluster this node belongs to may be at
              // another one.
              st.log->error("{} refused this node: {}; trying another head",
                            st.heads->current().to_string(), status.message());
              return to_next_head(self, status, retry);
            }
            st.log->error("registration as {} failed: {}", o.info.id, status.to_string());
            // Keep trying: the controller may be restarting or being upgraded.
            schedule_reconnect(self, retry);
          });
}

void adopt_controller(agent_actor* self, const AgentOptions& o, ControllerActor controller) {
  auto& st = self->state;
  if (st.controller != controller) {
    st.controller = std::move(controller);
    self->monitor(st.controller);
  }
  st.session.connected();
  send_register(self, o);
}

void caf_connect(agent_actor* self, const AgentOptions& o);

// A connection attempt failed: try again after the backoff.
void unreachable(agent_actor* self, const std::string& why) {
  auto& st = self->state;
  st.log->warn("cannot reach the controller at {}: {}; retrying", st.heads->current().to_string(),
               why);
  st.heads->failed();
  schedule_reconnect(self, st.session.connect_failed());
}

void connect(agent_actor* self, const AgentOptions& o) {
  auto& st = self->state;
  if (!st.session.should_connect())
    return;
  st.session.connect_started();
  if (o.local_supervisor) {
    self->request(o.local_supervisor, seconds_as(o.request_timeout_s), caf::get_atom::value)
        .then([=](const ControllerActor& controller) { adopt_controller(self, o, controller); },
              [=](caf::error& err) {
                self->state.log->warn("no controller on this head yet: {}; retrying",
                                      from_caf_error(err).message());
                schedule_reconnect(self, self->state.session.connect_failed());
              });
    return;
  }
  // Asked first, with a short deadline: CAF's own connect would block its
  // middleman (runtime/tcp_probe.hpp).
  auto ep = st.heads->current();
  auto probe = spawn_tcp_probe(self->home_system(), ep.host, ep.port, kProbeTimeout);
  self->request(probe, kProbeTimeout + std::chrono::seconds(2), probe_atom::value)
      .then(
          [=](const std::string& why) {
            if (why.empty())
              caf_connect(self, o);
            else
              unreachable(self, why);
          },
          [=](caf::error& err) { unreachable(self, self->home_system().render(err)); });
}

void caf_connect(agent_actor* self, const AgentOptions& o) {
  // The OpenSSL module's middleman when the node runs with TLS.
  auto mm = security::transport_actor(self->home_system());
  auto ep = self->state.heads->current();
  self->request(mm, seconds_as(o.request_timeout_s), caf::connect_atom::value, ep.host, ep.port)
      .then(
          [=](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
            auto& st = self->state;
            if (!ptr) {
              st.log->warn("{} answers but publishes no controller; retrying", ep.to_string());
              st.heads->failed();
              schedule_reconnect(self, st.session.connect_failed());
              return;
            }
            st.log->info("connected to the controller at {}", ep.to_string());
            adopt_controller(self, o, caf::actor_cast<ControllerActor>(ptr));
          },
          [=](caf::error& err) { unreachable(self, self->home_system().render(err)); });
}

void maybe_finish_shutdown(agent_actor* self, const AgentOptions& o) {
  auto& st = self->state;
  if (!st.stopping() || !st.shutdown_promise || !st.hosted->empty())
    return;
  auto finish = [=] {
    auto& st = self->state;
    st.session.deregistered();  // no more heartbeats
    if (st.shutdown_promise)
      st.shutdown_promise->deliver(caf::ok_atom::value);
    st.shutdown_promise.reset();
  };
  if (!st.session.is_registered()) {
    finish();
    return;
  }
  self->request(st.controller, seconds_as(o.request_timeout_s), deregister_atom::value, o.info.id,
                sign_request(o.identity, Operation::deregister, {o.info.id}))
      .then(
          [=](caf::ok_atom) {
            self->state.log->info("deregistered from the controller");
            finish();
          },
          [=](caf::error& err) {
            self->state.log->warn("deregistration failed: {}", from_caf_error(err).to_string());
            finish();
          });
}

// Ends a replica at once: its process by SIGKILL (the exit report follows),
// an in-process one by an exit message.
void kill_now(agent_actor* self, const AgentOptions& o, Hosted& h) {
  if (h.process) {
    if (o.processes)
      o.processes->signal(h.spec.replica_id, SIGKILL);
    return;
  }
  self->send_exit(h.handle, caf::exit_reason::kill);
}

void stop_replica(agent_actor* self, const AgentOptions& o, Hosted& h, double timeout_s) {
  auto stop = self->state.hosted->stop(h, timeout_s, std::chrono::steady_clock::now());
  if (stop.kill_now)
    return kill_now(self, o, h);
  if (stop.send_stop) {
    // Its answer (or error) tells nothing its exit does not: the down
    // message, or the process's exit report, settles the stop.
    self->request(h.handle, caf::infinite, stop_atom::value, timeout_s)
        .then([](caf::ok_atom) {}, [](caf::error&) {});
  }
  self->delayed_send(self, std::chrono::duration_cast<caf::timespan>(stop.grace),
                     stop_due_atom::value, h.spec.replica_id);
}

std::string make_secret() {
  std::random_device rd;
  std::string out;
  const char* hex = "0123456789abcdef";
  for (int i = 0; i < 32; ++i) {
    auto v = rd();
    out += hex[v & 0xf];
    out += hex[(v >> 4) & 0xf];
  }
  return out;
}

// The handle of a replica process (runtime/forwarder.hpp): it forwards every
// message to the remote replica actor in the sender's context, so requests
// and their answers take no extra hop. It lives until the agent ends it (with
// the cause of the process's exit), so the remote handle dying with the
// connection does not end it with a reason that says nothing, and the
// process can attach again behind it. An exit message sent to it (the
// controller's kill) ends it without reaching the process; the agent then
// kills the process.
ReplicaActor make_forwarder(caf::actor_system& sys, const std::shared_ptr<ForwardTarget>& target) {
  return caf::actor_cast<ReplicaActor>(spawn_forwarder(sys, target));
}

// The process of `id` if `secret` is its secret and it may attach now (it has
// not attached, or its connection was lost), else null (and the refusal is
// logged: a local process without the secret is not ours).
Hosted* check_process(agent_actor* self, const std::string& id, const std::string& secret,
                      const char* what) {
  auto& st = self->state;
  auto admitted = st.hosted->admit(id, secret);
  if (admitted)
    return *admitted;
  auto sender = self->current_sender();
  st.log->warn("refused a process that claims to be replica '{}' ({}): {} (from node {})", id, what,
               admitted.status().message(),
               sender ? to_string(sender->node()) : std::string("unknown"));
  return nullptr;
}

// Starts a troupe-replica process for `spec`; the spawn requests (`waiting`)
// are answered when the process attaches (or fail when it exits or hangs
// before that). An error: the process was not started.
Status spawn_process(agent_actor* self, const AgentOptions& o, const ReplicaSpec& spec,
                     std::vector<caf::typed_response_promise<ReplicaActor>> waiting) {
  auto& st = self->state;
  if (!o.processes || o.replica_binary.empty())
    return Status(errc::unavailable, "node " + o.info.id + " cannot start replica processes");
  auto secret = make_secret();
  node::ProcessSpec ps;
  ps.id = spec.replica_id;
  ps.executable = o.replica_binary;
  ps.args = {"--replica-id", spec.replica_id, "--node-id", o.info.id, "--parent-pid",
             std::to_string(::getpid()), "--log-level", o.log_level, "--log-format",
             o.log_format};
  // Absolute: the process runs in the replica log directory.
  auto absolute = [](const std::string& path) {
    std::error_code ec;
    auto p = std::filesystem::absolute(path, ec);
    return ec ? path : p.string();
  };
  if (o.replica_uid >= 0) {
    ps.args.insert(ps.args.end(), {"--run-as-uid", std::to_string(o.replica_uid), "--run-as-gid",
                                   std::to_string(o.replica_gid)});
  }
  for (const auto& dir : o.plugin_path) {
    ps.args.push_back("--plugin-path");
    ps.args.push_back(absolute(dir));
  }
  if (!o.library_cache.empty()) {
    ps.args.push_back("--library-cache");
    ps.args.push_back(absolute(o.library_cache));
  }
  // Its data channel: the process's ends go to it as fds 3...; the node's
  // are registered for the proxy once the process runs. Without one (it
  // could not be made) requests reach it over CAF.
  channel::Made made;
  if (o.channels && o.channel_lanes > 0) {
    auto m = channel::make_channel(spec.replica_id, o.channel_lanes);
    if (m) {
      made = std::move(m.value());
      ps.fds = made.child_fds;
      ps.args.insert(ps.args.end(),
                     {"--channel-lanes", std::to_string(o.channel_lanes), "--channel-max-frame",
                      std::to_string(made.channel->max_frame())});
    } else {
      st.log->warn("replica {}: no data channel ({}); its requests go over CAF",
                   spec.replica_id, m.status().message());
    }
  }
  // Its way to this node: a doorbell at which it asks the process
  // supervisor for connections (no port: runtime/gate_link.hpp).
  auto doorbell = gate_link::make_doorbell();
  if (!doorbell)
    return doorbell.status();
  ps.args.insert(ps.args.end(),
                 {"--gate-fd", std::to_string(3 + static_cast<int>(ps.fds.size()))});
  ps.fds.push_back(doorbell->process.get());
  ps.doorbell = doorbell->node.release();
  ps.stdin_data = secret + "\n";
  ps.memory_limit_bytes = spec.memory_limit_bytes;
  // glibc reserves 64 MiB of address space per thread arena; under an
  // RLIMIT_AS memory limit that would count against the user's budget.
  ps.env = {{"MALLOC_ARENA_MAX", "2"}};
  auto pid = o.processes->spawn(ps);
  for (int fd : made.child_fds)
    ::close(fd);
  doorbell->process = gate_link::Fd();
  if (!pid)
    return pid.status();
  if (made.channel)
    o.channels->add(made.channel);
  st.hosted->add_process(spec, *pid, std::move(secret), std::move(waiting));
  self->delayed_send(self, seconds_as(o.attach_timeout_s), attach_deadline_atom::value,
                     spec.replica_id, static_cast<int32_t>(*pid));
  st.log->info("started replica process {} of {}/{} ({}, pid {}{})", spec.replica_id, spec.app,
               spec.deployment, spec.import_path, *pid,
               spec.memory_limit_bytes > 0
                   ? ", memory limit " + format_bytes(spec.memory_limit_bytes)
                   : std::string());
  return Status::ok();
}

// Starts the replica of `spec` (its library, when pinned, is in the cache)
// and answers `waiting` with its actor, or with why it did not start.
void start_replica(agent_actor* self, const AgentOptions& o, const MetricsSinkActor& sink,
                   const ReplicaSpec& spec,
                   std::vector<caf::typed_response_promise<ReplicaActor>> waiting) {
  auto& st = self->state;
  if (spec.isolation != "in_process") {
    if (auto started = spawn_process(self, o, spec, waiting); !started) {
      for (auto& p : waiting)
        p.deliver(to_caf_error(started));
    }
    return;
  }
  replica::ReplicaOptions ropts;
  ropts.spec = spec;
  ropts.node_id = o.info.id;
  ropts.loader = o.loader;
  ropts.metrics_sink = sink;
  ropts.handles = o.handles;
  ropts.registry = o.registry;
  // Its own log file where a replica process's output would go: `troupectl
  // logs` reads it, also after the replica ended.
  if (o.processes)
    ropts.log_file = o.processes->log_path(spec.replica_id);
  // A deployment that declares its handler non-blocking is called
  // inline by this node's proxy (runtime/local_replicas.hpp).
  if (o.channels)
    ropts.local_replicas = o.channels->local_replicas();
  auto handle = replica::spawn_replica(self->home_system(), std::move(ropts));
  self->monitor(handle);
  st.replica_ids[handle.address()] = spec.replica_id;
  st.hosted->add_in_process(spec, handle);
  st.log->info("spawned replica {} of {}/{} ({})", spec.replica_id, spec.app, spec.deployment,
               spec.import_path);
  for (auto& p : waiting)
    p.deliver(handle);
}

void log_notes(agent_actor* self, const node::LibraryFetcher::Notes& notes) {
  for (const auto& n : notes) {
    if (n.level == node::LibraryFetcher::Note::Level::error)
      self->state.log->error("{}", n.text);
    else
      self->state.log->info("{}", n.text);
    count_library_event(self->state.registry, n.event);
  }
}

// Where the library fetcher gets a library the node lacks: the controller it
// was asked of (every piece of one fetch from the same one).
class ControllerLibrarySource final : public node::LibraryFetcher::Source {
 public:
  ControllerLibrarySource(agent_actor* self, ControllerActor from, double timeout_s)
      : self_(self), from_(std::move(from)), timeout_s_(timeout_s) {}

  void size(const std::string& sha256, SizeReply reply) override {
    auto* self = self_;
    self->request(from_, seconds_as(timeout_s_), library_atom::value, sha256)
        .then([self, reply](uint64_t n) { log_notes(self, reply(n)); },
              [self, reply](caf::error& e) { log_notes(self, reply(from_caf_error(e))); });
  }

  void piece(const std::string& sha256, uint64_t offset, PieceReply reply) override {
    auto* self = self_;
    self->request(from_, seconds_as(timeout_s_), library_atom::value, sha256, offset)
        .then([self, reply](const std::string& p) { log_notes(self, reply(p)); },
              [self, reply](caf::error& e) { log_notes(self, reply(from_caf_error(e))); });
  }

 private:
  agent_actor* self_;
  ControllerActor from_;
  double timeout_s_;
};

// Makes sure the node's library cache holds the pinned library, then calls
// `done` (node/library_fetcher.hpp).
void with_library(agent_actor* self, const AgentOptions& o, const libraries::Pinned& pin,
                  std::function<void(const Status&)> done) {
  auto& st = self->state;
  std::shared_ptr<node::LibraryFetcher::Source> source;
  if (st.controller)
    source = std::make_shared<ControllerLibrarySource>(self, st.controller, o.request_timeout_s);
  log_notes(self, st.libraries->ensure(pin, std::move(source), std::move(done)).notes);
}

// Every library_cache_prune_interval_s: removes the cached libraries that no
// replica of this node uses and that were fetched over
// library_cache_retention_s ago (a controller keeps them; a node that needs
// one again fetches it again).
void prune_library_cache(agent_actor* self) {
  auto& st = self->state;
  std::set<std::string> used;
  for (const auto& [id, h] : st.hosted->all()) {
    if (auto pin = node::pinned_library(h.spec.import_path))
      used.insert(pin->sha256);
  }
  for (const auto& sha : st.libraries->prune(used))
    st.log->info("removed library {} from the cache: no replica of this node uses it", sha);
}

// -- the replicas' lifecycle: one function per event ---------------------

// A restarted agent: watch the replicas its predecessor spawned (one that
// exited meanwhile is reported at once), and keep enforcing the stop
// deadlines it had set.
void watch_hosted(agent_actor* self, const AgentOptions& o) {
  auto& st = self->state;
  for (auto& w : st.hosted->adopt(std::chrono::steady_clock::now())) {
    if (w.await_attach) {
      self->delayed_send(self, seconds_as(o.attach_timeout_s), attach_deadline_atom::value, w.id,
                         static_cast<int32_t>(w.pid));
      continue;
    }
    if (w.remote) {
      self->monitor(w.remote);
      st.remote_ids[w.remote.address()] = w.id;
    }
    self->monitor(w.handle);
    st.replica_ids[w.handle.address()] = w.id;
    if (w.kill_in) {
      self->delayed_send(self, std::chrono::duration_cast<caf::timespan>(*w.kill_in),
                         stop_due_atom::value, w.id);
    }
  }
  if (!st.hosted->empty())
    st.log->info("agent started with {} replicas still hosted on this node", st.hosted->size());
}

// The connection to a replica process broke. (Its replica actor ending
// first, on a graceful stop or a fault in the process, ends the remote handle
// too: the process then exits by itself and its exit is reported.)
void remote_lost(agent_actor* self, const AgentOptions& o, const std::string& id,
                 const caf::error& reason) {
  auto& st = self->state;
  if (!o.processes)
    return;
  switch (st.hosted->connection_lost(id, reason == caf::exit_reason::remote_link_unreachable)) {
    case HostedReplicas::Lost::ignore:
      return;
    case HostedReplicas::Lost::kill:
      if (o.processes->signal(id, SIGKILL))
        st.log->warn("lost the connection to replica process {} while it stops; killed it", id);
      return;
    case HostedReplicas::Lost::wait_reattach: {
      // The process may still run (this node was frozen past its connection
      // timeout, say): it connects again and attaches again, or is killed.
      auto* h = st.hosted->find(id);
      st.log->warn("lost the connection to replica process {} (pid {}); it has {:.0f} s to attach "
                   "again",
                   id, h->pid, o.reattach_timeout_s);
      self->delayed_send(self, seconds_as(o.reattach_timeout_s), reattach_deadline_atom::value, id,
                         static_cast<int32_t>(h->pid), h->detaches);
      return;
    }
  }
}

// The handle of a replica ended: it is gone.
void replica_ended(agent_actor* self, const AgentOptions& o, const std::string& id,
                   const caf::error& reason) {
  auto& st = self->state;
  auto ended = st.hosted->handle_ended(id);
  // Its handle ended before its process (an exit sent to the handle): the
  // process must not run on unreachable.
  if (ended.process && o.processes)
    o.processes->signal(id, SIGKILL);
  if (ended.remote)
    st.remote_ids.erase(ended.remote.address());
  st.checks.forget(id);
  if (ended.expected)
    st.log->info("replica {} exited", id);
  else
    st.log->warn("replica {} exited unexpectedly: {}", id, self->home_system().render(reason));
  if (o.registry)
    o.registry->drop_remote(id);
  maybe_finish_shutdown(self, o);
}

void controller_lost(agent_actor* self, const AgentOptions& o, const caf::error& reason) {
  auto& st = self->state;
  st.controller = nullptr;
  auto retry = st.session.lost();
  if (!retry)
    return maybe_finish_shutdown(self, o);
  st.log->warn("connection to the controller lost ({}); reconnecting",
               self->home_system().render(reason));
  schedule_reconnect(self, retry);
}

// Who went down: a replica process's connection, a replica, or the
// controller.
void on_down(agent_actor* self, const AgentOptions& o, const caf::down_msg& dm) {
  auto& st = self->state;
  if (auto it = st.remote_ids.find(dm.source); it != st.remote_ids.end()) {
    auto id = it->second;
    st.remote_ids.erase(it);
    return remote_lost(self, o, id, dm.reason);
  }
  if (auto it = st.replica_ids.find(dm.source); it != st.replica_ids.end()) {
    auto id = it->second;
    st.replica_ids.erase(it);
    return replica_ended(self, o, id, dm.reason);
  }
  if (st.controller && dm.source == st.controller.address())
    controller_lost(self, o, dm.reason);
}

void heartbeat(agent_actor* self, const AgentOptions& o) {
  auto& st = self->state;
  // A stopping node keeps its heartbeat until it has deregistered: its
  // replicas finish the requests they hold meanwhile, which a DEAD node's
  // would not (every proxy would fail them over elsewhere).
  if (st.stopping() && !st.shutdown_promise)
    return;
  self->delayed_send(self, seconds_as(o.heartbeat_interval_s), tick_atom::value);
  prune_library_cache(self);
  // The loads reported since the last heartbeat go with this one; while no
  // heartbeat is due (no controller) they are dropped: replicas report
  // again every metrics_interval_s, and old averages would mislead.
  auto loads = st.reports.take_loads();
  if (!st.session.heartbeat_due())
    return;
  auto link = st.session.link();
  self->request(st.controller, seconds_as(o.request_timeout_s), heartbeat_atom::value, o.info.id,
                std::move(loads), sign_request(o.identity, Operation::heartbeat, {o.info.id}))
      .then([](caf::ok_atom) {},
            [=](caf::error& err) {
              auto& st = self->state;
              auto status = from_caf_error(err);
              using Failure = node::ControllerSession::HeartbeatFailure;
              switch (st.session.heartbeat_failed(link, status.code() == errc::not_found)) {
                case Failure::ignore:
                  return;
                case Failure::reregister:
                  st.log->warn("controller does not know this node ({}); registering again",
                               status.message());
                  return send_register(self, o);
                case Failure::report:
                  st.log->warn("heartbeat failed: {}", status.to_string());
                  return;
              }
            });
}

// Its library first (from the cache, else fetched), then the replica.
void start_with_library(agent_actor* self, const AgentOptions& o, const MetricsSinkActor& sink,
                        const ReplicaSpec& spec, const libraries::Pinned& pin) {
  with_library(self, o, pin, [=](const Status& ready) {
    auto& st = self->state;
    auto node = st.starting.extract(spec.replica_id);
    if (node.empty())
      return;
    auto waiting = std::move(node.mapped());
    Status outcome = ready;
    if (outcome && st.stopping())
      outcome = Status(errc::unavailable, "node " + o.info.id + " is shutting down");
    if (!outcome) {
      st.log->warn("replica {} of {}/{} not started: {}", spec.replica_id, spec.app,
                   spec.deployment, outcome.message());
      for (auto& p : waiting)
        p.deliver(to_caf_error(outcome));
      return;
    }
    start_replica(self, o, sink, spec, std::move(waiting));
  });
}

caf::result<ReplicaActor> on_spawn(agent_actor* self, const AgentOptions& o,
                                   const MetricsSinkActor& sink, const ReplicaSpec& spec) {
  auto& st = self->state;
  if (st.stopping())
    return to_caf_error(Status(errc::unavailable, "node " + o.info.id + " is shutting down"));
  if (auto* h = st.hosted->find(spec.replica_id)) {
    if (h->attached)
      return h->handle;  // a retried request: same replica
    auto rp = self->make_response_promise<ReplicaActor>();
    h->waiting.push_back(rp);
    return rp;
  }
  auto rp = self->make_response_promise<ReplicaActor>();
  auto pin = node::pinned_library(spec.import_path);
  if (!pin || o.library_cache.empty()) {
    count_start(o, spec);
    start_replica(self, o, sink, spec, {rp});
    return rp;
  }
  auto [it, fresh] = st.starting.try_emplace(spec.replica_id);
  it->second.push_back(rp);
  if (!fresh)
    return rp;  // a retried request: answered with the first
  count_start(o, spec);
  start_with_library(self, o, sink, spec, *pin);
  return rp;
}

caf::result<ReplicaSpec, MetricsSinkActor, ProxyKeeperActor> on_hello(
    agent_actor* self, const AgentOptions& o, const MetricsSinkActor& sink, const std::string& id,
    const std::string& secret) {
  auto* h = check_process(self, id, secret, "hello");
  if (!h)
    return to_caf_error(
        Status(errc::permission_denied, "not a replica process started by this node"));
  return {h->spec, sink, o.proxy};
}

caf::result<caf::ok_atom> on_attach(agent_actor* self, const std::string& id,
                                    const std::string& secret, const ReplicaActor& remote) {
  auto& st = self->state;
  auto* h = check_process(self, id, secret, "attach");
  if (!h || !remote)
    return to_caf_error(
        Status(errc::permission_denied, "not a replica process started by this node"));
  self->monitor(remote);
  st.remote_ids[remote.address()] = id;
  if (st.hosted->attach(*h, remote) == HostedReplicas::Attach::again) {
    // Everyone holds the forwarder: from now on it reaches the process over
    // the new connection.
    h->target->set(caf::actor_cast<caf::actor>(remote));
    st.log->info("replica process {} (pid {}) attached again", id, h->pid);
    return caf::ok_atom::value;
  }
  h->target = std::make_shared<ForwardTarget>(caf::actor_cast<caf::actor>(remote));
  auto handle = make_forwarder(self->home_system(), h->target);
  self->monitor(handle);
  st.replica_ids[handle.address()] = id;
  st.log->info("replica process {} (pid {}) attached", id, h->pid);
  for (auto& rp : st.hosted->attached(*h, handle))
    rp.deliver(handle);
  return caf::ok_atom::value;
}

void on_reattach_deadline(agent_actor* self, const AgentOptions& o, const std::string& id,
                          int32_t pid, uint32_t detach) {
  if (!self->state.hosted->reattach_overdue(id, pid, detach))
    return;
  self->state.log->error(
      "replica process {} (pid {}) did not attach again within {:.0f} s; killing it", id, pid,
      o.reattach_timeout_s);
  if (o.processes)
    o.processes->signal(id, SIGKILL);  // its exit report ends the handle
}

void on_attach_deadline(agent_actor* self, const AgentOptions& o, const std::string& id,
                        int32_t pid) {
  auto& st = self->state;
  if (!st.hosted->attach_overdue(id, pid))
    return;
  st.log->error("replica process {} (pid {}) did not attach within {:.0f} s; killing it", id, pid,
                o.attach_timeout_s);
  kill_now(self, o, *st.hosted->find(id));
}

void on_process_exit(agent_actor* self, const AgentOptions& o, const std::string& id, int32_t pid,
                     const std::string& cause, bool clean) {
  auto& st = self->state;
  std::vector<caf::typed_response_promise<ReplicaActor>> failed;
  auto* h = st.hosted->find(id);
  auto handle = h ? h->handle : ReplicaActor();
  auto exit = st.hosted->process_exited(id, pid, clean, &failed);
  if (exit != HostedReplicas::Exit::ignore && o.channels)
    o.channels->remove(id);
  switch (exit) {
    case HostedReplicas::Exit::ignore:
      return;
    case HostedReplicas::Exit::stopped:
      // The controller and every proxy monitor this handle: they see the
      // replica go down with the cause.
      return self->send_exit(handle, caf::exit_reason::user_shutdown);
    case HostedReplicas::Exit::crashed:
      st.log->warn("replica {} (pid {}) exited: {}", id, pid, cause);
      return self->send_exit(
          handle, to_caf_error(Status(errc::internal, "replica " + id + " exited: " + cause)));
    case HostedReplicas::Exit::never_attached: {
      // No user code ran: its spawn fails.
      Status why(errc::internal,
                 "replica process " + id + " exited before it attached: " + cause);
      st.log->warn("{}", why.message());
      for (auto& rp : failed)
        rp.deliver(to_caf_error(why));
      if (o.registry)
        o.registry->drop_remote(id);
      return maybe_finish_shutdown(self, o);
    }
  }
}

caf::result<caf::ok_atom> on_stop(agent_actor* self, const AgentOptions& o, const std::string& id,
                                  double timeout_s) {
  auto* h = self->state.hosted->find(id);
  if (!h)
    return to_caf_error(Status(errc::not_found, "no replica '" + id + "' on " + o.info.id));
  stop_replica(self, o, *h, timeout_s);
  return caf::ok_atom::value;
}

caf::result<caf::ok_atom> on_kill(agent_actor* self, const AgentOptions& o, const std::string& id) {
  auto* h = self->state.hosted->find(id);
  if (!h)
    return to_caf_error(Status(errc::not_found, "no replica '" + id + "' on " + o.info.id));
  self->state.log->warn("killing replica {}", id);
  kill_now(self, o, *h);
  return caf::ok_atom::value;
}

// The graceful-stop deadline of a replica passed.
void on_stop_due(agent_actor* self, const AgentOptions& o, const std::string& id) {
  auto* h = self->state.hosted->find(id);
  if (!h)
    return;
  self->state.log->warn("replica {} did not stop within its graceful timeout; killing it", id);
  kill_now(self, o, *h);
}

// A replica process's registry, served with this node's metrics while the
// replica is hosted here (not after it ended: a late report is dropped).
void on_process_metrics(agent_actor* self, const AgentOptions& o, const std::string& replica_id,
                        const std::string& encoded) {
  if (!o.registry || !self->state.hosted->find(replica_id))
    return;
  if (auto s = o.registry->set_remote(replica_id, encoded); !s)
    self->state.log->warn("metrics report of replica {} refused: {}", replica_id, s.message());
}

// An in-process replica's lines are in the node's own log; a replica
// process's output (running or ended) in its own file.
caf::result<std::string, uint64_t> on_logs(agent_actor* self, const AgentOptions& o,
                                           const std::string& id, uint64_t offset, uint32_t tail) {
  // Every replica's own file: a replica process's output, an in-process
  // replica's ctx.log() lines; kept after the replica ended. An in-process
  // replica without one (it could not be opened): its lines in the node's log.
  auto* h = self->state.hosted->find(id);
  bool in_process = h && !h->process;
  Result<node::LogRead> read = Status(errc::not_found, "");
  if (o.processes && !o.processes->log_path(id).empty())
    read = node::read_log(o.processes->log_path(id), "", offset, tail);
  if (!read && read.status().code() == errc::not_found && in_process && !o.node_log_file.empty())
    read = node::read_log(o.node_log_file, id, offset, tail);
  if (!read) {
    if (read.status().code() == errc::not_found)
      return to_caf_error(
          Status(errc::not_found, "node " + o.info.id + " has no log of replica " + id));
    return to_caf_error(read.status());
  }
  return {std::move(read->text), read->next_offset};
}

// The node is stopping: the controller replaces this node's replicas
// elsewhere, then stops them here (the usual stop commands).
caf::result<std::string> on_leave(agent_actor* self, const AgentOptions& o, double budget_s) {
  auto& st = self->state;
  if (!st.session.is_registered())
    return std::string("not registered with a controller: nothing moved");
  auto rp = self->make_response_promise<std::string>();
  self->request(st.controller, seconds_as(budget_s), leave_atom::value, o.info.id,
                sign_request(o.identity, Operation::leave, {o.info.id}))
      .then([rp](std::string& what) mutable { rp.deliver(std::move(what)); },
            [rp](caf::error& err) mutable {
              rp.deliver("the move did not finish: " + from_caf_error(err).message());
            });
  return rp;
}

caf::result<caf::ok_atom> on_shutdown(agent_actor* self, const AgentOptions& o, double grace_s) {
  auto& st = self->state;
  st.session.stop();
  auto rp = self->make_response_promise<caf::ok_atom>();
  st.shutdown_promise = rp;
  for (auto& [id, h] : st.hosted->all())
    stop_replica(self, o, h, grace_s * 0.8);
  maybe_finish_shutdown(self, o);
  return rp;
}

// What the agent forwards to the controller while registered (lost while
// not: replicas repeat their reports).
template <class... Ts>
void to_controller(agent_actor* self, Ts&&... xs) {
  auto& st = self->state;
  if (st.session.is_registered())
    self->send(st.controller, std::forward<Ts>(xs)...);
}

// -- health checks (node/health_checks.hpp) --------------------------------

double checks_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What changed goes to the controller in one message (lost while not
// registered: the next registration starts the checks over).
void send_health_changes(agent_actor* self, const AgentOptions& o) {
  auto changes = self->state.checks.take_changes();
  if (changes.empty())
    return;
  std::vector<HealthReport> reports;
  reports.reserve(changes.size());
  for (auto& c : changes)
    reports.push_back(
        {std::move(c.replica_id), c.watch, c.passed, c.failures, std::move(c.failure)});
  to_controller(self, health_atom::value, o.info.id, std::move(reports));
}

// Answers come one by one; the changes of a short window go together
// (kReportsWindow), so a node with many replicas checked at once (a new
// controller's watches) sends a few messages, not one per replica.
void reports_soon(agent_actor* self) {
  auto& st = self->state;
  if (st.reports_due || !st.checks.has_changes())
    return;
  st.reports_due = true;
  self->delayed_send(self, std::chrono::duration_cast<caf::timespan>(kReportsWindow),
                     reports_due_atom::value);
}

void schedule_checks(agent_actor* self) {
  auto& st = self->state;
  if (auto at = st.checks.arm(st.checks_timer_at))
    self->delayed_send(self, seconds_as(std::max(0.0, *at - checks_now())), checks_due_atom::value);
}

// A check was answered: its replica's next check is due a period after it
// was sent (perhaps sooner than the timer set for its timeout).
void answered(agent_actor* self) {
  reports_soon(self);
  schedule_checks(self);
}

// Times out what waited too long and sends what is due, each to its
// replica; replicas no longer hosted are forgotten.
void run_checks(agent_actor* self, const AgentOptions& o) {
  auto& st = self->state;
  const double now = checks_now();
  st.checks.expire(now);
  for (auto& c : st.checks.due(now)) {
    auto* h = st.hosted->find(c.replica_id);
    if (!h) {
      st.checks.forget(c.replica_id);
      continue;
    }
    if (!h->attached)
      continue;  // a process not (or no longer) attached: no answer, it times out
    auto id = c.replica_id;
    auto seq = c.seq;
    // HealthChecks times the check out itself; this bound only keeps the
    // request from living forever.
    self->request(h->handle, std::chrono::seconds(600), health_atom::value)
        .then(
            [=](caf::ok_atom) {
              self->state.checks.result(id, seq, true, "");
              answered(self);
            },
            [=](caf::error& err) {
              self->state.checks.result(id, seq, false, from_caf_error(err).message());
              answered(self);
            });
  }
  reports_soon(self);
  schedule_checks(self);
}

void on_watches(agent_actor* self, const AgentOptions& o, const std::vector<HealthWatch>& watches) {
  auto& st = self->state;
  const double now = checks_now();
  for (const auto& w : watches) {
    if (!st.hosted->find(w.replica_id))
      continue;  // not (or no longer) here: the controller learns it from its handle
    const auto& s = w.settings;
    st.checks.watch(w.replica_id, w.watch, {s.period_s, s.timeout_s, s.threshold, s.jitter}, now);
  }
  run_checks(self, o);
}

void init_agent(agent_actor* self, const AgentOptions& o, std::shared_ptr<HostedReplicas> hosted) {
  auto& st = self->state;
  st.hosted = std::move(hosted);
  if (!o.controller_endpoints.empty())
    st.heads.emplace(o.controller_endpoints);
  st.session = node::ControllerSession({o.initial_backoff_s, o.max_backoff_s}, [self] {
    // +-20 %: a restarted head is not hit by every node at once.
    return std::uniform_real_distribution<double>(0.8, 1.2)(self->state.rng);
  });
  node::LibraryFetcher::Options lo;
  lo.cache_dir = o.library_cache;
  lo.plugin_path = o.plugin_path;
  lo.retention_s = o.library_cache_retention_s;
  lo.prune_interval_s = o.library_cache_prune_interval_s;
  st.libraries = std::make_unique<node::LibraryFetcher>(std::move(lo));
  st.registry = o.registry;
  watch_hosted(self, o);
  self->set_down_handler([=](const caf::down_msg& dm) { on_down(self, o, dm); });
  connect(self, o);
  self->delayed_send(self, seconds_as(o.heartbeat_interval_s), tick_atom::value);
}

// `hosted`: the replicas of this node (those of a predecessor that died, or
// none); `sink`: where replicas send their metrics (the keeper, which
// outlives this actor and forwards them to the current agent).
AgentImpl::behavior_type agent(agent_actor* self, AgentOptions o,
                               std::shared_ptr<HostedReplicas> hosted, MetricsSinkActor sink) {
  init_agent(self, o, std::move(hosted));
  const auto& id = o.info.id;
  return {
      [=](reconnect_atom) { connect(self, o); },
      [=](tick_atom) { heartbeat(self, o); },
      [=](spawn_replica_atom, const ReplicaSpec& spec) { return on_spawn(self, o, sink, spec); },
      [=](list_replicas_atom) { return hosted_list(self->state); },
      [=](replica_hello_atom, const std::string& rid, const std::string& secret) {
        return on_hello(self, o, sink, rid, secret);
      },
      [=](replica_attach_atom, const std::string& rid, const std::string& secret,
          const ReplicaActor& remote) { return on_attach(self, rid, secret, remote); },
      [=](reattach_deadline_atom, const std::string& rid, int32_t pid, uint32_t detach) {
        on_reattach_deadline(self, o, rid, pid, detach);
      },
      [=](attach_deadline_atom, const std::string& rid, int32_t pid) {
        on_attach_deadline(self, o, rid, pid);
      },
      [=](replica_exit_atom, const std::string& rid, int32_t pid, const std::string& cause,
          bool clean) { on_process_exit(self, o, rid, pid, cause, clean); },
      [=](stop_atom, const std::string& rid, double timeout_s) {
        return on_stop(self, o, rid, timeout_s);
      },
      [=](kill_replica_atom, const std::string& rid) { return on_kill(self, o, rid); },
      [=](stop_due_atom, const std::string& rid) { on_stop_due(self, o, rid); },
      [=](metrics_atom, ReplicaLoad& load) { self->state.reports.add_load(std::move(load)); },
      [=](metrics_atom, const std::string& rid, const std::string& encoded) {
        on_process_metrics(self, o, rid, encoded);
      },
      [=](models_atom, const std::string& rid, uint64_t seq, std::vector<std::string>& models) {
        if (self->state.reports.add_models(ReplicaModels{rid, seq, std::move(models)}))
          self->delayed_send(
              self, std::chrono::duration_cast<caf::timespan>(node::ReplicaReports::kModelsWindow),
              models_due_atom::value);
      },
      [=](health_atom, const std::vector<HealthWatch>& watches) { on_watches(self, o, watches); },
      [=](reports_due_atom) {
        self->state.reports_due = false;
        send_health_changes(self, o);
      },
      [=](checks_due_atom) {
        self->state.checks_timer_at.reset();
        run_checks(self, o);
      },
      [=](models_due_atom) {
        // Lost while not registered: replicas repeat their lists with every
        // load report.
        to_controller(self, models_atom::value, id, self->state.reports.take_models());
      },
      [=](logs_atom, const std::string& rid, uint64_t offset, uint32_t tail) {
        return on_logs(self, o, rid, offset, tail);
      },
      [=](library_atom, const std::string& sha256) -> uint64_t {
        if (!libraries::is_sha256(sha256) || o.library_cache.empty())
          return 0;
        return libraries::LibraryDir(o.library_cache, false).size_of(sha256).value_or(0);
      },
      [=](library_atom, const std::string& sha256, uint64_t offset) -> caf::result<std::string> {
        if (!libraries::is_sha256(sha256) || o.library_cache.empty())
          return to_caf_error(Status(errc::not_found, "this node has no library " + sha256));
        auto piece = libraries::LibraryDir(o.library_cache, false)
                         .read(sha256, offset, libraries::kChunkBytes);
        if (!piece)
          return to_caf_error(piece.status());
        return std::move(*piece);
      },
      [=](stop_node_atom) {
        // `troupectl shutdown --nodes`: the same path as SIGTERM.
        self->state.log->warn("the controller asks this node to stop");
        ::kill(::getpid(), SIGTERM);
      },
      [=](leave_atom, double budget_s) { return on_leave(self, o, budget_s); },
      [=](shutdown_atom, double grace_s) { return on_shutdown(self, o, grace_s); },
  };
}

// The keeper's own messages; everything else goes to the current agent
// (runtime/keeper_actor.hpp).
caf::message_handler keeper_handlers(Keeper& keeper) {
  auto* self = keeper.self();
  return {
      [self, &keeper](shutdown_atom atom, double grace_s) -> caf::result<caf::ok_atom> {
        keeper.stop();
        if (!keeper.current())
          return caf::ok_atom::value;
        auto rp = self->make_response_promise<caf::ok_atom>();
        self->request(keeper.current(), seconds_as(grace_s + 2), atom, grace_s)
            .then([rp](caf::ok_atom ok) mutable { rp.deliver(ok); },
                  [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        return rp;
      },
      [self, &keeper](leave_atom atom, double budget_s) -> caf::result<std::string> {
        if (!keeper.current())
          return std::string("the node agent is restarting: nothing moved");
        return self->delegate(caf::actor_cast<AgentImpl>(keeper.current()), atom, budget_s);
      },
      [&keeper](caf::get_atom) -> caf::result<AgentActor> {
        if (!keeper.current())
          return to_caf_error(Status(errc::unavailable, "the node agent is restarting"));
        return caf::actor_cast<AgentActor>(keeper.current());
      },
  };
}

}  // namespace

// Keeps a node agent running: restarts it (with the replicas it hosted) when
// it dies of anything but a requested stop, e.g. `troupectl kill agent`.
// Replica processes' exit reports that come while no agent runs are kept for
// the next one; the replicas' metrics are dropped then.
AgentKeeperActor spawn_node_agent(caf::actor_system& sys, const AgentOptions& options) {
  auto hosted = std::make_shared<HostedReplicas>();
  KeeperOptions k;
  k.what = "node agent";
  k.policy = options.restart_policy;
  k.on_give_up = options.on_give_up;
  k.log = troupe::log::get("agent");
  k.unavailable = "the node agent is restarting";
  k.start = [options, hosted](Keeper& keeper) -> caf::actor {
    return caf::actor_cast<caf::actor>(keeper.self()->home_system().spawn(
        agent, options, hosted, caf::actor_cast<MetricsSinkActor>(keeper.self())));
  };
  k.hold = [](const caf::message& msg) { return msg.match_element<replica_exit_atom>(0); };
  k.handlers = keeper_handlers;
  return caf::actor_cast<AgentKeeperActor>(
      spawn_keeper(sys, std::move(k), "troupe.agent-keeper"));
}

}  // namespace troupe
