// Named resource amounts of a node ("cpu=4,mem=8G") or needed by a replica.
#pragma once

#include <map>
#include <string>

#include "runtime/status.hpp"

namespace troupe {

struct Resources {
  // Amount per resource name. Memory-like amounts are bytes; suffixes K, M, G,
  // T (powers of 1024) are accepted when parsing. Missing names mean zero.
  std::map<std::string, double> amounts;

  double get(const std::string& name) const;
  bool empty() const { return amounts.empty(); }

  // True when every amount in `need` is available in *this.
  bool fits(const Resources& need) const;
  // Element-wise; results below zero are clamped to zero.
  Resources minus(const Resources& other) const;
  Resources plus(const Resources& other) const;

  // "cpu=4,mem=8G": the canonical text form, parseable by parse_resources.
  std::string to_string() const;

  friend bool operator==(const Resources& a, const Resources& b) { return a.amounts == b.amounts; }
  friend bool operator!=(const Resources& a, const Resources& b) { return !(a == b); }
};

// Parses "name=amount[,name=amount...]". Names are [a-z][a-z0-9_]*; amounts
// are non-negative finite numbers with an optional K/M/G/T suffix. The empty
// string is the empty set. Errors name the offending entry.
Result<Resources> parse_resources(const std::string& text);

// A byte count as people read it: "512 MiB", "1.5 GiB", "100 bytes"
// (status lines, exit causes, logs).
std::string format_bytes(uint64_t bytes);

}  // namespace troupe
