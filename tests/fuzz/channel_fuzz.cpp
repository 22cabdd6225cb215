// The data channel's frame decoders (runtime/data_channel.hpp) on arbitrary
// payloads, as a replica process that went wrong could send them: an error
// naming the problem, never a crash. The first byte picks the decoder; the
// payload is copied to a word-aligned buffer, as the channel reads it.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/data_channel.hpp"
#include "runtime/wire.hpp"

using namespace troupe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1)
    return 0;
  std::vector<uint64_t> words((size - 1 + 7) / 8);
  if (size > 1)
    std::memcpy(words.data(), data + 1, size - 1);
  const size_t bytes = size - 1;
  Status st;
  switch (data[0] % 3) {
    case 0: {
      HttpRequest out;
      st = channel::decode_request(words.data(), bytes, out);
      break;
    }
    case 1: {
      HttpResponse out;
      st = channel::decode_answer(words.data(), bytes, out);
      break;
    }
    default: {
      bool overloaded = false;
      std::string message;
      st = channel::decode_refusal(words.data(), bytes, overloaded, message);
      break;
    }
  }
  if (!st.is_ok() && st.message().empty()) {
    std::fprintf(stderr, "an error without a message\n");
    std::abort();
  }
  return 0;
}
