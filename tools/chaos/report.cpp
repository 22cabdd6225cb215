#include "tools/chaos/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <sstream>

namespace chaos {

using nlohmann::json;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
const char* const kPoisonAnswered = "no poisoned request hung, went unanswered or was answered 2xx";

const Observation* first_obs(const std::vector<Observation>& obs, double after_s, double before_s,
                             const std::function<bool(const Observation&)>& pred) {
  for (const auto& o : obs) {
    if (o.start_s >= after_s && o.start_s < before_s && pred(o))
      return &o;
  }
  return nullptr;
}

std::string state_of(const Observation& o, const std::string& node) {
  auto it = o.node_state.find(node);
  return it == o.node_state.end() ? "" : it->second;
}

bool probe(const Observation& o, const std::string& node, bool load_enabled) {
  if (!load_enabled)
    return true;
  auto it = o.probe_ok.find(node);
  return it != o.probe_ok.end() && it->second;
}

double percentile(std::vector<float> v, double p) {
  if (v.empty())
    return std::nan("");
  size_t k = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size()))) - 1;
  k = std::min(k, v.size() - 1);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

std::string fixed(double v, int digits = 3) {
  if (std::isnan(v))
    return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

json opt(const std::optional<double>& v) {
  return v ? json(*v) : json(nullptr);
}

// A fault after which the controller must find the node DEAD and replace
// its replicas: frozen, killed for good, or cut off from the head.
bool loses_node(const FaultEvent& f) {
  if (f.kind == FaultKind::sigstop_node || (f.kind == FaultKind::kill9_node && f.end_s < 0))
    return true;
  return f.kind == FaultKind::partition && f.node != "head" &&
         std::find(f.peers.begin(), f.peers.end(), "head") != f.peers.end();
}

// Whether the fault's replacement time and DEAD detection are judged.
bool judged_as_lost(const FaultEvent& f) {
  return f.kind == FaultKind::sigstop_node || (f.kind == FaultKind::partition && loses_node(f));
}

std::string fault_label(const FaultEvent& f) {
  std::string s = to_string(f.kind);
  if (!f.node.empty())
    s += "(" + f.node + ")";
  else if (!f.app.empty())
    s += "(" + f.app + ")";
  return s;
}

std::string join(const std::set<std::string>& ids) {
  std::string out;
  for (const auto& id : ids)
    out += (out.empty() ? "" : ", ") + id;
  return out;
}

}  // namespace

std::optional<RolloutFindings> judge_rollout(const std::vector<FaultEvent>& faults,
                                             const std::vector<Observation>& obs) {
  // The release under test and the rollback after it.
  const FaultEvent* release = nullptr;
  const FaultEvent* rollback = nullptr;
  for (const auto& f : faults) {
    if (!release) {
      if (f.kind == FaultKind::redeploy)
        release = &f;
    } else if (f.kind == FaultKind::redeploy || f.kind == FaultKind::rollback) {
      rollback = &f;
      break;
    }
  }
  if (!release)
    return std::nullopt;
  RolloutFindings r;
  r.deployment = release->app + "/" + release->deployment;
  r.redeployed = release->ok;
  r.redeploy_error = release->ok ? "" : release->message;
  r.redeploy_s = release->t_s;
  r.redeploy_acked_s = release->acked_s;
  const double until = rollback ? rollback->t_s : kInf;
  if (rollback) {
    r.rollback_s = rollback->t_s;
    r.rollback_acked_s = rollback->acked_s;
    r.rolled_back = rollback->ok;
    r.rollback_error = rollback->ok ? "" : rollback->message;
  }
  auto view = [&](const Observation& o) -> const DeploymentView* {
    auto it = o.deployments.find(r.deployment);
    return it == o.deployments.end() ? nullptr : &it->second;
  };
  auto exact = [&](const DeploymentView& v) {
    if (v.status != "HEALTHY" || v.state_of.size() != r.kept_ids.size())
      return false;
    for (const auto& [id, state] : v.state_of) {
      if (state != "RUNNING" || !r.kept_ids.count(id))
        return false;
    }
    return true;
  };

  // The reference: the last poll answered before the redeploy started.
  const Observation* before = nullptr;
  for (const auto& o : obs) {
    if (o.state_end_s > release->t_s)
      break;
    if (o.status_ok)
      before = &o;
  }
  if (!before) {
    r.before_problem = "no poll answered before the redeploy";
  } else {
    r.before_t_s = before->start_s;
    if (const auto* v = view(*before)) {
      r.before_status = v->status;
      r.kept_ids = v->running_ids();
      if (v->status != "HEALTHY" || v->running != v->target || v->total != v->target)
        r.before_problem = "before the redeploy " + r.deployment + " was " + v->status + " with " +
                           std::to_string(v->running) + " RUNNING of " +
                           std::to_string(v->total) + " listed, target " +
                           std::to_string(v->target);
      else if (r.kept_ids.empty())
        r.before_problem = "before the redeploy " + r.deployment + " had no RUNNING replica";
    } else {
      r.before_problem = "the poll before the redeploy does not list " + r.deployment;
    }
  }

  const double acked = release->acked_s >= 0 ? release->acked_s : release->t_s;
  const DeploymentView* last_view = nullptr;
  std::optional<RolloutStep> prev;
  std::set<std::string> prev_ids;
  for (const auto& o : obs) {
    if (!o.status_ok)
      continue;
    const auto* v = view(o);
    // The steps: every change the polls saw, from the reference on.
    if (before && o.start_s >= before->start_s) {
      RolloutStep step;
      step.t_s = o.start_s;
      std::set<std::string> ids;
      if (v) {
        step.status = v->status;
        step.message = v->message;
        step.running = v->running;
        step.listed = v->total;
        step.target = v->target;
        for (const auto& [id, state] : v->state_of) {
          ids.insert(id + "=" + state);
          if (state == "RUNNING" && r.kept_ids.count(id))
            ++step.kept_running;
        }
      } else {
        step.status = "(not listed)";
      }
      if (!prev || prev->status != step.status || prev->message != step.message ||
          prev_ids != ids) {
        r.steps.push_back(step);
        prev = step;
        prev_ids = ids;
      }
    }
    // The kept ids are RUNNING at every poll from the reference to the end.
    if (before && !r.kept_ids.empty() && o.start_s >= before->start_s) {
      ++r.kept_polls;
      std::string missing;
      for (const auto& id : r.kept_ids) {
        std::string state = "not listed";
        if (v) {
          auto it = v->state_of.find(id);
          if (it != v->state_of.end())
            state = it->second;
        }
        if (state != "RUNNING")
          missing += (missing.empty() ? "" : ", ") + id + " " + state;
      }
      if (!missing.empty() && ++r.kept_polls_missing == 1)
        r.first_missing = "at t=" + fixed(o.start_s, 2) + ": " + missing;
    }
    if (v && o.start_s >= release->t_s) {
      for (const auto& [id, state] : v->state_of) {
        if (!r.kept_ids.count(id))
          r.new_ids.insert(id);
      }
    }
    // DEPLOY_FAILED, read by a poll that started after the redeploy and
    // before the rollback.
    if (v && !r.deploy_failed_s && o.start_s >= release->t_s && o.start_s < until &&
        v->status == "DEPLOY_FAILED") {
      r.deploy_failed_s = o.state_end_s - release->t_s;
      r.deploy_failed_message = v->message;
    }
    // Polls answered wholly between the acknowledgement and the rollback.
    if (o.start_s >= acked && o.state_end_s <= until) {
      ++r.between_polls;
      std::string st = v ? v->status : "(not listed)";
      ++r.between_by_status[st];
      if (st == "HEALTHY" && ++r.between_healthy == 1)
        r.first_healthy = "at t=" + fixed(o.start_s, 2) + " (" + fixed(o.start_s - acked, 2) +
                          " s after the acknowledgement): " + (v ? v->message : "");
    }
    if (rollback && v && !r.rollback_healthy_s && o.start_s >= rollback->t_s &&
        !r.kept_ids.empty() && exact(*v))
      r.rollback_healthy_s = o.state_end_s - rollback->t_s;
    last_view = v;
    r.final_t_s = o.start_s;
  }
  if (!r.final_t_s) {
    r.final_detail = "no poll answered";
  } else if (!last_view) {
    r.final_detail = "the last poll does not list " + r.deployment;
  } else {
    r.final_status = last_view->status;
    r.final_exact = !r.kept_ids.empty() && exact(*last_view);
    std::set<std::string> listed;
    for (const auto& [id, state] : last_view->state_of)
      listed.insert(id + " " + state);
    r.final_detail = "last poll (t=" + fixed(*r.final_t_s, 2) + "): " + last_view->status +
                     ", listing " + join(listed);
  }
  return r;
}

namespace {

// Highly available heads: the failover of each leader fault and quorum
// loss (Goals::max_failover_s), and the goals on it and on stepping down.
void analyze_ha(RunData& run) {
  const auto& obs = run.observations;
  const auto& goals = run.scenario.goals;
  for (auto& f : run.faults) {
    f.failover_s.reset();
    f.new_leader.clear();
    if (!f.ok)
      continue;
    const bool deposed = f.kind == FaultKind::kill_leader || f.kind == FaultKind::partition_leader;
    if (!deposed && f.kind != FaultKind::etcd_quorum_loss)
      continue;
    // A quorum loss is measured from the members' restart.
    const double from = deposed ? f.t_s : f.end_s;
    if (from < 0)
      continue;
    if (const auto* o = first_obs(obs, from, kInf, [&](const Observation& x) {
          return x.status_ok && !x.leader.empty() && (!deposed || x.leader != f.node);
        })) {
      f.failover_s = o->state_end_s - from;
      f.new_leader = o->leader;
    }
  }
  auto goal = [&](const char* name, std::optional<double> target, auto measure) {
    if (!target)
      return;
    GoalResult g{name, *target, std::nullopt, true, ""};
    int counted = 0;
    for (const auto& f : run.faults) {
      std::optional<std::optional<double>> v = measure(f);
      if (!f.ok || !v)
        continue;
      ++counted;
      g.measured = std::max(g.measured.value_or(0), v->value_or(kInf));
      if (!*v || **v > *target)
        g.met = false;
    }
    if (counted == 0) {
      g.met = false;
      g.detail = "no fault to measure it on";
    }
    run.goals.push_back(g);
  };
  using Measured = std::optional<std::optional<double>>;
  goal("max_failover_s", goals.max_failover_s, [](const FaultEvent& f) -> Measured {
    if (f.kind != FaultKind::kill_leader && f.kind != FaultKind::partition_leader &&
        f.kind != FaultKind::etcd_quorum_loss)
      return std::nullopt;
    return f.failover_s;
  });
  goal("max_step_down_s", goals.max_step_down_s, [](const FaultEvent& f) -> Measured {
    if (f.kind != FaultKind::partition_leader)
      return std::nullopt;
    return f.stepped_down_s >= 0 ? std::optional<double>(f.stepped_down_s - f.cut_from())
                                 : std::optional<double>();
  });
}

}  // namespace

void analyze(RunData& run) {
  const auto& obs = run.observations;
  const auto& goals = run.scenario.goals;

  // Recovery per fault.
  for (size_t i = 0; i < run.faults.size(); ++i) {
    auto& f = run.faults[i];
    // What an earlier analysis of the same run found is found again.
    f.recovery_s.reset();
    f.recovery_lower_s.reset();
    f.dead_detection_s.reset();
    f.replacement_s.reset();
    f.superseded = false;
    f.met.reset();
    f.inconclusive = false;
    f.note.clear();
    f.seen.clear();
    double next_t = i + 1 < run.faults.size() ? run.faults[i + 1].t_s : kInf;
    double ref = f.reference();
    std::function<bool(const Observation&)> cond;
    switch (f.kind) {
      case FaultKind::kill_replica:
        cond = [&](const Observation& o) { return o.healthy() && !o.replica_ids.count(f.victim); };
        break;
      case FaultKind::kill_controller:
      case FaultKind::fill_disk:
      case FaultKind::redeploy:
      case FaultKind::rollback:
      case FaultKind::kill_etcd_member:
      case FaultKind::etcd_quorum_loss:
        cond = [&](const Observation& o) { return o.healthy(); };
        break;
      case FaultKind::kill_proxy:
        cond = [&](const Observation& o) {
          return o.healthy() && probe(o, f.node, run.load_enabled);
        };
        break;
      case FaultKind::kill_agent:
        cond = [&](const Observation& o) { return o.healthy() && state_of(o, f.node) == "ALIVE"; };
        break;
      case FaultKind::kill9_node:
      case FaultKind::kill_leader:
        if (f.end_s >= 0) {
          cond = [&](const Observation& o) {
            return o.healthy() && state_of(o, f.node) == "ALIVE" &&
                   probe(o, f.node, run.load_enabled);
          };
        } else {
          cond = [&](const Observation& o) { return o.healthy() && state_of(o, f.node) == "DEAD"; };
        }
        break;
      case FaultKind::sigstop_node:
        cond = [&](const Observation& o) {
          return o.healthy() && state_of(o, f.node) == "ALIVE" &&
                 probe(o, f.node, run.load_enabled);
        };
        break;
      case FaultKind::partition:
      case FaultKind::degrade:
      case FaultKind::partition_leader:
        cond = [&](const Observation& o) {
          if (!o.healthy())
            return false;
          for (const auto& p : f.peers) {
            if (state_of(o, p) != "ALIVE")
              return false;
          }
          return state_of(o, f.node) == "ALIVE" &&
                 (f.kind == FaultKind::degrade || probe(o, f.node, run.load_enabled));
        };
        break;
      case FaultKind::sigterm_node:
        // The node left: healthy, and it is no longer listed.
        cond = [&](const Observation& o) { return o.healthy() && state_of(o, f.node).empty(); };
        break;
      case FaultKind::drain_node:
        cond = [&](const Observation& o) {
          auto it = o.replicas_per_node.find(f.node);
          return o.healthy() && state_of(o, f.node) == "DRAINING" &&
                 (it == o.replicas_per_node.end() || it->second == 0);
        };
        break;
      case FaultKind::poison:
        // The replicas it crashed are gone and replaced. Without known
        // victims only "healthy" can be told, which a poll before the
        // crash also sees (`seen` says so).
        cond = [&](const Observation& o) {
          if (!o.healthy())
            return false;
          for (const auto& v : f.victims) {
            if (o.replica_ids.count(v))
              return false;
          }
          return true;
        };
        break;
    }
    if (!f.ok) {
      f.note = (f.skipped ? "SKIPPED: " : "the fault was not injected: ") + f.message;
      continue;
    }
    // Recovery is read when the part of the poll it depends on answered.
    bool uses_probe =
        run.load_enabled &&
        (f.kind == FaultKind::kill_proxy || f.kind == FaultKind::kill9_node ||
         f.kind == FaultKind::sigstop_node || f.kind == FaultKind::partition ||
         f.kind == FaultKind::kill_leader || f.kind == FaultKind::partition_leader);
    // Rounds overlap: the recovery is proven by the round that saw it and
    // answered first, which need not be the first to start (one that met
    // the restarting controller can answer after rounds started later).
    auto answered = [&](const Observation& x) { return uses_probe ? x.end_s : x.state_end_s; };
    const Observation* o = nullptr;
    for (const auto& x : obs) {
      if (x.start_s >= ref && cond(x) && (!o || answered(x) < answered(*o)))
        o = &x;
    }
    if (o) {
      f.recovery_s = answered(*o) - ref;
      // Lower bound: the last poll after the fault, started before that
      // one, that did not see the recovery saw the state at or after its
      // start.
      f.recovery_lower_s = 0;
      for (const auto& x : obs) {
        if (x.start_s >= o->start_s)
          break;
        if (x.start_s >= ref && !cond(x))
          f.recovery_lower_s = x.start_s - ref;
      }
    }
    // The node's replicas just before the fault (last poll that ended before).
    if (!f.node.empty() && (node_scoped(f.kind) || f.kind == FaultKind::sigterm_node)) {
      for (const auto& o : obs) {
        if (o.end_s > f.t_s)
          break;
        auto it = o.replicas_per_node.find(f.node);
        f.replicas_on_node_before = it == o.replicas_per_node.end() ? 0 : it->second;
      }
    }
    // What the first poll after the fault saw: evidence that the fault took
    // effect (a recovery measured without ever seeing it is suspect).
    if (const auto* o = first_obs(obs, ref, kInf, [](const Observation&) { return true; })) {
      if (cond(*o))
        f.seen = "already recovered at the first poll after it (" +
                 fixed((uses_probe ? o->end_s : o->state_end_s) - o->start_s, 3) + " s long)";
      else
        f.seen = o->healthy() ? "first poll after it: healthy but condition not yet met"
                              : "first poll after it: " + o->unhealthy_reason();
    }
    if (loses_node(f)) {
      double until = f.end_s >= 0 ? f.end_s : kInf;
      if (const auto* o = first_obs(obs, f.t_s, until, [&](const Observation& x) {
            return state_of(x, f.node) == "DEAD";
          }))
        f.dead_detection_s = o->state_end_s - f.t_s;
      if (judged_as_lost(f)) {
        if (const auto* o = first_obs(obs, f.t_s, until, [&](const Observation& x) {
              return x.healthy() && state_of(x, f.node) == "DEAD";
            }))
          f.replacement_s = o->state_end_s - f.t_s;
      }
    }
    auto limit = f.max_recovery_s ? f.max_recovery_s : goals.max_recovery_s;
    if (limit) {
      double gap = next_t - ref;
      if (f.recovery_s && *f.recovery_s <= *limit) {
        f.met = true;
      } else if (gap < *limit && (!f.recovery_s || ref + *f.recovery_s > next_t)) {
        f.superseded = true;
        f.note = "the next fault came " + fixed(gap, 2) + " s later, before recovery";
      } else if (f.recovery_s && f.recovery_lower_s && *f.recovery_lower_s <= *limit) {
        // Recovered somewhere between the bounds, which straddle the limit:
        // the polls were too slow to tell. Not met (not proven), but said so.
        f.met = false;
        f.inconclusive = true;
        f.note = "inconclusive: recovered between " + fixed(*f.recovery_lower_s, 3) + " and " +
                 fixed(*f.recovery_s, 3) + " s; the polls were too far apart to tell";
      } else {
        f.met = false;
      }
    }
    if (!f.recovery_s && f.note.empty())
      f.note = "never healthy again while observed";
  }

  // Failed requests: in flight at a node fault, sent while a node was down or
  // frozen, or unexplained.
  struct Interval {
    std::string node;
    double from, to;
  };
  std::vector<Interval> unavailable;
  std::vector<std::pair<std::string, double>> hits;  // node faults: node, time
  std::set<std::string> faulted_nodes;
  for (const auto& f : run.faults) {
    if (!f.ok || !node_scoped(f.kind))
      continue;
    faulted_nodes.insert(f.node);
    hits.emplace_back(f.node, f.t_s);
    if (f.kind == FaultKind::sigstop_node || f.kind == FaultKind::partition ||
        f.kind == FaultKind::partition_leader)
      unavailable.push_back({f.node, f.t_s, f.end_s >= 0 ? f.end_s : kInf});
    if (f.kind == FaultKind::kill9_node || f.kind == FaultKind::kill_leader) {
      double to = kInf;
      if (f.end_s >= 0) {
        const auto* o = first_obs(obs, f.end_s, kInf, [&](const Observation& x) {
          return state_of(x, f.node) == "ALIVE" && probe(x, f.node, run.load_enabled);
        });
        to = o ? o->end_s : kInf;
      }
      unavailable.push_back({f.node, f.t_s, to});
    }
  }
  for (const auto& r : run.load.failures) {
    if (!faulted_nodes.count(r.node))
      ++run.failures_via_unfaulted;
    bool in_flight = false;
    for (const auto& [node, t] : hits) {
      if (node == r.node && r.start_s <= t && r.end_s >= t - 0.05)
        in_flight = true;
    }
    bool down = false;
    for (const auto& iv : unavailable) {
      if (iv.node == r.node && r.start_s <= iv.to && r.end_s >= iv.from)
        down = true;
    }
    if (in_flight)
      ++run.failures_in_flight;
    else if (down)
      ++run.failures_node_unavailable;
    else
      ++run.failures_unexplained;
  }
  // Failures beyond the recorded ones cannot be classified: count them as
  // unexplained rather than lose them.
  run.failures_unexplained += run.load.failures_not_recorded;

  // Poisoned requests: how they were answered.
  run.poison_sent = run.poison_502 = run.poison_2xx = run.poison_no_answer = 0;
  run.poison_by_answer.clear();
  std::string poison_bad;  // the first few that hung or were answered 2xx
  int poison_bad_count = 0;
  for (const auto& f : run.faults) {
    if (f.kind != FaultKind::poison || !f.ok)
      continue;
    ++run.poison_sent;
    std::string what = !f.answered     ? "unanswered"
                       : f.status != 0 ? std::to_string(f.status)
                                       : f.error;
    ++run.poison_by_answer[what];
    if (f.query_of_death())
      ++run.poison_502;
    bool bad = false;
    if (f.answered && f.status >= 200 && f.status < 300) {
      ++run.poison_2xx;
      bad = true;
    }
    if (!f.answered || f.status == 0) {
      ++run.poison_no_answer;
      bad = true;
    }
    if (bad && ++poison_bad_count <= 5)
      poison_bad += f.path + " at t=" + fixed(f.t_s, 2) + " via " + f.node + ": " + what + "; ";
  }
  run.invariants.erase(std::remove_if(run.invariants.begin(), run.invariants.end(),
                                      [](const Check& c) { return c.name == kPoisonAnswered; }),
                       run.invariants.end());
  if (run.poison_sent > 0) {
    Check c{kPoisonAnswered, poison_bad_count == 0, ""};
    if (c.ok) {
      c.detail = std::to_string(run.poison_sent) + " sent, every one answered with an error status";
    } else {
      c.detail = std::to_string(run.poison_no_answer) +
                 " without an answer (hung, reset or refused), " + std::to_string(run.poison_2xx) +
                 " answered 2xx, of " + std::to_string(run.poison_sent) + ": " + poison_bad;
    }
    run.invariants.push_back(c);
  }

  // Nodes that nothing targeted must stay ALIVE; every poll must be answered.
  std::set<std::string> targeted;
  for (const auto& f : run.faults) {
    if (f.ok && (node_scoped(f.kind) || f.kind == FaultKind::drain_node ||
                 f.kind == FaultKind::sigterm_node))
      targeted.insert(f.node);
    if (f.ok && network_fault(f.kind))  // its peers are cut off too
      targeted.insert(f.peers.begin(), f.peers.end());
  }
  run.nodes_seen_not_alive.clear();
  run.polls = run.polls_failed = 0;
  run.longest_unanswered_s = 0;
  std::optional<double> last_answer;
  for (const auto& o : obs) {
    ++run.polls;
    if (!o.status_ok || !o.nodes_ok)
      ++run.polls_failed;
    if (o.status_ok) {
      double from = last_answer.value_or(0);
      run.longest_unanswered_s = std::max(run.longest_unanswered_s, o.state_end_s - from);
      last_answer = o.state_end_s;
    }
    if (!o.nodes_ok)
      continue;
    for (const auto& [id, port] : run.http_ports) {
      if (targeted.count(id) || run.nodes_seen_not_alive.count(id))
        continue;
      auto st = state_of(o, id);
      if (st != "ALIVE")
        run.nodes_seen_not_alive[id] =
            (st.empty() ? std::string("not listed") : st) + " at t=" + fixed(o.start_s, 2);
    }
  }

  // Goals.
  run.goals.clear();
  if (goals.min_success_ratio) {
    GoalResult g{"min_success_ratio", *goals.min_success_ratio, std::nullopt, false, ""};
    int64_t total = run.load.ok + run.load.failed;
    if (total > 0) {
      g.measured = static_cast<double>(run.load.ok) / static_cast<double>(total);
      g.met = *g.measured >= *goals.min_success_ratio;
      g.detail = std::to_string(run.load.ok) + " of " + std::to_string(total) + " succeeded";
    } else {
      g.detail = "no request was made";
    }
    run.goals.push_back(g);
  }
  if (goals.max_recovery_s ||
      std::any_of(run.faults.begin(), run.faults.end(),
                  [](const FaultEvent& f) { return f.max_recovery_s.has_value(); })) {
    GoalResult g{"max_recovery_s", goals.max_recovery_s.value_or(0), std::nullopt, true, ""};
    int judged = 0, failed = 0, superseded = 0, inconclusive = 0;
    for (const auto& f : run.faults) {
      if (f.superseded)
        ++superseded;
      if (f.inconclusive)
        ++inconclusive;
      if (!f.met)
        continue;
      ++judged;
      if (!*f.met)
        ++failed;
      if (f.recovery_s)
        g.measured = std::max(g.measured.value_or(0), *f.recovery_s);
      else
        g.measured = kInf;
    }
    g.met = failed == 0 && judged > 0;
    g.detail = std::to_string(judged - failed) + " of " + std::to_string(judged) +
               " judged faults recovered in time; " + std::to_string(superseded) +
               " superseded by the next fault (not judged)";
    if (inconclusive)
      g.detail += "; " + std::to_string(inconclusive) +
                  " of the late ones inconclusive (bounds straddle the limit: polls too slow)";
    if (judged == 0)
      g.detail += "; no fault could be judged";
    run.goals.push_back(g);
  }
  if (goals.max_final_recovery_s) {
    GoalResult g{"max_final_recovery_s", *goals.max_final_recovery_s, std::nullopt, false, ""};
    if (run.converged_at_s && run.last_fault_s) {
      g.measured = *run.converged_at_s - *run.last_fault_s;
      g.met = *g.measured <= g.target;
    } else {
      g.detail = run.last_fault_s ? "never converged" : "no fault was injected";
    }
    run.goals.push_back(g);
  }
  auto per_fault_goal = [&](const char* name, std::optional<double> target,
                            std::optional<double> FaultEvent::*field) {
    if (!target)
      return;
    GoalResult g{name, *target, std::nullopt, true, ""};
    int counted = 0;
    for (const auto& f : run.faults) {
      if (!f.ok || !judged_as_lost(f))
        continue;
      ++counted;
      auto v = f.*field;
      g.measured = std::max(g.measured.value_or(0), v.value_or(kInf));
      if (!v || *v > *target)
        g.met = false;
    }
    if (counted == 0) {
      g.met = false;
      g.detail = "no sigstop_node fault, or partition from the head, to measure";
    }
    run.goals.push_back(g);
  };
  per_fault_goal("max_dead_detection_s", goals.max_dead_detection_s, &FaultEvent::dead_detection_s);
  per_fault_goal("max_replacement_s", goals.max_replacement_s, &FaultEvent::replacement_s);
  if (goals.max_dead_transitions_per_fault) {
    // Per node: polls that saw it turn DEAD, against the faults that
    // involved it (as the node hit, or as a peer of a network fault).
    GoalResult g{"max_dead_transitions_per_fault",
                 static_cast<double>(*goals.max_dead_transitions_per_fault), 0.0, true, ""};
    std::map<std::string, int> involved;
    for (const auto& f : run.faults) {
      if (!f.ok || f.node.empty())
        continue;
      ++involved[f.node];
      if (network_fault(f.kind)) {
        for (const auto& p : f.peers)
          ++involved[p];
      }
    }
    // A node's readings are counted as turns to DEAD only where their order
    // is certain: the head answered a call somewhere between the call's
    // start and its end, and the calls of consecutive rounds overlap when
    // one waits (a round that waited out its timeout, or a slow troupectl
    // start on a loaded machine). So a DEAD reading is a new turn only if its
    // call began after the call that read the node not DEAD had ended, and
    // that one after the end of the DEAD reading before it. Taken in the
    // order of their ends, the earliest-ending reading of each state is the
    // anchor: this counts the most turns the readings prove, never one the
    // controller did not make (a round that read DEAD just before a
    // re-registration but ended after the next round read ALIVE).
    struct Turns {
      bool any = false;        // a reading seen
      bool dead = false;       // the state of the anchor
      double anchor_end = 0;   // when the anchor's call ended
      int count = 0;
    };
    std::map<std::string, Turns> turns;
    std::vector<const Observation*> read;
    for (const auto& o : obs) {
      if (o.nodes_ok)
        read.push_back(&o);
    }
    std::stable_sort(read.begin(), read.end(), [](const Observation* a, const Observation* b) {
      return a->state_end_s < b->state_end_s;
    });
    for (const auto* op : read) {
      const auto& o = *op;
      double began = std::max(o.start_s, o.nodes_start_s);
      for (const auto& [id, st] : o.node_state) {
        auto& t = turns[id];
        bool dead = st == "DEAD";
        if (!t.any) {
          t = {true, dead, o.state_end_s, 0};
          continue;
        }
        if (dead == t.dead || began <= t.anchor_end)
          continue;
        if (dead)
          ++t.count;
        t.dead = dead;
        t.anchor_end = o.state_end_s;
      }
    }
    for (const auto& [id, port] : run.http_ports) {
      int n = turns[id].count;
      int allowed = static_cast<int>(*goals.max_dead_transitions_per_fault) * involved[id];
      g.measured = std::max(*g.measured, involved[id] ? static_cast<double>(n) / involved[id]
                                                      : static_cast<double>(n > 0 ? kInf : 0));
      if (n > allowed)
        g.met = false;
      g.detail += id + " turned DEAD " + std::to_string(n) + " times, " +
                  std::to_string(involved[id]) + " faults involved it; ";
    }
    if (run.polls == run.polls_failed) {
      g.met = false;
      g.detail += "no poll answered";
    }
    run.goals.push_back(g);
  }
  if (goals.max_replicas_above_surge) {
    // At every poll: replicas kept (listed and not STOPPING) on nodes not
    // DEAD, per deployment, against target + rollout surge (max(target / 5,
    // 1)). A surplus already being stopped is the convergence itself.
    GoalResult g{"max_replicas_above_surge", static_cast<double>(*goals.max_replicas_above_surge),
                 0.0, true, ""};
    int64_t worst = std::numeric_limits<int64_t>::min();
    std::string where;
    int counted = 0;
    for (const auto& o : obs) {
      if (!o.status_ok || !o.nodes_ok)
        continue;
      ++counted;
      for (const auto& [name, d] : o.deployments) {
        int64_t live = 0;
        for (const auto& [node, n] : d.kept_on) {
          if (state_of(o, node) != "DEAD")
            live += n;
        }
        int64_t over = live - (d.target + std::max<int64_t>(d.target / 5, 1));
        if (over > worst) {
          worst = over;
          where = name + " kept " + std::to_string(live) + " on live nodes at t=" +
                  fixed(o.start_s, 2) + ", target " + std::to_string(d.target);
        }
      }
    }
    g.measured = counted ? static_cast<double>(worst) : kInf;
    g.met = counted > 0 && worst <= *goals.max_replicas_above_surge;
    g.detail = counted ? "most over target + surge: " + where : "no poll answered";
    run.goals.push_back(g);
  }
  if (goals.replicas_unchanged) {
    // Against the last poll answered before the first fault.
    GoalResult g{"replicas_unchanged", 0, 0.0, false, ""};
    double first = kInf;
    for (const auto& f : run.faults) {
      if (f.ok)
        first = std::min(first, f.t_s);
    }
    const Observation* base = nullptr;
    for (const auto& o : obs) {
      if (o.status_ok && o.state_end_s < first)
        base = &o;
    }
    if (first == kInf) {
      g.detail = "no fault was injected";
    } else if (!base || !base->healthy()) {
      g.detail =
          base ? "the last poll before the first fault was not healthy: " + base->unhealthy_reason()
               : "no poll answered before the first fault";
    } else {
      int differing = 0;
      const Observation* last = nullptr;
      for (const auto& o : obs) {
        if (!o.status_ok || o.start_s <= base->start_s)
          continue;
        last = &o;
        if (o.replica_ids == base->replica_ids)
          continue;
        if (differing++ == 0) {
          std::string started, gone;
          for (const auto& id : o.replica_ids)
            started += base->replica_ids.count(id) ? "" : " " + id;
          for (const auto& id : base->replica_ids)
            gone += o.replica_ids.count(id) ? "" : " " + id;
          g.detail = "first at t=" + fixed(o.start_s, 2) +
                     (started.empty() ? "" : ": new" + started) +
                     (gone.empty() ? "" : ": gone" + gone) + "; ";
        }
      }
      g.measured = static_cast<double>(differing);
      bool all_running = last != nullptr;
      if (last) {
        for (const auto& [name, d] : last->deployments) {
          for (const auto& [id, st] : d.state_of)
            all_running = all_running && st == "RUNNING";
        }
      }
      g.met = differing == 0 && all_running;
      g.detail += std::to_string(differing) + " polls listed other replicas than the " +
                  std::to_string(base->replica_ids.size()) + " before the first fault" +
                  (!last         ? "; no poll answered after it"
                   : all_running ? "; all RUNNING at the last poll"
                                 : "; not all RUNNING at the last poll");
    }
    run.goals.push_back(g);
  }
  if (!goals.seen_unreachable.empty()) {
    GoalResult g{"seen_unreachable", static_cast<double>(goals.seen_unreachable.size()), 0.0, false,
                 ""};
    int seen = 0;
    for (const auto& id : goals.seen_unreachable) {
      std::optional<double> at;
      for (const auto& o : obs) {
        if (o.nodes_ok && state_of(o, id) == "UNREACHABLE") {
          at = o.start_s;
          break;
        }
      }
      seen += at ? 1 : 0;
      g.detail += id + (at ? " UNREACHABLE at t=" + fixed(*at, 2) : " never UNREACHABLE") + "; ";
    }
    g.measured = static_cast<double>(seen);
    g.met = seen == static_cast<int>(goals.seen_unreachable.size());
    run.goals.push_back(g);
  }
  if (goals.max_failures_via_unfaulted_nodes) {
    GoalResult g{"max_failures_via_unfaulted_nodes",
                 static_cast<double>(*goals.max_failures_via_unfaulted_nodes),
                 static_cast<double>(run.failures_via_unfaulted), false, ""};
    g.met =
        run.failures_via_unfaulted <= *goals.max_failures_via_unfaulted_nodes && run.load.ok > 0;
    run.goals.push_back(g);
  }
  if (goals.max_unexplained_failures) {
    GoalResult g{"max_unexplained_failures", static_cast<double>(*goals.max_unexplained_failures),
                 static_cast<double>(run.failures_unexplained), false, ""};
    g.met = run.failures_unexplained <= *goals.max_unexplained_failures && run.load.ok > 0;
    run.goals.push_back(g);
  }

  if (goals.min_poison_502_ratio) {
    GoalResult g{"min_poison_502_ratio", *goals.min_poison_502_ratio, std::nullopt, false, ""};
    if (run.poison_sent > 0) {
      g.measured = static_cast<double>(run.poison_502) / static_cast<double>(run.poison_sent);
      g.met = *g.measured >= g.target;
      g.detail = std::to_string(run.poison_502) + " of " + std::to_string(run.poison_sent) +
                 " answered 502 naming the request; answers:";
      for (const auto& [what, n] : run.poison_by_answer)
        g.detail += " " + what + "=" + std::to_string(n);
    } else {
      g.detail = "no poisoned request was sent";
    }
    run.goals.push_back(g);
  }
  if (goals.max_nodes_seen_not_alive) {
    GoalResult g{"max_nodes_seen_not_alive", static_cast<double>(*goals.max_nodes_seen_not_alive),
                 static_cast<double>(run.nodes_seen_not_alive.size()), false, ""};
    g.met =
        static_cast<int64_t>(run.nodes_seen_not_alive.size()) <= *goals.max_nodes_seen_not_alive &&
        run.polls > run.polls_failed;
    for (const auto& [id, what] : run.nodes_seen_not_alive)
      g.detail += id + " " + what + "; ";
    if (run.nodes_seen_not_alive.empty())
      g.detail = "every node nothing targeted was ALIVE in every answered poll (" +
                 std::to_string(run.polls - run.polls_failed) + ")";
    run.goals.push_back(g);
  }
  if (goals.max_status_gap_s) {
    GoalResult g{"max_status_gap_s", *goals.max_status_gap_s, run.longest_unanswered_s, false, ""};
    g.met = run.polls > run.polls_failed && run.longest_unanswered_s <= g.target;
    g.detail = "longest between two status answers; " + std::to_string(run.polls_failed) + " of " +
               std::to_string(run.polls) + " polls without an answer to status or nodes";
    run.goals.push_back(g);
  }
  if (goals.max_failed_status_polls) {
    GoalResult g{"max_failed_status_polls", static_cast<double>(*goals.max_failed_status_polls),
                 static_cast<double>(run.polls_failed), false, ""};
    g.met = run.polls_failed <= *goals.max_failed_status_polls && run.polls > 0;
    g.detail = std::to_string(run.polls_failed) + " of " + std::to_string(run.polls) +
               " polls without an answer to status or nodes; longest between two status "
               "answers " +
               fixed(run.longest_unanswered_s, 3) + " s";
    for (const auto& o : obs) {
      if (!o.status_ok || !o.nodes_ok) {
        g.detail += "; first at t=" + fixed(o.start_s, 2) + ": " +
                    (o.status_ok ? o.nodes_error : o.status_error);
        break;
      }
    }
    run.goals.push_back(g);
  }

  // The rollout goals: the release under test (the first redeploy).
  run.rollout = judge_rollout(run.faults, obs);
  const bool rollout_goals = goals.deploy_failed_within_s || !goals.deploy_failed_message.empty() ||
                             goals.replicas_kept || goals.no_healthy_until_rollback ||
                             goals.rollback_healthy_within_s;
  if (rollout_goals) {
    const RolloutFindings* ro = run.rollout ? &*run.rollout : nullptr;
    // Why nothing can be judged (empty: it can).
    std::string unjudged = !ro              ? "no redeploy fault was made"
                           : !ro->redeployed ? "the redeploy failed: " + ro->redeploy_error
                                             : "";
    if (goals.deploy_failed_within_s) {
      GoalResult g{"deploy_failed_within_s", *goals.deploy_failed_within_s, std::nullopt, false,
                   unjudged};
      if (unjudged.empty()) {
        g.measured = ro->deploy_failed_s.value_or(kInf);
        g.met = ro->deploy_failed_s && *ro->deploy_failed_s <= g.target;
        g.detail = ro->deploy_failed_s
                       ? ro->deployment + " read DEPLOY_FAILED " +
                             fixed(*ro->deploy_failed_s, 3) + " s after the redeploy"
                       : "no poll after the redeploy" +
                             std::string(ro->rollback_s ? " and before the rollback" : "") +
                             " read " + ro->deployment + " DEPLOY_FAILED";
      }
      run.goals.push_back(g);
    }
    if (!goals.deploy_failed_message.empty()) {
      // Target: every text; measured: the texts the first DEPLOY_FAILED
      // poll's message contains.
      const auto& texts = goals.deploy_failed_message;
      GoalResult g{"deploy_failed_message", static_cast<double>(texts.size()), std::nullopt, false,
                   unjudged};
      if (unjudged.empty() && !ro->deploy_failed_s) {
        g.measured = 0;
        g.detail = "never read DEPLOY_FAILED: no message to look for the texts in";
      } else if (unjudged.empty()) {
        int found = 0;
        std::string missing;
        for (const auto& t : texts) {
          if (ro->deploy_failed_message.find(t) != std::string::npos)
            ++found;
          else
            missing += (missing.empty() ? "" : ", ") + std::string("\"") + t + "\"";
        }
        g.measured = found;
        g.met = found == static_cast<int>(texts.size());
        g.detail = (g.met ? std::string("contains every text") : "does NOT contain " + missing) +
                   "; the message: " + ro->deploy_failed_message;
      }
      run.goals.push_back(g);
    }
    if (goals.replicas_kept) {
      // Measured: polls at which a kept id was not RUNNING.
      GoalResult g{"replicas_kept", 0, std::nullopt, false, unjudged};
      if (unjudged.empty()) {
        if (!ro->before_problem.empty()) {
          g.detail = ro->before_problem;
        } else {
          g.measured = static_cast<double>(ro->kept_polls_missing);
          g.met = ro->kept_polls_missing == 0;
          g.detail = std::to_string(ro->kept_ids.size()) + " ids RUNNING before the redeploy (" +
                     join(ro->kept_ids) + "); " + std::to_string(ro->kept_polls_missing) + " of " +
                     std::to_string(ro->kept_polls) + " polls to the end missed one";
          if (!ro->first_missing.empty())
            g.detail += ", first " + ro->first_missing;
          if (ro->rollback_s) {
            g.met = g.met && ro->final_exact;
            g.detail += std::string("; after the rollback, ") +
                        (ro->final_exact ? "HEALTHY with exactly those ids, all RUNNING"
                                         : "NOT HEALTHY with exactly those ids") +
                        " at the " + ro->final_detail;
          }
        }
      }
      run.goals.push_back(g);
    }
    if (goals.no_healthy_until_rollback) {
      // Measured: polls reading HEALTHY between acknowledgement and rollback.
      GoalResult g{"no_healthy_until_rollback", 0, std::nullopt, false, unjudged};
      if (unjudged.empty()) {
        g.measured = static_cast<double>(ro->between_healthy);
        g.met = ro->between_polls > 0 && ro->between_healthy == 0;
        g.detail = std::to_string(ro->between_healthy) + " of " +
                   std::to_string(ro->between_polls) + " polls between the redeploy's " +
                   "acknowledgement and the " + (ro->rollback_s ? "rollback" : "end") +
                   " read HEALTHY; by status:";
        for (const auto& [st, n] : ro->between_by_status)
          g.detail += " " + st + "=" + std::to_string(n);
        if (!ro->first_healthy.empty())
          g.detail += "; first " + ro->first_healthy;
        if (ro->between_polls == 0)
          g.detail += " (no poll to judge)";
      }
      run.goals.push_back(g);
    }
    if (goals.rollback_healthy_within_s) {
      GoalResult g{"rollback_healthy_within_s", *goals.rollback_healthy_within_s, std::nullopt,
                   false, unjudged};
      if (unjudged.empty()) {
        if (!ro->rollback_s) {
          g.detail = "no rollback was made";
        } else if (!ro->rolled_back) {
          g.detail = "the rollback failed: " + ro->rollback_error;
        } else if (!ro->before_problem.empty()) {
          g.detail = ro->before_problem;
        } else {
          g.measured = ro->rollback_healthy_s.value_or(kInf);
          g.met = ro->rollback_healthy_s && *ro->rollback_healthy_s <= g.target;
          g.detail = ro->rollback_healthy_s
                         ? "HEALTHY with exactly the kept ids " +
                               fixed(*ro->rollback_healthy_s, 3) + " s after the rollback"
                         : "never HEALTHY with exactly the kept ids after the rollback; " +
                               ro->final_detail;
        }
      }
      run.goals.push_back(g);
    }
  }
  analyze_ha(run);

  run.ok = run.setup_error.empty() && !run.interrupted;
  for (const auto& c : run.invariants)
    run.ok = run.ok && c.ok;
  for (const auto& g : run.goals)
    run.ok = run.ok && g.met;
}

json to_json(const RunData& run) {
  json j;
  j["scenario"] = run.scenario.name;
  j["scenario_file"] = run.scenario_path;
  j["command"] = run.command;
  j["seed"] = run.seed;
  j["started_utc"] = run.started_utc;
  j["wall_s"] = run.wall_s;
  j["ok"] = run.ok;
  j["setup_error"] = run.setup_error;
  j["interrupted"] = run.interrupted;
  j["poll_interval_ms"] = run.poll_ms;
  j["nodes"] = json::object();
  for (const auto& [id, port] : run.http_ports)
    j["nodes"][id] = {{"http_port", port}};

  json load;
  load["enabled"] = run.load_enabled;
  load["ok"] = run.load.ok;
  load["failed"] = run.load.failed;
  int64_t total = run.load.ok + run.load.failed;
  load["success_ratio"] = total ? json(static_cast<double>(run.load.ok) / total) : json(nullptr);
  load["late_sends"] = run.load.late_sends;
  load["per_node"] = json::object();
  for (const auto& [node, s] : run.load.per_node)
    load["per_node"][node] = {{"ok", s.ok}, {"failed", s.failed}};
  std::map<std::string, int64_t> codes;
  std::vector<float> all;
  json seconds = json::array();
  for (size_t i = 0; i < run.load.seconds.size(); ++i) {
    const auto& b = run.load.seconds[i];
    json row{{"t", i}, {"ok", b.ok}, {"failures", b.failures}};
    double p50 = percentile(b.latencies_ms, 0.5), p99 = percentile(b.latencies_ms, 0.99);
    row["p50_ms"] = std::isnan(p50) ? json(nullptr) : json(p50);
    row["p99_ms"] = std::isnan(p99) ? json(nullptr) : json(p99);
    json fired = json::array();
    for (const auto& f : run.faults) {
      if (f.t_s >= static_cast<double>(i) && f.t_s < static_cast<double>(i + 1))
        fired.push_back(fault_label(f));
    }
    row["faults"] = fired;
    seconds.push_back(row);
    for (const auto& [c, n] : b.failures)
      codes[c] += n;
    all.insert(all.end(), b.latencies_ms.begin(), b.latencies_ms.end());
  }
  load["failures_by_code"] = codes;
  double p50 = percentile(all, 0.5), p99 = percentile(all, 0.99);
  load["p50_ms"] = std::isnan(p50) ? json(nullptr) : json(p50);
  load["p99_ms"] = std::isnan(p99) ? json(nullptr) : json(p99);
  load["failure_classes"] = {{"in_flight_at_node_fault", run.failures_in_flight},
                             {"node_down_or_frozen", run.failures_node_unavailable},
                             {"unexplained", run.failures_unexplained},
                             {"via_unfaulted_nodes", run.failures_via_unfaulted}};
  load["seconds"] = seconds;
  j["load"] = load;

  json faults = json::array();
  for (const auto& f : run.faults) {
    json row{{"action", to_string(f.kind)},
             {"t_s", f.t_s},
             {"node", f.node},
             {"victim", f.victim},
             {"injected", f.ok},
             {"recovery_s", opt(f.recovery_s)},
             {"recovery_lower_s", opt(f.recovery_lower_s)},
             {"superseded", f.superseded},
             {"inconclusive", f.inconclusive},
             {"met", f.met ? json(*f.met) : json(nullptr)},
             {"note", f.note},
             {"seen", f.seen},
             {"replicas_on_node_before",
              f.replicas_on_node_before ? json(*f.replicas_on_node_before) : json(nullptr)}};
    if (f.end_s >= 0)
      row["end_s"] = f.end_s;
    if (f.dead_detection_s || judged_as_lost(f))
      row["dead_detection_s"] = opt(f.dead_detection_s);
    if (judged_as_lost(f))
      row["replacement_s"] = opt(f.replacement_s);
    if (!f.ok)
      row["error"] = f.message;
    if (f.skipped)
      row["skipped"] = true;
    if (network_fault(f.kind)) {
      row["peers"] = f.peers;
      row["network"] = f.network_detail;
    }
    if (f.kind == FaultKind::redeploy || f.kind == FaultKind::rollback) {
      row["app"] = f.app;
      if (!f.deployment.empty())
        row["deployment"] = f.deployment;
      row["acked_s"] = f.acked_s >= 0 ? json(f.acked_s) : json(nullptr);
      row["reply"] = f.reply;
    }
    if (ha_fault(f.kind)) {
      json ha = {{"failover_s", opt(f.failover_s)}, {"new_leader", f.new_leader}};
      if (!f.members.empty())
        ha["etcd_members"] = f.members;
      if (f.probe_acked)
        ha["probe_deploy"] = {{"app", f.probe_app},
                              {"acknowledged", *f.probe_acked},
                              {"answer", f.probe_message}};
      if (f.kind == FaultKind::partition_leader) {
        ha["stepped_down_s"] =
            f.stepped_down_s >= 0 ? json(f.stepped_down_s - f.cut_from()) : json(nullptr);
        ha["cut_in_place_s"] = f.cut_s >= 0 ? json(f.cut_s - f.t_s) : json(nullptr);
        ha["follows_after_heal_s"] =
            f.follows_s >= 0 && f.end_s >= 0 ? json(f.follows_s - f.end_s) : json(nullptr);
      }
      row["ha"] = ha;
    }
    if (f.kind == FaultKind::fill_disk)
      row["disk"] = {{"filled_bytes", f.disk_filled_bytes},
                     {"deploys_accepted_while_full", f.disk_accepted},
                     {"refusal", f.disk_refusal},
                     {"status_answered", f.disk_reads_ok},
                     {"refused_deploy_applied", f.disk_refused_applied},
                     {"deploy_after_freeing_ok",
                      f.disk_after_ok ? json(*f.disk_after_ok) : json(nullptr)},
                     {"deploy_after_freeing", f.disk_after_message}};
    if (f.kind == FaultKind::poison) {
      json victims = json::array();
      for (size_t i = 0; i < f.victims.size(); ++i)
        victims.push_back(
            {{"id", f.victims[i]}, {"node", i < f.victim_nodes.size() ? f.victim_nodes[i] : ""}});
      row["poison"] = {
          {"path", f.path},
          {"answered", f.answered},
          {"status", f.status},
          {"transport_error", f.error},
          {"answer_error", f.answer},
          {"request_id", f.request_id},
          {"answered_s", f.answered_s >= 0 ? json(f.answered_s) : json(nullptr)},
          {"latency_s", f.answered_s >= 0 ? json(f.answered_s - f.t_s) : json(nullptr)},
          {"query_of_death", f.query_of_death()},
          {"victims_known", f.victims_known},
          {"victims", victims}};
    }
    faults.push_back(row);
  }
  j["faults"] = faults;
  if (run.poison_sent > 0) {
    double slowest = 0;
    int64_t victims = 0;
    for (const auto& f : run.faults) {
      if (f.kind == FaultKind::poison && f.answered_s >= 0)
        slowest = std::max(slowest, f.answered_s - f.t_s);
      victims += static_cast<int64_t>(f.victims.size());
    }
    j["poison"] = {{"sent", run.poison_sent},           {"query_of_death_502", run.poison_502},
                   {"answered_2xx", run.poison_2xx},    {"no_answer", run.poison_no_answer},
                   {"by_answer", run.poison_by_answer}, {"slowest_answer_s", slowest},
                   {"replicas_crashed", victims}};
  }
  if (run.rollout) {
    const auto& r = *run.rollout;
    json steps = json::array();
    for (const auto& st : r.steps)
      steps.push_back({{"t_s", st.t_s},
                       {"status", st.status},
                       {"running", st.running},
                       {"listed", st.listed},
                       {"target", st.target},
                       {"kept_running", st.kept_running},
                       {"message", st.message}});
    j["rollout"] = {
        {"deployment", r.deployment},
        {"redeployed", r.redeployed},
        {"redeploy_error", r.redeploy_error},
        {"redeploy_s", r.redeploy_s},
        {"redeploy_acked_s", r.redeploy_acked_s >= 0 ? json(r.redeploy_acked_s) : json(nullptr)},
        {"rollback_s", opt(r.rollback_s)},
        {"rollback_acked_s", r.rollback_acked_s >= 0 ? json(r.rollback_acked_s) : json(nullptr)},
        {"rolled_back", r.rolled_back},
        {"rollback_error", r.rollback_error},
        {"before_t_s", opt(r.before_t_s)},
        {"before_status", r.before_status},
        {"before_problem", r.before_problem},
        {"kept_ids", r.kept_ids},
        {"deploy_failed_after_s", opt(r.deploy_failed_s)},
        {"deploy_failed_message", r.deploy_failed_message},
        {"kept_polls", r.kept_polls},
        {"kept_polls_missing", r.kept_polls_missing},
        {"first_missing", r.first_missing},
        {"polls_until_rollback", r.between_polls},
        {"polls_until_rollback_by_status", r.between_by_status},
        {"healthy_polls_until_rollback", r.between_healthy},
        {"first_healthy", r.first_healthy},
        {"new_replica_ids", r.new_ids},
        {"rollback_healthy_after_s", opt(r.rollback_healthy_s)},
        {"final_status", r.final_status},
        {"final_exact", r.final_exact},
        {"final", r.final_detail},
        {"steps", steps}};
  }
  j["polls"] = {{"count", run.polls},
                {"failed", run.polls_failed},
                {"longest_between_status_answers_s", run.longest_unanswered_s},
                {"nodes_seen_not_alive", run.nodes_seen_not_alive}};
  j["convergence"] = {{"last_fault_s", opt(run.last_fault_s)},
                      {"converged_at_s", opt(run.converged_at_s)},
                      {"final_recovery_s", run.converged_at_s && run.last_fault_s
                                               ? json(*run.converged_at_s - *run.last_fault_s)
                                               : json(nullptr)},
                      {"detail", run.convergence_detail}};
  json inv = json::array();
  for (const auto& c : run.invariants)
    inv.push_back({{"name", c.name}, {"ok", c.ok}, {"detail", c.detail}});
  j["invariants"] = inv;
  json goals = json::array();
  for (const auto& g : run.goals) {
    goals.push_back(
        {{"name", g.name},
         {"target", g.target},
         {"measured", g.measured && std::isfinite(*g.measured) ? json(*g.measured) : json(nullptr)},
         {"met", g.met},
         {"detail", g.detail}});
  }
  j["goals"] = goals;
  j["shutdown"] = {{"command_ok", run.shutdown.shutdown_command_ok},
                   {"error", run.shutdown.shutdown_error},
                   {"exit_codes", run.shutdown.exit_codes},
                   {"needed_sigterm", run.shutdown.needed_sigterm},
                   {"needed_sigkill", run.shutdown.needed_sigkill},
                   {"leftover_pids", run.shutdown.leftover_pids}};
  j["notes"] = run.notes;
  return j;
}

std::string to_text(const RunData& run) {
  std::ostringstream out;
  out << "chaos scenario " << run.scenario.name << " (" << run.scenario_path << ")\n";
  out << "command: " << run.command << "\n";
  out << "seed: " << run.seed << "   started: " << run.started_utc
      << "   wall: " << fixed(run.wall_s, 1) << " s   status poll every " << run.poll_ms << " ms\n";
  if (!run.setup_error.empty())
    out << "SETUP FAILED: " << run.setup_error << "\n";
  if (run.interrupted)
    out << "INTERRUPTED\n";

  out << "\nper second (by the second a request was sent):\n";
  out << "     t      ok  failed  p50 ms  p99 ms  failures by code / faults\n";
  std::map<std::string, int64_t> codes;
  std::vector<float> all;
  for (size_t i = 0; i < run.load.seconds.size(); ++i) {
    const auto& b = run.load.seconds[i];
    int64_t failed = 0;
    std::string what;
    for (const auto& [c, n] : b.failures) {
      failed += n;
      codes[c] += n;
      what += c + ":" + std::to_string(n) + " ";
    }
    for (const auto& f : run.faults) {
      if (f.t_s >= static_cast<double>(i) && f.t_s < static_cast<double>(i + 1))
        what += "<" + fault_label(f) + "> ";
    }
    char line[160];
    std::snprintf(line, sizeof(line), "%6zu %7lld %7lld %7s %7s  ", i, static_cast<long long>(b.ok),
                  static_cast<long long>(failed), fixed(percentile(b.latencies_ms, 0.5), 1).c_str(),
                  fixed(percentile(b.latencies_ms, 0.99), 1).c_str());
    out << line << what << "\n";
    all.insert(all.end(), b.latencies_ms.begin(), b.latencies_ms.end());
  }
  int64_t total = run.load.ok + run.load.failed;
  out << "\nrequests: " << total << ", ok " << run.load.ok << ", failed " << run.load.failed;
  if (total)
    out << ", success ratio " << fixed(static_cast<double>(run.load.ok) / total, 5);
  out << ", p50 " << fixed(percentile(all, 0.5), 1) << " ms, p99 "
      << fixed(percentile(all, 0.99), 1) << " ms\n";
  if (!codes.empty()) {
    out << "failures by code:";
    for (const auto& [c, n] : codes)
      out << " " << c << "=" << n;
    out << "\n";
  }
  out << "failure classes: in flight at a node fault " << run.failures_in_flight
      << ", node down or frozen " << run.failures_node_unavailable << ", unexplained "
      << run.failures_unexplained << "; via never-faulted nodes " << run.failures_via_unfaulted
      << "\n";
  for (const auto& [node, s] : run.load.per_node)
    out << "  via " << node << ": ok " << s.ok << ", failed " << s.failed << "\n";
  if (run.load.late_sends)
    out << "open-loop sends more than 100 ms late: " << run.load.late_sends << "\n";

  out << "\nfaults (" << run.faults.size() << "):\n";
  for (const auto& f : run.faults) {
    char head[96];
    std::snprintf(head, sizeof(head), "  t=%7.2f  %-16s %-6s ", f.t_s, to_string(f.kind),
                  f.node.c_str());
    out << head;
    if (f.kind == FaultKind::poison) {
      out << f.path << " -> ";
      if (!f.answered)
        out << "unanswered";
      else if (f.status)
        out << f.status;
      else
        out << f.error;
      if (f.answered_s >= 0)
        out << " in " << fixed(f.answered_s - f.t_s, 3) << " s";
      if (!f.request_id.empty())
        out << " (request " << f.request_id << ")";
      if (f.victims_known) {
        out << "; reached " << f.victims.size() << ":";
        for (size_t i = 0; i < f.victims.size(); ++i)
          out << " " << f.victims[i] << "@"
              << (i < f.victim_nodes.size() ? f.victim_nodes[i] : "?");
      }
      out << "; ";
    } else if (f.kind == FaultKind::redeploy || f.kind == FaultKind::rollback) {
      std::string reply = f.reply;
      for (size_t at = reply.find('\n'); at != std::string::npos; at = reply.find('\n', at))
        reply.replace(at, 1, "; ");
      out << f.app << (f.deployment.empty() ? "" : "/" + f.deployment) << ": "
          << (f.ok ? reply : std::string("FAILED")) << " (answered in "
          << (f.acked_s >= 0 ? fixed(f.acked_s - f.t_s, 3) : std::string("-")) << " s) ";
    } else if (!f.victim.empty())
      out << f.victim << " ";
    else if (f.replicas_on_node_before)
      out << "(" << *f.replicas_on_node_before << " replicas on it) ";
    if (network_fault(f.kind))
      out << f.network_detail << " ";
    if (!f.members.empty())
      out << "etcd " << f.members << " ";
    if (f.probe_acked)
      out << "deploy " << f.probe_app << ": " << f.probe_message << "; ";
    if (f.failover_s)
      out << "leader " << f.new_leader << " after " << fixed(*f.failover_s, 3) << " s; ";
    if (f.kind == FaultKind::partition_leader)
      out << "stepped down "
          << (f.stepped_down_s >= 0
                  ? "after " + fixed(f.stepped_down_s - f.cut_from(), 3) + " s of the cut"
                                    : std::string("never"))
          << "; ";
    if (f.kind == FaultKind::fill_disk && f.ok)
      out << "filled with " << f.disk_filled_bytes << " bytes, " << f.disk_accepted
          << " deploys fitted, then " << (f.disk_refusal.empty() ? "none refused" : "refused")
          << "; after freeing: "
          << (f.disk_after_ok ? f.disk_after_message : std::string("not freed")) << " ";
    if (f.end_s >= 0)
      out << "(until " << fixed(f.end_s, 2) << ") ";
    out << "recovery " << (f.recovery_s ? fixed(*f.recovery_s, 3) + " s" : "-");
    if (f.dead_detection_s)
      out << ", DEAD after " << fixed(*f.dead_detection_s, 3) << " s";
    if (f.replacement_s)
      out << ", replaced after " << fixed(*f.replacement_s, 3) << " s";
    if (f.met)
      out << (*f.met ? "  [met]" : f.inconclusive ? "  [INCONCLUSIVE]" : "  [MISSED]");
    if (f.superseded)
      out << "  [superseded]";
    if (!f.note.empty())
      out << "  (" << f.note << ")";
    out << "\n";
    if (!f.seen.empty())
      out << "               " << f.seen << "\n";
  }
  if (run.poison_sent > 0) {
    out << "poisoned requests: " << run.poison_sent << " sent, " << run.poison_502
        << " answered 502 (query of death), " << run.poison_2xx << " answered 2xx, "
        << run.poison_no_answer << " without an answer; by answer:";
    for (const auto& [what, n] : run.poison_by_answer)
      out << " " << what << "=" << n;
    out << "\n";
  }
  if (run.rollout) {
    const auto& r = *run.rollout;
    out << "\nrollout of " << r.deployment << " (redeploy at t=" << fixed(r.redeploy_s, 2);
    if (r.rollback_s)
      out << ", rollback at t=" << fixed(*r.rollback_s, 2);
    out << "):\n";
    if (!r.redeployed)
      out << "  the redeploy FAILED: " << r.redeploy_error << "\n";
    if (r.rollback_s && !r.rolled_back)
      out << "  the rollback FAILED: " << r.rollback_error << "\n";
    out << "  before: " << (r.before_status.empty() ? "-" : r.before_status) << ", RUNNING "
        << join(r.kept_ids) << (r.before_problem.empty() ? "" : " (" + r.before_problem + ")")
        << "\n";
    out << "  DEPLOY_FAILED: "
        << (r.deploy_failed_s ? fixed(*r.deploy_failed_s, 3) + " s after the redeploy: " +
                                    r.deploy_failed_message
                              : std::string("never read"))
        << "\n";
    out << "  polls until the rollback: " << r.between_polls << ", by status:";
    for (const auto& [st, n] : r.between_by_status)
      out << " " << st << "=" << n;
    out << "\n  kept ids missing from " << r.kept_polls_missing << " of " << r.kept_polls
        << " polls" << (r.first_missing.empty() ? "" : " (first " + r.first_missing + ")")
        << "; new replica ids seen: " << r.new_ids.size() << "\n";
    out << "  after the rollback: "
        << (r.rollback_healthy_s ? "HEALTHY with exactly the kept ids after " +
                                       fixed(*r.rollback_healthy_s, 3) + " s"
                                 : std::string("never HEALTHY with exactly the kept ids"))
        << "; " << r.final_detail << "\n";
    out << "  status as the polls saw it change (t, status, RUNNING/listed/target, kept "
           "RUNNING):\n";
    size_t shown = 0;
    for (const auto& st : r.steps) {
      if (++shown > 40) {
        out << "    ... " << r.steps.size() - 40 << " more in the JSON report\n";
        break;
      }
      std::string msg = st.message.substr(0, std::min(st.message.find('\n'), size_t{160}));
      char line[96];
      std::snprintf(line, sizeof(line), "    t=%7.2f %-14s %d/%d/%lld kept %d  ", st.t_s,
                    st.status.c_str(), st.running, st.listed, static_cast<long long>(st.target),
                    st.kept_running);
      out << line << msg << "\n";
    }
  }
  out << "polls: " << run.polls << ", " << run.polls_failed
      << " without an answer to status or nodes; longest between two status answers "
      << fixed(run.longest_unanswered_s, 3) << " s\n";
  for (const auto& [id, what] : run.nodes_seen_not_alive)
    out << "node " << id << " (never targeted) seen " << what << "\n";
  out << "\nconvergence: ";
  if (run.converged_at_s && run.last_fault_s)
    out << "healthy " << fixed(*run.converged_at_s - *run.last_fault_s, 3)
        << " s after the last fault (t=" << fixed(*run.last_fault_s, 2) << ")\n";
  else
    out << "NOT converged " << run.convergence_detail << "\n";

  out << "\ninvariants:\n";
  for (const auto& c : run.invariants)
    out << "  [" << (c.ok ? "ok" : "VIOLATED") << "] " << c.name
        << (c.detail.empty() ? "" : ": " + c.detail) << "\n";
  out << "\ngoals:\n";
  if (run.goals.empty())
    out << "  (none)\n";
  for (const auto& g : run.goals) {
    out << "  [" << (g.met ? "met" : "MISSED") << "] " << g.name << " " << fixed(g.target, 4)
        << ": measured "
        << (g.measured ? (std::isfinite(*g.measured) ? fixed(*g.measured, 4) : "never") : "-");
    if (!g.detail.empty())
      out << " (" << g.detail << ")";
    out << "\n";
  }
  out << "\nshutdown: "
      << (run.shutdown.shutdown_command_ok
              ? "shutdown --nodes ok"
              : "shutdown --nodes failed: " + run.shutdown.shutdown_error);
  for (const auto& [id, code] : run.shutdown.exit_codes)
    out << ", " << id << " exit " << code;
  if (!run.shutdown.needed_sigterm.empty())
    out << "; SIGTERM needed for " << run.shutdown.needed_sigterm.size();
  if (!run.shutdown.needed_sigkill.empty())
    out << "; SIGKILL needed for " << run.shutdown.needed_sigkill.size();
  out << "\n";
  for (const auto& n : run.notes)
    out << "note: " << n << "\n";
  out << "\nRESULT: " << (run.ok ? "PASS" : "FAIL") << "\n";
  return out.str();
}

}  // namespace chaos
