// A frame of a data port as it goes on the wire (runtime/data_channel.hpp,
// "frames on a byte stream"), for tests that talk to a data port with raw
// sockets. Header-only: a test that includes it links troupe_channel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/data_channel.hpp"

namespace troupe::testing {

// Its 8-byte prefix, then the frame padded to whole words.
inline std::string stream_frame(channel::Kind kind, uint64_t call, const std::string& payload) {
  std::vector<uint64_t> words;
  channel::FrameHeader h;
  h.kind = kind;
  h.call = call;
  channel::append_stream_frame(words, h, payload.data(), payload.size());
  return std::string(reinterpret_cast<const char*>(words.data()), words.size() * 8);
}

}  // namespace troupe::testing
