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
#include "replica/streams.hpp"
#include "runtime/wire.hpp"

namespace troupe::replica {

//   (handle, HttpRequest) -> (HttpResponse) (or a stream, see streams.hpp),
//   then releases request thread `index`, and tells a stopping replica actor
//   (done) after its last request.
caf::behavior request_worker(caf::event_based_actor*, Instance instance, DispatchPtr dispatch,
                             size_t index);

// Runs on a thread of its own until the node's end of the channel closes.
void channel_worker(Instance instance, DispatchPtr d);
// Instead of the channel_workers when the deployment declares its handler
// non-blocking: one thread that reads and answers in batches.
void channel_loop(Instance instance, DispatchPtr d);

// One thread per replica process with a data channel: reads the credit and
// cancel frames the proxy's io threads write into their lanes and applies
// them to the requests in flight (Dispatch::inflight). Returns when every
// lane is closed.
void lane_reader(DispatchPtr d);

}  // namespace troupe::replica
