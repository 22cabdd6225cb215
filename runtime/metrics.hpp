// The metrics of one process, kept by prometheus-cpp: a node's (its proxy,
// node agent, controller and in-process replicas register their families in
// the node's Registry) or a replica process's (reported to its node agent
// with encode(), and served by the node with its own through set_remote()).
// docs/observability.md lists every metric.
#pragma once

#include <memory>
#include <string>

#include "runtime/status.hpp"

namespace prometheus {
class Registry;
}

namespace troupe::metrics {

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Where the families of this process are made (thread-safe;
  // prometheus::Registry merges a family registered twice with the same
  // name and type).
  prometheus::Registry& prom();

  // The families of this process in the wire form (schemas/metrics.capnp).
  std::string encode() const;

  // The families `source` (a replica process) reported, in the form
  // encode() gives; they replace what it reported before. A report that
  // does not decode is refused and the previous one kept.
  Status set_remote(const std::string& source, const std::string& encoded);
  // Forgets what `source` reported (its process ended).
  void drop_remote(const std::string& source);
  size_t remote_sources() const;

  // The Prometheus text format (0.0.4) of this process's families and every
  // remote report, merged by family name. A remote family whose name this
  // process uses with another type is left out.
  std::string render() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::metrics
