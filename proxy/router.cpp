#include "proxy/router.hpp"

#include <algorithm>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include <caf/actor_cast.hpp>

namespace troupe::proxy {

// --- route table -------------------------------------------------------------

RouteTable::RouteTable(std::vector<Route> routes) : by_prefix_(std::move(routes)) {
  for (auto& r : by_prefix_) {
    r.key = deployment_key(r.app, r.deployment);
    for (auto& t : r.split) {
      auto target = std::make_shared<Route>(*t.route);
      target->key = deployment_key(target->app, target->deployment);
      target->split.clear();
      t.route = std::move(target);
    }
    for (auto& t : r.shadow) {
      auto target = std::make_shared<Route>(*t.route);
      target->key = deployment_key(target->app, target->deployment);
      target->split.clear();
      target->shadow.clear();
      t.route = std::move(target);
    }
  }
  std::sort(by_prefix_.begin(), by_prefix_.end(),
            [](const Route& a, const Route& b) { return a.prefix < b.prefix; });
  for (const auto& r : by_prefix_)
    by_length_.push_back(&r);
  std::stable_sort(by_length_.begin(), by_length_.end(), [](const Route* a, const Route* b) {
    return a->prefix.size() > b->prefix.size();
  });
}

RouteTable::Match RouteTable::match(std::string_view path) const {
  static constexpr std::string_view kRoot = "/";
  for (const Route* r : by_length_) {
    std::string_view prefix = r->prefix;
    if (prefix.empty() || prefix == kRoot)
      return {r, path.empty() ? kRoot : path};
    if (prefix.back() == '/') {
      // "/api/" matches "/api/..." and keeps the slash in the rest.
      if (path.substr(0, prefix.size()) == prefix)
        return {r, path.substr(prefix.size() - 1)};
      if (path == prefix.substr(0, prefix.size() - 1))
        return {r, kRoot};
      continue;
    }
    if (path.size() < prefix.size() || path.substr(0, prefix.size()) != prefix)
      continue;
    if (path.size() == prefix.size())
      return {r, kRoot};
    if (path[prefix.size()] == '/')
      return {r, path.substr(prefix.size())};
  }
  return {};
}

const Route* RouteTable::find_app(std::string_view app) const {
  for (const auto& r : by_prefix_) {
    if (r.app == app)
      return &r;
  }
  return nullptr;
}

// --- traffic split -------------------------------------------------------------

const Route& pick_target(const Route& route, double point) {
  if (route.split.empty())
    return route;
  for (const auto& t : route.split) {
    if (point < t.upto)
      return *t.route;
  }
  return *route.split.back().route;  // point >= 1: cannot come from key_point or next()
}

double key_point(std::string_view key) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : key) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  // FNV's low bits mix poorly for short keys: finish with a multiply-xorshift
  // (splitmix64's) so that the top 53 bits are spread over [0, 1).
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  h ^= h >> 31;
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

// --- shadow traffic ------------------------------------------------------------

std::vector<const Route*> pick_shadows(const Route& route, SplitRandom& random) {
  std::vector<const Route*> out;
  for (const auto& t : route.shadow) {
    // next() is in [0, 1): probability 0 never copies, 1 always does.
    if (random.next() < t.probability)
      out.push_back(t.route.get());
  }
  return out;
}

SplitRandom::SplitRandom(uint64_t seed) : state_(seed ? seed : 0x9e3779b97f4a7c15ULL) {}

double SplitRandom::next() {
  state_ ^= state_ >> 12;
  state_ ^= state_ << 25;
  state_ ^= state_ >> 27;
  return static_cast<double>((state_ * 2685821657736338717ULL) >> 11) * 0x1.0p-53;
}

SplitRandom& SplitRandom::thread_local_instance() {
  thread_local SplitRandom random([] {
    std::random_device rd;
    return (uint64_t{rd()} << 32) | rd();
  }());
  return random;
}

std::string deployment_key(std::string_view app, std::string_view deployment) {
  std::string key;
  key.reserve(app.size() + deployment.size() + 1);
  key.append(app);
  key.push_back('\0');
  key.append(deployment);
  return key;
}

// --- router ------------------------------------------------------------------

Router::Router(RouterOptions options) : options_(std::move(options)), rng_(options_.seed | 1) {}

uint64_t Router::next_random() {
  // xorshift64*: cheap, and deterministic for a given seed (tests).
  rng_ ^= rng_ >> 12;
  rng_ ^= rng_ << 25;
  rng_ ^= rng_ >> 27;
  return rng_ * 2685821657736338717ULL;
}

Router::Deployment* Router::find(const std::string& key) {
  auto it = deployments_.find(key);
  return it == deployments_.end() ? nullptr : it->second.get();
}

SlotPtr Router::choose(Deployment& d, const std::vector<std::string>& exclude) {
  auto excluded = [&](const ReplicaSlot& s) {
    return !exclude.empty() &&
           std::find(exclude.begin(), exclude.end(), s.replica_id) != exclude.end();
  };
  // Power of two choices within one group (local or remote replicas), without
  // allocating: count the candidates, then pick the k-th.
  auto pick = [&](bool local, bool allow_excluded) -> SlotPtr {
    auto eligible = [&](const ReplicaSlot& s) {
      return s.local == local && has_room(s) && (allow_excluded || !excluded(s));
    };
    size_t n = 0;
    for (const auto& s : d.replicas)
      n += eligible(*s) ? 1 : 0;
    if (n == 0)
      return nullptr;
    auto nth = [&](size_t k) -> const SlotPtr& {
      for (const auto& s : d.replicas) {
        if (eligible(*s) && k-- == 0)
          return s;
      }
      return d.replicas.front();  // unreachable: k < n
    };
    if (n == 1)
      return nth(0);
    size_t i = next_random() % n;
    size_t j = next_random() % (n - 1);
    if (j >= i)
      ++j;
    const SlotPtr& a = nth(i);
    const SlotPtr& b = nth(j);
    return b->in_flight < a->in_flight ? b : a;
  };
  // The best local and the best remote candidate; the less loaded wins, the
  // local one when equally loaded. Replicas this request already tried are
  // used only as a last resort.
  for (bool allow_excluded : {false, true}) {
    if (allow_excluded && exclude.empty())
      break;
    auto local = pick(true, allow_excluded);
    auto remote = pick(false, allow_excluded);
    if (local && (!remote || local->in_flight <= remote->in_flight))
      return local;
    if (remote)
      return remote;
  }
  return nullptr;
}

namespace {

// How many models choose_for_model() notes on a replica that has reported its
// list (answers and snapshots replace the list, so only the notes made since
// the last one count), and on one that never did.
constexpr size_t kMaxNotedModels = 256;
constexpr size_t kMaxNotedUnreported = 4;

}  // namespace

SlotPtr Router::choose_for_model(Deployment& d, const std::vector<std::string>& exclude,
                                 const std::string& model_id) {
  if (model_id.empty())
    return choose(d, exclude);
  auto holds = [&](const ReplicaSlot& s) {
    return std::find(s.model_ids.begin(), s.model_ids.end(), model_id) != s.model_ids.end();
  };
  auto eligible = [&](const ReplicaSlot& s) {
    return has_room(s) && std::find(exclude.begin(), exclude.end(), s.replica_id) == exclude.end();
  };
  // 1. A replica that holds the model: the least loaded, local when equal.
  SlotPtr best;
  for (const auto& s : d.replicas) {
    if (!eligible(*s) || !holds(*s))
      continue;
    if (!best || s->in_flight < best->in_flight ||
        (s->in_flight == best->in_flight && s->local && !best->local)) {
      best = s;
    }
  }
  if (best)
    return best;
  // 2. None with room holds it: a replica that will load it. Rank by the
  // models only it holds (evicting one of those makes the next request for
  // it load again), then by how many it holds.
  std::unordered_map<std::string, uint32_t> holders;
  for (const auto& s : d.replicas) {
    if (s->dead)
      continue;
    for (const auto& m : s->model_ids)
      ++holders[m];
  }
  auto rank = [&](const ReplicaSlot& s) {
    size_t sole = 0;
    for (const auto& m : s.model_ids)
      sole += holders[m] == 1 ? 1 : 0;
    return std::make_pair(sole, s.model_ids.size());
  };
  std::vector<const SlotPtr*> group;
  std::pair<size_t, size_t> lowest{SIZE_MAX, SIZE_MAX};
  for (const auto& s : d.replicas) {
    if (!eligible(*s))
      continue;
    auto r = rank(*s);
    if (r < lowest) {
      lowest = r;
      group.clear();
    }
    if (r == lowest)
      group.push_back(&s);
  }
  // Within the group, rendezvous hashing of (model, replica) rather than two
  // random choices: proxies that see the same lists place a new model on the
  // same replica (one load), where random choices would load it on two and
  // evict a model from each. Every member has room.
  SlotPtr chosen;
  if (!group.empty()) {
    double highest = -1;
    for (const SlotPtr* s : group) {
      std::string key = model_id;
      key.push_back('\0');
      key += (*s)->replica_id;
      double point = key_point(key);
      if (point > highest) {
        highest = point;
        chosen = *s;
      }
    }
  } else {
    chosen = choose(d, exclude);  // only replicas this request tried have room
  }
  // Noted until the replica's next list replaces it. Bounded: a deployment
  // without a ModelCache never reports a list, and requests naming ever new
  // ids must not grow it (nor the scans above).
  const size_t most = chosen && chosen->model_ids_seq > 0 ? kMaxNotedModels : kMaxNotedUnreported;
  if (chosen && !holds(*chosen) && chosen->model_ids.size() < most)
    chosen->model_ids.push_back(model_id);
  return chosen;
}

void Router::learn_models(const SlotPtr& slot, uint64_t seq, std::vector<std::string> model_ids) {
  if (!slot)
    return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (seq <= slot->model_ids_seq)
    return;
  slot->model_ids_seq = seq;
  slot->model_ids = std::move(model_ids);
}

void Router::drain(Deployment& d, std::vector<std::function<void()>>& ready) {
  while (!d.queue.empty()) {
    auto slot = choose_for_model(d, d.queue.front().exclude, d.queue.front().model_id);
    if (!slot)
      return;
    ++slot->in_flight;
    ready.push_back([w = std::move(d.queue.front().waiter), slot]() mutable { w(slot); });
    d.queue.pop_front();
  }
}

void Router::drop(Deployment& d, std::vector<std::function<void()>>& ready,
                  std::vector<SlotPtr>& left) {
  for (auto& q : d.queue)
    ready.push_back([w = std::move(q.waiter)]() mutable { w(nullptr); });
  d.queue.clear();
  for (auto& s : d.replicas) {
    s->owner = nullptr;
    s->dead = true;
    if (s->handle)
      by_address_.erase(s->handle.address());
    left.push_back(s);
  }
  d.replicas.clear();
}

namespace {

// Two handles of the same actor compare equal even when one is a dead proxy
// of an old connection and the other the proxy of a new one: compare the
// objects.
bool same_object(const ReplicaActor& a, const ReplicaActor& b) {
  // actor_cast of an empty handle calls through a null pointer in CAF 0.17.
  if (!a || !b)
    return !a && !b;
  return caf::actor_cast<caf::abstract_actor*>(a) == caf::actor_cast<caf::abstract_actor*>(b);
}

}  // namespace

void Router::set_replicas(Deployment& d, const std::vector<ReplicaEndpoint>& endpoints,
                          std::vector<ReplicaActor>& added, std::vector<SlotPtr>& left) {
  std::unordered_map<std::string, SlotPtr> current;
  current.reserve(d.replicas.size());
  for (auto& s : d.replicas)
    current.emplace(s->replica_id, std::move(s));
  std::vector<SlotPtr> next;
  next.reserve(endpoints.size());
  for (const auto& ep : endpoints) {
    SlotPtr slot;
    if (auto it = current.find(ep.replica_id); it != current.end()) {
      slot = std::move(it->second);
      current.erase(it);
    }
    next.push_back(endpoint_slot(d, std::move(slot), ep, added));
  }
  for (auto& [id, s] : current)
    leave(std::move(s), left);
  d.replicas = std::move(next);
}

void Router::patch_replicas(Deployment& d, const std::vector<ReplicaEndpoint>& endpoints,
                            const std::vector<std::string>& removed,
                            std::vector<ReplicaActor>& added, std::vector<SlotPtr>& left) {
  auto by_id = [](const SlotPtr& s, const std::string& id) { return s->replica_id < id; };
  // The set is sorted by replica id (the controller lists it so, and
  // set_replicas keeps its order).
  for (const auto& id : removed) {
    auto it = std::lower_bound(d.replicas.begin(), d.replicas.end(), id, by_id);
    if (it != d.replicas.end() && (*it)->replica_id == id) {
      leave(std::move(*it), left);
      d.replicas.erase(it);
    }
  }
  // Any snapshot that lists a replica makes it live again after a request
  // found no route to it; a delta of its deployment stands for listing
  // every replica it leaves in place.
  for (auto& s : d.replicas) {
    if (s->dead && s->no_route && !s->unreachable) {
      s->dead = false;
      s->no_route = false;
    }
  }
  for (const auto& ep : endpoints) {
    auto it = std::lower_bound(d.replicas.begin(), d.replicas.end(), ep.replica_id, by_id);
    if (it != d.replicas.end() && (*it)->replica_id == ep.replica_id)
      *it = endpoint_slot(d, std::move(*it), ep, added);
    else
      d.replicas.insert(it, endpoint_slot(d, nullptr, ep, added));
  }
}

SlotPtr Router::endpoint_slot(Deployment& d, SlotPtr slot, const ReplicaEndpoint& ep,
                              std::vector<ReplicaActor>& added) {
  if (slot) {
    if (same_object(slot->handle, ep.handle)) {
      if (slot->dead && slot->no_route && !slot->unreachable) {
        slot->dead = false;
        slot->no_route = false;
      }
    } else {
      if (slot->handle)
        by_address_.erase(slot->handle.address());
      slot->handle = ep.handle;
      // A new handle after the connection to its node dropped: the old
      // one died with the connection, the replica did not (it is still in
      // the controller's set); its own monitor tells if it is gone.
      if (slot->unreachable || slot->no_route) {
        slot->dead = false;
        slot->unreachable = false;
        slot->no_route = false;
      }
      if (ep.handle) {
        by_address_[ep.handle.address()] = slot;
        added.push_back(ep.handle);
      }
    }
  } else {
    slot = std::make_shared<ReplicaSlot>();
    slot->replica_id = ep.replica_id;
    slot->node_id = ep.node_id;
    slot->handle = ep.handle;
    slot->local = !options_.local_node.empty() && ep.node_id == options_.local_node;
    if (slot->local && options_.channel_of)
      slot->channel = options_.channel_of(ep.replica_id);
    if (slot->local && options_.local_replica_of)
      slot->local_replica = options_.local_replica_of(ep.replica_id);
    if (ep.handle) {
      by_address_[ep.handle.address()] = slot;
      added.push_back(ep.handle);
    }
  }
  slot->max_ongoing = std::max<uint32_t>(1, ep.max_ongoing_requests);
  // The controller's list, unless an answer of the replica told a newer one.
  if (ep.model_ids_seq > slot->model_ids_seq) {
    slot->model_ids_seq = ep.model_ids_seq;
    slot->model_ids = ep.model_ids;
  }
  slot->owner = &d;
  return slot;
}

void Router::leave(SlotPtr s, std::vector<SlotPtr>& left) {
  s->owner = nullptr;
  s->dead = true;
  if (s->handle)
    by_address_.erase(s->handle.address());
  left.push_back(std::move(s));
}

Router::Applied Router::apply(const RoutingSnapshot& snap) {
  Applied out;
  std::vector<SlotPtr> left;  // slots that left their deployment's set
  std::lock_guard<std::mutex> lock(mutex_);
  auto update = [&](const DeploymentEndpoints& e) {
    auto key = deployment_key(e.app, e.deployment);
    auto& slot = deployments_[key];
    if (!slot) {
      slot = std::make_unique<Deployment>();
      slot->app = e.app;
      slot->name = e.deployment;
    }
    slot->max_queued = e.max_queued_requests;
    if (e.partial)
      patch_replicas(*slot, e.replicas, e.removed_replicas, out.added, left);
    else
      set_replicas(*slot, e.replicas, out.added, left);
    drain(*slot, out.ready);
  };
  auto erase = [&](const std::string& key) {
    auto it = deployments_.find(key);
    if (it == deployments_.end())
      return;
    drop(*it->second, out.ready, left);
    deployments_.erase(it);
  };
  if (snap.full) {
    std::unordered_set<std::string> keep;
    for (const auto& [app, dep] : snap.withheld)
      keep.insert(deployment_key(app, dep));
    for (const auto& e : snap.deployments)
      keep.insert(deployment_key(e.app, e.deployment));
    std::vector<std::string> gone;
    for (const auto& [key, d] : deployments_) {
      if (keep.count(key) == 0)
        gone.push_back(key);
    }
    for (const auto& key : gone)
      erase(key);
    for (const auto& e : snap.deployments)
      update(e);
  } else {
    for (const auto& e : snap.deployments)
      update(e);
    for (const auto& [app, dep] : snap.removed)
      erase(deployment_key(app, dep));
  }
  if (snap.full || snap.routes_changed) {
    std::vector<Route> routes;
    routes.reserve(snap.routes.size());
    for (const auto& r : snap.routes) {
      Route route{r.prefix, r.app, r.ingress, {}, {}, r.traffic_key_header};
      route.open_inference = r.open_inference;
      // Cumulative weights, zero weights left out; the last target ends at
      // exactly 1 so that every point in [0, 1) has one.
      double upto = 0;
      for (const auto& [deployment, weight] : r.traffic) {
        if (!(weight > 0))
          continue;
        upto += weight;
        route.split.push_back(
            {upto, std::make_shared<Route>(Route{r.prefix, r.app, deployment, {}, {}, {}})});
      }
      if (!route.split.empty())
        route.split.back().upto = 1.0;
      for (const auto& [deployment, probability] : r.shadow) {
        route.shadow.push_back(
            {probability, std::make_shared<Route>(Route{r.prefix, r.app, deployment, {}, {}, {}})});
      }
      routes.push_back(std::move(route));
    }
    routes_ = std::make_shared<RouteTable>(std::move(routes));
  }
  if (!snap.dead_nodes.empty()) {
    std::unordered_set<std::string> dead(snap.dead_nodes.begin(), snap.dead_nodes.end());
    auto lose = [&](const SlotPtr& s) {
      if (dead.count(s->node_id) == 0)
        return;
      s->dead = true;
      out.lost.push_back(s);
    };
    for (const auto& s : left)
      lose(s);
    for (auto& [key, d] : deployments_) {
      for (const auto& s : d->replicas)
        lose(s);
    }
  }
  has_routes_ = true;
  epoch_ = snap.epoch;
  seq_ = snap.seq;
  return out;
}

bool Router::has_routes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return has_routes_;
}

std::shared_ptr<const RouteTable> Router::routes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return routes_;
}

uint64_t Router::epoch() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return epoch_;
}

uint64_t Router::seq() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return seq_;
}

bool Router::assign_now(Deployment& d, const std::vector<std::string>& exclude,
                        const std::string& model_id, Admission& out) {
  if (!d.queue.empty())
    return false;
  auto slot = choose_for_model(d, exclude, model_id);
  if (!slot)
    return false;
  ++slot->in_flight;
  out.kind = Admit::assigned;
  out.slot = std::move(slot);
  return true;
}

Router::Admission Router::admit(const std::string& key, const std::vector<std::string>& exclude,
                                Waiter waiter, const std::string& model_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  Admission out;
  auto* d = find(key);
  if (!d) {
    out.kind = Admit::no_deployment;
    return out;
  }
  // A request never overtakes the queue: if others wait, it waits behind them.
  if (assign_now(*d, exclude, model_id, out))
    return out;
  size_t cap =
      d->max_queued < 0 ? options_.unlimited_queue_cap : static_cast<size_t>(d->max_queued);
  if (d->queue.size() >= cap) {
    out.kind = Admit::queue_full;
    return out;
  }
  out.kind = Admit::queued;
  out.ticket = next_ticket_++;
  d->queue.push_back({out.ticket, exclude, std::move(waiter), model_id});
  out.queued = d->queue.size();
  out.no_replicas = std::none_of(d->replicas.begin(), d->replicas.end(),
                                 [](const SlotPtr& s) { return !s->dead; });
  return out;
}

Router::Admission Router::admit_if_free(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  Admission out;
  auto* d = find(key);
  if (!d) {
    out.kind = Admit::no_deployment;
    return out;
  }
  if (assign_now(*d, {}, std::string(), out))
    return out;
  out.kind = Admit::queue_full;
  out.queued = d->queue.size();
  return out;
}

std::vector<std::function<void()>> Router::release(const SlotPtr& slot, Outcome outcome) {
  std::vector<std::function<void()>> ready;
  if (!slot)
    return ready;
  std::lock_guard<std::mutex> lock(mutex_);
  if (slot->in_flight > 0)
    --slot->in_flight;
  if (outcome == Outcome::died)
    slot->dead = true;
  if (outcome == Outcome::unreachable) {
    slot->dead = true;
    slot->no_route = true;
  }
  if (slot->owner)
    drain(*static_cast<Deployment*>(slot->owner), ready);
  return ready;
}

void Router::mark_dead(const caf::actor_addr& replica, bool link_lost) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_address_.find(replica);
  if (it == by_address_.end())
    return;
  // Also when a request already found it dead: requests to a proxy of a
  // dropped connection fail before its down message arrives.
  auto& slot = *it->second;
  slot.unreachable = slot.unreachable || link_lost;
  slot.dead = true;
}

void Router::mark_node_lost(const caf::node_id& node) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [addr, slot] : by_address_) {
    if (addr.node() == node) {
      slot->unreachable = true;
      slot->dead = true;
    }
  }
}

bool Router::cancel(const std::string& key, uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto* d = find(key);
  if (!d)
    return false;
  auto it = std::find_if(d->queue.begin(), d->queue.end(),
                         [&](const Queued& q) { return q.ticket == ticket; });
  if (it == d->queue.end())
    return false;
  d->queue.erase(it);
  return true;
}

std::vector<Router::DeploymentView> Router::deployments() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<DeploymentView> out;
  for (const auto& [key, d] : deployments_) {
    DeploymentView v;
    v.app = d->app;
    v.deployment = d->name;
    v.max_queued = d->max_queued;
    v.queued = d->queue.size();
    for (const auto& s : d->replicas) {
      v.replicas.push_back(
          {s->replica_id, s->node_id, s->max_ongoing, s->in_flight, s->local, s->model_ids});
    }
    out.push_back(std::move(v));
  }
  std::sort(out.begin(), out.end(), [](const DeploymentView& a, const DeploymentView& b) {
    return std::tie(a.app, a.deployment) < std::tie(b.app, b.deployment);
  });
  return out;
}

std::vector<DeploymentLoad> Router::loads() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<DeploymentLoad> out;
  out.reserve(deployments_.size());
  for (const auto& [key, d] : deployments_) {
    double load = static_cast<double>(d->queue.size());
    for (const auto& s : d->replicas)
      load += s->in_flight;
    out.push_back({d->app, d->name, load});
  }
  std::sort(out.begin(), out.end(), [](const DeploymentLoad& a, const DeploymentLoad& b) {
    return std::tie(a.app, a.deployment) < std::tie(b.app, b.deployment);
  });
  return out;
}

std::vector<ReplicaActor> Router::handles() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<ReplicaActor> out;
  for (const auto& [addr, slot] : by_address_) {
    if (slot->handle)
      out.push_back(slot->handle);
  }
  return out;
}

SlotPtr Router::find_replica(const std::string& replica_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [addr, slot] : by_address_) {
    if (slot->replica_id == replica_id && !slot->dead && slot->owner)
      return slot;
  }
  return nullptr;
}

bool Router::has_replica(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = deployments_.find(key);
  if (it == deployments_.end())
    return false;
  const auto& replicas = it->second->replicas;
  return std::any_of(replicas.begin(), replicas.end(), [](const SlotPtr& s) { return !s->dead; });
}

void Router::clear() {
  std::unordered_map<std::string, std::unique_ptr<Deployment>> gone;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    gone.swap(deployments_);
    by_address_.clear();
    for (auto& [key, d] : gone) {
      for (auto& s : d->replicas)
        s->owner = nullptr;
    }
  }
  // Waiters are destroyed here, outside the lock, never called.
}

}  // namespace troupe::proxy
