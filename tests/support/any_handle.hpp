// A handle of a test actor that stands for any of troupe's actor interfaces
// (runtime/wire.hpp), for tests of plain classes that only keep the books of
// handles (the controller's directory and logic): the same actor can be
// given where a ReplicaActor, AgentActor or ProxyActor is expected, and
// compared with what comes back.
#pragma once

#include <type_traits>
#include <utility>

#include <caf/actor.hpp>
#include <caf/actor_addr.hpp>
#include <caf/actor_cast.hpp>
#include <caf/typed_actor.hpp>

namespace troupe::test {

class AnyHandle {
 public:
  AnyHandle() = default;
  explicit AnyHandle(caf::actor actor) : actor_(std::move(actor)) {}

  operator caf::actor() const { return actor_; }
  template <class... Sigs>
  operator caf::typed_actor<Sigs...>() const {
    return caf::actor_cast<caf::typed_actor<Sigs...>>(actor_);
  }
  caf::actor_addr address() const { return actor_.address(); }
  explicit operator bool() const { return static_cast<bool>(actor_); }

  friend bool operator==(const AnyHandle& a, const AnyHandle& b) {
    return a.address() == b.address();
  }
  friend bool operator!=(const AnyHandle& a, const AnyHandle& b) { return !(a == b); }
  // Any handle (typed or not) of the same actor.
  template <class H, class = std::enable_if_t<!std::is_same<H, AnyHandle>::value>>
  friend bool operator==(const H& h, const AnyHandle& a) {
    return h.address() == a.address();
  }
  template <class H, class = std::enable_if_t<!std::is_same<H, AnyHandle>::value>>
  friend bool operator==(const AnyHandle& a, const H& h) {
    return h.address() == a.address();
  }
  template <class H, class = std::enable_if_t<!std::is_same<H, AnyHandle>::value>>
  friend bool operator!=(const H& h, const AnyHandle& a) {
    return !(h == a);
  }

 private:
  caf::actor actor_;
};

}  // namespace troupe::test
