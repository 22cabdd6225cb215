// What a chaos run measured, the analysis of it (recovery per fault,
// classification of failed requests, invariants, goals), and its rendering as
// text or JSON.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/chaos/cluster.hpp"
#include "tools/chaos/load.hpp"
#include "tools/chaos/monitor.hpp"
#include "tools/chaos/scenario.hpp"

namespace chaos {

// One injected fault, as it happened.
struct FaultEvent {
  FaultKind kind = FaultKind::kill_replica;
  double t_s = 0;       // when the fault was injected (relative to t0)
  std::string node;     // node faults; the victim's node for kill_replica
  std::string victim;   // kill_replica: the replica id
  bool ok = false;      // the command succeeded
  std::string message;  // the command's error when !ok
  double end_s = -1;    // sigstop: SIGCONT; kill9 with restart: restart
  std::optional<double> max_recovery_s;

  // Filled by the analysis.
  std::optional<double> recovery_s;        // from `reference()` to healthy (upper bound)
  std::optional<double> recovery_lower_s;  // lower bound: start of the last poll not healthy
  std::optional<double> dead_detection_s;  // sigstop / kill9: until DEAD
  std::optional<double> replacement_s;     // sigstop: until at target elsewhere
  bool superseded = false;    // the next fault came before recovery and before the limit
  std::optional<bool> met;    // against max_recovery_s, when judged
  bool inconclusive = false;  // not met only because the polls were too slow to tell
  std::string note;
  std::string seen;                            // what the first poll after the fault saw
  std::optional<int> replicas_on_node_before;  // node faults: per the last poll before
  // sigterm_node: when the process exited (relative to t0; < 0: not seen
  // within drain delay + grace + 10 s) and its exit status.
  double exited_s = -1;
  int exit_code = -1;

  // partition / degrade: the peers, what was done, and the handle that
  // heals it; skipped: this host cannot make the fault (the run says so).
  std::vector<std::string> peers;
  std::string network_detail;
  size_t net_handle = 0;
  bool skipped = false;

  // fill_disk: the bytes written until ENOSPC; deploys accepted after that
  // (the checkpoint's log file had room left); the refusal (empty: none)
  // and whether status still answered and left the refused deploy out; the
  // deploy made after the space returned.
  size_t disk_filled_bytes = 0;
  int disk_accepted = 0;
  std::string disk_refusal;
  bool disk_reads_ok = false;
  bool disk_refused_applied = false;
  std::optional<bool> disk_after_ok;
  std::string disk_after_message;

  // poison: the request and its answer (filled once it is answered).
  std::string path;        // as sent, with the mark
  std::string marker;      // the mark's value (empty: no mark)
  bool answered = false;   // the client's call returned (answer or error)
  int status = 0;          // HTTP status; 0: no answer (`error` says why)
  std::string error;       // transport error: connect, reset, timeout
  std::string answer;      // the answer body's "error", if any
  std::string request_id;  // the answer body's "request_id", if any
  double answered_s = -1;  // when the answer (or the error) came
  // The replicas the request reached (their logs carry the marker) and
  // their nodes; victims_known: a mark was given and the logs were read.
  std::vector<std::string> victims;
  std::vector<std::string> victim_nodes;
  bool victims_known = false;
  // The proxy's query-of-death answer: 502 and a JSON body naming the request.
  bool query_of_death() const {
    return status == 502 && !request_id.empty() && answer.find("crashed") != std::string::npos;
  }

  // redeploy / rollback: the application (and, redeploy, the deployment
  // the rollout goals watch); when troupectl returned (the controller had
  // acknowledged the change: written ahead); what it printed.
  std::string app;
  std::string deployment;
  double acked_s = -1;
  std::string reply;

  // Highly available heads. kill_leader / partition_leader: `node` is the
  // head that led when it fired. The etcd faults: the members killed
  // (indices and names).
  std::vector<size_t> etcd_members;
  std::string members;
  // probe_deploy: the application the probe deploy added, whether it was
  // acknowledged and what troupectl said.
  std::string probe_app;
  std::optional<bool> probe_acked;
  std::string probe_message;
  // partition_leader: when the cut-off head, asked alone, first said that
  // it does not lead (< 0: never seen), and after the heal when it named
  // another head as leader (< 0: never seen); what it said last.
  double stepped_down_s = -1;
  // partition / partition_leader: when every rule of the cut was in place
  // (< 0: not known; the cut is then counted from t_s).
  double cut_s = -1;
  double cut_from() const { return cut_s >= 0 ? cut_s : t_s; }
  double follows_s = -1;
  std::string follower_answer;
  // Filled by the analysis: the failover (see Goals::max_failover_s) and
  // the leader that took over.
  std::optional<double> failover_s;
  std::string new_leader;

  // Where recovery is measured from: the end of a fault that lasts, the
  // acknowledgement of a redeploy or rollback (a poll started before it
  // may still see the old declaration), else the fault itself.
  double reference() const { return end_s >= 0 ? end_s : acked_s >= 0 ? acked_s : t_s; }
};

struct Check {
  std::string name;
  bool ok = false;
  std::string detail;
};

struct GoalResult {
  std::string name;
  double target = 0;
  std::optional<double> measured;
  bool met = false;
  std::string detail;
};

// One poll's view of the deployment a rollout watches, kept when it
// differs from the previous poll's (status, message, replicas and states).
struct RolloutStep {
  double t_s = 0;  // the poll's start
  std::string status;
  std::string message;
  int running = 0;
  int listed = 0;
  int64_t target = 0;
  int kept_running = 0;  // of the ids kept from before the redeploy
};

// What the status polls showed of a release under test: the first
// `redeploy` fault, the deployment it watches, and the rollback after it
// (the next `rollback` or `redeploy` fault). Filled by judge_rollout().
struct RolloutFindings {
  std::string deployment;  // "app/Deployment"
  bool redeployed = false;  // the redeploy command succeeded
  std::string redeploy_error;
  double redeploy_s = 0;
  double redeploy_acked_s = -1;
  std::optional<double> rollback_s;  // the rollback command started
  double rollback_acked_s = -1;
  bool rolled_back = false;  // the rollback command succeeded
  std::string rollback_error;

  // The last poll answered before the redeploy.
  std::optional<double> before_t_s;
  std::string before_status;
  std::string before_problem;  // why it cannot serve as the reference (empty: it can)
  std::set<std::string> kept_ids;  // RUNNING then

  // The first poll that started after the redeploy (and before the
  // rollback) and read DEPLOY_FAILED: seconds after the redeploy, message.
  std::optional<double> deploy_failed_s;
  std::string deploy_failed_message;
  // Polls answered from the reference poll to the end, and those where a
  // kept id was not RUNNING (the first such, described).
  int64_t kept_polls = 0;
  int64_t kept_polls_missing = 0;
  std::string first_missing;
  // Polls answered wholly between the redeploy's acknowledgement and the
  // rollback: how many, by the deployment's status; HEALTHY ones (first
  // described).
  int64_t between_polls = 0;
  std::map<std::string, int64_t> between_by_status;
  int64_t between_healthy = 0;
  std::string first_healthy;
  // Replica ids listed after the redeploy that were not kept: the new
  // version's starts (and any replacement of an old one) seen by the polls.
  std::set<std::string> new_ids;
  // After the rollback: seconds until a poll read HEALTHY with exactly the
  // kept ids, all RUNNING; the last answered poll's view of it.
  std::optional<double> rollback_healthy_s;
  std::optional<double> final_t_s;
  std::string final_status;
  bool final_exact = false;  // HEALTHY, listing exactly the kept ids, all RUNNING
  std::string final_detail;
  std::vector<RolloutStep> steps;
};

// Plain function over the recorded faults and polls (no cluster): the
// rollout of `faults`' first redeploy; nullopt when there is none.
std::optional<RolloutFindings> judge_rollout(const std::vector<FaultEvent>& faults,
                                             const std::vector<Observation>& observations);

struct RunData {
  Scenario scenario;
  std::string scenario_path;
  std::string command;  // the command line that produced the run
  uint32_t seed = 0;
  std::string started_utc;
  double wall_s = 0;
  std::string setup_error;  // the run could not start (cluster, deploy)
  bool interrupted = false;
  bool load_enabled = false;

  std::map<std::string, uint16_t> http_ports;
  std::vector<FaultEvent> faults;
  LoadResult load;
  std::vector<Observation> observations;
  std::optional<double> last_fault_s;    // the last fault event (incl. SIGCONT, restart)
  std::optional<double> converged_at_s;  // first healthy observation after it
  std::string convergence_detail;
  std::vector<Check> invariants;
  ShutdownResult shutdown;
  std::vector<std::string> notes;
  int poll_ms = 0;

  // Filled by analyze().
  int64_t failures_in_flight = 0;
  int64_t failures_node_unavailable = 0;
  int64_t failures_unexplained = 0;
  int64_t failures_via_unfaulted = 0;
  // poison: how the poisoned requests were answered.
  int64_t poison_sent = 0;
  int64_t poison_502 = 0;                           // query_of_death()
  int64_t poison_2xx = 0;                           // answered as if nothing crashed
  int64_t poison_no_answer = 0;                     // timeout (hung), reset, connect
  std::map<std::string, int64_t> poison_by_answer;  // "502", "503", "timeout", ...
  // Nodes never targeted by a node fault or drain that a poll saw not ALIVE:
  // id -> what the first such poll saw.
  std::map<std::string, std::string> nodes_seen_not_alive;
  int64_t polls = 0;
  int64_t polls_failed = 0;         // status or nodes unanswered
  double longest_unanswered_s = 0;  // longest stretch without a status answer
  std::optional<RolloutFindings> rollout;  // a redeploy fault: judge_rollout()
  std::vector<GoalResult> goals;
  bool ok = false;
};

// Recovery per fault, failure classes, goals and the verdict.
void analyze(RunData& run);

nlohmann::json to_json(const RunData& run);
std::string to_text(const RunData& run);

}  // namespace chaos
