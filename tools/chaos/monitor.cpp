#include "tools/chaos/monitor.hpp"

#include <algorithm>
#include <future>
#include <list>
#include <memory>

#include "tools/chaos/http_client.hpp"

namespace chaos {

using nlohmann::json;

std::set<std::string> DeploymentView::running_ids() const {
  std::set<std::string> out;
  for (const auto& [id, state] : state_of) {
    if (state == "RUNNING")
      out.insert(id);
  }
  return out;
}

bool Observation::healthy() const {
  return unhealthy_reason().empty();
}

std::string Observation::unhealthy_reason() const {
  if (!status_ok)
    return "status failed: " + status_error;
  if (recovering)
    return "controller recovering";
  if (!nodes_ok)
    return "nodes failed: " + nodes_error;
  for (const auto& [app, st] : app_status) {
    if (st != "RUNNING")
      return "application " + app + " is " + st;
  }
  for (const auto& [name, d] : deployments) {
    if (d.status != "HEALTHY")
      return "deployment " + name + " is " + d.status;
    if (d.running != d.target || d.total != d.target)
      return "deployment " + name + " has " + std::to_string(d.running) + " running of " +
             std::to_string(d.total) + " listed, target " + std::to_string(d.target);
  }
  if (!duplicate_ids.empty())
    return "replica " + duplicate_ids.front() + " listed twice";
  for (const auto& [node, count] : replicas_per_node) {
    auto it = node_state.find(node);
    if (count > 0 && it != node_state.end() && it->second != "ALIVE")
      return std::to_string(count) + " replicas on " + it->second + " node " + node;
  }
  return "";
}

Monitor::Monitor(const Cluster& cluster, std::map<std::string, Endpoint> http_ports,
                 std::string probe_path, Clock::time_point t0, std::chrono::milliseconds interval)
    : cluster_(cluster),
      http_ports_(std::move(http_ports)),
      probe_path_(std::move(probe_path)),
      t0_(t0),
      interval_(interval) {}

Monitor::~Monitor() {
  stop();
}

void Monitor::start() {
  thread_ = std::thread([this] { loop(); });
}

void Monitor::stop() {
  stop_ = true;
  if (thread_.joinable())
    thread_.join();
}

namespace {

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void read_status(const json& s, Observation& o) {
  o.recovering = s.value("recovering", false);
  if (auto l = s.find("leader"); l != s.end() && l->is_object())
    o.leader = l->value("node_id", std::string());
  std::map<std::string, int> seen;
  for (const auto& [app, a] : s.at("applications").items()) {
    o.app_status[app] = a.value("status", "");
    o.app_route[app] = a.value("route_prefix", "");
    for (const auto& [dname, d] : a.at("deployments").items()) {
      DeploymentView v;
      v.status = d.value("status", "");
      v.target = d.value("target_replicas", int64_t{0});
      v.message = d.value("message", "");
      for (const auto& r : d.at("replicas")) {
        ++v.total;
        if (r.value("state", "") != "STOPPING")
          ++v.kept_on[r.value("node", "")];
        if (r.value("state", "") == "RUNNING") {
          ++v.running;
          ++v.running_on[r.value("node", "")];
        }
        auto id = r.value("id", "");
        v.state_of[id] = r.value("state", "");
        if (++seen[id] == 2)
          o.duplicate_ids.push_back(id);
        o.replica_ids.insert(id);
        ++o.replicas_per_node[r.value("node", "")];
      }
      o.deployments[app + "/" + dname] = v;
    }
  }
}

}  // namespace

Observation Monitor::observe() const {
  Observation o;
  o.start_s = since(t0_);
  // The probes run alongside the troupectl calls: a frozen node's proxy
  // holds its probe until the timeout, which must not delay the status.
  std::map<std::string, std::future<bool>> probes;
  if (!probe_path_.empty()) {
    for (const auto& [node, port] : http_ports_) {
      probes[node] = std::async(std::launch::async, [this, port = port] {
        HttpClient client(port.host, port.port);
        auto r = client.get(probe_path_, 500ms);
        return r.status >= 200 && r.status < 300;
      });
    }
  }
  // Both troupectl calls at once: a round is as long as the slower one, not
  // their sum, so a recovery is read sooner after it happened (each call is
  // a process that connects anew: ~0.3 s on a 2-core machine).
  o.nodes_start_s = since(t0_);
  std::string nodes_error;
  auto nodes_call = std::async(
      std::launch::async, [this, &nodes_error] { return cluster_.nodes_json(1, &nodes_error); });
  auto status = cluster_.status_json(1, &o.status_error);
  if (status) {
    try {
      read_status(*status, o);
      o.status_ok = true;
    } catch (const std::exception& e) {
      o.status_error = std::string("unexpected status --json shape: ") + e.what();
    }
  }
  auto nodes = nodes_call.get();
  o.nodes_error = std::move(nodes_error);
  if (nodes) {
    try {
      for (const auto& row : *nodes) {
        o.node_state[row.at("id")] = row.at("state");
        o.node_pid[row.at("id")] = row.value("pid", int64_t{0});
      }
      o.nodes_ok = true;
    } catch (const std::exception& e) {
      o.nodes_error = std::string("unexpected nodes --json shape: ") + e.what();
    }
  }
  o.state_end_s = since(t0_);
  for (auto& [node, f] : probes)
    o.probe_ok[node] = f.get();
  o.end_s = since(t0_);
  return o;
}

void Monitor::loop() {
  // A round starts every interval even while earlier ones still wait: a
  // troupectl call that meets the fault holds its round until its timeout,
  // and the next round must see the cluster right after the fault, not a
  // second later. At most kMaxInFlight rounds run at once.
  constexpr size_t kMaxInFlight = 4;
  struct Round {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done = std::make_shared<std::atomic<bool>>(false);
  };
  std::list<Round> rounds;
  while (!stop_.load() && !g_interrupted.load()) {
    auto begin = Clock::now();
    for (auto it = rounds.begin(); it != rounds.end();) {
      if (it->done->load()) {
        it->thread.join();
        it = rounds.erase(it);
      } else {
        ++it;
      }
    }
    if (rounds.size() < kMaxInFlight) {
      auto& round = rounds.emplace_back();
      round.thread = std::thread([this, done = round.done] {
        Observation o = observe();
        {
          std::lock_guard<std::mutex> lock(mu_);
          observations_.push_back(std::move(o));
        }
        done->store(true);
      });
    }
    // Pace the rounds; troupectl and the probes cost the cluster CPU too.
    auto next = begin + interval_;
    while (Clock::now() < next && !stop_.load())
      std::this_thread::sleep_for(std::min<Clock::duration>(next - Clock::now(), 20ms));
  }
  for (auto& r : rounds)
    r.thread.join();
}

std::vector<Observation> Monitor::observations() const {
  std::vector<Observation> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out = observations_;
  }
  // Rounds overlap and are recorded as they end; the analysis reads them in
  // the order they started.
  std::stable_sort(out.begin(), out.end(),
                   [](const Observation& a, const Observation& b) { return a.start_s < b.start_s; });
  return out;
}

std::optional<Observation> Monitor::await(double after_s,
                                          const std::function<bool(const Observation&)>& pred,
                                          std::chrono::milliseconds deadline) const {
  std::optional<Observation> found;
  size_t checked = 0;
  wait_until(
      [&] {
        std::lock_guard<std::mutex> lock(mu_);
        for (; checked < observations_.size(); ++checked) {
          const auto& o = observations_[checked];
          if (o.start_s >= after_s && pred(o)) {
            found = o;
            return true;
          }
        }
        return false;
      },
      deadline, 20ms);
  return found;
}

}  // namespace chaos
