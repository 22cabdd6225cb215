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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1)
    return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: {
      auto state = decode_target_state(bytes);
      if (!state)
        return state.status().message().empty() ? (fail("an error without a message"), 0) : 0;
      auto again = decode_target_state(encode_target_state(*state));
      if (!again || !(*again == *state))
        fail("a target state does not survive encode and decode");
      break;
    }
    case 1: {
      auto app = decode_application(bytes);
      if (!app)
        return app.status().message().empty() ? (fail("an error without a message"), 0) : 0;
      auto again = decode_application(encode_application(*app));
      if (!again || !(*again == *app))
        fail("an application does not survive encode and decode");
      break;
    }
    default: {
      auto head = decode_head(bytes);
      if (!head)
        return head.status().message().empty() ? (fail("an error without a message"), 0) : 0;
      auto again = decode_head(encode_head(head->state, head->application_count));
      if (!again || !(again->state == head->state) ||
          again->application_count != head->application_count)
        fail("a checkpoint head does not survive encode and decode");
      break;
    }
  }
  return 0;
}
