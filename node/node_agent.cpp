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

#include "node/process_supervisor.hpp"
#include "node/replica_logs.hpp"
#include "replica/replica_actor.hpp"
#include "runtime/auth.hpp"
#include "runtime/data_channel.hpp"
#include "runtime/forwarder.hpp"
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
// again by now (id, pid, which loss of its connection).
using attach_deadline_atom = caf::atom_constant<caf::atom("attachdl")>;
using stop_due_atom = caf::atom_constant<caf::atom("stopdue")>;
using reattach_deadline_atom = caf::atom_constant<caf::atom("reattdl")>;
using AgentImpl = AgentActor::extend_with<AgentLocalActor>::extend<
    caf::reacts_to<reconnect_atom>, caf::reacts_to<tick_atom>,
    caf::reacts_to<attach_deadline_atom, std::string, int32_t>,
    caf::reacts_to<reattach_deadline_atom, std::string, int32_t, uint32_t>,
    caf::reacts_to<stop_due_atom, std::string>>;
using KeeperImpl = AgentKeeperActor::extend<caf::reacts_to<restart_atom>>;

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

struct Hosted {
  ReplicaSpec spec;
  // What everyone else holds: the replica's own handle (in process), or the
  // forwarding handle made when its process attached (empty before).
  ReplicaActor handle;
  bool stopping = false;
  // When stopping: when the agent kills it if it has not exited by then.
  std::chrono::steady_clock::time_point kill_at;
  // A replica process:
  bool process = false;
  pid_t pid = 0;
  // Written to the process's stdin. It attaches with it once; after that it
  // is accepted again only while the connection to the process is lost (it
  // attaches again with it, see `detached`).
  std::string secret;
  ReplicaActor remote;  // its replica actor, in the process
  // Where `handle` forwards to: `remote`, and the next remote handle when
  // the process attaches again.
  std::shared_ptr<ForwardTarget> target;
  // The connection to the process was lost while it runs (a frozen node
  // dropped it at its BASP connection timeout, say): the process connects
  // again and attaches its replica actor again, within
  // AgentOptions::reattach_timeout_s, or it is killed. `detaches` counts
  // the losses (which one a deadline is for).
  bool detached = false;
  uint32_t detaches = 0;
  // Spawn requests answered when the process attaches.
  std::vector<caf::typed_response_promise<ReplicaActor>> waiting;
};

// The replicas of this node, by id. They outlive the agent actor (they are
// not linked to it): owned by the current agent, and handed to the next one
// when the keeper restarts it, so the new agent reports them to the
// controller (which adopts them) instead of forgetting them.
using HostedReplicas = std::map<std::string, Hosted>;

struct AgentState {
  std::shared_ptr<HostedReplicas> hosted;
  ControllerActor controller;
  bool registered = false;
  bool connecting = false;
  bool stopping = false;
  double backoff_s = 0;
  uint64_t incarnation = 0;
  std::unordered_map<caf::actor_addr, std::string> replica_ids;
  // Replica actors in processes, by the address of their remote handle.
  std::unordered_map<caf::actor_addr, std::string> remote_ids;
  // Answered once every replica is gone and the node has deregistered.
  std::optional<caf::typed_response_promise<caf::ok_atom>> shutdown_promise;
  // Replicas whose library is being fetched, with the spawn requests that
  // wait for them; and per library (sha256) what waits for its fetch.
  std::map<std::string, std::vector<caf::typed_response_promise<ReplicaActor>>> starting;
  std::map<std::string, std::vector<std::function<void(const Status&)>>> library_waiters;
  // Cached libraries whose content this agent checked, and the file's stamp
  // then: checked again only once the file changed.
  std::map<std::string, libraries::LibraryDir::Stamp> verified_libraries;
  // When prune_library_cache() last looked.
  std::optional<std::chrono::steady_clock::time_point> cache_pruned_at;
  // The cache that fetches append to: one object for all the pieces of a
  // fetch, which keeps the running hash of each (LibraryDir::append).
  std::unique_ptr<libraries::LibraryDir> fetch_dir;
  std::minstd_rand rng{std::random_device{}()};
  std::shared_ptr<spdlog::logger> log = troupe::log::get("agent");
  static inline const char* name = "troupe.agent";
};

using agent_actor = AgentImpl::stateful_base<AgentState>;

std::vector<HostedReplicaInfo> hosted_list(const AgentState& st) {
  std::vector<HostedReplicaInfo> out;
  for (const auto& [id, h] : *st.hosted) {
    if (!h.handle)
      continue;  // a process that has not attached yet
    out.push_back({id, h.spec.app, h.spec.deployment, h.spec.code_version, h.spec.user_config,
                   h.stopping, h.handle});
  }
  return out;
}

void schedule_reconnect(agent_actor* self, const AgentOptions& o) {
  auto& st = self->state;
  if (st.stopping)
    return;
  st.backoff_s =
      st.backoff_s == 0 ? o.initial_backoff_s : std::min(st.backoff_s * 2, o.max_backoff_s);
  // +-20 % jitter so that a restarted head is not hit by every node at once.
  std::uniform_real_distribution<double> jitter(0.8, 1.2);
  self->delayed_send(self, seconds_as(st.backoff_s * jitter(st.rng)), reconnect_atom::value);
}

void send_register(agent_actor* self, const AgentOptions& o) {
  auto& st = self->state;
  auto controller = st.controller;
  self->request(controller, seconds_as(o.request_timeout_s), register_atom::value, o.info,
                caf::actor_cast<caf::actor>(self), hosted_list(st),
                sign_request(o.identity, Operation::register_node, {o.info.id}))
      .then(
          [=](uint64_t incarnation) {
            auto& st = self->state;
            if (st.controller != controller)
              return;  // superseded by a reconnect
            if (!st.registered) {
              st.log->info("registered with the controller as {} ({} replicas hosted)", o.info.id,
                           st.hosted->size());
            }
            st.registered = true;
            st.backoff_s = 0;
            st.incarnation = incarnation;
            if (o.proxy) {
              self->send(o.proxy, subscribe_atom::value, controller);
            }
          },
          [=](caf::error& err) {
            auto& st = self->state;
            if (st.controller != controller)
              return;
            auto status = from_caf_error(err);
            st.log->error("registration as {} failed: {}", o.info.id, status.to_string());
            // Keep trying: the controller may be restarting or being upgraded.
            schedule_reconnect(self, o);
          });
}

void adopt_controller(agent_actor* self, const AgentOptions& o, ControllerActor controller) {
  auto& st = self->state;
  st.controller = std::move(controller);
  st.registered = false;
  self->monitor(st.controller);
  send_register(self, o);
}

void caf_connect(agent_actor* self, const AgentOptions& o);

// A connection attempt failed: try again after the backoff.
void unreachable(agent_actor* self, const AgentOptions& o, const std::string& why) {
  auto& st = self->state;
  st.connecting = false;
  st.log->warn("cannot reach the controller at {}: {}; retrying", o.controller_endpoint.to_string(),
               why);
  schedule_reconnect(self, o);
}

void connect(agent_actor* self, const AgentOptions& o) {
  auto& st = self->state;
  if (st.stopping || st.connecting || st.controller)
    return;
  if (o.local_supervisor) {
    st.connecting = true;
    self->request(o.local_supervisor, seconds_as(o.request_timeout_s), caf::get_atom::value)
        .then(
            [=](const ControllerActor& controller) {
              self->state.connecting = false;
              adopt_controller(self, o, controller);
            },
            [=](caf::error& err) {
              self->state.connecting = false;
              self->state.log->warn("no controller on this head yet: {}; retrying",
                                    from_caf_error(err).message());
              schedule_reconnect(self, o);
            });
    return;
  }
  st.connecting = true;
  // Asked first, with a short deadline: CAF's own connect would block its
  // middleman (runtime/tcp_probe.hpp).
  const auto& ep = o.controller_endpoint;
  auto probe = spawn_tcp_probe(self->home_system(), ep.host, ep.port, kProbeTimeout);
  self->request(probe, kProbeTimeout + std::chrono::seconds(2), probe_atom::value)
      .then(
          [=](const std::string& why) {
            if (why.empty())
              caf_connect(self, o);
            else
              unreachable(self, o, why);
          },
          [=](caf::error& err) { unreachable(self, o, self->home_system().render(err)); });
}

void caf_connect(agent_actor* self, const AgentOptions& o) {
  // The OpenSSL module's middleman when the node runs with TLS.
  auto mm = security::transport_actor(self->home_system());
  const auto& ep = o.controller_endpoint;
  self->request(mm, seconds_as(o.request_timeout_s), caf::connect_atom::value, ep.host, ep.port)
      .then(
          [=](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
            auto& st = self->state;
            st.connecting = false;
            if (!ptr) {
              st.log->warn("{} answers but publishes no controller; retrying",
                           o.controller_endpoint.to_string());
              schedule_reconnect(self, o);
              return;
            }
            st.log->info("connected to the controller at {}", o.controller_endpoint.to_string());
            adopt_controller(self, o, caf::actor_cast<ControllerActor>(ptr));
          },
          [=](caf::error& err) { unreachable(self, o, self->home_system().render(err)); });
}

void maybe_finish_shutdown(agent_actor* self, const AgentOptions& o) {
  auto& st = self->state;
  if (!st.stopping || !st.shutdown_promise || !st.hosted->empty())
    return;
  auto finish = [=] {
    auto& st = self->state;
    st.registered = false;  // no more heartbeats
    if (st.shutdown_promise)
      st.shutdown_promise->deliver(caf::ok_atom::value);
    st.shutdown_promise.reset();
  };
  if (!st.registered || !st.controller) {
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
  if (!h.handle || h.detached) {
    // A process that has not attached runs no user code yet; one whose
    // connection is lost cannot be told to stop.
    h.stopping = true;
    kill_now(self, o, h);
    return;
  }
  if (!h.stopping) {
    h.stopping = true;
    // Its answer (or error) tells nothing its exit does not: the down
    // message, or the process's exit report, settles the stop.
    self->request(h.handle, caf::infinite, stop_atom::value, timeout_s)
        .then([](caf::ok_atom) {}, [](caf::error&) {});
  }
  // Enforce the timeout here too, so a stop survives a controller crash.
  auto grace = seconds_as(timeout_s + 0.5);
  h.kill_at = std::chrono::steady_clock::now() + grace;
  self->delayed_send(self, grace, stop_due_atom::value, h.spec.replica_id);
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

// Compares in time independent of where the strings differ.
bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size() || a.empty())
    return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
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
  auto it = st.hosted->find(id);
  if (it != st.hosted->end() && it->second.process &&
      (!it->second.handle || it->second.detached) && same_secret(it->second.secret, secret)) {
    return &it->second;
  }
  auto sender = self->current_sender();
  st.log->warn("refused a process that claims to be replica '{}' ({}): {} (from node {})", id, what,
               it == st.hosted->end() || !it->second.process   ? "no such replica process"
               : it->second.handle && !it->second.detached ? "it has attached already"
                                                           : "wrong secret",
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
  Hosted h;
  h.spec = spec;
  h.process = true;
  h.secret = make_secret();
  node::ProcessSpec ps;
  ps.id = spec.replica_id;
  ps.executable = o.replica_binary;
  ps.args = {"--node-port", std::to_string(o.gate_port), "--replica-id", spec.replica_id,
             "--node-id",   o.info.id,                   "--parent-pid",
             std::to_string(::getpid()), "--log-level", o.log_level,
             "--log-format", o.log_format};
  // Absolute: the process runs in the replica log directory.
  auto absolute = [](const std::string& path) {
    std::error_code ec;
    auto p = std::filesystem::absolute(path, ec);
    return ec ? path : p.string();
  };
  for (const auto& dir : o.plugin_path) {
    ps.args.push_back("--plugin-path");
    ps.args.push_back(absolute(dir));
  }
  if (!o.tls_dir.empty()) {
    ps.args.push_back("--tls-dir");
    ps.args.push_back(absolute(o.tls_dir));
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
  ps.stdin_data = h.secret + "\n";
  ps.memory_limit_bytes = spec.memory_limit_bytes;
  // glibc reserves 64 MiB of address space per thread arena; under an
  // RLIMIT_AS memory limit that would count against the user's budget.
  ps.env = {{"MALLOC_ARENA_MAX", "2"}};
  auto pid = o.processes->spawn(ps);
  for (int fd : made.child_fds)
    ::close(fd);
  if (!pid)
    return pid.status();
  if (made.channel)
    o.channels->add(made.channel);
  h.pid = *pid;
  h.waiting = std::move(waiting);
  (*st.hosted)[spec.replica_id] = std::move(h);
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
  // A deployment that declares its handler non-blocking is called
  // inline by this node's proxy (runtime/local_replicas.hpp).
  if (o.channels)
    ropts.local_replicas = o.channels->local_replicas();
  auto handle = replica::spawn_replica(self->home_system(), std::move(ropts));
  self->monitor(handle);
  st.replica_ids[handle.address()] = spec.replica_id;
  Hosted h;
  h.spec = spec;
  h.handle = handle;
  (*st.hosted)[spec.replica_id] = std::move(h);
  st.log->info("spawned replica {} of {}/{} ({})", spec.replica_id, spec.app, spec.deployment,
               spec.import_path);
  for (auto& p : waiting)
    p.deliver(handle);
}

// Calls every waiter of the library `sha256` once, with `outcome`.
void library_done(agent_actor* self, const std::string& sha256, const Status& outcome) {
  auto& st = self->state;
  auto it = st.library_waiters.find(sha256);
  if (it == st.library_waiters.end())
    return;
  auto waiters = std::move(it->second);
  st.library_waiters.erase(it);
  for (auto& f : waiters)
    f(outcome);
}

// Fetches the library from `offset` on (of `total` bytes) into the cache,
// piece by piece; the cache checks the content's hash when the last is in.
void fetch_library_piece(agent_actor* self, const AgentOptions& o, const ControllerActor& from,
                         const libraries::Pinned& pin, uint64_t total, uint64_t offset) {
  self->request(from, seconds_as(o.request_timeout_s), library_atom::value, pin.sha256, offset)
      .then(
          [=](const std::string& piece) {
            const std::string what = "library " + libraries::pinned(pin.name, pin.sha256);
            if (piece.empty()) {
              return library_done(self, pin.sha256,
                                  Status(errc::io_error, what + ": the controller sent " +
                                                             std::to_string(offset) + " of " +
                                                             std::to_string(total) + " bytes"));
            }
            auto& dir = self->state.fetch_dir;
            if (!dir)
              dir = std::make_unique<libraries::LibraryDir>(o.library_cache, false);
            auto got = dir->append(pin.sha256, total, offset, piece);
            if (!got) {
              // A hash mismatch included: refused, never loaded.
              self->state.log->error("{}: {}", what, got.status().message());
              return library_done(self, pin.sha256, Status(got.status().code(),
                                                           what + ": " + got.status().message()));
            }
            if (*got < total)
              return fetch_library_piece(self, o, from, pin, total, *got);
            self->state.log->info("fetched {} ({} bytes) from the controller", what, total);
            library_done(self, pin.sha256, Status::ok());
          },
          [=](caf::error& err) {
            library_done(self, pin.sha256,
                         Status(errc::unavailable,
                                "cannot fetch library " + libraries::pinned(pin.name, pin.sha256) +
                                    " from the controller: " + from_caf_error(err).message()));
          });
}

// Makes sure the node's library cache holds the pinned library, then calls
// `done`: a verified cached copy is used as it is; a cached copy whose
// content does not hash to the pin is refused (logged) and replaced; else
// this node's plugin path may hold the same build; else the controller has
// it.
void with_library(agent_actor* self, const AgentOptions& o, const libraries::Pinned& pin,
                  std::function<void(const Status&)> done) {
  auto& st = self->state;
  auto& waiters = st.library_waiters[pin.sha256];
  waiters.push_back(std::move(done));
  if (waiters.size() > 1)
    return;  // a fetch of it is under way
  const std::string what = "library " + libraries::pinned(pin.name, pin.sha256);
  libraries::LibraryDir cache(o.library_cache, false);
  if (auto st_open = cache.open(); !st_open)
    return library_done(self, pin.sha256, st_open);
  auto stamp = cache.stamp_of(pin.sha256);
  if (auto it = st.verified_libraries.find(pin.sha256);
      stamp && it != st.verified_libraries.end() && it->second == *stamp)
    return library_done(self, pin.sha256, Status::ok());
  auto cached = cache.verify(pin.sha256);
  if (cached && *cached) {
    if (stamp)
      st.verified_libraries[pin.sha256] = *stamp;
    return library_done(self, pin.sha256, Status::ok());
  }
  st.verified_libraries.erase(pin.sha256);
  if (!cached) {
    if (cached.status().code() != errc::corrupt)
      return library_done(self, pin.sha256, cached.status());
    st.log->error("refused the cached {}: {}; fetching it again", what, cached.status().message());
  }
  if (auto local = libraries::locate(o.plugin_path, pin.name)) {
    auto sha = libraries::sha256_file(*local);
    if (sha && *sha == pin.sha256)
      return library_done(self, pin.sha256, cache.put_file(pin.sha256, *local));
  }
  if (!st.controller) {
    return library_done(self, pin.sha256,
                        Status(errc::unavailable, what + " is not in this node's cache and the "
                                                         "controller is not connected"));
  }
  auto from = st.controller;
  self->request(from, seconds_as(o.request_timeout_s), library_atom::value, pin.sha256)
      .then(
          [=](uint64_t size) {
            if (size == 0) {
              return library_done(self, pin.sha256,
                                  Status(errc::not_found, "the controller has no " + what));
            }
            fetch_library_piece(self, o, from, pin, size, 0);
          },
          [=](caf::error& err) {
            library_done(self, pin.sha256,
                         Status(errc::unavailable, "cannot fetch " + what +
                                                       " from the controller: " +
                                                       from_caf_error(err).message()));
          });
}

// The library a replica spec pins (runtime/libraries.hpp), if any.
std::optional<libraries::Pinned> pinned_library(const ReplicaSpec& spec) {
  return libraries::split_pinned(spec.import_path.substr(0, spec.import_path.find(':')));
}

// Every library_cache_prune_interval_s: removes the cached libraries that no
// replica of this node uses and that were fetched over
// library_cache_retention_s ago (a controller keeps them; a node that needs
// one again fetches it again).
void prune_library_cache(agent_actor* self, const AgentOptions& o) {
  auto& st = self->state;
  const auto now = std::chrono::steady_clock::now();
  if (o.library_cache.empty() ||
      (st.cache_pruned_at && now - *st.cache_pruned_at <
                                 std::chrono::duration<double>(o.library_cache_prune_interval_s)))
    return;
  st.cache_pruned_at = now;
  std::set<std::string> used;
  for (const auto& [id, h] : *st.hosted) {
    if (auto pin = pinned_library(h.spec))
      used.insert(pin->sha256);
  }
  for (const auto& [sha, waiters] : st.library_waiters)
    used.insert(sha);
  libraries::LibraryDir cache(o.library_cache, false);
  const double wall_now = static_cast<double>(std::time(nullptr));
  for (const auto& sha :
       libraries::stale_libraries(cache.list(), used, wall_now, o.library_cache_retention_s)) {
    cache.remove(sha);
    st.verified_libraries.erase(sha);
    st.log->info("removed library {} from the cache: no replica of this node uses it", sha);
  }
}

// `hosted`: the replicas of this node (those of a predecessor that died, or
// none); `sink`: where replicas send their metrics (the keeper, which
// outlives this actor and forwards them to the current agent).
AgentImpl::behavior_type agent(agent_actor* self, AgentOptions o,
                               std::shared_ptr<HostedReplicas> hosted, MetricsSinkActor sink) {
  self->state.hosted = std::move(hosted);
  {
    // A restarted agent: watch the replicas its predecessor spawned (one
    // that exited meanwhile is reported at once), and keep enforcing the
    // stop deadlines it had set.
    auto& st = self->state;
    auto now = std::chrono::steady_clock::now();
    for (auto& [id, h] : *st.hosted) {
      // Spawn requests of the dead agent time out at the controller.
      h.waiting.clear();
      if (h.process && !h.handle) {
        self->delayed_send(self, seconds_as(o.attach_timeout_s), attach_deadline_atom::value, id,
                           static_cast<int32_t>(h.pid));
        continue;
      }
      if (h.remote) {
        self->monitor(h.remote);
        st.remote_ids[h.remote.address()] = id;
      }
      self->monitor(h.handle);
      st.replica_ids[h.handle.address()] = id;
      if (h.stopping) {
        auto left = h.kill_at > now ? h.kill_at - now : std::chrono::steady_clock::duration{0};
        self->delayed_send(self, std::chrono::duration_cast<caf::timespan>(left),
                           stop_due_atom::value, id);
      }
    }
    if (!st.hosted->empty())
      st.log->info("agent started with {} replicas still hosted on this node", st.hosted->size());
  }
  self->set_down_handler([=](const caf::down_msg& dm) {
    auto& st = self->state;
    if (auto it = st.remote_ids.find(dm.source); it != st.remote_ids.end()) {
      // The connection to a replica process broke. (Its replica actor
      // ending first, on a graceful stop or a fault in the process, ends the
      // remote handle too: the process then exits by itself and its exit is
      // reported.)
      auto id = it->second;
      st.remote_ids.erase(it);
      auto hit = st.hosted->find(id);
      if (hit == st.hosted->end() || dm.reason != caf::exit_reason::remote_link_unreachable ||
          !o.processes)
        return;
      auto& h = hit->second;
      if (h.stopping) {
        // It is on its way out: of no use any more.
        if (o.processes->signal(id, SIGKILL))
          st.log->warn("lost the connection to replica process {} while it stops; killed it", id);
        return;
      }
      // The process may still run (this node was frozen past its connection
      // timeout, say): it connects again and attaches again, or is killed.
      h.detached = true;
      ++h.detaches;
      st.log->warn("lost the connection to replica process {} (pid {}); it has {:.0f} s to attach "
                   "again",
                   id, h.pid, o.reattach_timeout_s);
      self->delayed_send(self, seconds_as(o.reattach_timeout_s), reattach_deadline_atom::value, id,
                         static_cast<int32_t>(h.pid), h.detaches);
      return;
    }
    if (auto it = st.replica_ids.find(dm.source); it != st.replica_ids.end()) {
      auto id = it->second;
      st.replica_ids.erase(it);
      auto hit = st.hosted->find(id);
      // Its handle ended before its process (an exit sent to the handle):
      // the process must not run on unreachable.
      if (hit != st.hosted->end() && hit->second.process && o.processes)
        o.processes->signal(id, SIGKILL);
      if (hit != st.hosted->end() && hit->second.remote)
        st.remote_ids.erase(hit->second.remote.address());
      bool expected = hit != st.hosted->end() && hit->second.stopping;
      if (expected) {
        st.log->info("replica {} exited", id);
      } else {
        st.log->warn("replica {} exited unexpectedly: {}", id,
                     self->home_system().render(dm.reason));
      }
      st.hosted->erase(id);
      if (o.registry)
        o.registry->drop_remote(id);
      maybe_finish_shutdown(self, o);
      return;
    }
    if (!st.controller || dm.source != st.controller.address())
      return;
    st.controller = nullptr;
    st.registered = false;
    if (st.stopping) {
      maybe_finish_shutdown(self, o);
      return;
    }
    st.log->warn("connection to the controller lost ({}); reconnecting",
                 self->home_system().render(dm.reason));
    schedule_reconnect(self, o);
  });
  connect(self, o);
  self->delayed_send(self, seconds_as(o.heartbeat_interval_s), tick_atom::value);
  return {
      [=](reconnect_atom) { connect(self, o); },
      [=](tick_atom) {
        auto& st = self->state;
        // A stopping node keeps its heartbeat until it has deregistered: its
        // replicas finish the requests they hold meanwhile, which a DEAD
        // node's would not (every proxy would fail them over elsewhere).
        if (st.stopping && !st.shutdown_promise)
          return;
        self->delayed_send(self, seconds_as(o.heartbeat_interval_s), tick_atom::value);
        prune_library_cache(self, o);
        if (!st.registered || !st.controller)
          return;
        auto controller = st.controller;
        self->request(controller, seconds_as(o.request_timeout_s), heartbeat_atom::value, o.info.id,
                      sign_request(o.identity, Operation::heartbeat, {o.info.id}))
            .then([](caf::ok_atom) {},
                  [=](caf::error& err) {
                    auto& st = self->state;
                    if (st.controller != controller || st.stopping)
                      return;
                    auto status = from_caf_error(err);
                    if (status.code() == errc::not_found) {
                      st.log->warn("controller does not know this node ({}); registering again",
                                   status.message());
                      st.registered = false;
                      send_register(self, o);
                    } else {
                      st.log->warn("heartbeat failed: {}", status.to_string());
                    }
                  });
      },
      [=](spawn_replica_atom, const ReplicaSpec& spec) -> caf::result<ReplicaActor> {
        auto& st = self->state;
        if (st.stopping) {
          return to_caf_error(Status(errc::unavailable, "node " + o.info.id + " is shutting down"));
        }
        if (auto it = st.hosted->find(spec.replica_id); it != st.hosted->end()) {
          if (it->second.handle)
            return it->second.handle;  // a retried request: same replica
          auto rp = self->make_response_promise<ReplicaActor>();
          it->second.waiting.push_back(rp);
          return rp;
        }
        auto rp = self->make_response_promise<ReplicaActor>();
        auto pin = pinned_library(spec);
        if (!pin || o.library_cache.empty()) {
          count_start(o, spec);
          start_replica(self, o, sink, spec, {rp});
          return rp;
        }
        // Its library first: from the cache, else fetched.
        auto [it, fresh] = st.starting.try_emplace(spec.replica_id);
        it->second.push_back(rp);
        if (!fresh)
          return rp;  // a retried request: answered with the first
        count_start(o, spec);
        with_library(self, o, *pin, [=](const Status& ready) {
          auto& st = self->state;
          auto node = st.starting.extract(spec.replica_id);
          if (node.empty())
            return;
          auto waiting = std::move(node.mapped());
          Status outcome = ready;
          if (outcome && st.stopping)
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
        return rp;
      },
      [=](list_replicas_atom) { return hosted_list(self->state); },
      [=](replica_hello_atom, const std::string& id, const std::string& secret)
          -> caf::result<ReplicaSpec, MetricsSinkActor, ProxyKeeperActor> {
        auto* h = check_process(self, id, secret, "hello");
        if (!h) {
          return to_caf_error(
              Status(errc::permission_denied, "not a replica process started by this node"));
        }
        return {h->spec, sink, o.proxy};
      },
      [=](replica_attach_atom, const std::string& id, const std::string& secret,
          const ReplicaActor& remote) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        auto* h = check_process(self, id, secret, "attach");
        if (!h || !remote) {
          return to_caf_error(
              Status(errc::permission_denied, "not a replica process started by this node"));
        }
        h->remote = remote;
        self->monitor(remote);
        st.remote_ids[remote.address()] = id;
        if (h->detached) {
          // Everyone holds the forwarder: from now on it reaches the process
          // over the new connection.
          h->detached = false;
          h->target->set(caf::actor_cast<caf::actor>(remote));
          st.log->info("replica process {} (pid {}) attached again", id, h->pid);
          return caf::ok_atom::value;
        }
        h->target = std::make_shared<ForwardTarget>(caf::actor_cast<caf::actor>(remote));
        h->handle = make_forwarder(self->home_system(), h->target);
        self->monitor(h->handle);
        st.replica_ids[h->handle.address()] = id;
        st.log->info("replica process {} (pid {}) attached", id, h->pid);
        for (auto& rp : h->waiting)
          rp.deliver(h->handle);
        h->waiting.clear();
        return caf::ok_atom::value;
      },
      [=](reattach_deadline_atom, const std::string& id, int32_t pid, uint32_t detach) {
        auto& st = self->state;
        auto it = st.hosted->find(id);
        if (it == st.hosted->end() || it->second.pid != pid || !it->second.detached ||
            it->second.detaches != detach)
          return;
        st.log->error("replica process {} (pid {}) did not attach again within {:.0f} s; killing it",
                      id, pid, o.reattach_timeout_s);
        if (o.processes)
          o.processes->signal(id, SIGKILL);  // its exit report ends the handle
      },
      [=](attach_deadline_atom, const std::string& id, int32_t pid) {
        auto& st = self->state;
        auto it = st.hosted->find(id);
        if (it == st.hosted->end() || it->second.pid != pid || it->second.handle)
          return;
        st.log->error("replica process {} (pid {}) did not attach within {:.0f} s; killing it", id,
                      pid, o.attach_timeout_s);
        kill_now(self, o, it->second);
      },
      [=](replica_exit_atom, const std::string& id, int32_t pid, const std::string& cause,
          bool clean) {
        auto& st = self->state;
        auto it = st.hosted->find(id);
        if (it == st.hosted->end() || it->second.pid != pid)
          return;
        if (o.channels)
          o.channels->remove(id);
        auto& h = it->second;
        if (h.handle) {
          // The controller and every proxy monitor this handle: they see the
          // replica go down with the cause.
          if (clean && h.stopping) {
            self->send_exit(h.handle, caf::exit_reason::user_shutdown);
          } else {
            st.log->warn("replica {} (pid {}) exited: {}", id, pid, cause);
            self->send_exit(h.handle, to_caf_error(Status(errc::internal, "replica " + id +
                                                                              " exited: " + cause)));
          }
          return;
        }
        // It never attached: no user code ran, its spawn fails.
        Status why(errc::internal, "replica process " + id + " exited before it attached: " + cause);
        st.log->warn("{}", why.message());
        for (auto& rp : h.waiting)
          rp.deliver(to_caf_error(why));
        st.hosted->erase(it);
        if (o.registry)
          o.registry->drop_remote(id);
        maybe_finish_shutdown(self, o);
      },
      [=](stop_atom, const std::string& id, double timeout_s) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        auto it = st.hosted->find(id);
        if (it == st.hosted->end()) {
          return to_caf_error(Status(errc::not_found, "no replica '" + id + "' on " + o.info.id));
        }
        stop_replica(self, o, it->second, timeout_s);
        return caf::ok_atom::value;
      },
      [=](kill_replica_atom, const std::string& id) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        auto it = st.hosted->find(id);
        if (it == st.hosted->end()) {
          return to_caf_error(Status(errc::not_found, "no replica '" + id + "' on " + o.info.id));
        }
        st.log->warn("killing replica {}", id);
        kill_now(self, o, it->second);
        return caf::ok_atom::value;
      },
      [=](stop_due_atom, const std::string& id) {
        // The graceful-stop deadline of a replica passed.
        auto& st = self->state;
        auto it = st.hosted->find(id);
        if (it == st.hosted->end())
          return;
        st.log->warn("replica {} did not stop within its graceful timeout; killing it", id);
        kill_now(self, o, it->second);
      },
      [=](metrics_atom, const std::string& replica_id, double ongoing, uint64_t finished) {
        auto& st = self->state;
        if (st.registered && st.controller) {
          self->send(st.controller, metrics_atom::value, o.info.id, replica_id, ongoing, finished);
        }
      },
      [=](metrics_atom, const std::string& replica_id, const std::string& encoded) {
        // A replica process's registry, served with this node's metrics
        // while the replica is hosted here (not after it ended: a late
        // report is dropped).
        auto& st = self->state;
        if (!o.registry || st.hosted->count(replica_id) == 0)
          return;
        if (auto s = o.registry->set_remote(replica_id, encoded); !s) {
          st.log->warn("metrics report of replica {} refused: {}", replica_id, s.message());
        }
      },
      [=](models_atom, const std::string& replica_id, uint64_t seq,
          std::vector<std::string>& model_ids) {
        // Lost while unregistered: the replica repeats it with every metrics
        // report.
        auto& st = self->state;
        if (st.registered && st.controller) {
          self->send(st.controller, models_atom::value, o.info.id, replica_id, seq,
                     std::move(model_ids));
        }
      },
      [=](logs_atom, const std::string& id, uint64_t offset,
          uint32_t tail) -> caf::result<std::string, uint64_t> {
        // An in-process replica's lines are in the node's own log; a
        // replica process's output (running or ended) in its own file.
        auto& st = self->state;
        auto it = st.hosted->find(id);
        bool in_process = it != st.hosted->end() && !it->second.process;
        Result<node::LogRead> read = Status(errc::not_found, "");
        if (in_process && !o.node_log_file.empty())
          read = node::read_log(o.node_log_file, id, offset, tail);
        else if (o.processes && !o.processes->log_path(id).empty())
          read = node::read_log(o.processes->log_path(id), "", offset, tail);
        if (!read) {
          if (read.status().code() == errc::not_found)
            return to_caf_error(
                Status(errc::not_found, "node " + o.info.id + " has no log of replica " + id));
          return to_caf_error(read.status());
        }
        return {std::move(read->text), read->next_offset};
      },
      [=](stop_node_atom) {
        // `troupectl shutdown --nodes`: the same path as SIGTERM.
        self->state.log->warn("the controller asks this node to stop");
        ::kill(::getpid(), SIGTERM);
      },
      [=](leave_atom, double budget_s) -> caf::result<std::string> {
        // The node is stopping: the controller replaces this node's replicas
        // elsewhere, then stops them here (the usual stop commands).
        auto& st = self->state;
        if (!st.registered || !st.controller)
          return std::string("not registered with a controller: nothing moved");
        auto rp = self->make_response_promise<std::string>();
        self->request(st.controller, seconds_as(budget_s), leave_atom::value, o.info.id,
                      sign_request(o.identity, Operation::leave, {o.info.id}))
            .then([rp](std::string& what) mutable { rp.deliver(std::move(what)); },
                  [rp](caf::error& err) mutable {
                    rp.deliver("the move did not finish: " + from_caf_error(err).message());
                  });
        return rp;
      },
      [=](shutdown_atom, double grace_s) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        st.stopping = true;
        auto rp = self->make_response_promise<caf::ok_atom>();
        st.shutdown_promise = rp;
        for (auto& [id, h] : *st.hosted)
          stop_replica(self, o, h, grace_s * 0.8);
        maybe_finish_shutdown(self, o);
        return rp;
      },
  };
}

// A replica process's exit report (replica_exit_atom's arguments).
struct ProcessExit {
  std::string id;
  int32_t pid = 0;
  std::string cause;
  bool clean = false;
};

struct KeeperState {
  AgentImpl agent;
  // Exit reports of replica processes that came while no agent ran; the
  // next agent gets them.
  std::vector<ProcessExit> exits;
  std::shared_ptr<HostedReplicas> hosted = std::make_shared<HostedReplicas>();
  bool stopping = false;
  RestartLimiter restarts;
  std::shared_ptr<spdlog::logger> log = troupe::log::get("agent");
  static inline const char* name = "troupe.agent-keeper";
};

using keeper_actor = KeeperImpl::stateful_base<KeeperState>;

void start_agent(keeper_actor* self, const AgentOptions& o) {
  auto& st = self->state;
  st.agent = self->home_system().spawn(agent, o, st.hosted, caf::actor_cast<MetricsSinkActor>(self));
  self->monitor(st.agent);
  for (auto& e : st.exits)
    self->send(st.agent, replica_exit_atom::value, e.id, e.pid, e.cause, e.clean);
  st.exits.clear();
}

// Keeps a node agent running: restarts it (with the replicas it hosted) when
// it dies of anything but a requested stop, e.g. `troupectl kill agent`, as
// the proxy's keeper restarts the proxy actor. Forwards to the current agent
// what outlives it: the shutdown request and the replicas' metrics.
KeeperImpl::behavior_type agent_keeper(keeper_actor* self, AgentOptions o) {
  self->state.restarts = RestartLimiter(o.restart_policy);
  self->set_down_handler([=](const caf::down_msg& dm) {
    auto& st = self->state;
    if (!st.agent || dm.source != st.agent.address())
      return;
    if (st.stopping || dm.reason == caf::exit_reason::user_shutdown) {
      st.agent = nullptr;
      self->quit(caf::exit_reason::user_shutdown);
      return;
    }
    auto reason = self->home_system().render(dm.reason);
    st.agent = nullptr;
    auto decision = st.restarts.on_death(std::chrono::steady_clock::now());
    if (decision.give_up) {
      auto message = st.restarts.give_up_message("node agent", reason);
      st.log->critical("{}", message);
      if (o.on_give_up)
        o.on_give_up(message);
      self->quit(to_caf_error(Status(errc::unavailable, message)));
      return;
    }
    st.log->error("node agent died ({}); restarting it with {} replicas hosted", reason,
                  st.hosted->size());
    if (decision.delay > RestartLimiter::duration::zero()) {
      self->delayed_send(self, std::chrono::duration_cast<caf::timespan>(decision.delay),
                         restart_atom::value);
      return;
    }
    start_agent(self, o);
  });
  // The process stops the agent by stopping the keeper.
  self->set_exit_handler([=](const caf::exit_msg& em) {
    auto& st = self->state;
    st.stopping = true;
    if (st.agent)
      self->send_exit(st.agent, em.reason);
    self->quit(em.reason);
  });
  start_agent(self, o);
  return {
      [=](restart_atom) {
        auto& st = self->state;
        if (!st.stopping && !st.agent)
          start_agent(self, o);
      },
      [=](shutdown_atom atom, double grace_s) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        st.stopping = true;
        if (!st.agent)
          return caf::ok_atom::value;
        auto rp = self->make_response_promise<caf::ok_atom>();
        self->request(st.agent, seconds_as(grace_s + 2), atom, grace_s)
            .then([rp](caf::ok_atom ok) mutable { rp.deliver(ok); },
                  [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        return rp;
      },
      [=](leave_atom atom, double budget_s) -> caf::result<std::string> {
        if (!self->state.agent)
          return std::string("the node agent is restarting: nothing moved");
        return self->delegate(self->state.agent, atom, budget_s);
      },
      [=](metrics_atom atom, const std::string& replica_id, double ongoing, uint64_t finished) {
        if (auto& a = self->state.agent)
          self->send(a, atom, replica_id, ongoing, finished);
      },
      [=](metrics_atom atom, const std::string& replica_id, std::string& encoded) {
        if (auto& a = self->state.agent)
          self->send(a, atom, replica_id, std::move(encoded));
      },
      [=](models_atom atom, const std::string& replica_id, uint64_t seq,
          std::vector<std::string>& model_ids) {
        if (auto& a = self->state.agent)
          self->send(a, atom, replica_id, seq, std::move(model_ids));
      },
      [=](caf::get_atom) -> caf::result<AgentActor> {
        if (!self->state.agent)
          return to_caf_error(Status(errc::unavailable, "the node agent is restarting"));
        return caf::actor_cast<AgentActor>(self->state.agent);
      },
      // From the replica gate: checked by the agent, which knows the secrets.
      [=](replica_hello_atom atom, const std::string& id, const std::string& secret)
          -> caf::result<ReplicaSpec, MetricsSinkActor, ProxyKeeperActor> {
        if (!self->state.agent)
          return to_caf_error(Status(errc::unavailable, "the node agent is restarting"));
        return self->delegate(self->state.agent, atom, id, secret);
      },
      [=](replica_attach_atom atom, const std::string& id, const std::string& secret,
          const ReplicaActor& remote) -> caf::result<caf::ok_atom> {
        if (!self->state.agent)
          return to_caf_error(Status(errc::unavailable, "the node agent is restarting"));
        return self->delegate(self->state.agent, atom, id, secret, remote);
      },
      // From the process supervisor's thread.
      [=](replica_exit_atom atom, const std::string& id, int32_t pid, const std::string& cause,
          bool clean) {
        auto& st = self->state;
        if (st.agent)
          self->send(st.agent, atom, id, pid, cause, clean);
        else
          st.exits.push_back(ProcessExit{id, pid, cause, clean});
      },
  };
}

}  // namespace

AgentKeeperActor spawn_node_agent(caf::actor_system& sys, const AgentOptions& options) {
  return sys.spawn(agent_keeper, options);
}

}  // namespace troupe
