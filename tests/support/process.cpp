#include "tests/support/process.hpp"

namespace troupe::testing {

std::string bin_dir() {
  return TROUPE_BIN_DIR;
}
std::string bin(const std::string& name) {
  return bin_dir() + "/" + name;
}

}  // namespace troupe::testing
