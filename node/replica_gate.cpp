#include "node/replica_gate.hpp"

#include <caf/all.hpp>

#include "runtime/log.hpp"
#include "runtime/wire.hpp"

namespace troupe::node {

namespace {

struct GateState {
  std::shared_ptr<spdlog::logger> log = troupe::log::get("agent");
  static inline const char* name = "troupe.replica-gate";
};

using gate_actor = ReplicaGateActor::stateful_base<GateState>;

ReplicaGateActor::behavior_type gate(gate_actor* self,
                                     std::function<AgentKeeperActor()> keeper_of) {
  self->set_default_handler([](caf::scheduled_actor* s, caf::message_view& mv) -> caf::result<caf::message> {
    auto* gs = static_cast<gate_actor*>(s);
    auto sender = s->current_sender();
    gs->state.log->warn("replica gate: refused a message {} from node {}",
                        mv.content().stringify().substr(0, 80),
                        sender ? to_string(sender->node()) : std::string("unknown"));
    return caf::make_error(caf::sec::unexpected_message);
  });
  return {
      [=](replica_hello_atom atom, const std::string& id, const std::string& secret)
          -> caf::result<ReplicaSpec, MetricsSinkActor, ProxyKeeperActor> {
        auto keeper = keeper_of();
        if (!keeper)
          return to_caf_error(Status(errc::unavailable, "the node is starting"));
        return self->delegate(keeper, atom, id, secret);
      },
      [=](replica_attach_atom atom, const std::string& id, const std::string& secret,
          const ReplicaActor& replica) -> caf::result<caf::ok_atom> {
        auto keeper = keeper_of();
        if (!keeper)
          return to_caf_error(Status(errc::unavailable, "the node is starting"));
        return self->delegate(keeper, atom, id, secret, replica);
      },
  };
}

}  // namespace

ReplicaGateActor spawn_replica_gate(caf::actor_system& sys,
                                    std::function<AgentKeeperActor()> agent_keeper) {
  return sys.spawn(gate, std::move(agent_keeper));
}

}  // namespace troupe::node
