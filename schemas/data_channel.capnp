# The data channel between a node's proxy and its replica processes
# (runtime/data_channel.hpp): one request, answer or refusal per frame. Both
# ends are built from the same source, but a node and its replicas may be
# of different builds during an upgrade of the binaries, so the same rules as
# target_state.capnp hold: fields are only ever added, at the end, with the
# next ordinal.
@0xb0875c6794cbff35;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schema");

struct ChannelHeader @0xa32ea212300ee689 {
  name @0 :Text;
  value @1 :Text;
}

# troupe::HttpRequest: proxy -> replica process.
struct ChannelRequest @0x9d3770ab37526b35 {
  method @0 :Text;
  path @1 :Text;
  query @2 :Text;
  headers @3 :List(ChannelHeader);
  body @4 :Data;
  requestId @5 :Text;
  timeoutS @6 :Float64;  # the time left when sent; 0: no deadline
  # On a worker's data port (proxy/peer_server.cpp): the replica of that
  # worker the request is for. Empty on a replica process's channel.
  replicaId @7 :Text;
}

# troupe::HttpResponse: replica process -> proxy.
struct ChannelAnswer @0xf2d5384ceba06c27 {
  status @0 :Int32;
  headers @1 :List(ChannelHeader);
  body @2 :Data;
}

# The replica did not run the request (it is at max_ongoing_requests, not
# ready, or stopping): the proxy places it again, as for a refusal over CAF.
struct ChannelRefusal @0xdce38e5f38baa608 {
  overloaded @0 :Bool;  # else unavailable
  message @1 :Text;
}
