#include "controller/shell/recovery_gate.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace troupe::controller {

RecoveryGate::RecoveryGate(const Clock& clock, double window_s, std::set<std::string> expected)
    : clock_(&clock),
      window_s_(window_s),
      deadline_(clock.now_s() + window_s),
      latest_(clock.now_s() + kMaxWindows * window_s),
      expected_(std::move(expected)) {}

void RecoveryGate::arrived() {
  if (recovering_)
    deadline_ = std::min(latest_, std::max(deadline_, clock_->now_s() + window_s_));
}

Status RecoveryGate::require_ready() const {
  if (recovering_) {
    return Status(errc::unavailable,
                  "the controller is recovering its state after a restart; retry in a few seconds");
  }
  return Status::ok();
}

void RecoveryGate::collect(std::vector<HostedReplica> hosted) {
  for (auto& h : hosted)
    hosted_.push_back(std::move(h));
}

bool RecoveryGate::all_expected_back(const std::map<std::string, NodeRecord>& nodes) const {
  if (!recovering_ || expected_.empty())
    return false;
  for (const auto& id : expected_) {
    auto it = nodes.find(id);
    if (it == nodes.end() || it->second.state == NodeState::dead)
      return false;
  }
  return true;
}

bool RecoveryGate::window_over() const {
  return recovering_ && clock_->now_s() >= deadline_;
}

std::vector<HostedReplica> RecoveryGate::finish() {
  recovering_ = false;
  expected_.clear();
  std::vector<HostedReplica> out = std::move(hosted_);
  hosted_.clear();
  return out;
}

std::set<std::string> NodesFile::load() const {
  std::set<std::string> ids;
  if (path_.empty())
    return ids;
  std::istringstream listed(read_ ? read_() : std::string());
  std::ifstream file;
  if (!read_)
    file.open(path_);
  std::istream& in = read_ ? static_cast<std::istream&>(listed) : file;
  std::string id;
  while (std::getline(in, id)) {
    if (!id.empty())
      ids.insert(id);
  }
  return ids;
}

std::string NodesFile::render(const std::map<std::string, NodeRecord>& nodes) {
  std::string content;
  for (const auto& [id, n] : nodes) {
    if (n.state != NodeState::dead)
      content += id + "\n";
  }
  return content;
}

bool NodesFile::save(const std::map<std::string, NodeRecord>& nodes) {
  if (path_.empty())
    return true;
  std::string content = render(nodes);
  if (content == written_)
    return true;
  bool ok = false;
  if (write_) {
    ok = write_(content);
  } else {
    std::ofstream out(path_ + ".tmp", std::ios::trunc);
    out << content;
    ok = static_cast<bool>(out.flush());
    out.close();
    ok = ok && std::rename((path_ + ".tmp").c_str(), path_.c_str()) == 0;
  }
  if (ok)
    written_ = content;
  else
    written_.reset();
  return ok;
}

}  // namespace troupe::controller
