#include "controller/shell/admission.hpp"

#include "runtime/address.hpp"
#include "runtime/auth.hpp"
#include "runtime/resources.hpp"

namespace troupe::controller {

Status check_protocol_version(uint32_t version) {
  if (version == kProtocolVersion)
    return Status::ok();
  return Status(errc::version_mismatch, "the controller speaks protocol version " +
                                            std::to_string(kProtocolVersion) + ", the caller " +
                                            std::to_string(version) + "; upgrade one of them");
}

Result<NodeRecord> admit_node(const std::string& ca_pem, const troupe::NodeInfo& info,
                              bool agent_given, const Credential& cred, spdlog::logger& log) {
  // The node signs its own id; only a certificate issued to that node passes.
  if (auto s = check_request(ca_pem, cred, Operation::register_node, {info.id}, info.id); !s) {
    log.warn("refused registration of node {} (pid {}): {}", info.id, info.pid, s.message());
    return s;
  }
  if (info.protocol_version != kProtocolVersion) {
    log.error("refused node {} (pid {}): protocol version {}, controller speaks {}", info.id,
              info.pid, info.protocol_version, kProtocolVersion);
    return Status(errc::version_mismatch,
                  "the controller speaks protocol version " + std::to_string(kProtocolVersion) +
                      ", node '" + info.id + "' speaks " + std::to_string(info.protocol_version));
  }
  if (auto s = validate_node_id(info.id); !s)
    return s;
  auto resources = parse_resources(info.resources);
  if (!resources)
    return resources.status();
  if (!agent_given)
    return Status(errc::invalid_argument, "no agent handle given");
  NodeRecord rec;
  rec.id = info.id;
  rec.host = info.host;
  rec.http_port = info.http_port;
  rec.peer_port = info.peer_port;
  rec.resources = *resources;
  rec.pid = info.pid;
  return rec;
}

Status check_head_mode(bool ha, const troupe::NodeInfo& info) {
  const std::string rule =
      ": a cluster has one head or highly available head candidates on etcd, never both";
  if (ha && info.head_mode == HeadMode::single_head)
    return Status(errc::conflict, "this head is a highly available head candidate (--ha-etcd) "
                                  "but node '" + info.id + "' is a single head (no --ha-etcd)" +
                                      rule);
  if (!ha && info.head_mode == HeadMode::candidate)
    return Status(errc::conflict, "this head is a single head (no --ha-etcd) but node '" +
                                      info.id + "' is a head candidate (--ha-etcd)" + rule);
  if (!ha && info.head_mode == HeadMode::head_list)
    return Status(errc::conflict, "this head is a single head (no --ha-etcd) but node '" +
                                      info.id + "' was given several heads to join (--join)" +
                                      rule);
  return Status::ok();
}

Status admit_operator_call(const std::string& ca_pem, const Credential& cred,
                           Operation operation, const std::vector<std::string>& args,
                           const RecoveryGate& recovery) {
  if (auto s = check_request(ca_pem, cred, operation, args); !s)
    return s;
  return recovery.require_ready();
}

Status admit_deploy(const std::string& ca_pem, const Credential& cred, const std::string& encoded,
                    const RecoveryGate& recovery, const Limits& limits,
                    const std::vector<std::string>& signed_too) {
  std::vector<std::string> args{encoded};
  args.insert(args.end(), signed_too.begin(), signed_too.end());
  if (auto s = admit_operator_call(ca_pem, cred, Operation::deploy, args, recovery); !s)
    return s;
  return check_config_size(encoded.size(), limits);
}

}  // namespace troupe::controller
