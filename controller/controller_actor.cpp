#include "controller/controller_actor.hpp"

#include <chrono>
#include <unordered_map>

#include <caf/all.hpp>

#include "controller/membership.hpp"
#include "runtime/address.hpp"
#include "runtime/log.hpp"
#include "runtime/wire.hpp"

namespace troupe::controller {

namespace {

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

struct AgentRef {
  std::string node_id;
  uint64_t incarnation = 0;
};

struct ControllerState {
  Membership membership{5.0};
  std::unordered_map<caf::actor_addr, AgentRef> agents;  // monitored agent -> node
  std::shared_ptr<spdlog::logger> log = troupe::log::get("controller");
  static inline const char* name = "troupe.controller";
};

using controller_actor = caf::stateful_actor<ControllerState>;

void log_transitions(ControllerState& st, const std::vector<NodeTransition>& ts) {
  for (const auto& t : ts) {
    st.log->warn("node {} {} -> {}: {}", t.id, to_string(t.from), to_string(t.to), t.reason);
  }
}

NodeStatus to_wire(const NodeRecord& n, double now) {
  NodeStatus s;
  s.id = n.id;
  s.address = n.host + ":" + std::to_string(n.http_port);
  s.state = to_string(n.state);
  s.resources = n.resources.to_string();
  s.last_heartbeat_age_ms = static_cast<int64_t>((now - n.last_heartbeat) * 1000);
  s.reason = n.reason;
  s.pid = n.pid;
  return s;
}

caf::behavior controller(controller_actor* self, ControllerOptions options) {
  auto interval = std::chrono::duration_cast<caf::timespan>(
      std::chrono::duration<double>(options.check_interval_s));
  self->state.membership = Membership(options.node_timeout_s);
  self->set_down_handler([=](const caf::down_msg& dm) {
    auto& st = self->state;
    auto it = st.agents.find(dm.source);
    if (it == st.agents.end())
      return;
    st.log->warn("lost the node agent of {}: {}", it->second.node_id, caf::to_string(dm.reason));
    log_transitions(
        st, st.membership.connection_lost(it->second.node_id, it->second.incarnation, now_s()));
    st.agents.erase(it);
  });
  self->delayed_send(self, interval, tick_atom::value);
  self->state.log->info("controller started (node timeout {:.1f} s)", options.node_timeout_s);
  return {
      [=](hello_atom, uint32_t version) -> caf::result<hello_atom, uint32_t, std::string> {
        if (version != kProtocolVersion) {
          return to_caf_error(Status(errc::version_mismatch,
                                     "the controller speaks protocol version " +
                                         std::to_string(kProtocolVersion) + ", the caller " +
                                         std::to_string(version) + "; upgrade one of them"));
        }
        return {hello_atom::value, kProtocolVersion, std::string("controller")};
      },
      [=](register_atom, const NodeInfo& info, const caf::actor& agent) -> caf::result<uint64_t> {
        auto& st = self->state;
        if (info.protocol_version != kProtocolVersion) {
          st.log->error("refused node {} (pid {}): protocol version {}, controller speaks {}",
                        info.id, info.pid, info.protocol_version, kProtocolVersion);
          return to_caf_error(Status(errc::version_mismatch,
                                     "the controller speaks protocol version " +
                                         std::to_string(kProtocolVersion) + ", node '" + info.id +
                                         "' speaks " + std::to_string(info.protocol_version)));
        }
        if (auto st_id = validate_node_id(info.id); !st_id)
          return to_caf_error(st_id);
        auto resources = parse_resources(info.resources);
        if (!resources)
          return to_caf_error(resources.status());
        if (!agent)
          return to_caf_error(Status(errc::invalid_argument, "no agent handle given"));
        NodeRecord rec;
        rec.id = info.id;
        rec.host = info.host;
        rec.http_port = info.http_port;
        rec.resources = *resources;
        rec.pid = info.pid;
        bool known = st.membership.nodes().count(info.id) > 0;
        uint64_t incarnation = st.membership.register_node(std::move(rec), now_s());
        // Forget any older connection of this node; monitor the new agent.
        for (auto it = st.agents.begin(); it != st.agents.end();) {
          if (it->second.node_id == info.id && it->first != agent.address()) {
            it = st.agents.erase(it);
          } else {
            ++it;
          }
        }
        st.agents[agent.address()] = AgentRef{info.id, incarnation};
        self->monitor(agent);
        st.log->info("node {} {} (pid {}, {}:{}, {})", info.id,
                     known ? "re-registered" : "registered", info.pid, info.host, info.http_port,
                     info.resources);
        return incarnation;
      },
      [=](heartbeat_atom, const std::string& id) -> caf::result<caf::ok_atom> {
        auto st = self->state.membership.heartbeat(id, now_s());
        if (!st)
          return to_caf_error(st);
        return caf::ok_atom::value;
      },
      [=](deregister_atom, const std::string& id) -> caf::result<caf::ok_atom> {
        auto& st = self->state;
        auto status = st.membership.deregister(id);
        if (!status)
          return to_caf_error(status);
        for (auto it = st.agents.begin(); it != st.agents.end();) {
          if (it->second.node_id == id) {
            self->demonitor(it->first);
            it = st.agents.erase(it);
          } else {
            ++it;
          }
        }
        st.log->info("node {} left the cluster", id);
        return caf::ok_atom::value;
      },
      [=](nodes_atom) {
        double now = now_s();
        std::vector<NodeStatus> out;
        for (const auto& [id, node] : self->state.membership.nodes())
          out.push_back(to_wire(node, now));
        return out;
      },
      [=](drain_atom, const std::string& id) -> caf::result<caf::ok_atom> {
        auto status = self->state.membership.drain(id);
        if (!status)
          return to_caf_error(status);
        self->state.log->warn("node {} is DRAINING (operator request)", id);
        return caf::ok_atom::value;
      },
      [=](tick_atom) {
        log_transitions(self->state, self->state.membership.check(now_s()));
        self->delayed_send(self, interval, tick_atom::value);
      },
  };
}

}  // namespace

caf::actor spawn_controller(caf::actor_system& sys, const ControllerOptions& options) {
  return sys.spawn(controller, options);
}

}  // namespace troupe::controller
