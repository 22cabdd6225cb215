#include "tools/troupectl/client.hpp"

#include <chrono>
#include <functional>

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>

#include "controller/store/codec.hpp"
#include "runtime/auth.hpp"
#include "runtime/head_list.hpp"
#include "runtime/libraries.hpp"
#include "runtime/security/tls.hpp"
#include "runtime/time.hpp"
#include "runtime/wire_rollback.hpp"

namespace troupe {

Status ControllerClient::describe(const caf::error& err) const {
  auto status = from_caf_error(err);
  if (status.code() == errc::timeout) {
    return Status(errc::timeout, "the controller at " + endpoint_.to_string() +
                                     " did not answer within " + std::to_string(timeout_s_) + " s");
  }
  return status;
}

Credential ControllerClient::sign(Operation operation,
                                  const std::vector<std::string>& args) const {
  return sign_request(identity_, operation, args);
}

Result<ControllerClient> ControllerClient::connect(caf::actor_system& sys, const Endpoint& endpoint,
                                                   double timeout_s,
                                                   std::optional<security::Identity> identity) {
  caf::scoped_actor self{sys};
  ControllerActor controller;
  Status failure;
  auto mm = security::transport_actor(sys);  // TLS when configured
  self->request(mm, seconds_as(timeout_s), caf::connect_atom::value, endpoint.host, endpoint.port)
      .receive(
          [&](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
            if (!ptr) {
              failure =
                  Status(errc::unavailable, "nothing is published at " + endpoint.to_string());
            } else {
              // Typed from here on; a peer of another version says so in
              // the hello below (CAF's typed connect would refuse it first,
              // without saying why).
              controller = caf::actor_cast<ControllerActor>(ptr);
            }
          },
          [&](caf::error& err) {
            auto status = from_caf_error(err);
            std::string why = status.code() == errc::timeout
                                  ? "no answer within " + std::to_string(timeout_s) + " s"
                                  : sys.render(err);
            failure = Status(errc::unavailable,
                             "cannot reach the controller at " + endpoint.to_string() + ": " + why);
          });
  if (!failure)
    return failure;
  self->request(controller, seconds_as(timeout_s), hello_atom::value, kProtocolVersion)
      .receive([&](hello_atom, uint32_t, const std::string&) {},
               [&](caf::error& err) {
                 auto status = from_caf_error(err);
                 failure = Status(status.code(), "the controller at " + endpoint.to_string() +
                                                     " refused the handshake: " + status.message());
               });
  if (!failure)
    return failure;
  return ControllerClient(sys, controller, endpoint, timeout_s, std::move(identity));
}

Result<ControllerClient> ControllerClient::connect(caf::actor_system& sys,
                                                   const std::vector<Endpoint>& heads,
                                                   double timeout_s,
                                                   std::optional<security::Identity> identity) {
  HeadList list(heads);
  std::set<std::string> tried;
  std::string why;
  Status last;
  while (tried.insert(list.current().to_string()).second) {
    auto client = connect(sys, list.current(), timeout_s, identity);
    if (client)
      return client;
    last = client.status();
    why += (why.empty() ? "" : "; ") + last.message();
    list.failed(last.code() == errc::not_leader ? last.message() : "");
  }
  if (tried.size() == 1)
    return last;  // one head, as it said
  return Status(last.code() == errc::not_leader ? errc::not_leader : errc::unavailable,
                "no head of " + to_string(list.heads()) + " leads: " + why);
}

Result<std::string> ControllerClient::leader(caf::actor_system& sys,
                                             const std::vector<Endpoint>& heads,
                                             double timeout_s) {
  caf::scoped_actor self{sys};
  auto mm = security::transport_actor(sys);
  std::string why;
  for (const auto& head : heads) {
    Result<std::string> out(errc::unavailable, "no answer");
    caf::actor published;
    self->request(mm, seconds_as(timeout_s), caf::connect_atom::value, head.host, head.port)
        .receive(
            [&](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
              if (ptr)
                published = caf::actor_cast<caf::actor>(ptr);
              else
                out = Status(errc::unavailable, "nothing is published at " + head.to_string());
            },
            [&](caf::error& err) {
              out = Status(errc::unavailable, "cannot reach it: " + sys.render(err));
            });
    if (published) {
      self->request(published, seconds_as(timeout_s), leader_atom::value)
          .receive([&](std::string& json) { out = std::move(json); },
                   [&](caf::error& err) { out = from_caf_error(err); });
    }
    if (out)
      return out;
    why += (why.empty() ? "" : "; ") + head.to_string() + ": " + out.status().message();
  }
  return Status(errc::unavailable, "no head answered: " + why);
}

Result<std::string> ControllerClient::leader_json() {
  caf::scoped_actor self{*sys_};
  Result<std::string> out(errc::internal, "no answer");
  self->request(controller_, seconds_as(timeout_s_), leader_atom::value)
      .receive([&](std::string& json) { out = std::move(json); },
               [&](caf::error& err) { out = describe(err); });
  return out;
}

Result<std::vector<NodeStatus>> ControllerClient::nodes() {
  caf::scoped_actor self{*sys_};
  Result<std::vector<NodeStatus>> out(errc::internal, "no answer");
  self->request(controller_, seconds_as(timeout_s_), nodes_atom::value)
      .receive([&](std::vector<NodeStatus>& nodes) { out = std::move(nodes); },
               [&](caf::error& err) { out = describe(err); });
  return out;
}

Status ControllerClient::drain(const std::string& node_id) {
  caf::scoped_actor self{*sys_};
  Status out(errc::internal, "no answer");
  self->request(controller_, seconds_as(timeout_s_), drain_atom::value, node_id,
                sign(Operation::drain, {node_id}))
      .receive([&](caf::ok_atom) { out = Status::ok(); },
               [&](caf::error& err) { out = describe(err); });
  return out;
}

}  // namespace troupe

namespace troupe {

template <class T, class... Ts>
static Result<T> ask(caf::actor_system& sys, const ControllerActor& dest, double timeout_s,
                     const std::function<Status(const caf::error&)>& describe, Ts&&... xs) {
  caf::scoped_actor self{sys};
  Result<T> out(errc::internal, "no answer");
  self->request(dest, seconds_as(timeout_s), std::forward<Ts>(xs)...)
      .receive([&](T& value) { out = std::move(value); },
               [&](caf::error& err) { out = describe(err); });
  return out;
}

Result<ControllerClient::DeployReply> ControllerClient::deploy(
    const controller::ApplicationSpec& app) {
  caf::scoped_actor self{*sys_};
  Result<DeployReply> out(errc::internal, "no answer");
  auto encoded = controller::encode_application(app);
  self->request(controller_, seconds_as(timeout_s_), deploy_atom::value, encoded,
                sign(Operation::deploy, {encoded}))
      .receive(
          [&](bool changed, uint64_t generation) {
            out = DeployReply{changed, generation};
          },
          [&](caf::error& err) { out = describe(err); });
  return out;
}

Status ControllerClient::delete_application(const std::string& app) {
  caf::scoped_actor self{*sys_};
  Status out(errc::internal, "no answer");
  self->request(controller_, seconds_as(timeout_s_), delete_atom::value, app, sign(Operation::delete_app, {app}))
      .receive([&](caf::ok_atom) { out = Status::ok(); },
               [&](caf::error& err) { out = describe(err); });
  return out;
}

Result<ControllerClient::DeployReply> ControllerClient::scale(const std::string& app,
                                                            const std::string& deployment,
                                                            uint32_t replicas) {
  caf::scoped_actor self{*sys_};
  Result<DeployReply> out(errc::internal, "no answer");
  self->request(controller_, seconds_as(timeout_s_), scale_atom::value, app, deployment, replicas,
                sign(Operation::scale, {app, deployment, std::to_string(replicas)}))
      .receive([&](bool changed, uint64_t generation) { out = DeployReply{changed, generation}; },
               [&](caf::error& err) { out = describe(err); });
  return out;
}

Result<uint64_t> ControllerClient::set_traffic(const std::string& app,
                                               const std::map<std::string, double>& weights) {
  TrafficWeights wire(weights.begin(), weights.end());
  return ask<uint64_t>(
      *sys_, controller_, timeout_s_, [&](const caf::error& e) { return describe(e); },
      traffic_atom::value, app, wire, sign(Operation::traffic, traffic_args(app, wire)));
}

Result<ControllerClient::RollbackReply> ControllerClient::rollback(const std::string& app) {
  caf::scoped_actor self{*sys_};
  Result<RollbackReply> out(errc::internal, "no answer");
  // The handshake checked the protocol version: this controller takes it.
  auto controller = caf::actor_cast<ControllerRollbackActor>(controller_);
  self->request(controller, seconds_as(timeout_s_), rollback_atom::value, app,
                sign(Operation::rollback, {app}))
      .receive(
          [&](uint64_t generation, uint64_t from) {
            out = RollbackReply{generation, from};
          },
          [&](caf::error& err) { out = describe(err); });
  return out;
}

Status ControllerClient::delete_deployment(const std::string& app, const std::string& deployment) {
  caf::scoped_actor self{*sys_};
  Status out(errc::internal, "no answer");
  self->request(controller_, seconds_as(timeout_s_), delete_atom::value, app, deployment,
                sign(Operation::delete_app, {app, deployment}))
      .receive([&](caf::ok_atom) { out = Status::ok(); },
               [&](caf::error& err) { out = describe(err); });
  return out;
}

Status ControllerClient::kill_replica(const std::string& replica_id) {
  return kill("replica", replica_id);
}

Result<std::string> ControllerClient::apply(const controller::TargetState& state,
                                            std::optional<uint64_t> if_generation) {
  auto encoded = controller::encode_target_state(state);
  if (if_generation) {
    const std::string generation = std::to_string(*if_generation);
    return ask<std::string>(
        *sys_, controller_, timeout_s_, [&](const caf::error& e) { return describe(e); },
        apply_atom::value, encoded, *if_generation, sign(Operation::deploy, {encoded, generation}));
  }
  return ask<std::string>(
      *sys_, controller_, timeout_s_, [&](const caf::error& e) { return describe(e); },
      apply_atom::value, encoded, sign(Operation::deploy, {encoded}));
}

Result<controller::TargetState> ControllerClient::config() {
  auto bytes = ask<std::string>(
      *sys_, controller_, timeout_s_, [&](const caf::error& e) { return describe(e); },
      config_atom::value);
  if (!bytes)
    return bytes.status();
  return controller::decode_target_state(*bytes);
}

Status ControllerClient::shutdown(bool nodes) {
  caf::scoped_actor self{*sys_};
  Status out(errc::internal, "no answer");
  self->request(controller_, seconds_as(timeout_s_), shutdown_atom::value, nodes,
                sign(Operation::shutdown, {nodes ? "nodes" : ""}))
      .receive([&](caf::ok_atom) { out = Status::ok(); },
               [&](caf::error& err) { out = describe(err); });
  return out;
}

Status ControllerClient::kill(const std::string& kind, const std::string& id) {
  caf::scoped_actor self{*sys_};
  Status out(errc::internal, "no answer");
  self->request(controller_, seconds_as(timeout_s_), kill_atom::value, kind, id,
                sign(Operation::kill, {kind, id}))
      .receive([&](caf::ok_atom) { out = Status::ok(); },
               [&](caf::error& err) {
                 // Killing the controller: it may die before it answers.
                 out = kind == "controller" ? Status::ok() : describe(err);
               });
  return out;
}

Result<std::string> ControllerClient::status_json() {
  return ask<std::string>(
      *sys_, controller_, timeout_s_, [&](const caf::error& e) { return describe(e); },
      status_atom::value);
}

Result<uint64_t> ControllerClient::library_size(const std::string& sha256) {
  return ask<uint64_t>(
      *sys_, controller_, timeout_s_, [&](const caf::error& e) { return describe(e); },
      library_atom::value, sha256);
}

Result<uint64_t> ControllerClient::upload_piece(const std::string& sha256, uint64_t total,
                                                uint64_t offset, const std::string& piece) {
  return ask<uint64_t>(
      *sys_, controller_, timeout_s_, [&](const caf::error& e) { return describe(e); },
      upload_atom::value, sha256, total, offset, piece,
      sign(Operation::upload, {sha256, std::to_string(total), std::to_string(offset),
                               libraries::sha256_hex(piece)}));
}

Result<ControllerClient::LogChunk> ControllerClient::logs(const std::string& replica_id,
                                                          uint64_t offset, uint32_t tail) {
  caf::scoped_actor self{*sys_};
  Result<LogChunk> out(errc::internal, "no answer");
  self->request(controller_, seconds_as(timeout_s_), logs_atom::value, replica_id, offset, tail)
      .receive([&](std::string& text, uint64_t next) { out = LogChunk{std::move(text), next}; },
               [&](caf::error& err) { out = describe(err); });
  return out;
}

Result<RoutingSnapshot> ControllerClient::snapshot(uint64_t epoch, uint64_t seq) {
  return ask<RoutingSnapshot>(
      *sys_, controller_, timeout_s_, [&](const caf::error& e) { return describe(e); },
      snapshot_atom::value, epoch, seq);
}

}  // namespace troupe
