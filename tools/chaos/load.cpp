#include "tools/chaos/load.hpp"

#include <algorithm>
#include <cmath>
#include <memory>

#include "tools/chaos/http_client.hpp"

namespace chaos {

namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

LoadGenerator::LoadGenerator(const LoadSpec& spec, std::map<std::string, Endpoint> ports,
                             Clock::time_point t0)
    : spec_(spec), ports_(std::move(ports)), t0_(t0) {
  end_ = t0_ + std::chrono::duration_cast<Clock::duration>(
                   std::chrono::duration<double>(spec_.duration_s));
}

LoadGenerator::~LoadGenerator() {
  stop();
}

void LoadGenerator::start() {
  size_t clients =
      spec_.concurrency > 0
          ? static_cast<size_t>(spec_.concurrency)
          : static_cast<size_t>(spec_.clients > 0 ? spec_.clients
                                                  : std::max(4, static_cast<int>(spec_.rate / 20)));
  std::vector<std::pair<std::string, Endpoint>> targets(ports_.begin(), ports_.end());
  if (spec_.follow_readyz) {
    for (const auto& [node, port] : ports_)
      ready_[node] = true;  // until a poll says otherwise
    watcher_ = std::thread([this] { watch_readiness(); });
  }
  for (size_t i = 0; i < clients; ++i) {
    const auto& [node, port] = targets[i % targets.size()];
    threads_.emplace_back([this, i, node = node, port = port] { client_loop(i, node, port); });
  }
}

void LoadGenerator::stop() {
  stop_ = true;
  for (auto& t : threads_) {
    if (t.joinable())
      t.join();
  }
  threads_.clear();
  if (watcher_.joinable())
    watcher_.join();
}

void LoadGenerator::watch_readiness() {
  std::map<std::string, std::unique_ptr<HttpClient>> clients;
  for (const auto& [node, port] : ports_)
    clients[node] = std::make_unique<HttpClient>(port.host, port.port);
  while (!stop_.load() && !g_interrupted.load()) {
    auto round = Clock::now();
    for (auto& [node, client] : clients) {
      auto r = client->get("/-/readyz", 500ms);
      std::lock_guard<std::mutex> lock(ready_mu_);
      ready_[node] = r.status == 200;
    }
    // The health check's period, as a load balancer's.
    std::this_thread::sleep_until(round + 100ms);
  }
}

bool LoadGenerator::ready(const std::string& node) const {
  std::lock_guard<std::mutex> lock(ready_mu_);
  auto it = ready_.find(node);
  return it == ready_.end() || it->second;
}

std::optional<std::pair<std::string, Endpoint>> LoadGenerator::next_ready(
    const std::string& node) const {
  std::lock_guard<std::mutex> lock(ready_mu_);
  auto it = ports_.upper_bound(node);
  for (size_t i = 0; i < ports_.size(); ++i, ++it) {
    if (it == ports_.end())
      it = ports_.begin();
    auto r = ready_.find(it->first);
    if (it->first != node && r != ready_.end() && r->second)
      return *it;
  }
  return std::nullopt;
}

void LoadGenerator::client_loop(size_t index, std::string node, Endpoint port) {
  auto client = std::make_unique<HttpClient>(port.host, port.port);
  auto timeout = std::chrono::milliseconds(static_cast<int64_t>(spec_.request_timeout_s * 1000));
  size_t path_index = index;
  const bool open_loop = spec_.rate > 0;
  const auto slot_len = open_loop ? std::chrono::duration<double>(1.0 / spec_.rate)
                                  : std::chrono::duration<double>(0);
  while (!stop_.load() && !g_interrupted.load()) {
    auto send_at = Clock::now();
    if (open_loop) {
      uint64_t slot = next_slot_.fetch_add(1);
      send_at = t0_ + std::chrono::duration_cast<Clock::duration>(slot_len * slot);
      if (send_at >= end_)
        break;
      // Waits for its slot in short steps so that stop() is not delayed.
      while (Clock::now() < send_at && !stop_.load())
        std::this_thread::sleep_for(std::min<Clock::duration>(send_at - Clock::now(), 20ms));
      if (stop_.load())
        break;
      if (Clock::now() - send_at > 100ms) {
        std::lock_guard<std::mutex> lock(mu_);
        ++result_.late_sends;
      }
    }
    auto start = Clock::now();
    if (start >= end_)
      break;
    if (spec_.follow_readyz && !ready(node)) {
      if (auto other = next_ready(node)) {
        node = other->first;
        client = std::make_unique<HttpClient>(other->second.host, other->second.port);
      }
    }
    const auto& path = spec_.paths[path_index++ % spec_.paths.size()];
    auto r = client->get(path, timeout);
    auto end = Clock::now();
    record(seconds_between(t0_, start), seconds_between(t0_, end), node, r.status, r.error);
    if (r.status == 0 && !open_loop) {
      // A refused connection returns at once; without a pause a closed-loop
      // client would spin through thousands of failures per second while a
      // node is down. The pause is the client's backoff, not a wait for a
      // condition.
      std::this_thread::sleep_for(10ms);
    }
  }
}

void LoadGenerator::record(double start_s, double end_s, const std::string& node, int status,
                           const std::string& error) {
  bool ok = status >= 200 && status < 300;
  std::lock_guard<std::mutex> lock(mu_);
  // Bucketed by the second the request was sent in.
  auto second = static_cast<size_t>(std::max(0.0, std::floor(start_s)));
  if (result_.seconds.size() <= second)
    result_.seconds.resize(second + 1);
  auto& b = result_.seconds[second];
  auto& n = result_.per_node[node];
  if (status != 0 && b.latencies_ms.size() < kMaxLatencySamplesPerSecond)
    b.latencies_ms.push_back(static_cast<float>((end_s - start_s) * 1000));
  if (ok) {
    ++b.ok;
    ++n.ok;
    ++result_.ok;
    return;
  }
  std::string code = status != 0 ? std::to_string(status) : error;
  ++b.failures[code];
  ++n.failed;
  ++result_.failed;
  if (result_.failures.size() < kMaxFailureRecords)
    result_.failures.push_back({start_s, end_s, node, code});
  else
    ++result_.failures_not_recorded;
}

LoadResult LoadGenerator::result() const {
  std::lock_guard<std::mutex> lock(mu_);
  return result_;
}

}  // namespace chaos
