#include "runtime/forwarder.hpp"

#include <utility>

#include <caf/actor_pool.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scoped_execution_unit.hpp>

namespace troupe {

caf::actor spawn_forwarder(caf::actor_system& sys, std::shared_ptr<ForwardTarget> target) {
  auto anchor = sys.spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](caf::ok_atom) {}};
  });
  caf::scoped_execution_unit context{&sys};
  return caf::actor_pool::make(
      &context, 1, [&] { return anchor; },
      [target = std::move(target)](caf::actor_system&, caf::actor_pool::uplock& guard,
                                   const caf::actor_pool::actor_vec&,
                                   caf::mailbox_element_ptr& m, caf::execution_unit* eu) {
        guard.unlock();
        if (auto to = target->get())
          to->enqueue(std::move(m), eu);
      });
}

}  // namespace troupe
