// runtime/tcp_probe.hpp: the check a node makes before it asks CAF to
// connect. (A peer that does not answer at all is the chaos scenarios'
// partitions: tools/chaos/scenarios/partition_*.yaml.)
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <caf/all.hpp>

#include "runtime/tcp_probe.hpp"
#include "runtime/wire.hpp"

namespace {

// A listening socket on 127.0.0.1, on a port the kernel picks.
struct Listener {
  int fd = -1;
  uint16_t port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    ::listen(fd, 4);
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~Listener() { ::close(fd); }
};

}  // namespace

TEST_CASE("tcp_probe: a listening port opens - a closed one is refused - a bad name is named") {
  uint16_t closed = 0;
  {
    Listener l;
    REQUIRE(l.port != 0);
    CHECK(troupe::tcp_probe("127.0.0.1", l.port, std::chrono::milliseconds(2000)) == "");
    CHECK(troupe::tcp_probe("localhost", l.port, std::chrono::milliseconds(2000)) == "");
    closed = l.port;
  }
  auto refused = troupe::tcp_probe("127.0.0.1", closed, std::chrono::milliseconds(2000));
  CHECK(refused.find("refused") != std::string::npos);
  auto unknown = troupe::tcp_probe("no-such-host.invalid", 80, std::chrono::milliseconds(2000));
  CHECK(unknown.find("cannot resolve no-such-host.invalid") == 0);
}

TEST_CASE("tcp_probe: the probe actor answers once with the result - then it is gone") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  Listener l;
  auto probe = troupe::spawn_tcp_probe(sys, "127.0.0.1", l.port, std::chrono::milliseconds(2000));
  caf::scoped_actor self{sys};
  std::string answer = "none";
  self->request(probe, std::chrono::seconds(5), troupe::probe_atom::value)
      .receive([&](const std::string& why) { answer = why; },
               [&](caf::error& err) { answer = "error: " + sys.render(err); });
  CHECK(answer == "");
  self->wait_for(probe);
  CHECK(probe->getf(caf::abstract_actor::is_terminated_flag));
}
