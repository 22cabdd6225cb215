// runtime/doorbell.hpp: a replica process rings, the node counts the rings
// and passes descriptors; the process keeps the newest one.
#include <sys/socket.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "runtime/doorbell.hpp"

using namespace troupe;
using namespace troupe::gate_link;
using namespace std::chrono_literals;

namespace {

// A socket pair whose first end is passed; the second tells them apart.
struct Marked {
  Fd passed;
  Fd kept;
};

Marked marked_pair() {
  int pair[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
  return {Fd(pair[0]), Fd(pair[1])};
}

// What arrives on `kept` after `text` is written into the descriptor that
// went through the doorbell.
std::string through(const Fd& received, const Fd& kept, const std::string& text) {
  REQUIRE(::write(received.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  char buf[64] = {};
  auto n = ::read(kept.get(), buf, sizeof(buf));
  REQUIRE(n > 0);
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace

TEST_CASE("doorbell: the node counts the rings waiting and the process takes the descriptor passed") {
  auto bell = make_doorbell();
  REQUIRE(bell.has_value());
  auto rings = take_rings(bell->node.get());
  REQUIRE(rings.has_value());
  CHECK(*rings == 0);
  REQUIRE(ring(bell->process.get()).is_ok());
  REQUIRE(ring(bell->process.get()).is_ok());
  rings = take_rings(bell->node.get());
  REQUIRE(rings.has_value());
  CHECK(*rings == 2);

  auto pair = marked_pair();
  REQUIRE(pass_fd(bell->node.get(), pair.passed.get()).is_ok());
  pair.passed = Fd();  // the node keeps no copy
  auto taken = take_fd(bell->process.get(), 1s);
  REQUIRE(taken.has_value());
  CHECK(through(*taken, pair.kept, "hello") == "hello");
}

TEST_CASE("doorbell: of several descriptors waiting the process keeps the newest and closes the others") {
  auto bell = make_doorbell();
  REQUIRE(bell.has_value());
  auto older = marked_pair();
  auto newer = marked_pair();
  REQUIRE(pass_fd(bell->node.get(), older.passed.get()).is_ok());
  REQUIRE(pass_fd(bell->node.get(), newer.passed.get()).is_ok());
  older.passed = Fd();
  newer.passed = Fd();
  auto taken = take_fd(bell->process.get(), 1s);
  REQUIRE(taken.has_value());
  CHECK(through(*taken, newer.kept, "newest") == "newest");
  // The older one was closed: its other end reads end-of-file.
  char byte = 0;
  CHECK(::read(older.kept.get(), &byte, 1) == 0);
}

TEST_CASE("doorbell: nothing passed is a timeout - a closed end is an error on either side") {
  auto bell = make_doorbell();
  REQUIRE(bell.has_value());
  auto none = take_fd(bell->process.get(), 10ms);
  REQUIRE_FALSE(none.has_value());
  CHECK(none.status().code() == errc::timeout);

  bell->node = Fd();
  auto closed = take_fd(bell->process.get(), 1s);
  REQUIRE_FALSE(closed.has_value());
  CHECK(closed.status().code() == errc::unavailable);

  auto other = make_doorbell();
  REQUIRE(other.has_value());
  other->process = Fd();
  auto gone = take_rings(other->node.get());
  REQUIRE_FALSE(gone.has_value());
  CHECK(gone.status().code() == errc::unavailable);
}
