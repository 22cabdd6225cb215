#include "node/hosted_replicas.hpp"

namespace troupe::node {

bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size() || a.empty())
    return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

Hosted* HostedReplicas::find(const std::string& id) {
  auto it = table_.find(id);
  return it == table_.end() ? nullptr : &it->second;
}

std::vector<HostedReplicaInfo> HostedReplicas::list() const {
  std::vector<HostedReplicaInfo> out;
  for (const auto& [id, h] : table_) {
    if (!h.attached)
      continue;  // a process that has not attached yet
    out.push_back({id, h.spec.app, h.spec.deployment, h.spec.code_version, h.spec.user_config,
                   h.stopping, h.handle});
  }
  return out;
}

Hosted& HostedReplicas::add_process(const ReplicaSpec& spec, pid_t pid, std::string secret,
                                    std::vector<caf::typed_response_promise<ReplicaActor>> waiting) {
  Hosted h;
  h.spec = spec;
  h.process = true;
  h.pid = pid;
  h.secret = std::move(secret);
  h.waiting = std::move(waiting);
  return table_[spec.replica_id] = std::move(h);
}

Hosted& HostedReplicas::add_in_process(const ReplicaSpec& spec, ReplicaActor handle) {
  Hosted h;
  h.spec = spec;
  h.handle = std::move(handle);
  h.attached = true;
  return table_[spec.replica_id] = std::move(h);
}

Result<Hosted*> HostedReplicas::admit(const std::string& id, const std::string& secret) {
  auto* h = find(id);
  if (h == nullptr || !h->process)
    return Status(errc::permission_denied, "no such replica process");
  if (h->attached && !h->detached)
    return Status(errc::permission_denied, "it has attached already");
  if (!same_secret(h->secret, secret))
    return Status(errc::permission_denied, "wrong secret");
  return h;
}

HostedReplicas::Attach HostedReplicas::attach(Hosted& h, ReplicaActor remote) {
  h.remote = std::move(remote);
  if (h.detached) {
    h.detached = false;
    return Attach::again;
  }
  return Attach::first;
}

std::vector<caf::typed_response_promise<ReplicaActor>> HostedReplicas::attached(
    Hosted& h, ReplicaActor handle) {
  h.handle = std::move(handle);
  h.attached = true;
  return std::move(h.waiting);
}

HostedReplicas::Lost HostedReplicas::connection_lost(const std::string& id, bool unreachable) {
  auto* h = find(id);
  if (h == nullptr || !h->process || !unreachable)
    return Lost::ignore;
  if (h->stopping)
    return Lost::kill;
  h->detached = true;
  ++h->detaches;
  return Lost::wait_reattach;
}

bool HostedReplicas::attach_overdue(const std::string& id, pid_t pid) const {
  auto it = table_.find(id);
  return it != table_.end() && it->second.pid == pid && !it->second.attached;
}

bool HostedReplicas::reattach_overdue(const std::string& id, pid_t pid, uint32_t detach) const {
  auto it = table_.find(id);
  return it != table_.end() && it->second.pid == pid && it->second.detached &&
         it->second.detaches == detach;
}

HostedReplicas::Exit HostedReplicas::process_exited(
    const std::string& id, pid_t pid, bool clean,
    std::vector<caf::typed_response_promise<ReplicaActor>>* failed_waiting) {
  auto it = table_.find(id);
  if (it == table_.end() || !it->second.process || it->second.pid != pid)
    return Exit::ignore;
  auto& h = it->second;
  if (h.attached)
    return clean && h.stopping ? Exit::stopped : Exit::crashed;
  if (failed_waiting != nullptr)
    *failed_waiting = std::move(h.waiting);
  table_.erase(it);
  return Exit::never_attached;
}

HostedReplicas::HandleEnded HostedReplicas::handle_ended(const std::string& id) {
  HandleEnded out;
  auto it = table_.find(id);
  if (it == table_.end())
    return out;
  out.known = true;
  out.process = it->second.process;
  out.expected = it->second.stopping;
  out.remote = it->second.remote;
  table_.erase(it);
  return out;
}

HostedReplicas::Stop HostedReplicas::stop(Hosted& h, double timeout_s, time_point now) {
  Stop out;
  if (!h.attached || h.detached) {
    // A process that has not attached runs no user code yet; one whose
    // connection is lost cannot be told to stop.
    h.stopping = true;
    out.kill_now = true;
    return out;
  }
  out.send_stop = !h.stopping;
  h.stopping = true;
  // Enforced by the agent too, so a stop survives a controller crash.
  out.grace = std::chrono::duration_cast<duration>(std::chrono::duration<double>(timeout_s + 0.5));
  h.kill_at = now + out.grace;
  return out;
}

std::vector<HostedReplicas::Watch> HostedReplicas::adopt(time_point now) {
  std::vector<Watch> out;
  for (auto& [id, h] : table_) {
    h.waiting.clear();
    Watch w;
    w.id = id;
    w.pid = h.pid;
    if (h.process && !h.attached) {
      w.await_attach = true;
      out.push_back(std::move(w));
      continue;
    }
    w.handle = h.handle;
    w.remote = h.remote;
    if (h.stopping)
      w.kill_in = h.kill_at > now ? h.kill_at - now : duration{0};
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace troupe::node
