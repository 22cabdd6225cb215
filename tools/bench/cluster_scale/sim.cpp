#include "tools/bench/cluster_scale/sim.hpp"

#include <unistd.h>

#include <algorithm>
#include <random>

#include <caf/all.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/io/middleman.hpp>

#include "node/health_checks.hpp"
#include "node/replica_reports.hpp"
#include "runtime/status.hpp"
#include "runtime/time.hpp"

namespace troupe::sim {
namespace {

// A simulated agent's health checks are due (or time out).
using checks_due_atom = caf::atom_constant<caf::atom("checksdue")>;
using reports_due_atom = caf::atom_constant<caf::atom("reportsdue")>;

double wall_now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// -- stand-in replica ---------------------------------------------------------

struct ReplicaState {
  ReplicaMetadata meta;
  caf::actor agent;
  HeadTraffic* traffic = nullptr;
  double metrics_interval_s = 10;
  uint64_t finished = 0;
};

caf::behavior stand_in_replica(caf::stateful_actor<ReplicaState>* self, ReplicaSpec spec,
                               std::string node_id, caf::actor agent, HeadTraffic* traffic) {
  auto& st = self->state;
  st.traffic = traffic;
  st.meta.replica_id = spec.replica_id;
  st.meta.node_id = std::move(node_id);
  st.meta.pid = static_cast<int32_t>(::getpid());
  st.meta.code_version = spec.code_version;
  st.meta.user_config = spec.user_config;
  st.meta.start_time = wall_now_s();
  st.agent = std::move(agent);
  st.metrics_interval_s = spec.metrics_interval_s > 0 ? spec.metrics_interval_s : 10;
  // Spread the reports over the interval, as replicas started at different
  // moments do.
  std::uniform_real_distribution<double> first(0, st.metrics_interval_s);
  std::minstd_rand rng{std::hash<std::string>{}(spec.replica_id)};
  self->delayed_send(self, seconds_as(first(rng)), tick_atom::value);
  return {
      [=](initialize_atom) { return self->state.meta; },
      [=](reconfigure_atom, const std::string& user_config, const BatchSettings& batch) {
        self->state.meta.user_config = user_config;
        self->state.meta.batch = batch;
        return self->state.meta;
      },
      [=](health_atom) {
        ++self->state.traffic->replica_checks;
        return caf::ok_atom::value;
      },
      [=](version_atom) { return self->state.meta; },
      [=](handle_atom, const HttpRequest&) {
        ++self->state.finished;
        HttpResponse r;
        r.body = "ok";
        return r;
      },
      [=](credit_atom, uint64_t, uint64_t) {},
      [=](cancel_atom, uint64_t, bool) {},
      [=](stop_atom, double) {
        self->quit();
        return caf::ok_atom::value;
      },
      [=](tick_atom) {
        auto& st = self->state;
        self->send(st.agent, metrics_atom::value, ReplicaLoad{st.meta.replica_id, 0.0, st.finished});
        self->delayed_send(self, seconds_as(st.metrics_interval_s), tick_atom::value);
      },
  };
}

// -- node agent -----------------------------------------------------------------

struct Hosted {
  ReplicaSpec spec;
  caf::actor handle;
  bool stopping = false;
};

struct AgentState {
  NodeInfo info;
  Endpoint controller_endpoint;
  caf::actor controller;
  caf::actor proxy;  // may be empty
  Observed* observed = nullptr;
  std::map<std::string, Hosted> hosted;
  std::map<caf::actor_addr, std::string> ids;
  bool registered = false;
  bool connecting = false;
  double backoff_s = 0;
  std::minstd_rand rng{std::random_device{}()};
  // Its replicas' load reports, carried by the next heartbeat as a real
  // agent does.
  node::ReplicaReports reports;
  // Its replicas' health checks, run as a real agent runs them.
  node::HealthChecks checks{
      [this](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); }};
  std::optional<double> checks_timer_at;
  bool reports_due = false;
  // Per watched replica: its threshold, and whether it was reported proven.
  std::map<std::string, std::pair<uint32_t, bool>> proof;
};

using agent_actor = caf::stateful_actor<AgentState>;

std::vector<HostedReplicaInfo> hosted_list(const AgentState& st) {
  std::vector<HostedReplicaInfo> out;
  for (const auto& [id, h] : st.hosted) {
    out.push_back({id, h.spec.app, h.spec.deployment, h.spec.code_version, h.spec.user_config,
                   h.stopping, caf::actor_cast<ReplicaActor>(h.handle)});
  }
  return out;
}

void note(agent_actor* self, std::string what) {
  std::lock_guard<std::mutex> lock(self->state.observed->mutex);
  self->state.observed->agent_notes[self->state.info.id] = std::move(what);
}

void schedule_reconnect(agent_actor* self) {
  auto& st = self->state;
  st.backoff_s = st.backoff_s == 0 ? 0.1 : std::min(st.backoff_s * 2, 1.0);
  std::uniform_real_distribution<double> jitter(0.8, 1.2);
  self->delayed_send(self, seconds_as(st.backoff_s * jitter(st.rng)), reconnect_atom::value);
}

void send_register(agent_actor* self) {
  auto controller = self->state.controller;
  ++self->state.observed->traffic.other;
  self->request(controller, std::chrono::seconds(10), register_atom::value, self->state.info,
                caf::actor_cast<caf::actor>(self), hosted_list(self->state), Credential{})
      .then(
          [=](uint64_t) {
            auto& st = self->state;
            if (st.controller != controller)
              return;
            st.registered = true;
            // As a real agent: its checks start over, the controller sends
            // the watches again.
            st.checks.clear();
            st.checks_timer_at.reset();
            st.backoff_s = 0;
            note(self, "registered");
            {
              std::lock_guard<std::mutex> lock(st.observed->mutex);
              st.observed->registered_at[st.info.id] = Clock::now();
            }
            if (st.proxy)
              self->send(st.proxy, subscribe_atom::value, controller);
          },
          [=](caf::error& err) {
            auto& st = self->state;
            note(self, "registration failed: " + self->home_system().render(err));
            if (st.controller != controller)
              return;
            // A handle from before a restart of the head (CAF's cache of
            // connections may hand it out once more): connect again.
            self->demonitor(st.controller);
            st.controller = nullptr;
            schedule_reconnect(self);
          });
}

void connect(agent_actor* self) {
  auto& st = self->state;
  if (st.connecting || st.controller)
    return;
  st.connecting = true;
  auto mm = self->home_system().middleman().actor_handle();
  self->request(mm, std::chrono::seconds(10), caf::connect_atom::value, st.controller_endpoint.host,
                st.controller_endpoint.port)
      .then(
          [=](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
            auto& st = self->state;
            st.connecting = false;
            if (!ptr) {
              schedule_reconnect(self);
              return;
            }
            st.controller = caf::actor_cast<caf::actor>(ptr);
            st.registered = false;
            note(self, "connected");
            self->monitor(st.controller);
            send_register(self);
          },
          [=](caf::error& err) {
            self->state.connecting = false;
            note(self, "connect failed: " + self->home_system().render(err));
            schedule_reconnect(self);
          });
}

double checks_now() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// As node/node_agent.cpp does: checks due go to the replicas, what changed
// goes to the controller in one message.
void send_health_changes(agent_actor* self) {
  auto& st = self->state;
  auto changes = st.checks.take_changes();
  if (changes.empty() || !st.registered || !st.controller)
    return;
  std::vector<HealthReport> reports;
  for (const auto& c : changes) {
    auto it = st.proof.find(c.replica_id);
    if (it != st.proof.end() && !it->second.second && c.passed >= it->second.first) {
      it->second.second = true;
      ++st.observed->traffic.proven;
    }
  }
  for (auto& c : changes)
    reports.push_back(
        {std::move(c.replica_id), c.watch, c.passed, c.failures, std::move(c.failure)});
  ++st.observed->traffic.health_reports;
  self->send(st.controller, health_atom::value, st.info.id, std::move(reports));
}

// The changes of 50 ms go together, as a real agent sends them.
void reports_soon(agent_actor* self) {
  auto& st = self->state;
  if (st.reports_due || !st.checks.has_changes())
    return;
  st.reports_due = true;
  self->delayed_send(self, std::chrono::milliseconds(50), reports_due_atom::value);
}

void schedule_checks(agent_actor* self) {
  auto& st = self->state;
  if (auto at = st.checks.arm(st.checks_timer_at))
    self->delayed_send(self, seconds_as(std::max(0.0, *at - checks_now())), checks_due_atom::value);
}

void run_checks(agent_actor* self) {
  auto& st = self->state;
  const double now = checks_now();
  st.checks.expire(now);
  for (auto& c : st.checks.due(now)) {
    auto it = st.hosted.find(c.replica_id);
    if (it == st.hosted.end()) {
      st.checks.forget(c.replica_id);
      continue;
    }
    auto id = c.replica_id;
    auto seq = c.seq;
    self->request(it->second.handle, std::chrono::seconds(600), health_atom::value)
        .then(
            [=](caf::ok_atom) {
              self->state.checks.result(id, seq, true, "");
              reports_soon(self);
              schedule_checks(self);
            },
            [=](caf::error& err) {
              self->state.checks.result(id, seq, false, self->home_system().render(err));
              reports_soon(self);
              schedule_checks(self);
            });
  }
  reports_soon(self);
  schedule_checks(self);
}

void forget(agent_actor* self, const std::string& id) {
  auto& st = self->state;
  auto it = st.hosted.find(id);
  if (it == st.hosted.end())
    return;
  st.ids.erase(it->second.handle.address());
  st.hosted.erase(it);
  std::lock_guard<std::mutex> lock(st.observed->mutex);
  st.observed->replicas.erase(id);
}

caf::behavior sim_agent(agent_actor* self, NodeInfo info, Endpoint controller, caf::actor proxy,
                        Observed* observed) {
  auto& st = self->state;
  st.info = std::move(info);
  st.controller_endpoint = std::move(controller);
  st.proxy = std::move(proxy);
  st.observed = observed;
  self->set_down_handler([=](const caf::down_msg& msg) {
    auto& st = self->state;
    if (st.controller && msg.source == st.controller.address()) {
      note(self, "lost the controller: " + self->home_system().render(msg.reason));
      st.controller = nullptr;
      st.registered = false;
      schedule_reconnect(self);
      return;
    }
    if (auto it = st.ids.find(msg.source); it != st.ids.end())
      forget(self, std::string(it->second));
  });
  self->send(self, reconnect_atom::value);
  self->send(self, tick_atom::value);
  return {
      [=](reconnect_atom) { connect(self); },
      [=](tick_atom) {
        auto& st = self->state;
        self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);
        auto loads = st.reports.take_loads();
        if (!st.registered || !st.controller)
          return;
        auto controller = st.controller;
        ++st.observed->traffic.heartbeats;
        st.observed->traffic.loads += loads.size();
        self->request(controller, std::chrono::seconds(2), heartbeat_atom::value, st.info.id,
                      std::move(loads), Credential{})
            .then([](caf::ok_atom) {},
                  [=](caf::error& err) {
                    auto& st = self->state;
                    if (st.controller == controller &&
                        from_caf_error(err).code() == errc::not_found) {
                      st.registered = false;
                      send_register(self);
                    }
                  });
      },
      [=](spawn_replica_atom, const ReplicaSpec& spec) -> ReplicaActor {
        auto& st = self->state;
        if (auto it = st.hosted.find(spec.replica_id); it != st.hosted.end())
          return caf::actor_cast<ReplicaActor>(it->second.handle);
        auto handle = self->spawn(stand_in_replica, spec, st.info.id,
                                  caf::actor_cast<caf::actor>(self), &st.observed->traffic);
        self->monitor(handle);
        st.ids[handle.address()] = spec.replica_id;
        st.hosted[spec.replica_id] = Hosted{spec, handle, false};
        {
          std::lock_guard<std::mutex> lock(st.observed->mutex);
          st.observed->replicas[spec.replica_id] = {handle, st.info.id};
          ++st.observed->spawned;
        }
        return caf::actor_cast<ReplicaActor>(handle);
      },
      [=](list_replicas_atom) { return hosted_list(self->state); },
      [=](stop_atom, const std::string& id, double timeout_s) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        auto it = st.hosted.find(id);
        if (it == st.hosted.end())
          return caf::ok_atom::value;
        it->second.stopping = true;
        auto rp = self->make_response_promise<caf::ok_atom>();
        self->request(it->second.handle, seconds_as(timeout_s + 1), stop_atom::value, timeout_s)
            .then([=](caf::ok_atom) mutable { rp.deliver(caf::ok_atom::value); },
                  [=](caf::error&) mutable { rp.deliver(caf::ok_atom::value); });
        return rp;
      },
      [=](kill_replica_atom, const std::string& id) {
        auto& st = self->state;
        if (auto it = st.hosted.find(id); it != st.hosted.end())
          self->send_exit(it->second.handle, caf::exit_reason::kill);
        return caf::ok_atom::value;
      },
      [=](stop_node_atom) { self->quit(); },
      [=](metrics_atom, ReplicaLoad& load) { self->state.reports.add_load(std::move(load)); },
      [=](health_atom, const std::vector<HealthWatch>& watches) {
        auto& st = self->state;
        for (const auto& w : watches) {
          if (!st.hosted.count(w.replica_id))
            continue;
          const auto& s = w.settings;
          st.checks.watch(w.replica_id, w.watch, {s.period_s, s.timeout_s, s.threshold, s.jitter},
                          checks_now());
          auto [it, fresh] = st.proof.try_emplace(w.replica_id, s.threshold, false);
          if (!fresh && it->second.second)
            --st.observed->traffic.proven;  // watched anew: counted again when proven
          it->second = {s.threshold, false};
        }
        run_checks(self);
      },
      [=](reports_due_atom) {
        self->state.reports_due = false;
        send_health_changes(self);
      },
      [=](checks_due_atom) {
        self->state.checks_timer_at.reset();
        run_checks(self);
      },
  };
}

// -- proxy ----------------------------------------------------------------------

struct ProxyState {
  size_t index = 0;
  std::string node_id;
  Observed* observed = nullptr;
  std::vector<char> buffer;
  caf::actor controller;  // the last one it subscribed to
  bool ticking = false;
};

using proxy_actor = caf::stateful_actor<ProxyState>;

void apply(ProxyView& view, const RoutingSnapshot& snap) {
  using Key = std::pair<std::string, std::string>;
  std::map<Key, std::vector<std::string>> next;
  if (snap.full) {
    for (const auto& [app, dep] : snap.withheld) {
      Key key{app, dep};
      if (auto it = view.deployments.find(key); it != view.deployments.end())
        next[key] = std::move(it->second);
    }
  } else {
    next = std::move(view.deployments);
    for (const auto& [app, dep] : snap.removed)
      next.erase(Key{app, dep});
  }
  for (const auto& d : snap.deployments) {
    auto& ids = next[Key{d.app, d.deployment}];
    if (!d.partial)
      ids.clear();
    for (const auto& id : d.removed_replicas) {
      auto it = std::lower_bound(ids.begin(), ids.end(), id);
      if (it != ids.end() && *it == id)
        ids.erase(it);
    }
    for (const auto& r : d.replicas) {
      auto it = std::lower_bound(ids.begin(), ids.end(), r.replica_id);
      if (it == ids.end() || *it != r.replica_id)
        ids.insert(it, r.replica_id);
    }
  }
  view.deployments = std::move(next);
  view.total = 0;
  for (const auto& [key, ids] : view.deployments)
    view.total += ids.size();
  if (view.epoch != snap.epoch)
    view.epoch_at = Clock::now();
  view.epoch = snap.epoch;
  view.seq = snap.seq;
}

bool lists(const ProxyView& view, const std::string& replica_id) {
  for (const auto& [key, ids] : view.deployments) {
    if (std::binary_search(ids.begin(), ids.end(), replica_id))
      return true;
  }
  return false;
}

caf::behavior sim_proxy(proxy_actor* self, size_t index, std::string node_id, Observed* observed) {
  self->state.index = index;
  self->state.node_id = std::move(node_id);
  self->state.observed = observed;
  auto refuse = [](auto&&...) -> caf::result<HttpResponse> {
    return to_caf_error(Status(errc::unavailable, "a simulated proxy serves no requests"));
  };
  return {
      [=](subscribe_atom, const caf::actor& controller) {
        auto& st = self->state;
        st.controller = controller;
        if (!st.ticking) {
          st.ticking = true;
          self->send(self, tick_atom::value);
        }
        uint64_t epoch = 0;
        uint64_t seq = 0;
        {
          std::lock_guard<std::mutex> lock(st.observed->mutex);
          epoch = st.observed->proxies[st.index].epoch;
          seq = st.observed->proxies[st.index].seq;
        }
        ++st.observed->traffic.other;
        self->send(controller, subscribe_atom::value, caf::actor_cast<ProxyActor>(self), epoch, seq,
                   st.node_id);
      },
      [=](snapshot_atom, RoutingSnapshot& snap) {
        auto& st = self->state;
        st.buffer.clear();
        caf::binary_serializer sink{self->home_system(), st.buffer};
        auto err = sink(snap);
        static_cast<void>(err);
        auto now = Clock::now();
        std::lock_guard<std::mutex> lock(st.observed->mutex);
        auto& view = st.observed->proxies[st.index];
        view.bytes += st.buffer.size();
        ++view.pushes;
        if (snap.full)
          ++view.full_pushes;
        apply(view, snap);
        auto& o = *st.observed;
        if (!o.watched.empty() && o.watched_ms[st.index] < 0 && !lists(view, o.watched)) {
          o.watched_ms[st.index] =
              std::chrono::duration<double, std::milli>(now - o.watched_since).count();
        }
        return caf::ok_atom::value;
      },
      [=](health_atom) {
        ++self->state.observed->traffic.health_answers;
        return caf::ok_atom::value;
      },
      [=](tick_atom) {
        // As a real proxy does every second: every deployment it routes,
        // with its requests queued and in flight (none here), in one message.
        auto& st = self->state;
        self->delayed_send(self, std::chrono::seconds(1), tick_atom::value);
        std::vector<DeploymentLoad> loads;
        {
          std::lock_guard<std::mutex> lock(st.observed->mutex);
          for (const auto& [key, ids] : st.observed->proxies[st.index].deployments)
            loads.push_back({key.first, key.second, 0.0});
        }
        if (!st.controller || loads.empty())
          return;
        ++st.observed->traffic.proxy_loads;
        self->send(st.controller, metrics_atom::value, st.node_id + "/proxy", std::move(loads));
      },
      [=](call_atom, const std::string& a, const std::string& b, const HttpRequest& r, double t) {
        return refuse(a, b, r, t);
      },
      [=](call_atom, const std::string& a, const std::string& b, const HttpRequest& r, double t,
          bool) { return refuse(a, b, r, t); },
      [=](cancel_atom, uint64_t) {},
  };
}

}  // namespace

SimCluster::SimCluster(caf::actor_system& sys, SimOptions options, Observed& observed)
    : sys_(sys), options_(std::move(options)), observed_(observed) {
  {
    std::lock_guard<std::mutex> lock(observed_.mutex);
    observed_.proxies.assign(options_.proxies, ProxyView{});
  }
  for (size_t i = 0; i < options_.nodes; ++i) {
    caf::actor proxy;
    if (i < options_.proxies)
      proxy = sys_.spawn(sim_proxy, i, node_id(i), &observed_);
    proxies_.push_back(proxy);
    NodeInfo info;
    info.id = node_id(i);
    info.host = "127.0.0.1";
    info.http_port = static_cast<uint16_t>(20000 + i);  // never connected to
    info.resources = options_.resources;
    info.pid = static_cast<int32_t>(::getpid());
    agents_.push_back(sys_.spawn(sim_agent, info, options_.controller, proxy, &observed_));
  }
}

std::string SimCluster::node_id(size_t index) const {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "sim-%04zu", index + 1);
  return buf;
}

void SimCluster::kill_node(size_t index) {
  // The host died: its agent, its proxy and every replica on it.
  std::vector<caf::actor> replicas;
  {
    std::lock_guard<std::mutex> lock(observed_.mutex);
    for (const auto& [id, where] : observed_.replicas) {
      if (where.second == node_id(index))
        replicas.push_back(where.first);
    }
  }
  for (auto& r : replicas)
    caf::anon_send_exit(r, caf::exit_reason::kill);
  caf::anon_send_exit(agents_.at(index), caf::exit_reason::kill);
  if (proxies_.at(index))
    caf::anon_send_exit(proxies_[index], caf::exit_reason::kill);
}

bool SimCluster::kill_replica(const std::string& replica_id) {
  caf::actor handle;
  {
    std::lock_guard<std::mutex> lock(observed_.mutex);
    auto it = observed_.replicas.find(replica_id);
    if (it == observed_.replicas.end())
      return false;
    handle = it->second.first;
  }
  caf::anon_send_exit(handle, caf::exit_reason::kill);
  return true;
}

void SimCluster::stop() {
  std::vector<caf::actor> replicas;
  {
    std::lock_guard<std::mutex> lock(observed_.mutex);
    for (const auto& [id, where] : observed_.replicas)
      replicas.push_back(where.first);
  }
  for (auto& r : replicas)
    caf::anon_send_exit(r, caf::exit_reason::kill);
  for (auto& a : agents_)
    caf::anon_send_exit(a, caf::exit_reason::kill);
  for (auto& p : proxies_) {
    if (p)
      caf::anon_send_exit(p, caf::exit_reason::kill);
  }
  agents_.clear();
  proxies_.clear();
}

}  // namespace troupe::sim
