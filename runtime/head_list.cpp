#include "runtime/head_list.hpp"

namespace troupe {

namespace {

constexpr const char* kNamed = "the leader is ";

bool same(const Endpoint& a, const Endpoint& b) {
  return a.host == b.host && a.port == b.port;
}

}  // namespace

std::string not_leader_message(const std::string& name, const std::string& address) {
  return std::string("this head does not lead: ") + kNamed + name + " at " + address;
}

std::optional<Endpoint> named_leader(const std::string& message) {
  auto at = message.find(kNamed);
  if (at == std::string::npos)
    return std::nullopt;
  auto rest = message.substr(at + std::char_traits<char>::length(kNamed));
  auto sep = rest.find(" at ");
  if (sep == std::string::npos)
    return std::nullopt;
  auto address = rest.substr(sep + 4);
  if (auto end = address.find_first_of(" ;,)\n"); end != std::string::npos)
    address.resize(end);
  auto ep = parse_endpoint(address);
  if (!ep)
    return std::nullopt;
  return *ep;
}

Result<std::vector<Endpoint>> parse_endpoints(const std::string& text) {
  std::vector<Endpoint> out;
  size_t start = 0;
  while (true) {
    auto end = text.find(',', start);
    auto item = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    auto ep = parse_endpoint(item);
    if (!ep) {
      // One address: its own message, as for a single HOST:PORT.
      if (start == 0 && end == std::string::npos)
        return ep.status();
      return Status(errc::invalid_argument, "'" + item + "': " + ep.status().message());
    }
    for (const auto& seen : out) {
      if (same(seen, *ep))
        return Status(errc::invalid_argument, ep->to_string() + " is given twice");
    }
    out.push_back(*ep);
    if (end == std::string::npos)
      break;
    start = end + 1;
  }
  return out;
}

std::string to_string(const std::vector<Endpoint>& endpoints) {
  std::string out;
  for (const auto& ep : endpoints)
    out += (out.empty() ? "" : ",") + ep.to_string();
  return out;
}

HeadList::HeadList(std::vector<Endpoint> heads) : heads_(std::move(heads)) {}

void HeadList::failed(const std::string& refusal) {
  if (auto leader = named_leader(refusal)) {
    for (size_t i = 0; i < heads_.size(); ++i) {
      if (same(heads_[i], *leader)) {
        at_ = i;
        return;
      }
    }
    heads_.push_back(*leader);
    at_ = heads_.size() - 1;
    return;
  }
  at_ = (at_ + 1) % heads_.size();
}

}  // namespace troupe
