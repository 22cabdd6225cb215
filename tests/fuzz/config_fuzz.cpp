// The YAML config loader (config/config.hpp) on arbitrary text: it answers a
// config or an error that says what is wrong, never crashes; and what it
// accepts prints back (to_yaml) to text that parses to the same config, as
// config.hpp promises.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "config/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024)
    return -1;  // a config file of that size is not the point
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto parsed = troupe::config::parse_config(text, "fuzz.yaml");
  if (!parsed) {
    if (parsed.status().message().empty()) {
      std::fprintf(stderr, "an error without a message\n");
      std::abort();
    }
    return 0;
  }
  const std::string printed = troupe::config::to_yaml(*parsed);
  auto again = troupe::config::parse_config(printed, "printed.yaml");
  if (!again) {
    std::fprintf(stderr, "to_yaml printed a config that does not parse: %s\n---\n%s\n",
                 again.status().message().c_str(), printed.c_str());
    std::abort();
  }
  if (*again != *parsed) {
    std::fprintf(stderr, "to_yaml lost something:\n%s\n", printed.c_str());
    std::abort();
  }
  return 0;
}
