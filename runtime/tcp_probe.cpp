#include "runtime/tcp_probe.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <caf/event_based_actor.hpp>

#include "runtime/wire.hpp"

namespace troupe {

std::string tcp_probe(const std::string& host, uint16_t port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0)
    return "cannot resolve " + host + ": " + ::gai_strerror(rc);
  std::string why = "no address for " + host;
  for (auto* a = found; a != nullptr; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = std::string("socket: ") + std::strerror(errno);
      continue;
    }
    int err = 0;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        int n = ::poll(&p, 1, static_cast<int>(timeout.count()));
        if (n == 0) {
          err = ETIMEDOUT;
        } else if (n < 0) {
          err = errno;
        } else {
          socklen_t len = sizeof(err);
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        }
      }
    }
    ::close(fd);
    if (err == 0) {
      ::freeaddrinfo(found);
      return "";
    }
    why = err == ETIMEDOUT ? "no answer within " + std::to_string(timeout.count()) + " ms"
                           : std::strerror(err);
  }
  ::freeaddrinfo(found);
  return why;
}

caf::actor spawn_tcp_probe(caf::actor_system& sys, std::string host, uint16_t port,
                           std::chrono::milliseconds timeout) {
  return sys.spawn<caf::detached>([=](caf::event_based_actor* self) -> caf::behavior {
    return {
        [=](probe_atom) -> std::string {
          self->quit();
          return tcp_probe(host, port, timeout);
        },
    };
  });
}

}  // namespace troupe
