// A head candidate at run time: its Election (controller/ha/election.hpp)
// stepped on a thread of its own with the real clock against etcd, and the
// moments it starts and stops leading reported to the head.
//
// Stopping to lead must not wait for etcd: a round can block in calls to an
// etcd that does not answer (each bounded by the client's timeout). A
// watchdog thread therefore ends the lead at leading_until() by the clock
// when no renewal moved it, whatever the election's thread is doing, and
// leading_term() (what the checkpoint's writes ask, controller/ha/
// etcd_checkpoint_store.hpp) is 0 from that moment on.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "controller/ha/election.hpp"

namespace troupe::ha {

struct CandidateCallbacks {
  // This candidate leads in `term`. From the candidate's threads, one call
  // at a time, alternating with on_follow; neither may call back into the
  // Candidate (they run under its lock: post to the head's actor instead).
  std::function<void(int64_t term)> on_lead;
  // It stopped leading (why).
  std::function<void(const std::string& why)> on_follow;
  // The leader it sees changed (another candidate, another term, none):
  // from the same thread, under the same rules.
  std::function<void(const std::optional<Holder>& leader)> on_leader_seen;
  // Why the candidate cannot do its work (etcd out of reach, its name
  // held, ...), when that begins, every kProblemEvery while it lasts, and
  // "" when it ends: for the log.
  std::function<void(const std::string& problem)> on_problem;
};

inline constexpr std::chrono::seconds kProblemEvery{5};

// What a candidate knows, for readiness, metrics and a follower's answer.
struct CandidateView {
  bool leading = false;
  int64_t term = 0;  // while leading
  std::optional<Holder> leader;  // who leads, as last read (none: unknown)
  std::string problem;
  std::string refusal;
  uint64_t leader_changes = 0;  // times this candidate started or stopped leading
};

// Who leads, as the head answers (leader_atom, runtime/wire.hpp), from a
// candidate's view: {"ha": true, "leading": whether this candidate leads,
// "asked": {"name", "node_id"}, "leader": {"name", "node_id", "address",
// "term", "since_unix_ms"} or null, "problem": why none is known ("" when
// one is)}.
std::string describe_leadership(const CandidateView& view, const ElectionOptions& self);

class Candidate {
 public:
  Candidate(ElectionOptions election, EtcdOptions etcd, CandidateCallbacks callbacks);
  ~Candidate();  // stop(true)
  Candidate(const Candidate&) = delete;
  Candidate& operator=(const Candidate&) = delete;

  // Stops both threads; `resign`: hands the lead over at once (the key
  // deleted, the lease revoked) instead of letting the lease run out.
  void stop(bool resign);
  // Hands the lead over at once and campaigns no more, but keeps watching
  // who leads (view(), on_leader_seen): a head that is stopping follows
  // its successor. Returns once the election's thread has resigned.
  void stand_down();

  // The term while leading by the clock, else 0. Lock-free.
  int64_t leading_term() const;
  // When the lead ends by the clock unless renewed (the past when it does
  // not lead). Lock-free.
  Clock::time_point leading_until() const;
  CandidateView view() const;

 private:
  void run();
  void watch();
  // Under mu_: reports a change of lead (on_lead / on_follow).
  void report(bool leading, int64_t term, const std::string& why);

  CandidateCallbacks callbacks_;
  EtcdElectionBackend backend_;
  Election election_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool resign_ = false;
  bool stand_down_ = false;  // asked, not done yet
  std::condition_variable stood_down_;
  bool reported_leading_ = false;
  CandidateView view_;
  std::atomic<int64_t> lead_term_{0};
  std::string reported_problem_;
  std::chrono::steady_clock::time_point problem_reported_at_{};
  std::atomic<int64_t> lead_until_ns_{0};  // steady clock
  std::thread runner_, watchdog_;
};

}  // namespace troupe::ha
