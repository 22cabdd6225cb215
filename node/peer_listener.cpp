#include "node/peer_listener.hpp"

#include <caf/all.hpp>

#include "runtime/security/tls.hpp"

namespace troupe::node {

Result<PeerListener> open_peer_listener(caf::actor_system& sys, const std::string& node_id,
                                        const std::string& bind, uint16_t port,
                                        uint16_t data_port, std::string data_token) {
  auto actor = sys.spawn([node_id, data_port, data_token]() -> PeerActor::behavior_type {
    return {
        [node_id](hello_atom) { return node_id; },
        [data_port, data_token](data_port_atom) {
          return std::make_tuple(data_port, data_token);
        },
    };
  });
  auto got = security::publish(caf::actor_cast<caf::actor>(actor), port, bind.c_str());
  if (!got) {
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
    return Status(errc::unavailable, "cannot open the peer port on " + bind + ":" +
                                         std::to_string(port) + ": " + sys.render(got.error()));
  }
  return PeerListener{actor, *got};
}

}  // namespace troupe::node
