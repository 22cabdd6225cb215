// What the two sides of a data port share (proxy/peer_client.cpp, the
// sending side; proxy/peer_server.cpp, the serving side): the failure frame's
// encoding of a CAF error, and the listener.
#pragma once

#include <cstdint>
#include <string>

#include <caf/error.hpp>

#include "proxy/core.hpp"
#include "proxy/frame_conn.hpp"

namespace troupe::proxy {

constexpr auto kHelloTimeout = std::chrono::seconds(5);

struct DataPort {
  explicit DataPort(asio::io_context& io) : acceptor(io) {}
  ip::tcp::acceptor acceptor;
  size_t next_worker = 0;
};

inline uint64_t amount_of(uint64_t v) {
  return std::min<uint64_t>(v, UINT32_MAX);
}

// A caf::error as a `failed` frame's code and payload, and back.
std::string error_payload(const caf::error& err);
caf::error error_of(uint32_t code, const char* payload, size_t bytes);

}  // namespace troupe::proxy
