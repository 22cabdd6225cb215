#include "replica/dispatch.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>

#include <caf/all.hpp>

#include "runtime/data_channel.hpp"
#include "runtime/log.hpp"
#include "runtime/status.hpp"
#include "runtime/wire.hpp"

namespace troupe::replica {

void Dispatch::account_locked(Clock::time_point now) {
  ongoing_area_ += ongoing_ * std::chrono::duration<double>(now - last_change_).count();
  last_change_ = now;
}

void Dispatch::started_locked(Clock::time_point now) {
  if (limit > 0 && ongoing_ >= limit && !all_busy_since_)
    all_busy_since_ = now;
}

uint64_t Dispatch::finished() {
  std::lock_guard<std::mutex> guard(mutex_);
  return finished_;
}

void Dispatch::ended_locked(Clock::time_point now) {
  ++finished_;
  last_finished_ = now;
  all_busy_since_.reset();
}

bool Dispatch::claim(size_t& index, Clock::time_point now) {
  for (size_t i = 0; i < workers.size(); ++i) {
    bool idle = false;
    if (busy[i].load(std::memory_order_relaxed) == false &&
        busy[i].compare_exchange_strong(idle, true, std::memory_order_acq_rel)) {
      std::lock_guard<std::mutex> guard(mutex_);
      if (limit > 0 && ongoing_ >= limit) {
        // Inline calls (Dispatch::admit) hold the other slots.
        busy[i].store(false, std::memory_order_release);
        return false;
      }
      account_locked(now);
      ++ongoing_;
      started_locked(now);
      index = i;
      return true;
    }
  }
  return false;
}

bool Dispatch::release(size_t index, Clock::time_point now) {
  bool last;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    account_locked(now);
    --ongoing_;
    ended_locked(now);
    last = ongoing_ == 0;
  }
  busy[index].store(false, std::memory_order_release);
  return last && stopping.load();
}

bool Dispatch::admit(Clock::time_point now) {
  std::lock_guard<std::mutex> guard(mutex_);
  if (ongoing_ >= limit)
    return false;
  account_locked(now);
  ++ongoing_;
  started_locked(now);
  return true;
}

bool Dispatch::finish(Clock::time_point now) {
  bool last;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    account_locked(now);
    --ongoing_;
    ended_locked(now);
    last = ongoing_ == 0;
  }
  if (last && stopping.load()) {
    if (auto r = replica.lock())
      caf::anon_send(caf::actor_cast<caf::actor>(r), done_atom::value);
    return true;
  }
  return false;
}

uint64_t Dispatch::park(caf::mailbox_element_ptr m) {
  std::lock_guard<std::mutex> guard(tokens_mutex_);
  uint64_t token = ++next_token_;
  tokens_.emplace(token, std::move(m));
  return token;
}

caf::mailbox_element_ptr Dispatch::take(uint64_t token) {
  std::lock_guard<std::mutex> guard(tokens_mutex_);
  auto it = tokens_.find(token);
  if (it == tokens_.end())
    return nullptr;
  auto m = std::move(it->second);
  tokens_.erase(it);
  return m;
}

Status Dispatch::check_progress(Clock::duration threshold, Clock::time_point now) {
  std::lock_guard<std::mutex> guard(mutex_);
  if (threshold <= Clock::duration::zero() || !all_busy_since_)
    return Status::ok();
  const auto busy_for = now - *all_busy_since_;
  if (busy_for < threshold)
    return Status::ok();
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f", std::chrono::duration<double>(busy_for).count());
  return Status(errc::unavailable, "stuck: all " + std::to_string(ongoing_) +
                                       " request threads busy for " + seconds +
                                       " s with none finished");
}

std::optional<Dispatch::Clock::time_point> Dispatch::last_finished() {
  std::lock_guard<std::mutex> guard(mutex_);
  return last_finished_;
}

uint32_t Dispatch::in_flight() {
  std::lock_guard<std::mutex> guard(mutex_);
  return ongoing_;
}

double Dispatch::take_average(Clock::time_point window_start, Clock::time_point now) {
  std::lock_guard<std::mutex> guard(mutex_);
  account_locked(now);
  double window = std::chrono::duration<double>(now - window_start).count();
  double average = window > 0 ? ongoing_area_ / window : ongoing_;
  ongoing_area_ = 0;
  return average;
}

namespace {

// Answers a request in the sender's context with an error.
void refuse(caf::mailbox_element& m, const Status& why, caf::execution_unit* eu) {
  if (m.sender && m.mid.is_request())
    m.sender->enqueue(nullptr, m.mid.response_id(), caf::make_message(to_caf_error(why)), eu);
}

// A call run by serve_here() that took longer than this held up the thread
// that reads the node's network connections: worth a warning, at most one
// per kSlowWarningGap per process.
constexpr auto kSlowCall = std::chrono::milliseconds(10);
constexpr auto kSlowWarningGap = std::chrono::seconds(10);

void note_slow_call(const local::LocalReplica& replica, const HttpRequest& request,
                    std::chrono::steady_clock::duration took) {
  static std::atomic<int64_t> last_warning_ns{0};
  if (took < kSlowCall)
    return;
  int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now().time_since_epoch())
                    .count();
  int64_t last = last_warning_ns.load(std::memory_order_relaxed);
  if (last != 0 && now - last < std::chrono::nanoseconds(kSlowWarningGap).count())
    return;
  if (!last_warning_ns.compare_exchange_strong(last, now))
    return;
  static auto log = troupe::log::get("replica");
  log->warn("replica {}: its non-blocking handler took {:.1f} ms on the thread that reads other "
            "nodes' requests (request {}), holding up this node's network connections; a "
            "handler that waits must not declare itself non-blocking",
            replica.replica_id(),
            std::chrono::duration<double, std::milli>(took).count(), request.request_id);
}

// A request to a replica whose handler is declared non-blocking, run here,
// in the sender's context (for a request from another node: the thread
// that read it from the network), and answered straight to the sender: no
// hand-off to a request thread and back. False when the replica closed its
// inline registration (it is exiting): then the request goes the normal way.
bool serve_here(local::LocalReplica& replica, caf::mailbox_element& m, caf::execution_unit* eu) {
  HttpResponse answer;
  const auto& request = m.content().get_as<HttpRequest>(1);
  auto began = std::chrono::steady_clock::now();
  auto result = replica.serve(request, answer);
  note_slow_call(replica, request, std::chrono::steady_clock::now() - began);
  switch (result.kind) {
    case local::InlineResult::closed:
      return false;
    case local::InlineResult::stopping:
      refuse(m, Status(errc::unavailable, result.why), eu);
      return true;
    case local::InlineResult::overloaded:
      refuse(m, Status(errc::overloaded, result.why), eu);
      return true;
    case local::InlineResult::streaming:
      result.stream->start(m.sender, m.mid);
      return true;
    case local::InlineResult::answered:
      break;
  }
  if (m.sender && m.mid.is_request())
    m.sender->enqueue(nullptr, m.mid.response_id(), caf::make_message(std::move(answer)), eu);
  return true;
}

}  // namespace

caf::actor_pool::policy dispatch_policy(DispatchPtr d) {
  return [d](caf::actor_system&, caf::actor_pool::uplock& guard, const caf::actor_pool::actor_vec&,
             caf::mailbox_element_ptr& m, caf::execution_unit* eu) {
    guard.unlock();
    // Credits and cancellations of requests in flight: applied here, in the
    // sender's context, also while every request thread is busy.
    if (m->content().match_elements<credit_atom, uint64_t, uint64_t>()) {
      d->inflight.grant(m->content().get_as<uint64_t>(1), m->content().get_as<uint64_t>(2));
      return;
    }
    if (m->content().match_elements<cancel_atom, uint64_t, bool>()) {
      d->inflight.cancel(m->content().get_as<uint64_t>(1), m->content().get_as<bool>(2));
      return;
    }
    if (d->ready.load(std::memory_order_acquire) &&
        m->content().match_elements<handle_atom, HttpRequest>()) {
      if (d->stopping.load()) {
        refuse(*m, Status(errc::unavailable, "replica " + d->replica_id + " is stopping"), eu);
        return;
      }
      // Only a non-blocking handler runs in the sender's context (a CAF
      // thread): a blocking one goes to a request thread.
      if (auto here = d->inline_replica.lock(); here && !here->blocking()) {
        if (serve_here(*here, *m, eu))
          return;
      }
      if (d->channel) {
        if (!d->admit()) {
          refuse(*m,
                 Status(errc::overloaded, "replica " + d->replica_id +
                                              " is at max_ongoing_requests (" +
                                              std::to_string(d->limit) + ")"),
                 eu);
          return;
        }
        // Queued into the channel: the next idle request thread takes it.
        uint64_t token = d->park(std::move(m));
        if (channel::send_local(d->channel->inject_fd(), token) != channel::Sent::sent) {
          auto back = d->take(token);
          d->finish();
          if (back) {
            refuse(*back,
                   Status(errc::overloaded,
                          "replica " + d->replica_id + " cannot queue more requests"),
                   eu);
          }
        }
        return;
      }
      size_t index = 0;
      if (!d->claim(index)) {
        refuse(
            *m,
            Status(errc::overloaded, "replica " + d->replica_id + " is at max_ongoing_requests (" +
                                         std::to_string(d->workers.size()) + ")"),
            eu);
        return;
      }
      d->workers[index]->enqueue(std::move(m), eu);
      return;
    }
    // Control messages, and requests before the replica is ready.
    if (auto replica = d->replica.lock()) {
      replica->enqueue(std::move(m), eu);
      return;
    }
    refuse(*m, Status(errc::unavailable, "replica " + d->replica_id + " has exited"), eu);
  };
}

}  // namespace troupe::replica
