// Writes the binary seed inputs of the checkpoint, channel, gRPC and Open
// Inference Protocol fuzzers from real encodings: the example configs' target
// states and applications, data-channel frames of a request, an answer and a
// refusal, HTTP/2 conversations of gRPC calls made with nghttp2's client
// side, and the protocol's messages made with protobuf's generated code. Run from the
// fuzz build (docs/reliability.md, "Fuzzing"):
//   build/fuzz/bin/make_fuzz_seeds tests/fuzz/corpus examples/*.yaml
#include <sys/socket.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "controller/store/codec.hpp"
#include "grpc_predict_v2.pb.h"
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

// A gRPC call for a client conversation: its headers and its body as sent.
struct Call {
  std::string path;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  bool reset = false;  // the client cancels it after sending it
};

std::string message(const std::string& bytes) {
  const size_t n = bytes.size();
  std::string out{0, char(n >> 24), char(n >> 16), char(n >> 8), char(n)};
  return out + bytes;
}

// What a client sends for `calls`: the preface, its SETTINGS, and each call.
std::string conversation(const std::vector<Call>& calls) {
  nghttp2_session_callbacks* cbs = nullptr;
  nghttp2_session_callbacks_new(&cbs);
  nghttp2_session* session = nullptr;
  nghttp2_session_client_new(&session, cbs, nullptr);
  nghttp2_session_callbacks_del(cbs);
  nghttp2_submit_settings(session, NGHTTP2_FLAG_NONE, nullptr, 0);
  std::vector<std::string> bodies;
  bodies.reserve(calls.size());
  std::vector<int32_t> resets;
  for (const auto& c : calls) {
    std::vector<std::pair<std::string, std::string>> fields = {
        {":method", "POST"}, {":scheme", "http"}, {":authority", "127.0.0.1"},
        {":path", c.path},   {"te", "trailers"},  {"content-type", "application/grpc"}};
    fields.insert(fields.end(), c.headers.begin(), c.headers.end());
    std::vector<nghttp2_nv> nva;
    for (auto& [n, v] : fields)
      nva.push_back({reinterpret_cast<uint8_t*>(n.data()), reinterpret_cast<uint8_t*>(v.data()),
                     n.size(), v.size(), NGHTTP2_NV_FLAG_NONE});
    bodies.push_back(c.body);
    nghttp2_data_provider provider;
    provider.source.ptr = &bodies.back();
    provider.read_callback = [](nghttp2_session*, int32_t, uint8_t* buf, size_t length,
                                uint32_t* flags, nghttp2_data_source* src, void*) -> ssize_t {
      auto& p = *static_cast<std::string*>(src->ptr);
      size_t n = std::min(length, p.size());
      std::copy_n(p.data(), n, buf);
      p.erase(0, n);
      if (p.empty())
        *flags |= NGHTTP2_DATA_FLAG_EOF;
      return ssize_t(n);
    };
    int32_t id =
        nghttp2_submit_request(session, nullptr, nva.data(), nva.size(), &provider, nullptr);
    if (c.reset)
      resets.push_back(id);
  }
  std::string out;
  auto drain = [&] {
    const uint8_t* data = nullptr;
    ssize_t n;
    while ((n = nghttp2_session_mem_send(session, &data)) > 0)
      out.append(reinterpret_cast<const char*>(data), size_t(n));
  };
  drain();
  for (int32_t id : resets)
    nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
  drain();
  nghttp2_session_del(session);
  return out;
}

void write_plain(const std::filesystem::path& path, const std::string& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

void grpc_seeds(const std::filesystem::path& dir) {
  write_plain(dir / "unary",
              conversation({{"/t.S/Unary", {}, message(std::string("\n\x03", 2) + "abc")}}));
  write_plain(dir / "metadata", conversation({{"/t.S/Unary",
                                               {{"application", "greeter"},
                                                {"grpc-timeout", "250m"},
                                                {"x-user-bin", "AAEC"},
                                                {"x-request-id", "seed-1"}},
                                               message("x")}}));
  write_plain(dir / "stream", conversation({{"/t.S/Stream", {}, message("ab")}}));
  write_plain(dir / "two-calls",
              conversation({{"/t.S/Unary", {}, message("1")}, {"/t.S/Stream", {}, message("22")}}));
  write_plain(dir / "cancelled", conversation({{"/t.S/Hold", {}, message(""), true}}));
  write_plain(dir / "two-messages",
              conversation({{"/t.S/Unary", {}, message("a") + message("b")}}));
  write_plain(dir / "compressed",
              conversation({{"/t.S/Unary", {}, "\x01" + message("z").substr(1)}}));
  write_plain(dir / "too-large",
              conversation({{"/t.S/Unary", {}, message(std::string(5000, 'q'))}}));
  write_plain(dir / "bad-timeout",
              conversation({{"/t.S/Unary", {{"grpc-timeout", "soon"}}, message("")}}));
}

// Each input of the oip fuzzer: its first byte picks what the rest is
// (tests/fuzz/oip_fuzz.cpp).
void oip_seeds(const std::filesystem::path& dir) {
  auto infer = [](bool raw) {
    inference::ModelInferRequest r;
    r.set_model_name("fuzz");
    r.set_id("seed");
    auto* x = r.add_inputs();
    x->set_name("x");
    x->set_datatype("FP32");
    x->add_shape(2);
    x->add_shape(2);
    const float values[] = {0.5f, -1.0f, 2.0f, 3.25f};
    if (raw) {
      r.add_raw_input_contents(std::string(reinterpret_cast<const char*>(values), sizeof values));
    } else {
      for (float v : values)
        x->mutable_contents()->add_fp32_contents(v);
    }
    r.add_outputs()->set_name("y");
    return r.SerializeAsString();
  };
  write_plain(dir / "grpc-typed", std::string(1, '\0') + infer(false));
  write_plain(dir / "grpc-raw", std::string(1, '\0') + infer(true));
  write_plain(dir / "rest-body",
              "\x01"
              R"({"id": "a", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2],)"
              R"( "data": [[1.5, 2]]}], "outputs": [{"name": "rows"}]})");
  write_plain(dir / "rest-path", "\x02/models/fuzz/versions/1/infer");
  write_plain(dir / "answer",
              "\x03"
              R"({"model_name": "m", "outputs": [{"name": "y", "datatype": "FP16", "shape":)"
              R"( [2], "data": [1.0, -2.5]}], "parameters": {"k": 1}})");
  inference::ModelReadyRequest ready;
  ready.set_name("fuzz");
  ready.set_version("1");
  write_plain(dir / "ready", "\x04" + ready.SerializeAsString());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: make_fuzz_seeds CORPUS_DIR CONFIG.yaml...\n");
    return 2;
  }
  const std::filesystem::path corpus = argv[1];
  grpc_seeds(corpus / "grpc");
  oip_seeds(corpus / "oip");
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
