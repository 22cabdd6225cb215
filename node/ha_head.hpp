// A head candidate of a highly available cluster (troupe-node --head
// --ha-etcd URL[,URL...] --ha-name NAME): it campaigns for the lead in etcd
// (controller/ha/candidate.hpp) and runs the controller only while it leads.
//
// Leading in term T: a controller is spawned over the checkpoint in etcd
// (controller/ha/etcd_checkpoint_store.hpp), whose writes are fenced by T
// and refused the moment the candidate stops leading by its own clock; it
// recovers as a restarted controller does (loads the checkpoint, waits for
// the nodes, adopts their replicas) and is published on the head's port. A
// controller that dies while the candidate leads is restarted under the
// restart policy, as on a single head.
//
// Stopping to lead (the lease lost, etcd out of reach, another candidate's
// key): the controller is killed at once and the port closed; the candidate
// keeps campaigning. While it does not lead, (get) answers `unavailable`
// naming the leader it knows ("this head does not lead: the leader is NAME
// at ADDR") or "no leader yet".
#pragma once

#include <memory>
#include <string>

#include <caf/actor_system.hpp>

#include "controller/ha/candidate.hpp"
#include "node/head_supervisor.hpp"

namespace troupe {

struct HaHeadOptions {
  controller::ControllerOptions controller;
  std::string bind;
  uint16_t port = 0;
  ha::ElectionOptions election;  // prefix, name, and the address it advertises
  ha::EtcdOptions etcd;
  RestartPolicy restart_policy;
  std::function<void(const std::string&)> on_give_up;
};

class HaHead {
 public:
  // Spawns the head's actor and starts campaigning (threads of its own).
  static std::unique_ptr<HaHead> start(caf::actor_system& sys, const HaHeadOptions& options);
  ~HaHead();  // stop(true)
  HaHead(const HaHead&) = delete;
  HaHead& operator=(const HaHead&) = delete;

  // (get) -> the controller while leading; (shutdown) -> (ok).
  HeadSupervisorActor actor() const { return actor_; }
  ha::CandidateView view() const;
  // Stops campaigning; `resign` hands the lead over at once (the election
  // key deleted, the lease revoked) rather than when the lease runs out.
  void stop(bool resign);
  // A graceful stop's first step: the lead handed over at once (the
  // controller stops, another candidate leads at its next look) while this
  // head keeps watching who leads, so that its follower names the next
  // leader and its agent moves its replicas through that one. Returns once
  // the key is given up (or could not be).
  void hand_over();
  bool leading() const;

  struct Shared;

 private:
  HaHead() = default;
  std::shared_ptr<Shared> shared_;
  HeadSupervisorActor actor_;
};

}  // namespace troupe
