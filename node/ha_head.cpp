#include "node/ha_head.hpp"

#include <algorithm>
#include <chrono>
#include <future>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "controller/controller_metrics.hpp"
#include "controller/ha/etcd_checkpoint_store.hpp"
#include "runtime/head_list.hpp"
#include "runtime/log.hpp"
#include "runtime/security/tls.hpp"
#include "runtime/wire.hpp"

namespace troupe {

namespace {

// From the candidate's threads: it leads in a term, stopped leading, or
// sees another leader.
using ha_lead_atom = caf::atom_constant<caf::atom("halead")>;
using ha_follow_atom = caf::atom_constant<caf::atom("hafollow")>;
using ha_seen_atom = caf::atom_constant<caf::atom("haseen")>;
using ha_problem_atom = caf::atom_constant<caf::atom("haproblem")>;

}  // namespace

struct HaHead::Shared {
  HaHeadOptions options;
  std::shared_ptr<spdlog::logger> log = troupe::log::get("ha");
  // Set before `attached` is ready; the callbacks wait for it, so the actor
  // never sees a lead before the candidate is there to ask.
  std::unique_ptr<ha::Candidate> candidate;
  std::promise<void> attach;
  std::shared_future<void> attached = attach.get_future().share();
  // The actor's own: the term it runs a controller in (0: it follows), and
  // the follower it publishes on the port meanwhile.
  int64_t term = 0;
  caf::actor follower;
  // The node id of the last other candidate seen leading: when this one
  // takes over, that one lost its lease (killed, cut off, stopping), so its
  // recovery window does not wait for it to report its replicas. Forgotten
  // once used, and when this head loses etcd itself (then every lease lapsed
  // and that node may well run on: chaos ha_heads_short, etcd_quorum_loss).
  std::string last_leader;
  std::shared_ptr<Publisher> pub = std::make_shared<Publisher>();

  void leading(bool leads) const {
    if (options.controller.metrics)
      options.controller.metrics->leading(leads);
  }
  std::string leadership() const {
    return ha::describe_leadership(candidate->view(), options.election);
  }
};

namespace {

using Shared = HaHead::Shared;

// What a head that does not lead answers: the leader it knows, or why it
// knows none.
std::string follower_answer(const ha::CandidateView& view) {
  if (!view.refusal.empty())
    return "this head cannot campaign: " + view.refusal;
  if (view.leader && !view.leading)
    return not_leader_message(view.leader->name, view.leader->address);
  if (!view.problem.empty())
    return "no leader yet (" + view.problem + ")";
  return "no leader yet";
}

// What a candidate that does not lead publishes on its port: every request
// is answered errc::not_leader naming the leader it knows (never with state
// of its own), and (leader) with who leads. It ends with its head's actor.
caf::behavior follower(caf::event_based_actor* self, std::shared_ptr<Shared> sh,
                       caf::actor_addr head) {
  self->monitor(caf::actor_cast<caf::actor>(head));
  self->set_down_handler([self](const caf::down_msg&) { self->quit(); });
  self->set_default_handler(
      [sh](caf::scheduled_actor*, caf::message_view&) -> caf::result<caf::message> {
        return to_caf_error(Status(errc::not_leader, follower_answer(sh->candidate->view())));
      });
  return {
      [sh](leader_atom) { return sh->leadership(); },
  };
}

// `lines` without the line `skip`.
std::string without_line(const std::string& lines, const std::string& skip) {
  std::string out;
  size_t at = 0;
  while (at < lines.size()) {
    auto end = lines.find('\n', at);
    auto line = lines.substr(at, end == std::string::npos ? std::string::npos : end - at);
    if (!line.empty() && line != skip)
      out += line + "\n";
    if (end == std::string::npos)
      break;
    at = end + 1;
  }
  return out;
}

constexpr std::chrono::milliseconds kCheckpointWriteTimeout{3000};

// A controller over the checkpoint in etcd, writing under `term` only while
// the candidate still leads in it by its own clock.
caf::actor start_controller(Keeper& keeper, const std::shared_ptr<Shared>& sh) {
  int64_t term = sh->term;
  if (keeper.stopping() || term == 0 || sh->candidate->leading_term() != term)
    return caf::actor();
  std::weak_ptr<Shared> weak = sh;
  // A write may wait out etcd's own leader election (one member lost: up to
  // twice its election timeout, 1 s by default) rather than refuse a deploy,
  // but never past this head's lead (then its controller is stopped): it
  // runs on the controller's own thread.
  auto etcd = sh->options.etcd;
  etcd.timeout = std::max(etcd.timeout, kCheckpointWriteTimeout);
  auto store = std::make_shared<ha::EtcdCheckpointStore>(
      etcd, sh->options.election.prefix,
      [weak, term]() -> int64_t {
        auto sh = weak.lock();
        return sh && sh->candidate->leading_term() == term ? term : 0;
      },
      [weak] {
        auto sh = weak.lock();
        return sh ? sh->candidate->leading_until() : std::chrono::steady_clock::time_point();
      });
  auto options = sh->options.controller;
  // Beside the checkpoint, not in this head's own state dir (a stale list
  // there: controller_options.hpp).
  options.nodes_list = controller::ControllerOptions::NodesList{
      "etcd key " + ha::nodes_key(sh->options.election.prefix),
      [store, skip = sh->last_leader] { return without_line(store->load_nodes(), skip); },
      [store](const std::string& content) { return store->save_nodes(content).is_ok(); }};
  options.leadership = [weak] {
    auto sh = weak.lock();
    return sh ? sh->leadership() : std::string("{}");
  };
  options.own_thread = true;  // its writes wait for etcd
  options.highly_available = true;
  auto* self = keeper.self();
  auto controller =
      caf::actor_cast<caf::actor>(controller::spawn_controller(self->home_system(), options, store));
  auto& pub = sh->pub;
  pub->what = "controller";
  pub->current = [controller] { return controller; };
  pub->on_published = [log = sh->log, bind = pub->bind, term,
                       restarts = keeper.restarts()](uint16_t port) {
    log->warn("leading in term {}: the controller{} is published on {}:{}", term,
              restarts ? " (restart #" + std::to_string(restarts) + ")" : std::string(), bind,
              port);
  };
  publish_again(self, pub);
  return controller;
}

void stop_follower(Keeper& keeper, const std::shared_ptr<Shared>& sh) {
  if (!sh->follower)
    return;
  keeper.self()->send_exit(sh->follower, caf::exit_reason::user_shutdown);
  sh->follower = nullptr;
}

void on_lead(Keeper& keeper, const std::shared_ptr<Shared>& sh, int64_t term) {
  if (sh->candidate->leading_term() != term) {
    sh->log->info("the lead of term {} is already over", term);
    return;
  }
  if (sh->term == term && keeper.current())
    return;
  keeper.release(caf::exit_reason::kill);
  stop_follower(keeper, sh);
  sh->term = term;
  sh->leading(true);
  sh->log->warn("this head leads (term {}): starting the controller over the checkpoint in etcd",
                term);
  keeper.start();
  // The lost leader is left out of this lead's first controller only: a
  // restarted one, or this head's next lead, waits for its node like any.
  sh->last_leader.clear();
}

// Not leading (any more): the controller killed at once, the follower on
// the port.
void on_follow(Keeper& keeper, const std::shared_ptr<Shared>& sh, const std::string& why) {
  if (sh->term != 0) {
    sh->log->warn("this head stopped leading (term {}): {}; its controller stops", sh->term, why);
    sh->term = 0;
    sh->leading(false);
    keeper.release(caf::exit_reason::kill);
  }
  if (sh->follower || keeper.stopping())
    return;
  auto* self = keeper.self();
  sh->follower = self->spawn(follower, sh, self->address());
  auto& pub = sh->pub;
  pub->what = "follower";
  pub->current = [f = sh->follower] { return f; };
  pub->on_published = [log = sh->log, bind = pub->bind](uint16_t port) {
    log->info("not leading: {}:{} answers with the leader's address", bind, port);
  };
  publish_again(self, pub);
}

void on_seen(const std::shared_ptr<Shared>& sh) {
  auto view = sh->candidate->view();
  if (view.leading)
    return;
  if (view.leader && view.leader->node_id != sh->options.election.node_id)
    sh->last_leader = view.leader->node_id;
  sh->log->info("{}", follower_answer(view));
}

caf::message_handler ha_handlers(Keeper& keeper, std::shared_ptr<Shared> sh) {
  return {
      [&keeper, sh](caf::get_atom) -> caf::result<ControllerActor> {
        if (keeper.current())
          return caf::actor_cast<ControllerActor>(keeper.current());
        auto view = sh->candidate->view();
        return to_caf_error(Status(errc::not_leader, view.leading
                                                         ? "the controller of this head is starting"
                                                         : follower_answer(view)));
      },
      [&keeper, sh](publish_retry_atom, uint64_t round, int attempt) {
        publish_attempt(keeper.self(), sh->pub, round, attempt);
      },
      [&keeper, sh](ha_lead_atom, int64_t term) { on_lead(keeper, sh, term); },
      [&keeper, sh](ha_follow_atom, const std::string& why) { on_follow(keeper, sh, why); },
      [sh](ha_seen_atom) { on_seen(sh); },
      [sh](ha_problem_atom, const std::string& problem) {
        if (problem.empty()) {
          sh->log->info("etcd answers again: campaigning");
          return;
        }
        // This head cannot reach etcd either: the leader's lease may lapse
        // with everyone's (etcd without a quorum) while its node runs on
        // with its replicas, so the next lead waits for that node too.
        sh->last_leader.clear();
        sh->log->warn("no campaign for now: {}", problem);
      },
      [&keeper, sh](shutdown_atom) -> caf::result<caf::ok_atom> {
        keeper.stop();
        stop_follower(keeper, sh);
        if (keeper.current())
          keeper.self()->send_exit(keeper.current(), caf::exit_reason::user_shutdown);
        return caf::ok_atom::value;
      },
  };
}

}  // namespace

std::unique_ptr<HaHead> HaHead::start(caf::actor_system& sys, const HaHeadOptions& options) {
  std::unique_ptr<HaHead> head(new HaHead);
  auto sh = std::make_shared<Shared>();
  sh->options = options;
  sh->pub->bind = options.bind;
  sh->pub->port = options.port;
  sh->pub->log = sh->log;
  auto k = controller_keeper_options(options.restart_policy, options.on_give_up, sh->log);
  k.start = [sh](Keeper& keeper) { return start_controller(keeper, sh); };
  k.handlers = [sh](Keeper& keeper) { return ha_handlers(keeper, sh); };
  auto keeper = spawn_keeper(sys, std::move(k), "troupe.ha-head");
  head->actor_ = caf::actor_cast<HeadSupervisorActor>(keeper);
  sh->leading(false);

  // The callbacks hold the actor weakly: it does not outlive its node.
  auto addr = keeper.address();
  auto post = [addr, ready = sh->attached](auto... xs) {
    ready.wait();
    if (auto a = caf::actor_cast<caf::actor>(addr))
      caf::anon_send(a, xs...);
  };
  ha::CandidateCallbacks callbacks;
  callbacks.on_lead = [post](int64_t term) { post(ha_lead_atom::value, term); };
  callbacks.on_follow = [post](const std::string& why) { post(ha_follow_atom::value, why); };
  callbacks.on_leader_seen = [post](const std::optional<ha::Holder>&) {
    post(ha_seen_atom::value);
  };
  callbacks.on_problem = [post](const std::string& problem) {
    post(ha_problem_atom::value, problem);
  };
  sh->candidate = std::make_unique<ha::Candidate>(options.election, options.etcd, callbacks);
  // Until it leads, the port answers with the leader's address. Sent before
  // the callbacks may post anything, so that it comes first.
  caf::anon_send(keeper, ha_follow_atom::value, std::string("campaigning"));
  sh->attach.set_value();
  head->shared_ = std::move(sh);
  return head;
}

HaHead::~HaHead() {
  stop(true);
}

ha::CandidateView HaHead::view() const {
  return shared_->candidate->view();
}

bool HaHead::leading() const {
  return shared_ && shared_->candidate && shared_->candidate->view().leading;
}

void HaHead::hand_over() {
  if (shared_ && shared_->candidate)
    shared_->candidate->stand_down();
}

void HaHead::stop(bool resign) {
  if (shared_ && shared_->candidate)
    shared_->candidate->stop(resign);
}

}  // namespace troupe
