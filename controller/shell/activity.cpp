#include "controller/shell/activity.hpp"

namespace troupe::controller {

namespace {

// "app#Deployment#7" -> "app/Deployment"; "" when it is not a replica id.
std::string deployment_key(const std::string& replica_id) {
  auto first = replica_id.find('#');
  auto last = replica_id.rfind('#');
  if (first == std::string::npos || last == first)
    return "";
  return replica_id.substr(0, first) + "/" + replica_id.substr(first + 1, last - first - 1);
}

}  // namespace

void Activity::record(double now, std::string kind, std::string subject, std::string message,
                      bool warn) {
  if (kind == "crash") {
    if (auto key = deployment_key(subject); !key.empty())
      ++restarts_[key];
  }
  events_.push_back({now, std::move(kind), std::move(subject), std::move(message), warn});
  while (events_.size() > capacity_)
    events_.pop_front();
}

nlohmann::json Activity::events_json(double now, size_t limit) const {
  auto out = nlohmann::json::array();
  for (auto it = events_.rbegin(); it != events_.rend() && out.size() < limit; ++it) {
    out.push_back({{"age_s", now - it->at},
                   {"kind", it->kind},
                   {"subject", it->subject},
                   {"message", it->message},
                   {"warn", it->warn}});
  }
  return out;
}

void Activity::report(const ReplicaLoad& load, double now) {
  auto [it, fresh] = counters_.try_emplace(load.replica_id);
  auto& c = it->second;
  const bool continues = !fresh && load.finished >= c.finished && load.errors >= c.errors &&
                         now > c.at;
  if (continues) {
    c.load.requests_per_s = static_cast<double>(load.finished - c.finished) / (now - c.at);
    c.load.errors_per_s = static_cast<double>(load.errors - c.errors) / (now - c.at);
  } else {
    c.load.requests_per_s = 0;
    c.load.errors_per_s = 0;
  }
  c.finished = load.finished;
  c.errors = load.errors;
  c.at = now;
  c.load.in_flight = load.ongoing;
  c.load.streams = load.streams;
  c.load.p99_s = load.p99_s;
}

std::optional<ReplicaActivity> Activity::load(const std::string& replica_id, double now,
                                              double stale_s) const {
  auto it = counters_.find(replica_id);
  if (it == counters_.end() || now - it->second.at > stale_s)
    return std::nullopt;
  return it->second.load;
}

double Activity::rate(const std::string& replica_id, double now, double stale_s) const {
  auto l = load(replica_id, now, stale_s);
  return l ? l->requests_per_s : 0;
}

uint64_t Activity::restarts(const std::string& app, const std::string& deployment) const {
  auto it = restarts_.find(app + "/" + deployment);
  return it == restarts_.end() ? 0 : it->second;
}

void Activity::prune(const std::function<bool(const std::string&)>& keep) {
  for (auto it = counters_.begin(); it != counters_.end();) {
    if (keep(it->first))
      ++it;
    else
      it = counters_.erase(it);
  }
}

}  // namespace troupe::controller
