#include "runtime/wire.hpp"

#include <atomic>
#include <mutex>

#include <caf/actor_system_config.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/message.hpp>
#include <caf/sec.hpp>
#include <caf/serializer.hpp>

namespace troupe {

class SnapshotEncoding {
 public:
  // Writes `x`, the snapshot that holds this encoding (EncodingSlot gives
  // it to no other), into `sink`: the stored bytes, made now if this is the
  // first call.
  caf::error write(caf::serializer& sink, RoutingSnapshot& x) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!made_) {
        // The sink's context: the actor handles in the snapshot are
        // registered with the sending system just as a direct write would.
        caf::binary_serializer first{sink.context(), bytes_};
        if (auto err = inspect_fields(first, x)) {
          bytes_.clear();
          return err;
        }
        made_ = true;
        serialized_.fetch_add(1, std::memory_order_relaxed);
      } else {
        copied_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    return sink.apply_raw(bytes_.size(), bytes_.data());
  }

  static SnapshotEncodingCounts counts() {
    return {serialized_.load(std::memory_order_relaxed), copied_.load(std::memory_order_relaxed)};
  }

 private:
  std::mutex mutex_;
  bool made_ = false;
  std::vector<char> bytes_;  // written once, under mutex_; read-only after
  static std::atomic<uint64_t> serialized_;
  static std::atomic<uint64_t> copied_;
};

std::atomic<uint64_t> SnapshotEncoding::serialized_{0};
std::atomic<uint64_t> SnapshotEncoding::copied_{0};

SnapshotEncodingCounts snapshot_encoding_counts() {
  return SnapshotEncoding::counts();
}

caf::error inspect(caf::serializer& f, RoutingSnapshot& x) {
  if (x.wire.encoding)
    return x.wire.encoding->write(f, x);
  return inspect_fields(f, x);
}

void share_encoding(RoutingSnapshot& x) {
  x.wire.encoding = std::make_shared<SnapshotEncoding>();
}

void register_wire_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<NodeInfo>("troupe.NodeInfo");
  cfg.add_message_type<NodeStatus>("troupe.NodeStatus");
  cfg.add_message_type<std::vector<NodeStatus>>("troupe.NodeStatusList");
  cfg.add_message_type<BatchSettings>("troupe.BatchSettings");
  cfg.add_message_type<ReplicaSpec>("troupe.ReplicaSpec");
  cfg.add_message_type<ReplicaMetadata>("troupe.ReplicaMetadata");
  cfg.add_message_type<ReplicaLoad>("troupe.ReplicaLoad");
  cfg.add_message_type<std::vector<ReplicaLoad>>("troupe.ReplicaLoadList");
  cfg.add_message_type<ReplicaModels>("troupe.ReplicaModels");
  cfg.add_message_type<DeploymentLoad>("troupe.DeploymentLoad");
  cfg.add_message_type<HealthSettings>("troupe.HealthSettings");
  cfg.add_message_type<HealthReport>("troupe.HealthReport");
  cfg.add_message_type<HealthWatch>("troupe.HealthWatch");
  cfg.add_message_type<std::vector<HealthWatch>>("troupe.HealthWatchList");
  cfg.add_message_type<std::vector<HealthReport>>("troupe.HealthReportList");
  cfg.add_message_type<std::vector<DeploymentLoad>>("troupe.DeploymentLoadList");
  cfg.add_message_type<std::vector<ReplicaModels>>("troupe.ReplicaModelsList");
  cfg.add_message_type<HostedReplicaInfo>("troupe.HostedReplicaInfo");
  cfg.add_message_type<std::vector<HostedReplicaInfo>>("troupe.HostedReplicaList");
  cfg.add_message_type<HttpRequest>("troupe.HttpRequest");
  cfg.add_message_type<HttpResponse>("troupe.HttpResponse");
  cfg.add_message_type<RouteEntry>("troupe.RouteEntry");
  cfg.add_message_type<ReplicaEndpoint>("troupe.ReplicaEndpoint");
  cfg.add_message_type<DeploymentEndpoints>("troupe.DeploymentEndpoints");
  cfg.add_message_type<RoutingSnapshot>("troupe.RoutingSnapshot");
  cfg.add_message_type<PeerEndpoint>("troupe.PeerEndpoint");
  cfg.add_message_type<Credential>("troupe.Credential");
  // Handles that travel as message elements of their own.
  cfg.add_message_type<ReplicaActor>("troupe.ReplicaActor");
  cfg.add_message_type<MetricsSinkActor>("troupe.MetricsSinkActor");
  cfg.add_message_type<ProxyActor>("troupe.ProxyActor");
  cfg.add_message_type<AgentActor>("troupe.AgentActor");
  cfg.add_message_type<ControllerActor>("troupe.ControllerActor");
  cfg.add_message_type<ProxyKeeperActor>("troupe.ProxyKeeperActor");
  cfg.add_message_type<PeerActor>("troupe.PeerActor");
  cfg.add_message_type<TrafficWeights>("troupe.TrafficWeights");
  cfg.set("middleman.app-identifiers", std::vector<std::string>{kAppIdentifier});
  cfg.add_error_category(kErrorCategory,
                         [](uint8_t code, caf::atom_value, const caf::message& ctx) {
                           std::string text = to_string(static_cast<errc>(code));
                           if (ctx.match_elements<std::string>())
                             text += ": " + ctx.get_as<std::string>(0);
                           return text;
                         });
}

caf::error to_caf_error(const Status& status) {
  return caf::error(static_cast<uint8_t>(status.code()), kErrorCategory,
                    caf::make_message(status.message()));
}

Status from_caf_error(const caf::error& err) {
  if (!err)
    return Status::ok();
  std::string context;
  if (err.context().match_elements<std::string>())
    context = err.context().get_as<std::string>(0);
  if (err.category() == kErrorCategory)
    return Status(static_cast<errc>(err.code()), context);
  if (err.category() == caf::atom("system")) {
    auto code = static_cast<caf::sec>(err.code());
    std::string what = caf::to_string(code);
    if (!context.empty())
      what += " (" + context + ")";
    switch (code) {
      case caf::sec::request_timeout:
        return Status(errc::timeout, "no answer in time");
      case caf::sec::cannot_connect_to_node:
      case caf::sec::remote_linking_failed:
      case caf::sec::request_receiver_down:
      case caf::sec::no_route_to_receiving_node:
      // A replica's handle (an actor pool) answers an empty message once its
      // replica has exited.
      case caf::sec::unexpected_response:
        return Status(errc::unavailable, what);
      default:
        return Status(errc::internal, what);
    }
  }
  return Status(errc::internal, caf::to_string(err));
}

}  // namespace troupe
