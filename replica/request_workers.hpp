// The replica's request threads (internal to replica/): each runs one request
// at a time in the user's handle(), with the instance the control worker
// made. Two kinds:
//   - request_worker: a CAF detached actor per thread, claimed by the
//     replica's handle (Dispatch::claim) and released when it answers;
//   - in a replica process with a data channel (runtime/data_channel.hpp),
//     one request loop that takes requests straight from the channel's
//     socket (admission: Dispatch::admit): channel_loop for a non-blocking
//     handler, channel_blocking_loop (with its takeover and pool) for the
//     rest.
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

// When the deployment declares its handler non-blocking: one thread that
// reads and answers in batches, until the node's end of the channel closes.
void channel_loop(Instance instance, DispatchPtr d);
// For a handler that may block: one loop
// that reads and answers in batches and runs the handler itself while its
// calls are short, taken over by another thread when a call blocks, and a
// pool of `threads` for the rest (request_workers.cpp, RequestLoop).
// Returns once the node's end of the channel closed and every call ended.
void channel_blocking_loop(Instance instance, DispatchPtr d, size_t threads);

// One thread per replica process with a data channel: reads the credit and
// cancel frames the proxy's io threads write into their lanes and applies
// them to the requests in flight (Dispatch::inflight). Returns when every
// lane is closed.
void lane_reader(DispatchPtr d);

}  // namespace troupe::replica
