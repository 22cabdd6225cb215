// A blocking client of the controller over CAF actor messages, used by
// troupectl and by tests. Every call is bounded by the timeout given at
// connect time.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "controller/core/model.hpp"
#include "runtime/address.hpp"
#include "runtime/auth.hpp"
#include "runtime/security/credentials.hpp"
#include "runtime/status.hpp"
#include "runtime/wire.hpp"

namespace troupe {

class ControllerClient {
 public:
  // Connects and checks that both sides speak the same protocol version.
  static Result<ControllerClient> connect(caf::actor_system& sys, const Endpoint& endpoint,
                                          double timeout_s,
                                          std::optional<security::Identity> identity = {});
  // The same with the head candidates of a highly available cluster: each
  // is tried in turn (the one a follower names first, runtime/head_list.hpp)
  // until the leader answers, also when only one was given. A failure names
  // every head tried and why; with one head tried, its own.
  static Result<ControllerClient> connect(caf::actor_system& sys,
                                          const std::vector<Endpoint>& heads, double timeout_s,
                                          std::optional<security::Identity> identity = {});
  // Who leads (leader_atom, runtime/wire.hpp), as the first of `heads` that
  // answers says: a follower answers too. The JSON object.
  static Result<std::string> leader(caf::actor_system& sys, const std::vector<Endpoint>& heads,
                                    double timeout_s);

  Result<std::vector<NodeStatus>> nodes();
  Status drain(const std::string& node_id);

  struct DeployReply {
    bool changed = false;
    uint64_t generation = 0;
  };
  Result<DeployReply> deploy(const controller::ApplicationSpec& app);
  Status delete_application(const std::string& app);
  // Declarative deploy of a whole TargetState (its http settings too: they
  // are signed with it); the answer is the controller's JSON summary
  // ({"changed", "generation", "applications"}).
  // With `if_generation`, refused (errc::conflict, naming the current
  // generation) unless the target state is at exactly that generation.
  Result<std::string> apply(const controller::TargetState& state,
                            std::optional<uint64_t> if_generation = std::nullopt);
  // Sets one deployment's num_replicas (not an autoscaled one).
  Result<DeployReply> scale(const std::string& app, const std::string& deployment,
                            uint32_t replicas);
  // Replaces an application's traffic split; the generation after it.
  Result<uint64_t> set_traffic(const std::string& app, const std::map<std::string, double>& weights);
  // Deploys the application's last good declaration again (`rollback`).
  struct RollbackReply {
    uint64_t generation = 0;       // the target state's after it
    uint64_t from_generation = 0;  // the generation whose declaration it is
  };
  Result<RollbackReply> rollback(const std::string& app);
  // Deletes one deployment of an application (not its ingress).
  Status delete_deployment(const std::string& app, const std::string& deployment);
  // The declared target state.
  Result<controller::TargetState> config();
  Status shutdown(bool nodes);
  // kind: replica, proxy, agent or controller.
  Status kill(const std::string& kind, const std::string& id);
  // Sends an exit (kill) to the replica, as a crash would.
  Status kill_replica(const std::string& replica_id);
  // The status document (see docs/architecture.md), as JSON text.
  Result<std::string> status_json();
  // Who leads, as this controller answers leader_atom (JSON text).
  Result<std::string> leader_json();
  // A replica's log lines (node/replica_logs.hpp): from `offset`, or the
  // last `tail` when it is node::kLogTail; and where to read on from.
  struct LogChunk {
    std::string text;
    uint64_t next_offset = 0;
  };
  Result<LogChunk> logs(const std::string& replica_id, uint64_t offset, uint32_t tail);
  // Deployment libraries (runtime/libraries.hpp): what the controller holds
  // of one (0: nothing), and one piece of an upload (signed) -> the bytes it
  // holds after it.
  Result<uint64_t> library_size(const std::string& sha256);
  Result<uint64_t> upload_piece(const std::string& sha256, uint64_t total, uint64_t offset,
                                const std::string& piece);
  // The route table and running replicas; epoch/seq of the last snapshot held
  // (0/0: everything).
  Result<RoutingSnapshot> snapshot(uint64_t epoch = 0, uint64_t seq = 0);

  const ControllerActor& controller() const { return controller_; }

 private:
  ControllerClient(caf::actor_system& sys, ControllerActor controller, Endpoint endpoint,
                   double timeout_s, std::optional<security::Identity> identity)
      : sys_(&sys),
        controller_(std::move(controller)),
        endpoint_(std::move(endpoint)),
        timeout_s_(timeout_s),
        identity_(std::move(identity)) {}

  Credential sign(Operation operation, const std::vector<std::string>& args) const;

  // Prefixes failures with the controller's address.
  Status describe(const caf::error& err) const;

  caf::actor_system* sys_;
  ControllerActor controller_;
  Endpoint endpoint_;
  double timeout_s_;
  std::optional<security::Identity> identity_;
};

}  // namespace troupe
