#include "controller/core/commands.hpp"

namespace troupe::controller {

const char* to_string(CommandKind kind) {
  switch (kind) {
    case CommandKind::start:
      return "start";
    case CommandKind::reconfigure:
      return "reconfigure";
    case CommandKind::watch_health:
      return "watch_health";
    case CommandKind::recover:
      return "recover";
    case CommandKind::stop:
      return "stop";
    case CommandKind::kill:
      return "kill";
  }
  return "?";
}

const char* to_string(NodeState s) {
  switch (s) {
    case NodeState::alive:
      return "ALIVE";
    case NodeState::draining:
      return "DRAINING";
    case NodeState::dead:
      return "DEAD";
    case NodeState::unreachable:
      return "UNREACHABLE";
  }
  return "?";
}

}  // namespace troupe::controller
