#include "controller/ha/candidate.hpp"

#include <nlohmann/json.hpp>

namespace troupe::ha {

namespace {

int64_t ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string describe_leadership(const CandidateView& view, const ElectionOptions& self) {
  using Json = nlohmann::json;
  Json out{{"ha", true},
           {"leading", view.leading},
           {"asked", {{"name", self.name}, {"node_id", self.node_id}}},
           {"leader", nullptr},
           {"problem", ""}};
  if (view.leader) {
    const auto& h = *view.leader;
    out["leader"] = Json{{"name", h.name},
                         {"node_id", h.node_id.empty() ? h.name : h.node_id},
                         {"address", h.address},
                         {"term", h.term},
                         {"since_unix_ms", h.since_unix_ms}};
  } else {
    out["problem"] = !view.refusal.empty() ? view.refusal
                     : view.problem.empty() ? std::string("no leader yet")
                                            : view.problem;
  }
  return out.dump();
}

Candidate::Candidate(ElectionOptions election, EtcdOptions etcd, CandidateCallbacks callbacks)
    : callbacks_(std::move(callbacks)),
      backend_(std::move(etcd)),
      election_(std::move(election), backend_) {
  runner_ = std::thread([this] { run(); });
  watchdog_ = std::thread([this] { watch(); });
}

Candidate::~Candidate() {
  stop(true);
}

void Candidate::stop(bool resign) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !runner_.joinable())
      return;
    stopping_ = true;
    resign_ = resign;
  }
  wake_.notify_all();
  if (runner_.joinable())
    runner_.join();
  if (watchdog_.joinable())
    watchdog_.join();
}

int64_t Candidate::leading_term() const {
  if (ns(Clock::now()) >= lead_until_ns_.load(std::memory_order_acquire))
    return 0;
  return lead_term_.load(std::memory_order_acquire);
}

Clock::time_point Candidate::leading_until() const {
  return Clock::time_point(std::chrono::nanoseconds(lead_until_ns_.load(std::memory_order_acquire)));
}

CandidateView Candidate::view() const {
  std::lock_guard<std::mutex> lock(mu_);
  CandidateView v = view_;
  v.leading = reported_leading_ && leading_term() != 0;
  v.term = v.leading ? lead_term_.load() : 0;
  return v;
}

void Candidate::report(bool leading, int64_t term, const std::string& why) {
  if (leading == reported_leading_)
    return;
  reported_leading_ = leading;
  ++view_.leader_changes;
  if (leading) {
    if (callbacks_.on_lead)
      callbacks_.on_lead(term);
  } else {
    lead_term_.store(0, std::memory_order_release);
    lead_until_ns_.store(0, std::memory_order_release);
    if (callbacks_.on_follow)
      callbacks_.on_follow(why);
  }
}

void Candidate::stand_down() {
  std::unique_lock<std::mutex> lock(mu_);
  if (stopping_ || !election_.campaigning())
    return;
  stand_down_ = true;
  wake_.notify_all();
  stood_down_.wait(lock, [this] { return !stand_down_ || stopping_; });
}

void Candidate::run() {
  while (true) {
    bool standing_down = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_)
        break;
      standing_down = stand_down_;
    }
    if (standing_down) {
      (void)election_.stand_down();  // best effort: otherwise the lease runs out
      std::lock_guard<std::mutex> lock(mu_);
      report(false, 0, "resigned: this head is stopping");
      stand_down_ = false;
      stood_down_.notify_all();
    }
    auto next = election_.step(Clock::now(), unix_ms());
    auto now = Clock::now();
    bool leading = election_.leading(now);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (leading) {
        // The lead's end first, then the term: leading_term() never pairs
        // a new term with an old deadline of another term.
        lead_until_ns_.store(ns(election_.leading_until()), std::memory_order_release);
        lead_term_.store(election_.term(), std::memory_order_release);
      }
      report(leading, election_.term(),
             election_.last_loss().empty() ? "another candidate leads" : election_.last_loss());
      const auto& seen = election_.holder();
      bool changed = seen.has_value() != view_.leader.has_value() ||
                     (seen && (seen->name != view_.leader->name || seen->term != view_.leader->term));
      view_.leader = seen;
      if (changed && callbacks_.on_leader_seen)
        callbacks_.on_leader_seen(seen);
      view_.problem = election_.problem();
      view_.refusal = election_.refusal();
      const auto& problem = view_.problem;
      if (callbacks_.on_problem &&
          (problem.empty() != reported_problem_.empty() ||
           (!problem.empty() && now - problem_reported_at_ >= kProblemEvery))) {
        reported_problem_ = problem;
        problem_reported_at_ = now;
        callbacks_.on_problem(problem);
      }
    }
    wake_.notify_all();  // the watchdog's deadline moved
    std::unique_lock<std::mutex> lock(mu_);
    wake_.wait_until(lock, std::max(next, now + std::chrono::milliseconds(5)),
                     [this] { return stopping_ || stand_down_; });
  }
  bool resign = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    resign = resign_ && election_.campaigning();
    report(false, 0, resign ? "resigned" : "stopped");
    stand_down_ = false;
    stood_down_.notify_all();
  }
  if (resign)
    (void)election_.resign();  // best effort: otherwise the lease runs out
}

void Candidate::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    int64_t until = lead_until_ns_.load(std::memory_order_acquire);
    if (reported_leading_ && until != 0 && ns(Clock::now()) >= until) {
      report(false, 0, "the lease was not renewed in time (etcd did not answer)");
      continue;
    }
    if (reported_leading_ && until != 0)
      wake_.wait_until(lock, Clock::time_point(std::chrono::nanoseconds(until)));
    else
      wake_.wait(lock);
  }
}

}  // namespace troupe::ha
