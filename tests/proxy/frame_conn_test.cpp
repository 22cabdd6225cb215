// The framed byte stream of a data port (proxy/frame_conn.hpp): frames read
// whole from any split of the bytes, malformed input refused, and two
// connections over a socket pair (no network, no proxy) exchanging frames,
// writing the frames of one pass together, and closing once with a reason.
#include "proxy/frame_conn.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <doctest/doctest.h>

using namespace troupe;
using namespace troupe::proxy;

namespace {

// The byte stream of `frames` (kind, call, payload) as a data port carries it.
std::string stream_of(const std::vector<std::tuple<channel::Kind, uint64_t, std::string>>& frames) {
  std::vector<uint64_t> words;
  for (const auto& [kind, call, payload] : frames) {
    channel::FrameHeader h;
    h.kind = kind;
    h.call = call;
    channel::append_stream_frame(words, h, payload.data(), payload.size());
  }
  return std::string(reinterpret_cast<const char*>(words.data()), words.size() * 8);
}

struct Seen {
  channel::Kind kind;
  uint64_t call;
  std::string payload;
};

// Feeds `bytes` to a reader in pieces of `step` bytes; what it drained.
std::vector<Seen> feed(FrameReader& in, const std::string& bytes, size_t step, bool& ok) {
  std::vector<Seen> seen;
  ok = true;
  for (size_t at = 0; at < bytes.size() && ok; at += step) {
    size_t n = std::min(step, bytes.size() - at);
    auto space = in.space();
    REQUIRE(space.size() >= n);
    std::memcpy(space.data(), bytes.data() + at, n);
    in.bytes += n;
    ok = in.drain([&](const channel::FrameHeader& h, const char* p, size_t b) {
      seen.push_back({h.kind, h.call, std::string(p, b)});
      return true;
    });
  }
  return seen;
}

// One end of a socket pair as a FrameConn that records what it reads.
struct TestConn : FrameConn {
  std::vector<Seen> frames;
  std::vector<std::string> closed_for;
  bool refuse = false;  // the next frame breaks the protocol

  TestConn(asio::io_context& io, int fd) : FrameConn(io) { sock->assign(ip::tcp::v4(), fd); }

  bool on_frame(const channel::FrameHeader& h, const char* payload, size_t bytes) override {
    if (refuse)
      return false;
    frames.push_back({h.kind, h.call, std::string(payload, bytes)});
    return true;
  }
  void on_closed(const std::string& why) override { closed_for.push_back(why); }
};

struct Pair {
  asio::io_context io;
  std::shared_ptr<TestConn> a, b;
  Pair() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    a = std::make_shared<TestConn>(io, fds[0]);
    b = std::make_shared<TestConn>(io, fds[1]);
  }
  // Runs the io_context until `done` or nothing is left to run.
  template <class F>
  bool run_until(F done) {
    io.restart();
    while (!done()) {
      if (io.run_one() == 0)
        return done();
    }
    return true;
  }
};

}  // namespace

TEST_CASE("frame reader: frames come out whole whatever the split of the bytes") {
  auto bytes = stream_of({{channel::Kind::hello, 0, "token"},
                          {channel::Kind::chunk, 7, std::string(10000, 'x')},
                          {channel::Kind::end, 7, ""}});
  for (size_t step : {size_t{1}, size_t{3}, size_t{8}, size_t{4096}, bytes.size()}) {
    CAPTURE(step);
    FrameReader in;
    bool ok = false;
    auto seen = feed(in, bytes, step, ok);
    CHECK(ok);
    REQUIRE(seen.size() == 3);
    CHECK(seen[0].kind == channel::Kind::hello);
    CHECK(seen[0].payload == "token");
    CHECK(seen[1].call == 7);
    CHECK(seen[1].payload == std::string(10000, 'x'));
    CHECK(seen[2].kind == channel::Kind::end);
    CHECK(seen[2].payload.empty());
    CHECK(in.bytes == 0);
  }
}

TEST_CASE("frame reader: a length over its largest frame is refused - a stranger makes it allocate nothing") {
  FrameReader in;
  in.max_frame = 4096;
  const size_t initial = in.words.size();
  bool ok = true;
  auto seen = feed(in, stream_of({{channel::Kind::request, 1, std::string(100000, 'r')}}), 4096, ok);
  CHECK_FALSE(ok);
  CHECK(seen.empty());
  CHECK(in.words.size() == initial);  // it never grew to take the frame
}

TEST_CASE("frame reader: a length shorter than a header - or another version - is malformed") {
  {
    FrameReader in;
    std::string bytes(16, '\0');
    uint32_t len = 3;
    std::memcpy(bytes.data(), &len, sizeof(len));
    bool ok = true;
    feed(in, bytes, bytes.size(), ok);
    CHECK_FALSE(ok);
  }
  {
    auto bytes = stream_of({{channel::Kind::hello, 0, "t"}});
    // The header's version byte follows the 8-byte length prefix.
    channel::FrameHeader h;
    std::memcpy(&h, bytes.data() + channel::kStreamPrefix, sizeof(h));
    h.version = channel::kVersion + 1;
    std::memcpy(bytes.data() + channel::kStreamPrefix, &h, sizeof(h));
    FrameReader in;
    bool ok = true;
    CHECK(feed(in, bytes, bytes.size(), ok).empty());
    CHECK_FALSE(ok);
  }
}

TEST_CASE("frame conn: frames queued in one pass arrive in order at the other end") {
  Pair p;
  p.b->read();
  for (uint64_t call = 1; call <= 100; ++call)
    p.a->frame(channel::Kind::credit, call, static_cast<uint32_t>(call * 10), 0, nullptr, 0);
  CHECK(p.a->out.size() > 0);  // queued, not written yet: one write after this pass
  REQUIRE(p.run_until([&] { return p.b->frames.size() == 100; }));
  for (uint64_t call = 1; call <= 100; ++call)
    CHECK(p.b->frames[call - 1].call == call);
  CHECK(p.a->closed_for.empty());
  CHECK(p.b->closed_for.empty());
}

TEST_CASE("frame conn: a frame the other side refuses closes it once - with the reason") {
  Pair p;
  p.b->read();
  p.b->refuse = true;
  p.a->frame(channel::Kind::request, 1, 0, 0, "x", 1);
  REQUIRE(p.run_until([&] { return !p.b->closed_for.empty(); }));
  CHECK(p.b->closed_for == std::vector<std::string>{"protocol error (a malformed frame)"});
  p.b->close("again");  // closed already: nothing more
  CHECK(p.b->closed_for.size() == 1);
}

TEST_CASE("frame conn: the other side closing is seen as such") {
  Pair p;
  p.b->read();
  p.a->close("done");
  CHECK(p.a->closed_for == std::vector<std::string>{"done"});
  REQUIRE(p.run_until([&] { return !p.b->closed_for.empty(); }));
  CHECK(p.b->closed_for == std::vector<std::string>{"closed by the other side"});
  // A closed connection queues nothing more for writing.
  p.b->frame(channel::Kind::credit, 1, 1, 0, nullptr, 0);
  CHECK_FALSE(p.b->flush_posted);
}
