#include "runtime/auth.hpp"

#include <cstdio>
#include <ctime>

namespace troupe {

const char* operation_name(Operation op) {
  switch (op) {
    case Operation::register_node:
      return "register";
    case Operation::heartbeat:
      return "heartbeat";
    case Operation::deregister:
      return "deregister";
    case Operation::leave:
      return "leave";
    case Operation::drain:
      return "drain";
    case Operation::deploy:
      return "deploy";
    case Operation::delete_app:
      return "delete";
    case Operation::shutdown:
      return "shutdown";
    case Operation::kill:
      return "kill";
    case Operation::scale:
      return "scale";
    case Operation::traffic:
      return "traffic";
    case Operation::upload:
      return "upload";
    case Operation::rollback:
      return "rollback";
  }
  return "unknown";
}

std::string operation_digest(Operation op, const std::vector<std::string>& args) {
  return security::request_digest(operation_name(op), args);
}

std::vector<std::string> traffic_args(const std::string& app, const TrafficWeights& weights) {
  std::vector<std::string> out = {app};
  for (const auto& [name, weight] : weights) {
    char text[64];
    std::snprintf(text, sizeof text, "%a", weight);
    out.push_back(name + "=" + text);
  }
  return out;
}

Credential sign_request(const std::optional<security::Identity>& identity, Operation op,
                        const std::vector<std::string>& args) {
  if (!identity)
    return {};
  auto signed_credential =
      security::sign(*identity, operation_digest(op, args), std::time(nullptr));
  if (!signed_credential)
    return {};  // the controller refuses it, naming why
  return {signed_credential->certificate_pem, signed_credential->timestamp,
          signed_credential->signature};
}

Status check_request(const std::string& ca_pem, const Credential& credential, Operation op,
                     const std::vector<std::string>& args,
                     const std::optional<std::string>& node_id) {
  const std::string operation = operation_name(op);
  if (ca_pem.empty())
    return Status::ok();
  if (credential.empty()) {
    return Status(errc::permission_denied,
                  "permission denied: " + operation + " needs a signed credential (" +
                      (node_id ? "a node" : "an operator") + " certificate of this cluster)");
  }
  security::Credential c{credential.certificate_pem, credential.timestamp, credential.signature};
  auto now = static_cast<int64_t>(std::time(nullptr));
  if (!node_id) {
    return security::authorize(ca_pem, c, operation, args, security::Role::operator_, now);
  }
  auto caller = security::verify_caller(ca_pem, c, operation_digest(op, args), now);
  if (!caller)
    return caller.status();
  if (auto st = security::require_role(caller->role, security::Role::node, operation); !st)
    return st;
  if (caller->name != *node_id) {
    return Status(errc::permission_denied, "permission denied: the certificate of node '" +
                                               caller->name + "' cannot " + operation + " node '" +
                                               *node_id + "'");
  }
  return Status::ok();
}

namespace {

std::string utc(int64_t unix_seconds) {
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  char text[32] = "?";
  if (::gmtime_r(&t, &tm) != nullptr)
    std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

}  // namespace

Status ReplayGuard::admit(const Credential& credential, Operation op, int64_t unix_now) {
  while (!expiries_.empty() && expiries_.begin()->first < unix_now) {
    seen_.erase(expiries_.begin()->second);
    expiries_.erase(expiries_.begin());
  }
  if (credential.empty())
    return Status::ok();
  security::Credential c{credential.certificate_pem, credential.timestamp, credential.signature};
  std::string key = security::signature_identity(c);
  if (key.empty())
    key = "text:" + credential.signature;
  if (seen_.count(key) != 0) {
    return Status(errc::permission_denied,
                  std::string("permission denied: ") + operation_name(op) +
                      ": this credential was used already (signed at " +
                      utc(credential.timestamp) + "); a request is signed anew for each call");
  }
  int64_t expiry = credential.timestamp + window_s_;
  seen_.emplace(key, expiry);
  expiries_.emplace(expiry, key);
  return Status::ok();
}

}  // namespace troupe
