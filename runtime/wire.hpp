// Every atom and message type that crosses the wire between troupe processes,
// registered in one place (register_wire_types) shared by every binary.
//
// Compatibility rule: the handshake messages (hello, register) carry
// kProtocolVersion using only built-in types, so two binaries of different
// versions can always decode them and refuse each other with a clear message
// instead of CAF silently dropping messages of unknown types.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>

#include "runtime/status.hpp"

namespace caf {
class actor_system_config;
}

namespace troupe {

// Bump on any change of a wire type or of a message's meaning.
constexpr uint32_t kProtocolVersion = 1;
// CAF's BASP handshake identifier; equal on every node of a cluster.
constexpr const char* kAppIdentifier = "troupe";

// -- atoms (at most 10 characters) -------------------------------------------
using hello_atom = caf::atom_constant<caf::atom("hello")>;
using register_atom = caf::atom_constant<caf::atom("register")>;
using deregister_atom = caf::atom_constant<caf::atom("deregister")>;
using heartbeat_atom = caf::atom_constant<caf::atom("heartbeat")>;
using nodes_atom = caf::atom_constant<caf::atom("nodes")>;
using drain_atom = caf::atom_constant<caf::atom("drain")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using reconnect_atom = caf::atom_constant<caf::atom("reconnect")>;
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;

// -- wire types --------------------------------------------------------------

// What a node agent tells the controller about itself when registering.
struct NodeInfo {
  std::string id;
  std::string host;        // address the node's services bind to
  uint16_t http_port = 0;  // where the node's HTTP proxy serves
  std::string resources;   // canonical text form, see parse_resources
  int32_t pid = 0;
  uint32_t protocol_version = kProtocolVersion;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, NodeInfo& x) {
  return f(caf::meta::type_name("troupe.NodeInfo"), x.id, x.host, x.http_port, x.resources, x.pid,
           x.protocol_version);
}

// One row of `troupectl nodes`.
struct NodeStatus {
  std::string id;
  std::string address;  // host:http_port
  std::string state;    // ALIVE, DRAINING or DEAD
  std::string resources;
  int64_t last_heartbeat_age_ms = 0;
  std::string reason;  // why the node is in its state ("missed heartbeats for 5.2 s")
  int32_t pid = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, NodeStatus& x) {
  return f(caf::meta::type_name("troupe.NodeStatus"), x.id, x.address, x.state, x.resources,
           x.last_heartbeat_age_ms, x.reason, x.pid);
}

// Registers every type above with CAF, and sets the app identifier. Call once
// on every actor_system_config before the system starts.
void register_wire_types(caf::actor_system_config& cfg);

// -- errors across the wire --------------------------------------------------

// troupe::Status travels as a caf::error of this category; the code is the
// errc value and the context holds the message.
constexpr caf::atom_value kErrorCategory = caf::atom("troupe");

caf::error to_caf_error(const Status& status);
// Maps any caf::error (ours, or CAF's own such as request_timeout) to a Status
// a user can read.
Status from_caf_error(const caf::error& err);

}  // namespace troupe
