#include "runtime/doorbell.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace troupe::gate_link {

namespace {

Status sys_error(const char* what) {
  return Status(errc::io_error, std::string(what) + ": " + std::strerror(errno));
}

// The one descriptor a message on a doorbell carries; -1 when it carried
// none (closed, or not what the node sends).
Result<int> receive_one(int doorbell) {
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = ::recvmsg(doorbell, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0)
    return sys_error("recvmsg on the doorbell");
  if (n == 0)
    return Status(errc::unavailable, "the node closed the doorbell");
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
        c->cmsg_len == CMSG_LEN(sizeof(int))) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
      return fd;
    }
  }
  return -1;
}

}  // namespace

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0)
    ::close(fd_);
}

int Fd::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

Result<Doorbell> make_doorbell() {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0)
    return sys_error("socketpair for the doorbell");
  Doorbell d;
  d.node = Fd(pair[0]);
  d.process = Fd(pair[1]);
  return d;
}

Status ring(int doorbell) {
  char byte = 'r';
  if (::send(doorbell, &byte, 1, MSG_NOSIGNAL) != 1)
    return sys_error("ringing the doorbell");
  return Status::ok();
}

Result<size_t> take_rings(int doorbell) {
  size_t rings = 0;
  for (;;) {
    char byte = 0;
    ssize_t n = ::recv(doorbell, &byte, 1, MSG_DONTWAIT);
    if (n > 0) {
      ++rings;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return rings;
    if (n == 0)
      return Status(errc::unavailable, "the process closed its doorbell");
    return sys_error("recv on the doorbell");
  }
}

Status pass_fd(int doorbell, int fd) {
  char byte = 'c';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  if (::sendmsg(doorbell, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) != 1)
    return sys_error("sendmsg on the doorbell");
  return Status::ok();
}

Result<Fd> take_fd(int doorbell, std::chrono::milliseconds wait) {
  pollfd p{doorbell, POLLIN, 0};
  int ready = 0;
  do {
    ready = ::poll(&p, 1, static_cast<int>(wait.count()));
  } while (ready < 0 && errno == EINTR);
  if (ready < 0)
    return sys_error("poll on the doorbell");
  if (ready == 0)
    return Status(errc::timeout, "the node offered no connection within " +
                                     std::to_string(wait.count()) + " ms");
  Fd newest;
  for (;;) {
    auto got = receive_one(doorbell);
    if (!got) {
      if (newest)
        return newest;
      return got.status();
    }
    if (*got >= 0)
      newest = Fd(*got);  // an older one, never used, is closed
    pollfd more{doorbell, POLLIN, 0};
    if (::poll(&more, 1, 0) <= 0 || (more.revents & POLLIN) == 0)
      break;
  }
  if (!newest)
    return Status(errc::unavailable, "the doorbell carried no connection");
  return newest;
}

}  // namespace troupe::gate_link
