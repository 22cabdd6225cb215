#include "controller/shell/startup.hpp"

#include <cstdio>

namespace troupe::controller {

CoreOptions incarnation_options(uint64_t seed, const Limits& limits) {
  CoreOptions options;
  options.snapshot_epoch = seed | 1;
  char tag[16];
  std::snprintf(tag, sizeof(tag), "%06x", static_cast<unsigned>(seed >> 40) & 0xffffff);
  options.replica_id_tag = tag;
  options.limits = limits;
  return options;
}

std::optional<std::set<std::string>> nodes_to_await(const Result<std::optional<TargetState>>& saved,
                                                    const NodesFile& nodes_file) {
  if (saved.has_value() && !saved->has_value())
    return std::nullopt;
  return nodes_file.load();
}

}  // namespace troupe::controller
