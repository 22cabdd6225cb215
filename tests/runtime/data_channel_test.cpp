// The data channel's frames and sockets (runtime/data_channel.hpp), over
// real socket pairs made by make_channel: what the proxy sends a replica
// process decodes to the same request, answers larger than a frame arrive in
// several, a full channel says busy instead of blocking, a closed end says
// closed, and malformed payloads are errors that name what is wrong.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "runtime/data_channel.hpp"

using namespace troupe;
using namespace troupe::channel;

namespace {

// The process's ends as troupe-replica gets them (requests, inject, lanes).
std::unique_ptr<ReplicaEnd> replica_end(Made& made) {
  auto& fds = made.child_fds;
  REQUIRE(fds.size() >= 3);
  std::vector<int> lanes(fds.begin() + 2, fds.end());
  auto end = std::make_unique<ReplicaEnd>(fds[0], fds[1], lanes, made.channel->max_frame());
  fds.clear();  // owned by `end` now
  return end;
}

// One frame from `fd` into `buffer` (non-blocking); its size, 0 when none.
size_t receive(int fd, FrameBuffer& buffer) {
  ssize_t n = ::recv(fd, buffer.data(), buffer.capacity(), MSG_DONTWAIT | MSG_TRUNC);
  return n > 0 ? static_cast<size_t>(n) : 0;
}

HttpRequest sample_request(size_t body_bytes) {
  HttpRequest r;
  r.method = "POST";
  r.path = "/items/7";
  r.query = "a=1&b=%20";
  r.headers = {{"Content-Type", "application/json"}, {"X-Dup", "1"}, {"X-Dup", "2"}};
  r.body.assign(body_bytes, 'x');
  for (size_t i = 0; i < r.body.size(); i += 97)
    r.body[i] = static_cast<char>(i % 256);  // binary, NULs included
  r.request_id = "abc123";
  return r;
}

}  // namespace

TEST_CASE("data channel: a request frame decodes to the request the proxy sent - on its lane") {
  auto made = make_channel("r1", 2);
  REQUIRE(made);
  auto& ch = *made.value().channel;
  CHECK(ch.replica_id() == "r1");
  CHECK(ch.lanes() == 2);
  CHECK(ch.max_frame() >= 16u << 10);
  CHECK(ch.max_frame() % 8 == 0);
  auto end = replica_end(made.value());

  auto sent = sample_request(1000);
  REQUIRE(send_request(ch.request_fd(), 42, 1, sent, ch.max_frame()) == Sent::sent);
  FrameBuffer buffer(end->max_frame());
  size_t n = receive(end->request_fd(), buffer);
  REQUIRE(n > sizeof(FrameHeader));
  CHECK(buffer.header().version == kVersion);
  CHECK(buffer.header().kind == Kind::request);
  CHECK(buffer.header().lane == 1);
  CHECK(buffer.header().call == 42);
  HttpRequest got;
  REQUIRE(decode_request(buffer.payload(), n - sizeof(FrameHeader), got));
  CHECK(got.method == sent.method);
  CHECK(got.path == sent.path);
  CHECK(got.query == sent.query);
  CHECK(got.headers == sent.headers);
  CHECK(got.body == sent.body);
  CHECK(got.request_id == sent.request_id);
}

TEST_CASE("data channel: an answer larger than a frame comes in several - in order - the last without kMore") {
  auto made = make_channel("r1", 1);
  REQUIRE(made);
  auto& ch = *made.value().channel;
  auto end = replica_end(made.value());

  HttpResponse answer;
  answer.status = 201;
  answer.headers = {{"Content-Type", "application/octet-stream"}};
  answer.body.assign(ch.max_frame() * 2 + 123, '\0');
  for (size_t i = 0; i < answer.body.size(); ++i)
    answer.body[i] = static_cast<char>((i * 31) % 251);
  // The frames fit in the lane's buffer together (a quarter of it each).
  REQUIRE(send_answer(end->answer_fd(0), 9, answer, end->max_frame()));

  FrameBuffer buffer(ch.max_frame());
  std::vector<uint64_t> whole;
  size_t bytes = 0;
  int frames = 0;
  for (;;) {
    size_t n = receive(ch.answer_fd(0), buffer);
    REQUIRE(n > sizeof(FrameHeader));
    REQUIRE(n <= ch.max_frame());
    ++frames;
    CHECK(buffer.header().kind == Kind::answer);
    CHECK(buffer.header().call == 9);
    size_t part = n - sizeof(FrameHeader);
    whole.resize((bytes + part + 7) / 8);
    std::memcpy(reinterpret_cast<char*>(whole.data()) + bytes, buffer.payload(), part);
    bytes += part;
    if ((buffer.header().flags & kMore) == 0)
      break;
  }
  CHECK(frames == 3);
  HttpResponse got;
  REQUIRE(decode_answer(whole.data(), bytes, got));
  CHECK(got.status == 201);
  CHECK(got.headers == answer.headers);
  CHECK(got.body == answer.body);
}

TEST_CASE("data channel: a request over max_frame is too_large - a full channel is busy - a closed one closed") {
  auto made = make_channel("r1", 1);
  REQUIRE(made);
  auto& ch = *made.value().channel;
  auto end = replica_end(made.value());

  CHECK(send_request(ch.request_fd(), 1, 0, sample_request(ch.max_frame()), ch.max_frame()) ==
        Sent::too_large);

  // Nobody reads: the socket's buffer fills up and a send says busy instead
  // of blocking the io thread.
  auto big = sample_request(ch.max_frame() / 2);
  Sent last = Sent::sent;
  int sent = 0;
  for (int i = 0; i < 10000 && last == Sent::sent; ++i) {
    last = send_request(ch.request_fd(), static_cast<uint64_t>(i), 0, big, ch.max_frame());
    if (last == Sent::sent)
      ++sent;
  }
  CHECK(sent >= 1);
  CHECK(last == Sent::busy);
  CHECK(send_local(end->inject_fd(), 5) == Sent::busy);

  // The process exits: its ends close.
  end.reset();
  CHECK(send_request(ch.request_fd(), 2, 0, sample_request(10), ch.max_frame()) == Sent::closed);
  FrameBuffer buffer(ch.max_frame());
  CHECK(::recv(ch.answer_fd(0), buffer.data(), buffer.capacity(), MSG_DONTWAIT) == 0);
}

TEST_CASE("data channel: a refusal and a local frame carry what the other side needs") {
  auto made = make_channel("r1", 1);
  REQUIRE(made);
  auto& ch = *made.value().channel;
  auto end = replica_end(made.value());

  REQUIRE(send_refusal(end->answer_fd(0), 77, true, "replica r1 is at max_ongoing_requests (4)",
                       end->max_frame()));
  FrameBuffer buffer(ch.max_frame());
  size_t n = receive(ch.answer_fd(0), buffer);
  REQUIRE(n > sizeof(FrameHeader));
  CHECK(buffer.header().kind == Kind::refusal);
  CHECK(buffer.header().call == 77);
  bool overloaded = false;
  std::string message;
  REQUIRE(decode_refusal(buffer.payload(), n - sizeof(FrameHeader), overloaded, message));
  CHECK(overloaded);
  CHECK(message == "replica r1 is at max_ongoing_requests (4)");

  // The process queues a request it got over CAF for its own request threads.
  REQUIRE(send_local(end->inject_fd(), 1234) == Sent::sent);
  n = receive(end->request_fd(), buffer);
  CHECK(n == sizeof(FrameHeader));
  CHECK(buffer.header().kind == Kind::local);
  CHECK(buffer.header().call == 1234);
}

TEST_CASE("data channel: malformed payloads are errors naming the frame - never a crash") {
  std::vector<uint64_t> garbage(64);
  for (size_t i = 0; i < garbage.size(); ++i)
    garbage[i] = 0x9e3779b97f4a7c15ULL * (i + 1);
  HttpRequest request;
  auto st = decode_request(garbage.data(), garbage.size() * 8, request);
  CHECK_FALSE(st);
  CHECK(st.message().find("malformed request frame") != std::string::npos);

  HttpResponse answer;
  st = decode_answer(garbage.data(), 12, answer);
  CHECK_FALSE(st);
  CHECK(st.message().find("malformed answer frame") != std::string::npos);
  CHECK(st.message().find("12 bytes") != std::string::npos);

  bool overloaded = false;
  std::string message;
  st = decode_refusal(garbage.data(), 0, overloaded, message);
  CHECK_FALSE(st);
  CHECK(st.message().find("malformed refusal frame") != std::string::npos);
}

TEST_CASE("data channel: a few bytes claiming a million headers are refused - not built") {
  // Found by tests/fuzz/channel_fuzz.cpp. A hand-made request: root
  // ChannelRequest (1 data word, 6 pointers) whose headers list claims
  // 1,000,000 empty structs in zero words. Under Cap'n Proto's default limit
  // the decoder built a million headers from 80 bytes.
  const uint32_t count = 1'000'000;
  const uint64_t words[] = {
      0x0000000900000000ULL,              // segment table: 1 segment of 9 words
      0x0006000100000000ULL,              // root: struct, 1 data word, 6 pointers
      0,                                  // timeoutS
      0, 0, 0,                            // method, path, query: null
      0x0000000700000009ULL,              // headers: inline-composite list, 0 words, tag 2 ahead
      0, 0,                               // body, requestId: null
      static_cast<uint64_t>(count) << 2,  // list tag: `count` structs of 0 words each
  };
  HttpRequest request;
  auto st = decode_request(words, sizeof words, request);
  CHECK_FALSE(st);
  CHECK(request.headers.empty());
  CHECK_MESSAGE(st.message().find("traversal limit") != std::string::npos, st.message());

  // The same frame claiming 3 headers decodes (the limit is the frame's
  // size, not a fixed number).
  uint64_t few[sizeof words / sizeof words[0]];
  std::copy(std::begin(words), std::end(words), few);
  few[9] = uint64_t{3} << 2;
  st = decode_request(few, sizeof few, request);
  REQUIRE_MESSAGE(st, st.message());
  CHECK(request.headers.size() == 3);
}

TEST_CASE("data channel: the registry finds a replica's channel until it is removed - the fds close with the last holder") {
  Registry registry;
  auto made = make_channel("r1", 1);
  REQUIRE(made);
  auto ch = std::move(made.value().channel);
  int fd = ch->request_fd();
  registry.add(ch);
  CHECK(registry.size() == 1);
  CHECK(registry.find("r1") == ch);
  CHECK(registry.find("r2") == nullptr);
  registry.remove("r1");
  registry.remove("r1");  // idempotent
  CHECK(registry.find("r1") == nullptr);
  CHECK(::fcntl(fd, F_GETFD) >= 0);  // still held here
  ch.reset();
  CHECK(::fcntl(fd, F_GETFD) < 0);
  for (int child : made.value().child_fds)
    ::close(child);
}

TEST_CASE("data channel: a stream is a head - chunks split at max_frame - an end - credit and cancel go the other way") {
  auto made = make_channel("r1", 1);
  REQUIRE(made);
  auto ch = made.value().channel;
  auto end = replica_end(made.value());
  int replica_lane = end->answer_fd(0);
  int node_lane = ch->answer_fd(0);
  FrameBuffer buffer(ch->max_frame());

  HttpResponse head;
  head.status = 201;
  head.headers = {{"Content-Type", "text/event-stream"}};
  REQUIRE(send_head(replica_lane, 42, head, ch->max_frame()));
  size_t n = receive(node_lane, buffer);
  REQUIRE(n > sizeof(FrameHeader));
  CHECK(buffer.header().kind == Kind::head);
  CHECK(buffer.header().call == 42);
  HttpResponse got;
  REQUIRE(decode_answer(buffer.payload(), n - sizeof(FrameHeader), got));
  CHECK(got.status == 201);
  CHECK(got.headers == head.headers);
  CHECK(got.body.empty());

  // A chunk larger than a frame arrives as several chunk frames, in order.
  std::string data(ch->max_frame() * 2 + 5, 'a');
  for (size_t i = 0; i < data.size(); i += 13)
    data[i] = static_cast<char>(i % 251);
  REQUIRE(send_chunk(replica_lane, 42, data.data(), data.size(), ch->max_frame()));
  std::string joined;
  int frames = 0;
  while ((n = receive(node_lane, buffer)) > 0) {
    CHECK(buffer.header().kind == Kind::chunk);
    CHECK(buffer.header().call == 42);
    CHECK(n <= ch->max_frame());
    joined.append(static_cast<const char*>(buffer.payload()), n - sizeof(FrameHeader));
    ++frames;
  }
  CHECK(frames == 3);
  CHECK(joined == data);

  REQUIRE(send_end(replica_lane, 42, false, "the producer raised", ch->max_frame()));
  n = receive(node_lane, buffer);
  REQUIRE(n > sizeof(FrameHeader));
  CHECK(buffer.header().kind == Kind::end);
  CHECK((buffer.header().flags & kComplete) == 0);
  CHECK(std::string(static_cast<const char*>(buffer.payload()), n - sizeof(FrameHeader)) ==
        "the producer raised");
  REQUIRE(send_end(replica_lane, 42, true, "", ch->max_frame()));
  n = receive(node_lane, buffer);
  CHECK(n == sizeof(FrameHeader));
  CHECK((buffer.header().flags & kComplete) != 0);

  // The node writes credits and cancellations into its end of the lane.
  CHECK(send_control(node_lane, Kind::credit, 42, 65536) == Sent::sent);
  CHECK(send_control(node_lane, Kind::cancel, 43, 0) == Sent::sent);
  n = receive(replica_lane, buffer);
  CHECK(n == sizeof(FrameHeader));
  CHECK(buffer.header().kind == Kind::credit);
  CHECK(buffer.header().call == 42);
  CHECK(buffer.header().amount == 65536);
  n = receive(replica_lane, buffer);
  CHECK(buffer.header().kind == Kind::cancel);
  CHECK(buffer.header().call == 43);
}

TEST_CASE("data channel: a batch sends its frames with one call - each read alone in order - busy and closed say where they stopped") {
  auto made = make_channel("r1", 2);
  REQUIRE(made);
  auto& ch = *made.value().channel;
  auto end = replica_end(made.value());

  Batch requests;
  CHECK(requests.empty());
  for (uint64_t call = 1; call <= 5; ++call) {
    auto r = sample_request(100 * call);
    r.request_id = "id" + std::to_string(call);
    REQUIRE(requests.add_request(call, 1, r, ch.max_frame()) == Sent::sent);
  }
  // Too large for a frame: refused, nothing added.
  CHECK(requests.add_request(6, 1, sample_request(ch.max_frame()), ch.max_frame()) ==
        Sent::too_large);
  REQUIRE(requests.size() == 5);
  CHECK(requests.call(0) == 1);
  CHECK(requests.call(4) == 5);
  REQUIRE(requests.flush(ch.request_fd(), MSG_DONTWAIT) == Sent::sent);
  CHECK(requests.sent_count() == 5);
  // Sent already: a second flush sends nothing more.
  REQUIRE(requests.flush(ch.request_fd(), MSG_DONTWAIT) == Sent::sent);

  FrameBuffer buffer(end->max_frame());
  for (uint64_t call = 1; call <= 5; ++call) {
    size_t n = receive(end->request_fd(), buffer);
    REQUIRE(n > sizeof(FrameHeader));
    CHECK(buffer.header().kind == Kind::request);
    CHECK(buffer.header().lane == 1);
    CHECK(buffer.header().call == call);
    HttpRequest got;
    REQUIRE(decode_request(buffer.payload(), n - sizeof(FrameHeader), got));
    CHECK(got.body == sample_request(100 * call).body);
    CHECK(got.request_id == "id" + std::to_string(call));
  }
  CHECK(receive(end->request_fd(), buffer) == 0);

  // Answers the same way, into a lane.
  Batch answers;
  for (int status : {200, 404, 503}) {
    HttpResponse a;
    a.status = status;
    a.headers = {{"Content-Type", "text/plain"}};
    a.body = "status " + std::to_string(status);
    REQUIRE(answers.add_answer(static_cast<uint64_t>(status), a, end->max_frame()) == Sent::sent);
  }
  HttpResponse huge;
  huge.body.assign(end->max_frame(), 'x');
  CHECK(answers.add_answer(7, huge, end->max_frame()) == Sent::too_large);
  REQUIRE(answers.flush(end->answer_fd(0), 0) == Sent::sent);
  for (int status : {200, 404, 503}) {
    size_t n = receive(ch.answer_fd(0), buffer);
    REQUIRE(n > sizeof(FrameHeader));
    CHECK(buffer.header().kind == Kind::answer);
    CHECK(buffer.header().call == static_cast<uint64_t>(status));
    HttpResponse got;
    REQUIRE(decode_answer(buffer.payload(), n - sizeof(FrameHeader), got));
    CHECK(got.status == status);
    CHECK(got.body == "status " + std::to_string(status));
  }
  answers.clear();
  CHECK(answers.empty());
  CHECK(answers.sent_count() == 0);

  // Nobody reads: the socket fills, and the flush stops at the first frame
  // it does not take, without blocking; what it took is on its way.
  Batch full;
  auto big = sample_request(ch.max_frame() / 2);
  for (uint64_t call = 0; call < 200; ++call)
    REQUIRE(full.add_request(call, 0, big, ch.max_frame()) == Sent::sent);
  CHECK(full.flush(ch.request_fd(), MSG_DONTWAIT) == Sent::busy);
  size_t taken = full.sent_count();
  CHECK(taken >= 1);
  CHECK(taken < 200);
  size_t read = 0;
  while (receive(end->request_fd(), buffer) > 0) {
    CHECK(buffer.header().call == read);
    ++read;
  }
  CHECK(read == taken);
  // Room again: the rest goes, from where it stopped.
  auto again = full.flush(ch.request_fd(), MSG_DONTWAIT);
  CHECK((again == Sent::sent || again == Sent::busy));
  CHECK(full.sent_count() > taken);
  CHECK(receive(end->request_fd(), buffer) > 0);
  CHECK(buffer.header().call == taken);

  // The process exits: a flush says closed.
  end.reset();
  Batch late;
  REQUIRE(late.add_request(1, 0, sample_request(10), ch.max_frame()) == Sent::sent);
  CHECK(late.flush(ch.request_fd(), MSG_DONTWAIT) == Sent::closed);
  CHECK(late.sent_count() == 0);
}

namespace {

// The frames of a data port's byte stream (prefix, header, payload), as a
// reader splits them.
struct StreamFrame {
  FrameHeader header;
  const char* payload;
  size_t bytes;
};
std::vector<StreamFrame> split_stream(const std::vector<uint64_t>& words) {
  std::vector<StreamFrame> out;
  auto* base = reinterpret_cast<const char*>(words.data());
  size_t total = words.size() * 8, off = 0;
  while (off < total) {
    uint32_t prefix[2];
    std::memcpy(prefix, base + off, sizeof(prefix));
    REQUIRE(prefix[1] == 0);
    REQUIRE(prefix[0] >= sizeof(FrameHeader));
    StreamFrame f;
    std::memcpy(&f.header, base + off + kStreamPrefix, sizeof(FrameHeader));
    f.payload = base + off + kStreamPrefix + sizeof(FrameHeader);
    f.bytes = prefix[0] - sizeof(FrameHeader);
    // Every payload starts on a word, as Cap'n Proto reads it.
    CHECK(reinterpret_cast<uintptr_t>(f.payload) % 8 == 0);
    out.push_back(f);
    off += kStreamPrefix + ((prefix[0] + 7) & ~size_t{7});
  }
  REQUIRE(off == total);
  return out;
}

}  // namespace

TEST_CASE("data port frames: a request names its replica - answers heads and raw frames follow in order on one stream") {
  std::vector<uint64_t> words;
  auto sent = sample_request(333);
  append_stream_request(words, 7, sent, "app#Dep#abc");
  HttpResponse answer;
  answer.status = 201;
  answer.headers = {{"Content-Type", "text/plain"}, {"X-A", "b"}};
  answer.body = std::string(1001, 'z');
  REQUIRE(append_stream_answer(words, Kind::answer, 7, answer));
  REQUIRE(append_stream_answer(words, Kind::head, 8, answer));
  FrameHeader chunk;
  chunk.kind = Kind::chunk;
  chunk.call = 8;
  append_stream_frame(words, chunk, "abc", 3);  // not a whole word: padded
  FrameHeader credit;
  credit.kind = Kind::credit;
  credit.call = 8;
  credit.amount = 65536;
  append_stream_frame(words, credit, nullptr, 0);

  auto frames = split_stream(words);
  REQUIRE(frames.size() == 5);
  CHECK(frames[0].header.kind == Kind::request);
  CHECK(frames[0].header.call == 7);
  HttpRequest got;
  std::string replica;
  REQUIRE(decode_request(frames[0].payload, frames[0].bytes, got, replica));
  CHECK(replica == "app#Dep#abc");
  CHECK(got.path == sent.path);
  CHECK(got.headers == sent.headers);
  CHECK(got.body == sent.body);
  // A replica process's channel names none.
  std::vector<uint64_t> plain;
  append_stream_request(plain, 1, sent, "");
  auto one = split_stream(plain);
  REQUIRE(decode_request(one[0].payload, one[0].bytes, got, replica));
  CHECK(replica.empty());

  HttpResponse a;
  CHECK(frames[1].header.kind == Kind::answer);
  REQUIRE(decode_answer(frames[1].payload, frames[1].bytes, a));
  CHECK(a.status == 201);
  CHECK(a.headers == answer.headers);
  CHECK(a.body == answer.body);
  CHECK(frames[2].header.kind == Kind::head);
  CHECK(frames[2].header.call == 8);
  REQUIRE(decode_answer(frames[2].payload, frames[2].bytes, a));
  CHECK(a.status == 201);
  CHECK(a.body.empty());  // a head carries no body
  CHECK(frames[3].header.kind == Kind::chunk);
  CHECK(std::string(frames[3].payload, frames[3].bytes) == "abc");
  CHECK(frames[4].header.kind == Kind::credit);
  CHECK(frames[4].header.amount == 65536);
  CHECK(frames[4].bytes == 0);
}

TEST_CASE("data port frames: an answer over the largest frame is refused - nothing appended") {
  std::vector<uint64_t> words;
  HttpResponse huge;
  huge.status = 200;
  huge.body.assign(kMaxStreamFrame, 'x');
  CHECK_FALSE(append_stream_answer(words, Kind::answer, 1, huge));
  CHECK(words.empty());
  // Its head alone fits.
  CHECK(append_stream_answer(words, Kind::head, 1, huge));
  CHECK(split_stream(words).size() == 1);
}
