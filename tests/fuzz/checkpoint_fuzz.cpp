// The controller's checkpoint decoders (controller/store/codec.hpp) on
// arbitrary bytes, as a damaged or foreign RocksDB value would be: an error
// naming the problem, never a crash; and what decodes encodes back to bytes
// that decode to the same value. The first byte picks the record kind.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "controller/store/codec.hpp"

using namespace troupe::controller;

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "%s\n", what);
  std::abort();
}

// An error has a message; a value encodes back (`reencode`: encode, then
// decode) to one that is `same`.
template <class T, class Reencode, class Same>
void check(const troupe::Result<T>& decoded, Reencode reencode, Same same, const char* what) {
  if (!decoded) {
    if (decoded.status().message().empty())
      fail("an error without a message");
    return;
  }
  auto again = reencode(*decoded);
  if (!again || !same(*again, *decoded))
    fail(what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1)
    return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto equal = [](const auto& a, const auto& b) { return a == b; };
  switch (data[0] % 3) {
    case 0:
      check(decode_target_state(bytes),
            [](const TargetState& s) { return decode_target_state(encode_target_state(s)); }, equal,
            "a target state does not survive encode and decode");
      break;
    case 1:
      check(decode_application(bytes),
            [](const ApplicationSpec& a) { return decode_application(encode_application(a)); },
            equal, "an application does not survive encode and decode");
      break;
    default:
      check(decode_head(bytes),
            [](const CheckpointHead& h) {
              return decode_head(encode_head(h.state, h.application_count));
            },
            [](const CheckpointHead& a, const CheckpointHead& b) {
              return a.state == b.state && a.application_count == b.application_count;
            },
            "a checkpoint head does not survive encode and decode");
      break;
  }
  return 0;
}
