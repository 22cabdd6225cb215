#include "controller/shell/activity.hpp"

namespace troupe::controller {

void Activity::record(double now, std::string kind, std::string subject, std::string message,
                      bool warn) {
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

void Activity::count(const std::string& replica_id, uint64_t finished, double now) {
  auto [it, fresh] = counters_.try_emplace(replica_id);
  auto& c = it->second;
  if (!fresh && finished >= c.finished && now > c.at)
    c.rate = static_cast<double>(finished - c.finished) / (now - c.at);
  else
    c.rate = 0;
  c.finished = finished;
  c.at = now;
}

double Activity::rate(const std::string& replica_id, double now, double stale_s) const {
  auto it = counters_.find(replica_id);
  if (it == counters_.end() || now - it->second.at > stale_s)
    return 0;
  return it->second.rate;
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
