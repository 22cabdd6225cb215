// Direct connections between workers. Every worker publishes a peer actor on
// its peer port (node/peer_listener.hpp) and the controller names, in each
// snapshot, the peer listeners of the nodes hosting the replicas it lists.
// The proxy actor connects to each of them once: CAF then routes every
// message to that node's actors over the direct connection (its routing
// table prefers a direct route to the indirect one through the head), so
// worker-to-worker requests neither load the head's multiplexer nor stop
// when the head does. A connection that fails or drops is retried with a
// backoff; meanwhile that node is reached through the head, as before.
#include <algorithm>
#include <chrono>

#include "proxy/core.hpp"
#include "runtime/security/tls.hpp"
#include "runtime/tcp_probe.hpp"

namespace troupe::proxy {

namespace {

constexpr auto kConnectTimeout = std::chrono::seconds(10);
constexpr std::chrono::milliseconds kProbeTimeout{2000};
constexpr auto kHelloTimeout = std::chrono::seconds(5);

std::string where(const PeerEndpoint& ep) {
  return ep.host + ":" + std::to_string(ep.port);
}

void failed(ProxyImpl::pointer self, const core_ptr& core, const std::string& id,
            const PeerEndpoint& endpoint, const std::string& why) {
  auto it = core->peers.find(id);
  if (it == core->peers.end() || !(it->second.endpoint == endpoint))
    return;  // forgotten, or the node moved and a new attempt runs
  auto& link = it->second;
  link.connecting = false;
  ++link.failures;
  uint32_t backoff = reconnect_backoff_s(link.failures);
  // The first failure, then one in ten: a peer that stays away is reached
  // through the head meanwhile.
  if (link.failures == 1 || link.failures % 10 == 0) {
    core->log->warn(
        "no direct connection to node {} at {} ({}); reaching it through the head, retrying in "
        "{} s",
        id, where(link.endpoint), why, backoff);
  }
  self->delayed_send(self, std::chrono::seconds(backoff), reconnect_atom::value, id);
}

void caf_connect(ProxyImpl::pointer self, const core_ptr& core, const std::string& id,
                 const PeerEndpoint& endpoint);

// Where the peer's data port is (peer_client.cpp): the io threads send its
// replicas' requests there from now on. A peer without one (TLS, or an older
// node that does not know the question) is reached over CAF.
void ask_data_port(ProxyImpl::pointer self, const core_ptr& core, const std::string& id,
                   const PeerEndpoint& endpoint, const PeerActor& peer) {
  self->request(peer, kHelloTimeout, data_port_atom::value)
      .then(
          [=](uint16_t port, const std::string& token) {
            auto it = core->peers.find(id);
            if (it == core->peers.end() || !(it->second.endpoint == endpoint))
              return;
            if (port == 0) {
              core->set_data_port(id, std::nullopt);
              return;
            }
            core->set_data_port(id, Proxy::Core::DataPortEndpoint{endpoint.host, port, token});
          },
          [=](caf::error& err) {
            core->log->info("node {} has no data port ({}); its replicas are reached over CAF", id,
                            self->home_system().render(err));
            core->set_data_port(id, std::nullopt);
          });
}

void connect(ProxyImpl::pointer self, const core_ptr& core, const std::string& id) {
  auto& link = core->peers.at(id);
  link.connecting = true;
  auto endpoint = link.endpoint;
  // Asked first, with a short deadline: CAF's own connect to a peer that
  // does not answer would block the middleman, and with it every other
  // connect of this node (runtime/tcp_probe.hpp).
  auto probe = spawn_tcp_probe(self->home_system(), endpoint.host, endpoint.port, kProbeTimeout);
  self->request(probe, kProbeTimeout + std::chrono::seconds(2), probe_atom::value)
      .then(
          [=](const std::string& why) {
            auto it = core->peers.find(id);
            if (it == core->peers.end() || !(it->second.endpoint == endpoint))
              return;  // forgotten or moved meanwhile
            if (!why.empty()) {
              failed(self, core, id, endpoint, why);
              return;
            }
            caf_connect(self, core, id, endpoint);
          },
          [=](caf::error& err) { failed(self, core, id, endpoint, self->home_system().render(err)); });
}

void caf_connect(ProxyImpl::pointer self, const core_ptr& core, const std::string& id,
                 const PeerEndpoint& endpoint) {
  auto mm = security::transport_actor(self->home_system());
  self->request(mm, kConnectTimeout, caf::connect_atom::value, endpoint.host, endpoint.port)
      .then(
          [=](const caf::node_id& node, caf::strong_actor_ptr& ptr,
              const std::set<std::string>&) {
            auto it = core->peers.find(id);
            if (it == core->peers.end() || !(it->second.endpoint == endpoint))
              return;  // forgotten or moved meanwhile
            if (!ptr) {
              failed(self, core, id, endpoint, "it publishes no peer actor");
              return;
            }
            auto peer = caf::actor_cast<PeerActor>(ptr);
            self->request(peer, kHelloTimeout, hello_atom::value)
                .then(
                    [=](const std::string& answered) {
                      auto it = core->peers.find(id);
                      if (it == core->peers.end() || !(it->second.endpoint == endpoint))
                        return;
                      if (answered != id) {
                        failed(self, core, id, endpoint, "node " + answered + " answers there");
                        return;
                      }
                      auto& link = it->second;
                      link.connecting = false;
                      link.failures = 0;
                      link.node = node;
                      link.actor = peer.address();
                      self->monitor(peer);
                      core->log->info("direct connection to node {} at {}", id, where(endpoint));
                      ask_data_port(self, core, id, endpoint, peer);
                    },
                    [=](caf::error& err) {
                      failed(self, core, id, endpoint, self->home_system().render(err));
                    });
          },
          [=](caf::error& err) { failed(self, core, id, endpoint, self->home_system().render(err)); });
}

}  // namespace

bool Proxy::Core::is_peer_node(const caf::node_id& node) const {
  return std::any_of(peers.begin(), peers.end(), [&](const auto& kv) {
    return kv.second.node && kv.second.node == node;
  });
}

std::set<caf::node_id> Proxy::Core::direct_nodes() const {
  std::set<caf::node_id> out;
  for (const auto& [id, link] : peers) {
    if (link.actor)
      out.insert(link.node);
  }
  return out;
}

void peers_from_snapshot(ProxyImpl::pointer self, const core_ptr& core,
                         const RoutingSnapshot& snap) {
  if (!core->options.connect_peers)
    return;
  for (const auto& id : snap.dead_nodes) {
    core->peers.erase(id);
    core->set_data_port(id, std::nullopt);
  }
  for (const auto& ep : snap.peers) {
    if (ep.node_id == core->options.node_id || ep.port == 0)
      continue;
    auto& link = core->peers[ep.node_id];
    if (link.endpoint == ep && (link.actor || link.connecting || link.failures > 0))
      continue;  // connected, on its way, or waiting for its retry
    if (!(link.endpoint == ep)) {
      link = Proxy::Core::PeerLink{};  // new, or the node came back elsewhere
      link.endpoint = ep;
    }
    connect(self, core, ep.node_id);
  }
}

void peer_retry(ProxyImpl::pointer self, const core_ptr& core, const std::string& node_id) {
  auto it = core->peers.find(node_id);
  if (it == core->peers.end() || it->second.actor || it->second.connecting)
    return;
  connect(self, core, node_id);
}

bool peer_down(ProxyImpl::pointer self, const core_ptr& core, const caf::actor_addr& source) {
  auto it = std::find_if(core->peers.begin(), core->peers.end(),
                         [&](const auto& kv) { return kv.second.actor == source; });
  if (it == core->peers.end())
    return false;
  auto id = it->first;
  it->second.actor = caf::actor_addr();
  // Its data port is asked again with the connection: the node may have
  // restarted with another one.
  core->set_data_port(id, std::nullopt);
  core->log->warn("lost the direct connection to node {}; reaching it through the head", id);
  // CAF dropped the handles of that node's actors with the connection: the
  // head sends that node's replicas again (a delta, not the whole view),
  // reached through the head until the direct connection is up again.
  ControllerActor controller;
  {
    std::lock_guard<std::mutex> lock(core->actor_mutex);
    controller = core->controller;
  }
  if (controller) {
    self->send(controller, subscribe_atom::value, caf::actor_cast<ProxyActor>(self),
               core->router.epoch(), core->router.seq(), core->options.node_id, id);
  }
  it->second.failures = 1;
  self->delayed_send(self, std::chrono::seconds(1), reconnect_atom::value, id);
  return true;
}

void watch_peers(ProxyImpl::pointer self, const core_ptr& core) {
  for (auto& [id, link] : core->peers) {
    link.connecting = false;
    if (!link.actor) {
      self->send(self, reconnect_atom::value, id);
      continue;
    }
    self->monitor(caf::actor_cast<caf::actor>(link.actor));
  }
}

}  // namespace troupe::proxy
