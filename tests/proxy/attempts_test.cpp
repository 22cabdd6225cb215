// Attempts: the retry decisions of the proxy's call state machine (crashes,
// losses, refusals with backoff). Plain counts: no clock, no sockets.
#include <doctest/doctest.h>

#include <chrono>
#include <vector>

#include "proxy/attempts.hpp"

using namespace troupe::proxy;
using std::chrono::milliseconds;

TEST_CASE(
    "proxy/attempts: a query of death is retried once after a crash and gives 502 after the "
    "second") {
  Attempts a(5);
  CHECK(a.lost(true) == Attempts::Loss::retry);
  CHECK(a.crashes() == 1);
  CHECK(a.losses() == 1);
  CHECK(a.lost(true) == Attempts::Loss::crashed);
  CHECK(a.crashes() == 2);
  // The crash that answers 502 is not counted as a loss.
  CHECK(a.losses() == 1);
}

TEST_CASE("proxy/attempts: losses that are not crashes end at max_attempts with 503") {
  Attempts a(5);
  for (int i = 0; i < 4; ++i)
    CHECK(a.lost(false) == Attempts::Loss::retry);
  CHECK(a.lost(false) == Attempts::Loss::give_up);
  CHECK(a.losses() == 5);
  CHECK(a.crashes() == 0);
}

TEST_CASE("proxy/attempts: a crash counts against max_attempts too") {
  Attempts a(3);
  CHECK(a.lost(false) == Attempts::Loss::retry);
  CHECK(a.lost(true) == Attempts::Loss::retry);
  // Third loss: max_attempts is reached before a second crash.
  CHECK(a.lost(false) == Attempts::Loss::give_up);

  // A second crash answers 502 even when max_attempts is reached with it.
  Attempts b(2);
  CHECK(b.lost(true) == Attempts::Loss::retry);
  CHECK(b.lost(true) == Attempts::Loss::crashed);
}

TEST_CASE("proxy/attempts: crashes after losses still get their one retry") {
  Attempts a(5);
  CHECK(a.lost(false) == Attempts::Loss::retry);
  CHECK(a.lost(false) == Attempts::Loss::retry);
  CHECK(a.lost(true) == Attempts::Loss::retry);
  CHECK(a.lost(false) == Attempts::Loss::retry);
  CHECK(a.lost(true) == Attempts::Loss::crashed);
}

TEST_CASE("proxy/attempts: max_attempts 1 ends the request at its first loss") {
  // With max_attempts 1 the first loss of any kind ends the request: a crash
  // is counted as a loss as well.
  Attempts a(1);
  CHECK(a.lost(true) == Attempts::Loss::give_up);
  Attempts b(1);
  CHECK(b.lost(false) == Attempts::Loss::give_up);
  // max_attempts 0 behaves as 1.
  Attempts c(0);
  CHECK(c.lost(false) == Attempts::Loss::give_up);
}

TEST_CASE("proxy/attempts: refusals are placed again at once then after 1 2 4 ... 50 ms") {
  Attempts a(5);
  auto first = a.refused();
  CHECK(first.kind == Attempts::Refusal::again);
  CHECK(first.delay == milliseconds(0));
  std::vector<milliseconds> delays;
  for (int i = 0; i < 9; ++i) {
    auto r = a.refused();
    REQUIRE(r.kind == Attempts::Refusal::after_delay);
    delays.push_back(r.delay);
  }
  CHECK(delays == std::vector<milliseconds>{milliseconds(1), milliseconds(2), milliseconds(4),
                                            milliseconds(8), milliseconds(16), milliseconds(32),
                                            milliseconds(50), milliseconds(50), milliseconds(50)});
  CHECK(a.refusals() == 10);
}

TEST_CASE("proxy/attempts: more than 40 refusals give up") {
  Attempts a(5);
  for (uint32_t i = 1; i <= Attempts::kMaxRefusals; ++i) {
    auto r = a.refused();
    CHECK(r.kind != Attempts::Refusal::give_up);
    CHECK(r.delay <= Attempts::kMaxBackoff);
  }
  CHECK(a.refused().kind == Attempts::Refusal::give_up);
  CHECK(a.refusals() == Attempts::kMaxRefusals + 1);
}

TEST_CASE("proxy/attempts: refusals are counted apart from losses and crashes") {
  Attempts a(2);
  for (int i = 0; i < 10; ++i)
    a.refused();
  CHECK(a.losses() == 0);
  CHECK(a.crashes() == 0);
  // Still one retry after a crash, and max_attempts untouched by refusals.
  CHECK(a.lost(true) == Attempts::Loss::retry);
  CHECK(a.lost(false) == Attempts::Loss::give_up);
  // Losses do not reset the refusal backoff either.
  CHECK(a.refused().delay == milliseconds(50));
}
