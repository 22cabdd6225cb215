// The heads a worker or troupectl may find the controller at (--join and
// --address take a list: the candidates of a highly available head,
// docs/architecture.md "High availability"), as plain C++: which one to try
// now, and the next one after a failure. A candidate that does not lead
// answers errc::not_leader with not_leader_message(); the leader it names
// is tried next (and added to the list when it was not in it), so that a
// worker given any one candidate finds the leader.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "runtime/address.hpp"
#include "runtime/status.hpp"

namespace troupe {

// "this head does not lead: the leader is NAME at HOST:PORT"
std::string not_leader_message(const std::string& name, const std::string& address);
// The leader's address in such a message; none when it names none ("no
// leader yet") or the address is not HOST:PORT.
std::optional<Endpoint> named_leader(const std::string& message);

// A comma-separated list of HOST:PORT (at least one; no duplicates).
Result<std::vector<Endpoint>> parse_endpoints(const std::string& text);
std::string to_string(const std::vector<Endpoint>& endpoints);

class HeadList {
 public:
  // `heads` non-empty.
  explicit HeadList(std::vector<Endpoint> heads);

  const Endpoint& current() const { return heads_[at_]; }
  // The current head could not be reached, published nothing, or does not
  // lead (`refusal`: its answer): the one it named when it named one, else
  // the next in the list, round robin.
  void failed(const std::string& refusal = "");
  const std::vector<Endpoint>& heads() const { return heads_; }

 private:
  std::vector<Endpoint> heads_;
  size_t at_ = 0;
};

}  // namespace troupe
