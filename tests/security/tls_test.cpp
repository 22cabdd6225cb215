// Two CAF actor systems in one process talk over loopback through CAF's
// OpenSSL module: who gets through the handshake and who does not.
#include "runtime/security/tls.hpp"

#include <chrono>
#include <condition_variable>
#include <ctime>
#include <filesystem>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/manager.hpp>

#include "runtime/system_setup.hpp"
#include "tests/support/temp_dir.hpp"

using troupe::errc;
using namespace troupe::security;
using troupe::testing::TempDir;

namespace {

// Bounds every wait: a failed handshake must end in an error, never a hang.
constexpr auto kTimeout = std::chrono::seconds(10);

struct Outcome {
  bool ok = false;
  int answer = 0;
  caf::error error;
  std::string text;
};

// A client system configured by `setup`: connects to 127.0.0.1:`port` through
// the transport actor and asks the published actor for 41 + 1.
template <class Setup>
Outcome call(uint16_t port, Setup setup) {
  caf::actor_system_config cfg;
  troupe::configure_actor_system(cfg, {});
  setup(cfg);
  caf::actor_system sys{cfg};
  Outcome out;
  caf::scoped_actor self{sys};
  caf::strong_actor_ptr server;
  self->request(transport_actor(sys), kTimeout, caf::connect_atom::value, std::string("127.0.0.1"),
                port)
      .receive([&](caf::node_id&, caf::strong_actor_ptr& ptr,
                   std::set<std::string>&) { server = std::move(ptr); },
               [&](caf::error& err) { out.error = std::move(err); });
  if (!server) {
    out.text = sys.render(out.error);
    return out;
  }
  self->request(caf::actor_cast<caf::actor>(server), kTimeout, 41)
      .receive(
          [&](int answer) {
            out.ok = true;
            out.answer = answer;
          },
          [&](caf::error& err) {
            out.error = std::move(err);
            out.text = sys.render(out.error);
          });
  return out;
}

// Two clusters: "home" (server, operator, and an expired identity) and
// "foreign" (an operator of another CA).
struct Fixture {
  TempDir tmp;
  std::string home = tmp / "home";
  std::string foreign = tmp / "foreign";

  Fixture() {
    REQUIRE(init_ca(home).is_ok());
    REQUIRE(init_ca(foreign).is_ok());
    REQUIRE(issue_certificate(home, "server", Role::node, 1).is_ok());
    REQUIRE(issue_certificate(home, "alice", Role::operator_, 1).is_ok());
    int64_t now = static_cast<int64_t>(std::time(nullptr));
    REQUIRE(
        issue_certificate(home, "old", Role::operator_, Validity{now - 7200, now - 3600}).is_ok());
    REQUIRE(issue_certificate(foreign, "mallory", Role::operator_, 1).is_ok());
  }

  // A directory that trusts the home CA but holds mallory's identity.
  std::string mixed() {
    std::string dir = tmp / "mixed";
    if (std::filesystem::create_directory(dir)) {
      std::filesystem::copy_file(home + "/ca.crt", dir + "/ca.crt");
      std::filesystem::copy_file(foreign + "/mallory.crt", dir + "/mallory.crt");
      std::filesystem::copy_file(foreign + "/mallory.key", dir + "/mallory.key");
    }
    return dir;
  }
};

// CAF's OpenSSL settings made directly, past configure_tls()'s checks (which
// refuse an expired identity): trust `ca_dir`'s CA, present `identity`
// ("<dir>/<name>", without .crt/.key).
void set_tls_files(caf::actor_system_config& cfg, const std::string& ca_dir,
                   const std::string& identity) {
  cfg.load<caf::openssl::manager>();
  cfg.openssl_cafile = ca_dir + "/ca.crt";
  cfg.openssl_certificate = identity + ".crt";
  cfg.openssl_key = identity + ".key";
}

// The server side: an adder published over TLS with the home CA.
struct Server {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::actor adder;
  uint16_t port = 0;

  explicit Server(const std::string& tls_dir) {
    troupe::configure_actor_system(cfg, {});
    auto configured = configure_tls(cfg, tls_dir, "server");
    REQUIRE_MESSAGE(configured, configured.to_string());
    sys = std::make_unique<caf::actor_system>(cfg);
    REQUIRE(tls_enabled(*sys));
    adder = sys->spawn([]() -> caf::behavior { return {[](int x) { return x + 1; }}; });
    // Port 0: the kernel picks a free port, so parallel test runs never clash.
    auto published = publish(adder, 0, "127.0.0.1");
    REQUIRE_MESSAGE(published, sys->render(published.error()));
    port = *published;
  }
  ~Server() {
    caf::anon_send_exit(adder, caf::exit_reason::user_shutdown);
    sys.reset();
  }
};

// A refused handshake ends the connect attempt with an error of its own, long
// before the request's timeout.
void check_refused(const Outcome& out) {
  CHECK_FALSE(out.ok);
  CHECK(out.error);
  CHECK_MESSAGE(out.error != caf::make_error(caf::sec::request_timeout), out.text);
}

}  // namespace

TEST_CASE("configure_tls checks the files before CAF sees them") {
  Fixture f;
  SUBCASE("valid identity: module loaded, absolute paths set") {
    caf::actor_system_config cfg;
    troupe::configure_actor_system(cfg, {});
    REQUIRE(configure_tls(cfg, f.home, "alice"));
    CHECK(cfg.openssl_cafile == f.home + "/ca.crt");
    CHECK(cfg.openssl_certificate == f.home + "/alice.crt");
    CHECK(cfg.openssl_key == f.home + "/alice.key");
  }
  SUBCASE("a missing file is named") {
    caf::actor_system_config cfg;
    auto s = configure_tls(cfg, f.home, "bob");
    CHECK(s.code() == errc::not_found);
    CHECK(s.message().find(f.home + "/bob.crt: no such file") != std::string::npos);
    CHECK(cfg.openssl_certificate.empty());
  }
  SUBCASE("an expired identity is refused at start with its date") {
    caf::actor_system_config cfg;
    auto s = configure_tls(cfg, f.home, "old");
    CHECK(s.code() == errc::permission_denied);
    CHECK(s.message().find("certificate 'old'") != std::string::npos);
    CHECK(s.message().find("expired on") != std::string::npos);
    CHECK(cfg.openssl_certificate.empty());
  }
}

TEST_CASE("mutual TLS between two actor systems") {
  Fixture f;
  Server server(f.home);

  SUBCASE("a client with a certificate of the cluster CA gets an answer") {
    auto out = call(server.port, [&](caf::actor_system_config& cfg) {
      REQUIRE(configure_tls(cfg, f.home, "alice"));
    });
    CHECK_MESSAGE(out.ok, out.text);
    CHECK(out.answer == 42);
    auto diagnosis = diagnose_tls("127.0.0.1", server.port, f.home, "alice", kTimeout);
    CHECK_MESSAGE(diagnosis.is_ok(), diagnosis.to_string());
  }

  SUBCASE("a client with a certificate of another CA fails to connect") {
    auto out = call(server.port, [&](caf::actor_system_config& cfg) {
      REQUIRE(configure_tls(cfg, f.foreign, "mallory"));
    });
    check_refused(out);
    // CAF does not say why; diagnose_tls does.
    auto why = diagnose_tls("127.0.0.1", server.port, f.foreign, "mallory", kTimeout);
    CHECK(why.code() == errc::permission_denied);
    CHECK_MESSAGE(why.message().find("the certificate 'server' it presented is not signed by "
                                     "this cluster's CA") != std::string::npos,
                  why.message());
  }

  SUBCASE("a client that trusts the cluster CA but shows another CA's certificate fails") {
    // The client accepts the server; the server must refuse the client.
    auto out = call(server.port, [&](caf::actor_system_config& cfg) {
      set_tls_files(cfg, f.home, f.foreign + "/mallory");
    });
    check_refused(out);
  }

  SUBCASE("a client with an expired certificate fails to connect") {
    // configure_tls refuses an expired identity, so set CAF's fields directly.
    auto out = call(server.port, [&](caf::actor_system_config& cfg) {
      set_tls_files(cfg, f.home, f.home + "/old");
    });
    check_refused(out);
    // The server's alert says so, and so does our own check.
    auto why = diagnose_tls("127.0.0.1", server.port, f.home, "old", kTimeout);
    CHECK(why.code() == errc::permission_denied);
    CHECK_MESSAGE(why.message().find("refused our certificate 'old' (sslv3 alert certificate "
                                     "expired)") != std::string::npos,
                  why.message());
    CHECK_MESSAGE(why.message().find("expired on") != std::string::npos, why.message());
  }

  SUBCASE("a TLS client without a certificate fails to connect") {
    // CAF's OpenSSL module with no files configured: anonymous TLS.
    auto out = call(server.port,
                    [&](caf::actor_system_config& cfg) { cfg.load<caf::openssl::manager>(); });
    check_refused(out);
  }

  SUBCASE("a client that trusts the cluster CA but shows another CA's certificate is told so") {
    // A directory with the home CA and mallory's identity.
    auto why = diagnose_tls("127.0.0.1", server.port, f.mixed(), "", kTimeout);
    CHECK(why.code() == errc::permission_denied);
    CHECK_MESSAGE(
        why.message().find("refused our certificate 'mallory' (tlsv1 alert unknown ca)") !=
            std::string::npos,
        why.message());
  }

  SUBCASE("a plain-text client fails to connect") {
    auto out = call(server.port, [](caf::actor_system_config&) {});
    check_refused(out);
  }

  // Whatever was refused before, the server still serves valid clients.
  auto again = call(server.port, [&](caf::actor_system_config& cfg) {
    REQUIRE(configure_tls(cfg, f.home, "alice"));
  });
  CHECK_MESSAGE(again.ok, again.text);
}

namespace {

// A cluster member that keeps one TLS connection to the server open.
struct Member {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::actor server;

  Member(const std::string& tls_dir, const std::string& name, uint16_t port) {
    troupe::configure_actor_system(cfg, {});
    auto configured = configure_tls(cfg, tls_dir, name);
    REQUIRE_MESSAGE(configured, configured.to_string());
    sys = std::make_unique<caf::actor_system>(cfg);
    caf::scoped_actor self{*sys};
    self->request(transport_actor(*sys), kTimeout, caf::connect_atom::value,
                  std::string("127.0.0.1"), port)
        .receive([&](caf::node_id&, caf::strong_actor_ptr& ptr,
                     std::set<std::string>&) { server = caf::actor_cast<caf::actor>(ptr); },
                 [&](caf::error& err) { FAIL("member cannot connect: " << sys->render(err)); });
  }

  // One round trip over the member's existing connection.
  bool ask(std::string& why) {
    caf::scoped_actor self{*sys};
    bool ok = false;
    self->request(server, kTimeout, 41)
        .receive([&](int answer) { ok = answer == 42; },
                 [&](caf::error& err) { why = sys->render(err); });
    return ok;
  }
};

// Collects the failed handshakes this process reports.
struct FailureLog {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<HandshakeFailure> seen;

  FailureLog() {
    on_handshake_failure([this](const HandshakeFailure& f) {
      std::lock_guard<std::mutex> guard(mutex);
      seen.push_back(f);
      changed.notify_all();
    });
  }
  ~FailureLog() { on_handshake_failure(nullptr); }

  // Waits (bounded) for a refusal on the accepting side whose reason
  // contains `text`; returns it, or an empty failure.
  HandshakeFailure refused_with(const std::string& text) {
    std::unique_lock<std::mutex> lock(mutex);
    HandshakeFailure found;
    changed.wait_for(lock, kTimeout, [&] {
      for (auto& f : seen) {
        if (f.accepting && f.reason.find(text) != std::string::npos) {
          found = f;
          return true;
        }
      }
      return false;
    });
    return found;
  }
};

}  // namespace

TEST_CASE("the OpenSSL error-queue guard is active in this program") {
  CHECK(detail::error_queue_guard_active());
}

TEST_CASE("an open TLS connection survives refused and departing peers") {
  // CAF 0.17 never clears OpenSSL's error queue: without troupe's guard, the
  // error a refused or departing peer leaves on the server's multiplexer
  // thread made the server drop the next connection that merely had to wait
  // for data.
  Fixture f;
  FailureLog failures;
  Server server(f.home);
  Member member(f.home, "alice", server.port);
  std::string why;
  REQUIRE_MESSAGE(member.ask(why), why);

  std::string mixed = f.mixed();

  struct Visitor {
    const char* what;
    std::function<void(caf::actor_system_config&)> setup;
    bool refused;
  };
  std::vector<Visitor> visitors = {
      {"a member that connects and leaves",
       [&](caf::actor_system_config& cfg) { REQUIRE(configure_tls(cfg, f.home, "alice")); }, false},
      {"a plain-text client", [](caf::actor_system_config&) {}, true},
      {"a client of another CA",
       [&](caf::actor_system_config& cfg) { REQUIRE(configure_tls(cfg, f.foreign, "mallory")); },
       true},
      {"a client showing another CA's certificate",
       [&](caf::actor_system_config& cfg) { set_tls_files(cfg, mixed, mixed + "/mallory"); }, true},
      {"a client with an expired certificate",
       [&](caf::actor_system_config& cfg) { set_tls_files(cfg, f.home, f.home + "/old"); }, true},
  };
  bool connected = true;
  for (int round = 0; round < 2 && connected; ++round) {
    for (auto& v : visitors) {
      std::string what = v.what;
      auto out = call(server.port, v.setup);
      if (v.refused)
        check_refused(out);
      else
        CHECK_MESSAGE(out.ok, what << ": " << out.text);
      // Several round trips: each ends with a read that has to wait. A
      // dropped connection shows as a timeout; one is enough to know.
      for (int i = 0; i < 3 && connected; ++i)
        connected = member.ask(why);
      if (!connected) {
        FAIL_CHECK("the member's connection broke after " << what << ": " << why);
        break;
      }
    }
  }

  // The server named each refused peer and the reason.
  auto foreign_cert = failures.refused_with("its certificate 'mallory' was refused");
  CHECK_MESSAGE(foreign_cert.peer.rfind("127.0.0.1:", 0) == 0, foreign_cert.peer);
  CHECK(foreign_cert.reason.find("unable to get local issuer certificate") != std::string::npos);
  auto expired = failures.refused_with("its certificate 'old' was refused");
  CHECK(expired.reason.find("certificate has expired") != std::string::npos);
  // The client of another CA refused the server's certificate first.
  auto unknown_ca = failures.refused_with("it refused our certificate (tlsv1 alert unknown ca)");
  CHECK_MESSAGE(unknown_ca.peer.rfind("127.0.0.1:", 0) == 0, unknown_ca.peer);
  auto plain = failures.refused_with("it does not speak TLS");
  CHECK_MESSAGE(plain.peer.rfind("127.0.0.1:", 0) == 0, plain.peer);
}
