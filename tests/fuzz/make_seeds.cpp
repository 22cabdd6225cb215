// Writes the binary seed inputs of the checkpoint and channel fuzzers from
// real encodings: the example configs' target states and applications, and
// data-channel frames of a request, an answer and a refusal. Run from the
// fuzz build (docs/reliability.md, "Fuzzing"):
//   build/fuzz/bin/make_fuzz_seeds tests/fuzz/corpus examples/*.yaml
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "controller/store/codec.hpp"
#include "runtime/data_channel.hpp"
#include "runtime/wire.hpp"

using namespace troupe;

namespace {

void write(const std::filesystem::path& path, char kind, const std::string& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out.put(kind);
  out << bytes;
}

// The payload of the next frame on `fd` (after its header).
std::string next_payload(int fd) {
  std::vector<char> buf(1 << 16);
  ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
  if (n < static_cast<ssize_t>(sizeof(channel::FrameHeader))) {
    std::fprintf(stderr, "no frame\n");
    std::exit(1);
  }
  return std::string(buf.data() + sizeof(channel::FrameHeader),
                     static_cast<size_t>(n) - sizeof(channel::FrameHeader));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: make_fuzz_seeds CORPUS_DIR CONFIG.yaml...\n");
    return 2;
  }
  const std::filesystem::path corpus = argv[1];
  for (int i = 2; i < argc; ++i) {
    auto config = config::load_config_file(argv[i]);
    if (!config) {
      std::fprintf(stderr, "%s\n", config.status().message().c_str());
      return 1;
    }
    const std::string stem = std::filesystem::path(argv[i]).stem().string();
    const auto& state = config->state;
    write(corpus / "checkpoint" / (stem + "-state"), 0, controller::encode_target_state(state));
    write(corpus / "checkpoint" / (stem + "-head"), 2,
          controller::encode_head(state, static_cast<uint32_t>(state.applications.size())));
    for (const auto& [name, app] : state.applications)
      write(corpus / "checkpoint" / (stem + "-" + name), 1, controller::encode_application(app));
  }
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, fds) != 0)
    return 1;
  HttpRequest req;
  req.method = "POST";
  req.path = "/echo";
  req.query = "a=1&b=x%20y";
  req.headers = {{"Content-Type", "application/json"}, {"X-Request-Id", "abc"}};
  req.body = "{\"k\": [1, 2, 3]}";
  req.request_id = "abc";
  req.timeout_s = 30;
  (void)channel::send_request(fds[0], 7, 0, req, 1 << 16);
  write(corpus / "channel" / "request", 0, next_payload(fds[1]));
  HttpResponse answer;
  answer.status = 200;
  answer.headers = {{"Content-Type", "text/plain"}};
  answer.body = "hello";
  (void)channel::send_answer(fds[0], 7, answer, 1 << 16);
  write(corpus / "channel" / "answer", 1, next_payload(fds[1]));
  (void)channel::send_refusal(fds[0], 7, true, "replica r is at max_ongoing_requests (1)", 1 << 16);
  write(corpus / "channel" / "refusal", 2, next_payload(fds[1]));
  return 0;
}
