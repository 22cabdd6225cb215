// A replica process's doorbell (runtime/gate_link.hpp says what it is for):
// an unnamed SOCK_SEQPACKET socket pair between the node and the process.
// The process rings (one byte) when it needs a connection to its node; the
// node passes it one end of a new socket pair (SCM_RIGHTS). Plain POSIX:
// the node's process supervisor watches the node's ends.
#pragma once

#include <chrono>
#include <cstddef>

#include "runtime/status.hpp"

namespace troupe::gate_link {

// One end of a socket; closed with this object.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release();

 private:
  int fd_ = -1;
};

struct Doorbell {
  Fd node;     // kept by the node
  Fd process;  // inherited by the process (close-on-exec: the spawner dups it)
};

// A new doorbell (close-on-exec on both ends).
Result<Doorbell> make_doorbell();

// The process's side: asks the node for a connection.
Status ring(int doorbell);

// The node's side: reads the rings waiting on its end without blocking;
// how many, or an error once the process's end is closed.
Result<size_t> take_rings(int doorbell);

// Passes `fd` through the node's end of a doorbell; it does not block (a
// doorbell holds a few descriptors the process has not taken yet).
Status pass_fd(int doorbell, int fd);

// Takes the newest descriptor waiting on the process's end of a doorbell,
// waiting at most `wait` for one (older ones, unused, are closed). Errors:
// timeout; unavailable when the node's end is closed.
Result<Fd> take_fd(int doorbell, std::chrono::milliseconds wait);

}  // namespace troupe::gate_link
