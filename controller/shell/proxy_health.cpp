#include "controller/shell/proxy_health.hpp"

namespace troupe::controller {

const char* to_string(ProxyHealth h) {
  switch (h) {
    case ProxyHealth::starting:
      return "STARTING";
    case ProxyHealth::healthy:
      return "HEALTHY";
    case ProxyHealth::unhealthy:
      return "UNHEALTHY";
  }
  return "?";
}

void ProxyHealthMonitor::track(Key key, const std::string& node_id) {
  proxies_[key].node_id = node_id;
}

void ProxyHealthMonitor::forget(Key key) {
  proxies_.erase(key);
}

std::vector<ProxyHealthMonitor::Key> ProxyHealthMonitor::start_due_checks() {
  double now = clock_.now_s();
  std::vector<Key> due;
  for (auto& [key, p] : proxies_) {
    if (p.checking || now < p.next_check)
      continue;
    p.checking = true;
    due.push_back(key);
  }
  return due;
}

ProxyCheckOutcome ProxyHealthMonitor::settle(Key key, bool ok) {
  ProxyCheckOutcome out;
  auto it = proxies_.find(key);
  if (it == proxies_.end())
    return out;  // gone meanwhile
  Record& p = it->second;
  out.node_id = p.node_id;
  p.checking = false;
  p.next_check = clock_.now_s() + options_.period_s;
  if (ok) {
    out.verdict =
        p.health == ProxyHealth::unhealthy ? ProxyVerdict::recovered : ProxyVerdict::healthy;
    p.health = ProxyHealth::healthy;
    p.failures = 0;
    return out;
  }
  out.failures = ++p.failures;
  if (p.failures < options_.unhealthy_after) {
    out.verdict = ProxyVerdict::failed;
    return out;
  }
  if (p.health == ProxyHealth::unhealthy) {
    out.verdict = ProxyVerdict::still_unhealthy;
    return out;
  }
  p.health = ProxyHealth::unhealthy;
  out.verdict = ProxyVerdict::became_unhealthy;
  return out;
}

std::optional<ProxyHealth> ProxyHealthMonitor::health(Key key) const {
  auto it = proxies_.find(key);
  if (it == proxies_.end())
    return std::nullopt;
  return it->second.health;
}

std::string ProxyHealthMonitor::node_health(const std::string& node_id) const {
  auto key = proxy_of(node_id);
  return key ? to_string(proxies_.at(*key).health) : kNoProxy;
}

std::optional<ProxyHealthMonitor::Key> ProxyHealthMonitor::proxy_of(
    const std::string& node_id) const {
  for (const auto& [key, p] : proxies_) {
    if (p.node_id == node_id)
      return key;
  }
  return std::nullopt;
}

}  // namespace troupe::controller
