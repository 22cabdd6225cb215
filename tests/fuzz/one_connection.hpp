// What the fuzzers of the proxy's listeners (http_fuzz, grpc_fuzz) do with
// each input: send it on a new connection to 127.0.0.1:port, end the
// sending side, and read whatever the server sends until it closes. Aborts
// (a finding) when the server does not close within 5 s of the client's end.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace troupe::fuzz {

inline void send_on_one_connection(uint16_t port, const uint8_t* data, size_t size) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int fd = -1;
  // Thousands of connections a second: the client ends each with a reset
  // (SO_LINGER 0, below) so that no port waits in TIME_WAIT; a connect that
  // still finds no free port or a full backlog is tried again.
  for (int attempt = 0;; ++attempt) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
      std::abort();
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0)
      break;
    const int err = errno;
    ::close(fd);
    if (attempt == 100) {
      std::fprintf(stderr, "connect to the server: %s\n", std::strerror(err));
      std::abort();
    }
    ::usleep(10000);
  }
  const linger reset{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  size_t sent = 0;
  while (sent < size) {
    ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0)
      break;  // the server closed early (a rejected request, a protocol error)
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  // Everything the server answers, until it closes.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  char buf[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) {
      std::fprintf(stderr, "the server did not close within 5 s of the client's end\n");
      std::abort();
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0)
      continue;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0)
      break;
  }
  ::close(fd);
}

}  // namespace troupe::fuzz
