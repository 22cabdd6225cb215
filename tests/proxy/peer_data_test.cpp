// Both sides of a data port (proxy/peer_client.cpp, proxy/peer_server.cpp)
// over socket pairs: an io thread of a Proxy::Core without its server on one
// end, a bare framed connection (proxy/frame_conn.hpp) playing the other
// worker on the other. What they decide: the client says hello with the
// token and sends nothing before the answer; answers, failures and streams
// reach the call state machine; a frame for a request the connection was not
// sent closes it; a lost connection places its requests again, not as
// crashes. The server refuses a connection without the token, fails a
// request for a replica it does not have, answers one of a non-blocking
// in-process replica at once, and closes a connection that reuses a request
// id. Over TLS (proxy/data_tls.hpp), both sides must show a node certificate
// of the cluster's CA before the token is sent or taken. Deterministic: no
// timer expires, the io_context runs until a condition.
#include <doctest/doctest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <caf/actor_companion.hpp>
#include <caf/all.hpp>
#include <caf/scoped_execution_unit.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "proxy/call.hpp"
#include "proxy/core.hpp"
#include "proxy/data_tls.hpp"
#include "proxy/frame_conn.hpp"
#include "proxy/paths.hpp"
#include "proxy/peer_frames.hpp"
#include "runtime/data_channel.hpp"
#include "runtime/local_replicas.hpp"
#include "runtime/security/certs.hpp"
#include "tests/proxy/proxy_fakes.hpp"

using namespace troupe;
using namespace troupe::proxy;

namespace {

using fakes::FakeExchange;

struct Seen {
  channel::Kind kind;
  uint64_t call;
  uint32_t amount;
  std::string payload;
};

// The other worker: one end of a socket pair as a framed connection that
// records what it reads.
struct OtherSide : FrameConn {
  std::vector<Seen> frames;
  std::vector<std::string> closed_for;
  OtherSide(asio::io_context& io, int fd) : FrameConn(io) { sock->assign(ip::tcp::v4(), fd); }
  bool on_frame(const channel::FrameHeader& h, const char* payload, size_t bytes) override {
    frames.push_back({h.kind, h.call, h.amount, std::string(payload, bytes)});
    return true;
  }
  void on_closed(const std::string& why) override { closed_for.push_back(why); }
  size_t count(channel::Kind kind) const {
    return std::count_if(frames.begin(), frames.end(),
                         [&](const Seen& s) { return s.kind == kind; });
  }
  const Seen* last(channel::Kind kind) const {
    for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
      if (it->kind == kind)
        return &*it;
    }
    return nullptr;
  }
  void request(uint64_t call, const HttpRequest& r, const std::string& replica_id) {
    channel::append_stream_request(out, call, r, replica_id);
    schedule_flush();
  }
  void answer(channel::Kind kind, uint64_t call, const HttpResponse& r) {
    REQUIRE(channel::append_stream_answer(out, kind, call, r));
    schedule_flush();
  }
};

// (replica id, node id) of a deployment's replicas.
using Replicas = std::vector<std::pair<std::string, std::string>>;

struct Harness : fakes::IoThreadHarness {
  std::vector<std::shared_ptr<OtherSide>> others;

  // This node is n1; `inline_ids`: its replicas called inline. Each replica
  // has a stand-in handle of its own.
  explicit Harness(const Replicas& replicas, std::vector<std::string> inline_ids = {})
      : IoThreadHarness(inline_ids) {
    core->data_token = "this-node-token";
    std::vector<ReplicaEndpoint> eps;
    for (const auto& [id, node] : replicas) {
      ReplicaEndpoint e;
      e.replica_id = id;
      e.node_id = node;
      e.max_ongoing_requests = 4;
      e.handle = stand_in();
      eps.push_back(e);
    }
    route(std::move(eps));
  }
  ~Harness() {
    for (auto& o : others)
      o->drop();
  }

  // A socket pair: this io thread's end, and the other worker's, reading.
  std::pair<ip::tcp::socket, std::shared_ptr<OtherSide>> pair() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    ip::tcp::socket mine(io);
    mine.assign(ip::tcp::v4(), fds[0]);
    auto other = std::make_shared<OtherSide>(io, fds[1]);
    other->read();
    others.push_back(other);
    return {std::move(mine), other};
  }

  // The connection to `node`'s data port, up: the other side answered hello.
  std::shared_ptr<OtherSide> connect(const std::string& node, const std::string& token = "tok") {
    auto [mine, other] = pair();
    worker.peers.adopt(node, DataPortEndpoint{"127.0.0.1", 1, token}, std::move(mine));
    REQUIRE(run_until([&, o = other] { return o->count(channel::Kind::hello) == 1; }));
    CHECK(other->frames[0].payload == token);
    other->frame(channel::Kind::hello, 0, 0, 0, nullptr, 0);
    REQUIRE(run_until([&] { return worker.peers.up(node); }));
    return other;
  }

  // A call of GET /echo/x dispatched, and its request frame read by
  // `other`, the connection it went over: its key there.
  uint64_t dispatch_to(const std::shared_ptr<OtherSide>& other, CallPtr& c,
                       std::shared_ptr<FakeExchange>& ex) {
    size_t before = other->count(channel::Kind::request);
    c = make_call(ex);
    dispatch(c);
    REQUIRE(run_until([&] { return other->count(channel::Kind::request) == before + 1; }));
    return other->last(channel::Kind::request)->call;
  }

  // A connection served by this io thread's data port, admitted: the other
  // side said hello with this node's token and got hello back.
  std::shared_ptr<OtherSide> served_conn() {
    auto [mine, other] = pair();
    worker.served.serve(std::move(mine));
    std::string token = core->data_token;
    other->frame(channel::Kind::hello, 0, 0, 0, token.data(), token.size());
    REQUIRE(run_until([&, o = other] { return o->count(channel::Kind::hello) == 1; }));
    return other;
  }

  // Runs the io_context until `done`, or for at most 10 s (a deadline on a
  // condition: a broken side fails the test instead of hanging it).
  template <class F>
  bool run_until(F done) {
    io.restart();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done() && std::chrono::steady_clock::now() < deadline)
      io.run_one_until(deadline);
    return done();
  }
  // Runs what is ready until nothing is: frames written to a socket pair are
  // readable at once, so what one side sent has been handled by the other.
  void settle() {
    for (int quiet = 0; quiet < 3;) {
      io.restart();
      quiet = io.poll() == 0 ? quiet + 1 : 0;
    }
  }

};

int status_of(const FakeExchange& ex) {
  REQUIRE(ex.answers.size() == 1);
  return static_cast<int>(ex.answers[0].result_int());
}

// The request frames the other side got: (call, replica id, path).
struct SeenRequest {
  uint64_t call;
  std::string replica_id;
  std::string path;
};
std::vector<SeenRequest> requests_of(const OtherSide& o) {
  std::vector<SeenRequest> out;
  for (const auto& f : o.frames) {
    if (f.kind != channel::Kind::request)
      continue;
    HttpRequest r;
    std::string replica;
    REQUIRE(channel::decode_request(f.payload.data(), f.payload.size(), r, replica));
    out.push_back({f.call, replica, r.path});
  }
  return out;
}

HttpResponse ok(const std::string& body) {
  HttpResponse r;
  r.status = 200;
  r.body = body;
  return r;
}

}  // namespace

TEST_CASE("peer client: it says hello with the token and sends nothing before the answer") {
  Harness h(Replicas{{"r1", "n2"}});
  auto [mine, other] = h.pair();
  h.worker.peers.adopt("n2", DataPortEndpoint{"127.0.0.1", 1, "tok"}, std::move(mine));
  REQUIRE(h.run_until([&, o = other] { return o->count(channel::Kind::hello) == 1; }));
  CHECK(other->frames[0].payload == "tok");
  std::shared_ptr<FakeExchange> ex;
  auto c = h.make_call(ex);
  c->slot = h.core->router.find_replica("r1");
  REQUIRE(c->slot);
  c->key = 11;
  CHECK_FALSE(h.worker.peers.send(c));  // not up yet: it goes another way
  other->frame(channel::Kind::hello, 0, 0, 0, nullptr, 0);
  REQUIRE(h.run_until([&] { return h.worker.peers.up("n2"); }));
  CHECK(h.worker.peers.send(c));
  CHECK(c->via == &h.worker.peers);
  REQUIRE(h.run_until([&, o = other] { return requests_of(*o).size() == 1; }));
  auto seen = requests_of(*other);
  CHECK(seen[0].call == 11);
  CHECK(seen[0].replica_id == "r1");
  CHECK(seen[0].path == "/x");
  h.worker.untrack(c.get());
}

TEST_CASE("peer client: an answer frame answers the call and frees its replica") {
  Harness h(Replicas{{"r1", "n2"}});
  auto other = h.connect("n2");
  std::shared_ptr<FakeExchange> ex;
  CallPtr c;
  uint64_t sent = h.dispatch_to(other, c, ex);
  CHECK(c->via == &h.worker.peers);
  other->answer(channel::Kind::answer, sent, ok("from n2"));
  REQUIRE(h.run_until([&] { return c->done; }));
  CHECK(status_of(*ex) == 200);
  CHECK(ex->answers[0].body() == "from n2");
  CHECK(h.core->router.find_replica("r1")->in_flight == 0);
  CHECK(h.worker.active.empty());
}

TEST_CASE("peer client: a failure frame is judged as the replica's own error - a refusal is placed again") {
  Harness h(Replicas{{"r1", "n2"}, {"r2", "n2"}});
  auto other = h.connect("n2");
  std::shared_ptr<FakeExchange> ex;
  CallPtr c;
  uint64_t sent = h.dispatch_to(other, c, ex);
  auto first = requests_of(*other)[0];
  REQUIRE(first.call == sent);
  auto payload = error_payload(to_caf_error(Status(errc::overloaded, "replica is full")));
  other->frame(channel::Kind::failed, first.call, static_cast<uint32_t>(errc::overloaded), 0,
               payload.data(), payload.size());
  // Refused: placed again, on the other replica, as a new attempt.
  REQUIRE(h.run_until([&] { return requests_of(*other).size() == 2; }));
  auto second = requests_of(*other)[1];
  CHECK(second.call != first.call);
  CHECK(second.replica_id != first.replica_id);
  CHECK_FALSE(c->done);
  CHECK(c->attempts.crashes() == 0);
  // A failure that is not a refusal: 502 naming it.
  auto bad = error_payload(to_caf_error(Status(errc::internal, "handler threw")));
  other->frame(channel::Kind::failed, second.call, static_cast<uint32_t>(errc::internal), 0,
               bad.data(), bad.size());
  REQUIRE(h.run_until([&] { return c->done; }));
  CHECK(status_of(*ex) == 502);
  CHECK(ex->answers[0].body().find("handler threw") != std::string::npos);
}

TEST_CASE("peer client: a frame for a request the connection was not sent closes it - a stale one is ignored") {
  Harness h(Replicas{{"r1", "n2"}, {"r3", "n3"}});
  auto n2 = h.connect("n2");
  auto n3 = h.connect("n3");
  std::shared_ptr<FakeExchange> ex;
  auto c = h.make_call(ex);
  c->slot = h.core->router.find_replica("r1");
  c->key = 21;
  REQUIRE(h.worker.peers.send(c));
  REQUIRE(h.run_until([&] { return requests_of(*n2).size() == 1; }));
  // n3 answers a request it never saw: a key no call has is stale (the call
  // may have been failed over meanwhile), and changes nothing.
  n3->answer(channel::Kind::answer, 999, ok("stale"));
  h.settle();
  CHECK(h.worker.peers.up("n3"));
  // The key of a request in flight on n2: n3 is closed, the call untouched.
  n3->answer(channel::Kind::answer, 21, ok("forged"));
  REQUIRE(h.run_until([&] { return !h.worker.peers.up("n3"); }));
  CHECK_FALSE(c->done);
  CHECK(ex->answers.empty());
  CHECK(h.worker.peers.up("n2"));
  n2->answer(channel::Kind::answer, 21, ok("from n2"));
  REQUIRE(h.run_until([&] { return c->done; }));
  CHECK(ex->answers[0].body() == "from n2");
}

TEST_CASE("peer client: a lost connection places its requests again - not as crashes") {
  Harness h(Replicas{{"r1", "n2"}, {"r2", "n2"}});
  auto other = h.connect("n2");
  std::shared_ptr<FakeExchange> ex;
  CallPtr c;
  uint64_t sent = h.dispatch_to(other, c, ex);
  REQUIRE(requests_of(*other)[0].call == sent);
  auto replica = requests_of(*other)[0].replica_id;
  other->close("gone");
  REQUIRE(h.run_until([&] { return !h.worker.peers.up("n2"); }));
  CHECK(c->tried == std::vector<std::string>{replica});
  CHECK(c->attempts.crashes() == 0);
  CHECK(c->attempts.losses() == 1);
  // Placed again on the other replica, over CAF while the connection is down.
  CHECK(c->via == &h.worker.caf);
  CHECK(c->slot->replica_id != replica);
  CHECK(h.core->router.find_replica(replica)->in_flight == 0);
}

TEST_CASE("peer client: a stream's head - chunks and end reach the client - each chunk is credited back") {
  Harness h(Replicas{{"r1", "n2"}});
  auto other = h.connect("n2");
  std::shared_ptr<FakeExchange> ex;
  CallPtr c;
  uint64_t call = h.dispatch_to(other, c, ex);
  // A chunk before the head breaks the protocol.
  {
    Harness h2(Replicas{{"r1", "n2"}});
    auto o2 = h2.connect("n2");
    std::shared_ptr<FakeExchange> ex2;
    auto c2 = h2.make_call(ex2);
    dispatch(c2);
    REQUIRE(h2.run_until([&] { return requests_of(*o2).size() == 1; }));
    o2->frame(channel::Kind::chunk, requests_of(*o2)[0].call, 0, 0, "x", 1);
    REQUIRE(h2.run_until([&] { return !h2.worker.peers.up("n2"); }));
    CHECK(ex2->chunks.empty());
  }
  HttpResponse head = ok("");
  head.stream = 1;
  other->answer(channel::Kind::head, call, head);
  REQUIRE(h.run_until([&] { return c->streaming && ex->answers.size() == 1; }));
  other->frame(channel::Kind::chunk, call, 0, 0, "hello", 5);
  REQUIRE(h.run_until([&] { return other->count(channel::Kind::credit) == 1; }));
  CHECK(ex->chunks == std::vector<std::string>{"hello"});
  CHECK(other->last(channel::Kind::credit)->amount == 5);
  CHECK(other->last(channel::Kind::credit)->call == call);
  other->frame(channel::Kind::end, call, 0, channel::kComplete, nullptr, 0);
  REQUIRE(h.run_until([&] { return ex->ended != -1; }));
  CHECK(ex->ended == 1);
  CHECK(h.core->router.find_replica("r1")->in_flight == 0);
  CHECK(h.worker.active.empty());
}

TEST_CASE("peer server: a connection without this node's token is refused and closed") {
  Harness h(Replicas{{"r1", "n1"}}, {"r1"});
  for (std::string token : {std::string("wrong-token"), std::string()}) {
    CAPTURE(token);
    auto [mine, other] = h.pair();
    h.worker.served.serve(std::move(mine));
    CHECK(h.worker.served.connections() == 1);
    other->frame(channel::Kind::hello, 0, 0, 0, token.data(), token.size());
    REQUIRE(h.run_until([&, o = other] { return !o->closed_for.empty(); }));
    CHECK(other->count(channel::Kind::hello) == 0);
    CHECK(h.worker.served.connections() == 0);
  }
  // A request before any hello is refused the same way, and never served.
  auto [mine, other] = h.pair();
  h.worker.served.serve(std::move(mine));
  HttpRequest r;
  r.path = "/x";
  other->request(1, r, "r1");
  REQUIRE(h.run_until([&, o = other] { return !o->closed_for.empty(); }));
  CHECK(h.fakes["r1"]->calls == 0);
}

TEST_CASE("peer server: with the token it serves a non-blocking in-process replica at once") {
  Harness h(Replicas{{"r1", "n1"}}, {"r1"});
  auto other = h.served_conn();
  HttpRequest r;
  r.path = "/x";
  r.request_id = "req-7";
  other->request(5, r, "r1");
  REQUIRE(h.run_until([&, o = other] { return o->count(channel::Kind::answer) == 1; }));
  auto* a = other->last(channel::Kind::answer);
  CHECK(a->call == 5);
  HttpResponse answer;
  REQUIRE(channel::decode_answer(a->payload.data(), a->payload.size(), answer));
  CHECK(answer.status == 200);
  CHECK(answer.body == "from r1");
  REQUIRE(h.fakes["r1"]->calls == 1);
  CHECK(h.fakes["r1"]->seen.request_id == "req-7");
  // Its own key at the replica, not the other worker's id.
  CHECK(h.fakes["r1"]->seen.call_key != 5);
  // Overloaded: a failure frame that carries the refusal.
  h.fakes["r1"]->kind = local::InlineResult::overloaded;
  other->request(6, r, "r1");
  REQUIRE(h.run_until([&, o = other] { return o->count(channel::Kind::failed) == 1; }));
  auto* f = other->last(channel::Kind::failed);
  CHECK(f->call == 6);
  auto err = error_of(f->amount, f->payload.data(), f->payload.size());
  CHECK(from_caf_error(err).code() == errc::overloaded);
}

TEST_CASE("peer server: a request for a replica it does not have fails naming it - a request id in use closes the connection") {
  Harness h(Replicas{{"r1", "n1"}, {"r9", "n9"}});
  auto other = h.served_conn();
  HttpRequest r;
  r.path = "/x";
  // r9 is another node's; zz nobody's.
  for (std::string id : {std::string("r9"), std::string("zz")}) {
    other->request(1, r, id);
  }
  REQUIRE(h.run_until([&, o = other] { return o->count(channel::Kind::failed) == 2; }));
  for (size_t i = 0; i < 2; ++i) {
    const auto& f = other->frames[1 + i];
    REQUIRE(f.kind == channel::Kind::failed);
    auto st = from_caf_error(error_of(f.amount, f.payload.data(), f.payload.size()));
    CHECK(st.code() == errc::unavailable);
    CHECK(st.message() ==
          "replica " + std::string(i == 0 ? "r9" : "zz") + " is not a replica of node n1");
  }
  // r1's handle never answers here: the request stays in flight, and a second
  // request with its id breaks the protocol.
  other->request(2, r, "r1");
  h.settle();
  CHECK(other->closed_for.empty());
  other->request(2, r, "r1");
  REQUIRE(h.run_until([&, o = other] { return !o->closed_for.empty(); }));
  CHECK(h.worker.served.connections() == 0);
}

// --- over TLS (proxy/data_tls.hpp) -------------------------------------------------

namespace {

// A cluster CA with the nodes n1 and n2 and the operator alice; another CA
// with a node of its own, mallory. Removed with the test.
struct Certs {
  std::string root, dir, other;
  Certs() {
    char tmpl[] = "/tmp/troupe-peer-tls.XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    root = tmpl;
    dir = root + "/ca";
    other = root + "/other";
    REQUIRE(security::init_ca(dir));
    REQUIRE(security::issue_certificate(dir, "n1", security::Role::node));
    REQUIRE(security::issue_certificate(dir, "n2", security::Role::node));
    REQUIRE(security::issue_certificate(dir, "alice", security::Role::operator_));
    REQUIRE(security::init_ca(other));
    REQUIRE(security::issue_certificate(other, "mallory", security::Role::node));
  }
  ~Certs() { std::filesystem::remove_all(root); }

  static std::shared_ptr<DataTls> load(const std::string& d, const std::string& name) {
    auto tls = DataTls::load(d, name);
    REQUIRE(tls);
    return tls.value();
  }
  // A context that presents `name` of `d` (none when empty) and checks
  // nothing of the peer: a stranger who goes as far as TLS lets it.
  static std::shared_ptr<asio::ssl::context> stranger(const std::string& d,
                                                      const std::string& name) {
    auto ctx = std::make_shared<asio::ssl::context>(asio::ssl::context::tls);
    if (!name.empty()) {
      ctx->use_certificate_chain_file(d + "/" + name + ".crt");
      ctx->use_private_key_file(d + "/" + name + ".key", asio::ssl::context::pem);
    }
    ctx->set_verify_mode(asio::ssl::verify_none);
    return ctx;
  }
};

// The harness with this node's log kept, and TLS on with n1's certificate.
struct TlsHarness : Harness {
  Certs certs;
  std::ostringstream log_text;
  explicit TlsHarness(const Replicas& replicas, std::vector<std::string> inline_ids = {})
      : Harness(replicas, std::move(inline_ids)) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(log_text);
    sink->set_pattern("%l %v");
    core->log = std::make_shared<spdlog::logger>("peer-tls-test", sink);
    core->options.data_tls = Certs::load(certs.dir, "n1");
  }
  bool logged(const std::string& text) const {
    return log_text.str().find(text) != std::string::npos;
  }

  // A socket pair whose other end runs a TLS handshake with `ctx` (as the
  // accepting side when `server`) and reads once it succeeded; its
  // outcome lands in `*outcome` ("" or why it failed).
  std::pair<ip::tcp::socket, std::shared_ptr<OtherSide>> tls_pair(
      std::shared_ptr<asio::ssl::context> ctx, bool server,
      std::shared_ptr<std::optional<std::string>> outcome) {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    ip::tcp::socket mine(io);
    mine.assign(ip::tcp::v4(), fds[0]);
    auto other = std::make_shared<OtherSide>(io, fds[1]);
    others.push_back(other);
    other->handshake(std::move(ctx), server, [o = other.get(), outcome](const std::string& why) {
      *outcome = why;
      if (why.empty())
        o->read();
      else
        o->close(why);
    });
    return {std::move(mine), other};
  }
};

}  // namespace

TEST_CASE("peer client and server over TLS: node certificates of the cluster get through - requests and answers travel encrypted") {
  TlsHarness h(Replicas{{"r1", "n2"}});
  // This node's client to n2's data port, n2 played with n2's certificate.
  auto outcome = std::make_shared<std::optional<std::string>>();
  auto [mine, other] = h.tls_pair(Certs::load(h.certs.dir, "n2")->context(), true, outcome);
  h.worker.peers.adopt("n2", DataPortEndpoint{"127.0.0.1", 1, "tok"}, std::move(mine));
  REQUIRE(h.run_until([&, o = other] { return o->count(channel::Kind::hello) == 1; }));
  CHECK(*outcome == std::optional<std::string>(""));
  CHECK(other->frames[0].payload == "tok");
  other->frame(channel::Kind::hello, 0, 0, 0, nullptr, 0);
  REQUIRE(h.run_until([&] { return h.worker.peers.up("n2"); }));
  std::shared_ptr<FakeExchange> ex;
  CallPtr c;
  uint64_t sent = h.dispatch_to(other, c, ex);
  CHECK(c->via == &h.worker.peers);
  other->answer(channel::Kind::answer, sent, ok("from n2 over TLS"));
  REQUIRE(h.run_until([&] { return c->done; }));
  CHECK(status_of(*ex) == 200);
  CHECK(ex->answers[0].body() == "from n2 over TLS");

  // This node's data port served to n2 over TLS: hello with the token
  // inside the session, hello back.
  auto served_outcome = std::make_shared<std::optional<std::string>>();
  auto [theirs, client] =
      h.tls_pair(Certs::load(h.certs.dir, "n2")->context(), false, served_outcome);
  h.worker.served.serve(std::move(theirs));
  std::string token = h.core->data_token;
  client->frame(channel::Kind::hello, 0, 0, 0, token.data(), token.size());
  REQUIRE(h.run_until([&, o = client] { return o->count(channel::Kind::hello) == 1; }));
  CHECK(*served_outcome == std::optional<std::string>(""));
  CHECK_FALSE(h.logged("refused"));
}

TEST_CASE("peer server over TLS: an operator's certificate - another CA's - none and plain TCP are refused with the token - the log names each") {
  TlsHarness h(Replicas{{"r1", "n1"}});
  std::string token = h.core->data_token;
  struct Stranger {
    std::string dir, name;
    bool tls;
    std::string logged;
  };
  const std::vector<Stranger> strangers = {
      {h.certs.dir, "alice", true, "its certificate 'alice' has the operator role: data ports "
                                   "serve nodes only"},
      {h.certs.other, "mallory", true, "its certificate 'mallory' was refused: unable to get "
                                       "local issuer certificate"},
      {h.certs.dir, "", true, "it presented no certificate"},
      {"", "", false, "it does not speak TLS"},
  };
  for (const auto& s : strangers) {
    CAPTURE(s.logged);
    std::shared_ptr<OtherSide> client;
    if (s.tls) {
      auto outcome = std::make_shared<std::optional<std::string>>();
      auto [theirs, other] = h.tls_pair(Certs::stranger(s.dir, s.name), false, outcome);
      h.worker.served.serve(std::move(theirs));
      client = other;
    } else {
      auto [theirs, other] = h.pair();
      h.worker.served.serve(std::move(theirs));
      client = other;
    }
    // It even knows the token: without a node certificate it does not help.
    client->frame(channel::Kind::hello, 0, 0, 0, token.data(), token.size());
    REQUIRE(h.run_until([&] { return h.logged(s.logged); }));
    REQUIRE(h.run_until([&] { return h.worker.served.connections() == 0; }));
    h.settle();
    CHECK(client->count(channel::Kind::hello) == 0);
    CHECK(h.logged("refused a data port connection from"));
  }
}

TEST_CASE("peer client over TLS: a data port that shows an operator's certificate is refused - before the token - requests go another way") {
  TlsHarness h(Replicas{{"r1", "n2"}});
  auto outcome = std::make_shared<std::optional<std::string>>();
  auto [mine, other] = h.tls_pair(Certs::stranger(h.certs.dir, "alice"), true, outcome);
  h.worker.peers.adopt("n2", DataPortEndpoint{"127.0.0.1", 1, "tok"}, std::move(mine));
  REQUIRE(h.run_until([&] {
    return h.logged("no data port connection to node n2") &&
           h.logged("its certificate 'alice' has the operator role");
  }));
  h.settle();
  CHECK_FALSE(h.worker.peers.up("n2"));
  CHECK(other->count(channel::Kind::hello) == 0);  // the token never left
  std::shared_ptr<FakeExchange> ex;
  auto c = h.make_call(ex);
  c->slot = h.core->router.find_replica("r1");
  REQUIRE(c->slot);
  c->key = 12;
  CHECK_FALSE(h.worker.peers.send(c));
  h.worker.untrack(c.get());
}
