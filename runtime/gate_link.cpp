#include "runtime/gate_link.hpp"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/io/basp_broker.hpp>

namespace troupe::gate_link {

namespace {

Status sys_error(const char* what) {
  return Status(errc::io_error, std::string(what) + ": " + std::strerror(errno));
}

caf::actor basp_broker(caf::actor_system& sys) {
  return sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
}

}  // namespace

Status offer_connection(caf::actor_system& sys, const caf::actor& gate,
                        const std::set<std::string>& sigs, int doorbell) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
    return sys_error("socketpair for a replica connection");
  Fd mine(pair[0]);
  Fd theirs(pair[1]);
  if (auto passed = pass_fd(doorbell, theirs.get()); !passed)
    return passed;
  // The broker writes its handshake at once, into the socket's buffer.
  auto scribe = sys.middleman().backend().new_scribe(mine.release());
  // Port 0: never a doorman's, so the gate is published on these
  // connections only (the broker answers each with its handshake at once).
  caf::anon_send(basp_broker(sys), caf::publish_atom::value, std::move(scribe), uint16_t{0},
                 caf::actor_cast<caf::strong_actor_ptr>(gate), sigs);
  return Status::ok();
}

Result<caf::strong_actor_ptr> connect(caf::actor_system& sys, caf::scoped_actor& self, Fd fd,
                                      std::chrono::milliseconds timeout) {
  auto scribe = sys.middleman().backend().new_scribe(fd.release());
  caf::strong_actor_ptr published;
  Status failed;
  self->request(basp_broker(sys), timeout, caf::connect_atom::value, std::move(scribe),
                uint16_t{0})
      .receive(
          [&](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
            published = std::move(ptr);
          },
          [&](caf::error& err) {
            failed = Status(errc::unavailable, "no handshake with the node: " + sys.render(err));
          });
  if (!failed.is_ok())
    return failed;
  if (!published)
    return Status(errc::unavailable, "the node published nothing on the connection");
  return published;
}

}  // namespace troupe::gate_link
