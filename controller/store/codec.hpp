// Bytes <-> TargetState for the controller's checkpoint, using the Cap'n Proto
// schema in schemas/target_state.capnp.
//
// Every record is an 8-byte envelope followed by one Cap'n Proto message in
// the standard (unpacked) serialization:
//
//   offset 0  4 bytes  magic "TRCP"
//   offset 4  2 bytes  format version, little endian (kFormatVersion)
//   offset 6  1 byte   record kind (RecordKind)
//   offset 7  1 byte   reserved, 0
//   offset 8  ...      capnp::messageToFlatArray() of the kind's root struct
//
// Unpacked rather than packed: decoding can then bound the work and memory a
// record may cost by its size (see decode_*), and RocksDB compresses its
// table files anyway; the WAL carries ~1/3 more bytes per save (669 vs 499
// bytes per deployment in tools/bench/checkpoint_write), and encoding and
// decoding are faster.
//
// Adding schema fields does not change the format version: older records read
// with the new schema see defaults for the missing fields. The version is
// bumped only for changes older binaries must not read (see the schema's
// evolution rules); decoders refuse a version newer than their own with
// errc::version_mismatch, so an older controller never runs on data it would
// misread or silently truncate when it writes back.
//
// Decoding never throws: malformed input of any kind is errc::corrupt with a
// message saying what is wrong. Messages do not name a file; callers that
// know where the bytes came from prefix that.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "controller/core/model.hpp"
#include "runtime/status.hpp"

namespace troupe::controller {

inline constexpr char kCheckpointMagic[4] = {'T', 'R', 'C', 'P'};
// The newest format version this binary reads and writes. Each record is
// written with the lowest version that carries it, so that an older binary
// reads what it understands and refuses what it would misread:
//   1  everything but what follows
//   2  an application with a traffic split (ApplicationSpec::traffic or
//      traffic_key_header): version 1 binaries would drop the split and send
//      every request to the ingress
//   3  a target state (or head) with http settings (TargetState::http), or
//      an application with shadow traffic (ApplicationSpec::shadow):
//      version 2 binaries would drop the request timeout, so requests that
//      end in 504 would wait forever, and write the state back without it;
//      they would drop a shadow and silently stop the copies
//   4  an application with a deployment whose library is pinned by its
//      SHA-256 (DeploymentSpec::library_sha256): version 3 binaries would drop
//      the pin and look an uploaded library up by a path on the operator's
//      machine
//   5  an application served by the Open Inference Protocol too
//      (ApplicationSpec::open_inference): version 4 binaries would drop the
//      flag, silently stop its /v2/models/... and gRPC inference routes (the
//      application itself keeps serving at its prefix) and write the state
//      back without it
inline constexpr uint16_t kFormatVersion = 5;
inline constexpr size_t kEnvelopeSize = 8;

enum class RecordKind : uint8_t {
  target_state = 1,  // schema TargetState: a whole TargetState
  head = 2,          // schema CheckpointHead: TargetState minus applications
  application = 3,   // schema ApplicationSpec
};

// A whole TargetState in one record (deterministic: equal states give equal
// bytes).
std::string encode_target_state(const TargetState& state);
Result<TargetState> decode_target_state(std::string_view bytes);

// One application in one record; the RocksDB store keeps one per key.
std::string encode_application(const ApplicationSpec& app);
Result<ApplicationSpec> decode_application(std::string_view bytes);

// Everything in a TargetState except its applications, plus how many
// application records belong with it.
struct CheckpointHead {
  TargetState state;  // applications is empty
  uint32_t application_count = 0;
  // Applications whose last good declaration is their current one (written
  // without the spec), with its generation: not in state.last_running until
  // resolve_current() has the applications.
  std::map<std::string, uint64_t> last_running_current;
};
// Writes everything but state.applications, which it only reads to write a
// last good declaration equal to its application's as `current`; the count
// is given separately.
std::string encode_head(const TargetState& state, uint32_t application_count);
Result<CheckpointHead> decode_head(std::string_view bytes);
// Fills state.last_running[app] with state.applications[app] for each
// application of `current` (CheckpointHead::last_running_current) at its
// generation; errc::corrupt naming an application that is not in
// state.applications.
Status resolve_current(TargetState& state, const std::map<std::string, uint64_t>& current);

}  // namespace troupe::controller
