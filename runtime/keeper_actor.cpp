#include "runtime/keeper_actor.hpp"

#include <caf/all.hpp>

#include <chrono>

#include "runtime/log.hpp"
#include "runtime/status.hpp"
#include "runtime/wire.hpp"

namespace troupe {

Keeper::Keeper(caf::event_based_actor* self, KeeperOptions options)
    : self_(self), options_(std::move(options)), limiter_(options_.policy) {
  if (!options_.now)
    options_.now = [] { return std::chrono::steady_clock::now(); };
  if (!options_.log)
    options_.log = log::get("keeper");
}

void Keeper::start(caf::actor running) {
  current_ = running ? std::move(running) : (options_.start ? options_.start(*this) : caf::actor());
  if (!current_)
    return;
  self_->monitor(current_);
  for (auto& msg : held_)
    self_->send(current_, std::move(msg));
  held_.clear();
}

void Keeper::release(const caf::error& reason) {
  if (!current_)
    return;
  self_->demonitor(current_);
  self_->send_exit(current_, reason);
  current_ = nullptr;
  if (options_.on_gone)
    options_.on_gone();
}

void Keeper::on_down(const caf::down_msg& dm) {
  if (!current_ || dm.source != current_.address())
    return;
  current_ = nullptr;
  if (options_.on_gone)
    options_.on_gone();
  if (stopping_ || dm.reason == caf::exit_reason::user_shutdown) {
    options_.log->info("{} stopped", options_.what);
    self_->quit(caf::exit_reason::user_shutdown);
    return;
  }
  auto reason = self_->home_system().render(dm.reason);
  auto decision = limiter_.on_death(options_.now());
  if (decision.give_up) {
    auto message = limiter_.give_up_message(options_.what, reason);
    options_.log->critical("{}", message);
    if (options_.on_give_up)
      options_.on_give_up(message);
    self_->quit(to_caf_error(Status(errc::unavailable, message)));
    return;
  }
  ++restarts_;
  options_.log->error("{} died ({}); restarting it (restart #{})", options_.what, reason,
                      restarts_);
  if (decision.delay > RestartLimiter::duration::zero()) {
    self_->delayed_send(self_, std::chrono::duration_cast<caf::timespan>(decision.delay),
                        restart_atom::value);
    return;
  }
  start();
}

void Keeper::on_exit(const caf::exit_msg& em) {
  stopping_ = true;
  if (current_)
    self_->send_exit(current_, em.reason);
  self_->quit(em.reason);
}

caf::result<caf::message> Keeper::forward(caf::message msg) {
  if (current_)
    return self_->delegate(current_, std::move(msg));
  auto* element = self_->current_mailbox_element();
  if (element != nullptr && element->mid.is_request())
    return to_caf_error(Status(errc::unavailable, options_.unavailable));
  if (!stopping_ && options_.hold && options_.hold(msg))
    held_.push_back(std::move(msg));
  return caf::message{};
}

namespace {

class KeeperActor : public caf::event_based_actor {
 public:
  KeeperActor(caf::actor_config& cfg, KeeperOptions options, const char* name, caf::actor running)
      : caf::event_based_actor(cfg),
        keeper_(this, std::move(options)),
        name_(name),
        running_(std::move(running)) {}

  const char* name() const override { return name_; }

  caf::behavior make_behavior() override {
    set_down_handler([this](caf::down_msg& dm) { keeper_.on_down(dm); });
    set_exit_handler([this](caf::exit_msg& em) { keeper_.on_exit(em); });
    set_default_handler([this](caf::scheduled_actor*, caf::message_view& x) {
      return keeper_.forward(x.move_content_to_message());
    });
    keeper_.start(std::move(running_));
    caf::message_handler own{
        // The restart policy's interval passed.
        [this](restart_atom) {
          if (!keeper_.stopping() && !keeper_.current())
            keeper_.start();
        },
    };
    if (keeper_.options().handlers)
      return keeper_.options().handlers(keeper_).or_else(own);
    return own;
  }

 private:
  Keeper keeper_;
  const char* name_;
  caf::actor running_;
};

}  // namespace

caf::actor spawn_keeper(caf::actor_system& sys, KeeperOptions options, const char* name,
                        caf::actor running) {
  return sys.spawn<KeeperActor>(std::move(options), name, std::move(running));
}

}  // namespace troupe
