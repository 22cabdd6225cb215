// The replica's request threads (internal to replica/): each runs one request
// at a time in the user's handle(), with the instance the control worker
// made. Two kinds:
//   - request_worker: a CAF detached actor per thread, claimed by the
//     replica's handle (Dispatch::claim) and released when it answers;
//   - channel_worker: a plain thread of a replica with a data channel
//     (runtime/data_channel.hpp), which takes requests straight from the
//     channel's socket (admission: Dispatch::admit).
#pragma once

#include <cstddef>

#include <caf/event_based_actor.hpp>

#include "replica/dispatch.hpp"
#include "replica/instance.hpp"
#include "runtime/wire.hpp"

namespace troupe::replica {

// Runs the user's handler; what it throws becomes a 500 with a JSON body.
// With `models` (the replica's ModelCache report) and a request that names a
// model, the answer carries the models the replica holds after it
// (multiplex::kHeldModelsHeader), for the proxy's router.
HttpResponse run_handler(Deployment& d, HttpRequest& req, const ModelReport* models = nullptr);

//   (handle, HttpRequest) -> (HttpResponse), then releases request thread
//   `index`, and tells a stopping replica actor (done) after its last request.
caf::behavior request_worker(caf::event_based_actor*, Instance instance, DispatchPtr dispatch,
                             size_t index);

// Runs on a thread of its own until the node's end of the channel closes.
void channel_worker(Instance instance, DispatchPtr d);

}  // namespace troupe::replica
