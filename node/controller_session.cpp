#include "node/controller_session.hpp"

#include <algorithm>

namespace troupe::node {

ControllerSession::ControllerSession(Options options, std::function<double()> jitter)
    : options_(options), jitter_(std::move(jitter)) {}

double ControllerSession::next_delay() {
  backoff_s_ = backoff_s_ == 0 ? options_.initial_backoff_s
                               : std::min(backoff_s_ * 2, options_.max_backoff_s);
  return backoff_s_ * (jitter_ ? jitter_() : 1.0);
}

bool ControllerSession::should_connect() const {
  return !stopping_ && !connecting_ && !connected_;
}

void ControllerSession::connect_started() {
  connecting_ = true;
}

std::optional<double> ControllerSession::connect_failed() {
  connecting_ = false;
  if (stopping_)
    return std::nullopt;
  return next_delay();
}

uint64_t ControllerSession::connected() {
  connecting_ = false;
  connected_ = true;
  registered_ = false;
  return ++link_;
}

std::optional<double> ControllerSession::lost() {
  connected_ = false;
  registered_ = false;
  if (stopping_)
    return std::nullopt;
  return next_delay();
}

ControllerSession::Registered ControllerSession::registered(uint64_t link, uint64_t incarnation) {
  if (link != link_ || !connected_)
    return Registered::stale;
  bool first = !registered_;
  registered_ = true;
  backoff_s_ = 0;
  incarnation_ = incarnation;
  return first ? Registered::first : Registered::again;
}

std::optional<double> ControllerSession::register_failed(uint64_t link) {
  if (link != link_ || !connected_ || stopping_)
    return std::nullopt;
  // Tried again through a new attempt to reach the controller: it may be
  // restarting or being upgraded.
  connected_ = false;
  return next_delay();
}

std::optional<double> ControllerSession::register_refused_by_follower(uint64_t link) {
  if (link != link_ || !connected_ || stopping_)
    return std::nullopt;
  connected_ = false;
  backoff_s_ = 0;
  return next_delay();
}

bool ControllerSession::heartbeat_due() const {
  return registered_ && connected_;
}

ControllerSession::HeartbeatFailure ControllerSession::heartbeat_failed(uint64_t link,
                                                                        bool not_found) {
  if (link != link_ || !connected_ || stopping_)
    return HeartbeatFailure::ignore;
  if (!not_found)
    return HeartbeatFailure::report;
  registered_ = false;
  return HeartbeatFailure::reregister;
}

}  // namespace troupe::node
