// The etcd client, the election and the checkpoint in etcd against a real
// three-member etcd cluster on loopback (tools/common/etcd_cluster.hpp):
// members killed and quorum lost as faults; every wait has a deadline.
#include <atomic>
#include <thread>

#include <doctest/doctest.h>

#include "controller/ha/election.hpp"
#include "controller/ha/etcd_checkpoint_store.hpp"
#include "controller/ha/etcd_client.hpp"
#include "runtime/security/certs.hpp"
#include "tools/common/etcd_cluster.hpp"
#include "tools/common/process.hpp"
#include "tools/common/temp_dir.hpp"

using namespace troupe;
using namespace troupe::ha;
using namespace std::chrono_literals;

namespace {

EtcdOptions client_options(const proc::EtcdCluster& cluster,
                           std::chrono::milliseconds timeout = 1000ms) {
  EtcdOptions o;
  o.endpoints = cluster.client_urls();
  o.timeout = timeout;
  return o;
}

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Steps an election on the real clock until `done` holds or `within` passed.
bool step_until(Election& e, const std::function<bool()>& done, std::chrono::milliseconds within) {
  auto until = Clock::now() + within;
  while (Clock::now() < until) {
    auto next = e.step(Clock::now(), unix_ms());
    if (done())
      return true;
    auto wait = std::min(next, until) - Clock::now();
    if (wait > Clock::duration::zero())
      std::this_thread::sleep_for(std::min<Clock::duration>(wait, 20ms));  // the next round
  }
  return done();
}

controller::TargetState state_with(const std::string& app) {
  controller::TargetState s;
  controller::ApplicationSpec a;
  a.name = app;
  s.applications[app] = a;
  return s;
}

}  // namespace

TEST_CASE("etcd client: puts - gets and transactions carry any bytes - through one member and read through another") {
  proc::TempDir dir("etcd-client");
  proc::EtcdCluster cluster(dir.path());
  EtcdOptions one;
  one.endpoints = {cluster.member(0).client_url()};
  EtcdClient first(one);
  std::string bytes;
  for (int i = 0; i < 256; ++i)
    bytes.push_back(static_cast<char>(i));
  auto rev = first.put("/t/bytes", bytes);
  REQUIRE_MESSAGE(rev, rev.status().to_string());
  CHECK(*rev > 0);

  EtcdOptions third;
  third.endpoints = {cluster.member(2).client_url()};
  EtcdClient other(third);
  auto got = other.get("/t/bytes");
  REQUIRE_MESSAGE(got, got.status().to_string());
  REQUIRE(*got);
  CHECK((*got)->value == bytes);
  CHECK((*got)->create_revision == *rev);
  auto missing = other.get("/t/none");
  REQUIRE(missing);
  CHECK_FALSE(*missing);

  // A transaction: only the branch whose comparison holds runs.
  auto created = other.txn({Compare{"/t/once", Compare::Target::create_revision, 0, {}}},
                           {Op::put("/t/once", "a"), Op::get("/t/once")}, {Op::get("/t/once")});
  REQUIRE(created);
  CHECK(created->succeeded);
  REQUIRE(created->gets.size() == 1);
  REQUIRE(created->gets[0]);
  CHECK(created->gets[0]->value == "a");
  auto again = first.txn({Compare{"/t/once", Compare::Target::create_revision, 0, {}}},
                         {Op::put("/t/once", "b")}, {Op::get("/t/once")});
  REQUIRE(again);
  CHECK_FALSE(again->succeeded);
  REQUIRE(again->gets.size() == 1);
  REQUIRE(again->gets[0]);
  CHECK(again->gets[0]->value == "a");
}

TEST_CASE("etcd client: a lease keeps its key alive while renewed - revoked or expired it takes the key away") {
  proc::TempDir dir("etcd-lease");
  proc::EtcdCluster cluster(dir.path());
  EtcdClient c(client_options(cluster));
  auto lease = c.grant(1);
  REQUIRE_MESSAGE(lease, lease.status().to_string());
  REQUIRE(c.put("/t/leased", "x", *lease));
  auto ttl = c.keep_alive(*lease);
  REQUIRE_MESSAGE(ttl, ttl.status().to_string());
  CHECK(*ttl == 1);
  // Not renewed: etcd expires it (1 s, and its own rounding) and the key goes.
  CHECK(proc::wait_until([&] {
    auto kv = c.get("/t/leased");
    return kv && !*kv;
  }, 10s));
  auto gone = c.keep_alive(*lease);
  CHECK(gone.status().code() == errc::not_found);

  auto second = c.grant(30);
  REQUIRE(second);
  REQUIRE(c.put("/t/revoked", "y", *second));
  CHECK(c.revoke(*second).is_ok());
  auto kv = c.get("/t/revoked");
  REQUIRE(kv);
  CHECK_FALSE(*kv);
  CHECK(c.revoke(*second).is_ok());  // gone already: fine
  CHECK(c.keep_alive(*second).status().code() == errc::not_found);
}

TEST_CASE("etcd client: when the member it uses dies the next call is answered by another") {
  proc::TempDir dir("etcd-failover");
  proc::EtcdCluster cluster(dir.path());
  EtcdClient c(client_options(cluster, 3000ms));
  REQUIRE(c.put("/t/k", "1"));
  std::string used = c.endpoint();
  REQUIRE_FALSE(used.empty());
  size_t index = 0;
  for (size_t i = 0; i < cluster.size(); ++i)
    if (cluster.member(i).client_url() == used)
      index = i;
  cluster.kill(index);
  auto rev = c.put("/t/k", "2");
  REQUIRE_MESSAGE(rev, rev.status().to_string());
  CHECK(c.endpoint() != used);
  auto kv = c.get("/t/k");
  REQUIRE(kv);
  REQUIRE(*kv);
  CHECK((*kv)->value == "2");
}

TEST_CASE("etcd client: no member reachable - the error names every member and why") {
  EtcdOptions o;
  o.endpoints = {"http://127.0.0.1:" + std::to_string(proc::free_port()),
                 "127.0.0.1:" + std::to_string(proc::free_port())};
  o.timeout = 500ms;
  EtcdClient c(o);
  auto r = c.get("/t/x");
  REQUIRE_FALSE(r);
  CHECK(r.status().code() == errc::unavailable);
  CHECK(r.status().message().find(o.endpoints[0]) != std::string::npos);
  CHECK(r.status().message().find("Connection refused") != std::string::npos);
}

TEST_CASE("etcd endpoints: a list of URLs or host:port - a bad entry is named") {
  auto ok = parse_endpoints("http://10.0.0.1:2379,10.0.0.2:2379");
  REQUIRE(ok);
  CHECK(*ok == std::vector<std::string>{"http://10.0.0.1:2379", "http://10.0.0.2:2379"});
  auto bad = parse_endpoints("10.0.0.1:2379,https//x");
  REQUIRE_FALSE(bad);
  CHECK(bad.status().code() == errc::invalid_argument);
  CHECK(bad.status().message().find("'https//x'") != std::string::npos);
  CHECK_FALSE(parse_endpoints("10.0.0.1:99999"));
  CHECK_FALSE(parse_endpoints(""));
}

TEST_CASE("election on etcd: one leader of three - a killed leader is followed within its lease - a resigned one at once") {
  proc::TempDir dir("etcd-election");
  proc::EtcdCluster cluster(dir.path());
  std::vector<std::unique_ptr<EtcdElectionBackend>> backends;
  std::vector<std::unique_ptr<Election>> heads;
  for (const char* name : {"h1", "h2", "h3"}) {
    backends.push_back(std::make_unique<EtcdElectionBackend>(client_options(cluster)));
    ElectionOptions o;
    o.prefix = "/troupe-test";
    o.name = name;
    o.address = std::string(name) + ":7300";
    heads.push_back(std::make_unique<Election>(o, *backends.back()));
  }
  auto now_leading = [&] {
    int n = 0;
    for (auto& h : heads)
      if (h->leading(Clock::now()))
        ++n;
    return n;
  };
  REQUIRE(step_until(*heads[0], [&] { return heads[0]->leading(Clock::now()); }, 5s));
  for (size_t i : {1, 2}) {
    REQUIRE(step_until(*heads[i], [&] { return heads[i]->holder().has_value(); }, 5s));
    CHECK(heads[i]->holder()->name == "h1");
    CHECK(heads[i]->holder()->address == "h1:7300");
    CHECK_FALSE(heads[i]->leading(Clock::now()));
  }
  CHECK(now_leading() == 1);

  // h1 stops taking steps without resigning (a kill -9): its lease runs out
  // in etcd and one of the others leads.
  auto killed = Clock::now();
  bool taken = false;
  while (!taken && Clock::now() - killed < 6s) {
    for (size_t i : {1, 2}) {
      heads[i]->step(Clock::now(), unix_ms());
      taken = taken || heads[i]->leading(Clock::now());
    }
    std::this_thread::sleep_for(20ms);  // the next round
  }
  REQUIRE(taken);
  auto took = Clock::now() - killed;
  MESSAGE("a new leader " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                          << " ms after the old one stopped");
  CHECK(took >= 1000ms);  // not before its lease could have expired
  CHECK(took <= 3500ms);
  size_t next = heads[1]->leading(Clock::now()) ? 1 : 2;
  size_t other = next == 1 ? 2 : 1;
  CHECK(heads[next]->term() > 0);

  // The new leader resigns: the third takes over at its next look.
  CHECK(heads[next]->resign().is_ok());
  auto resigned = Clock::now();
  REQUIRE(step_until(*heads[other], [&] { return heads[other]->leading(Clock::now()); }, 3s));
  CHECK(Clock::now() - resigned <= 1000ms);
}

TEST_CASE("checkpoint in etcd: the leader's saves load back - a deposed leader's late write is refused (fencing)") {
  proc::TempDir dir("etcd-fencing");
  proc::EtcdCluster cluster(dir.path());
  EtcdElectionBackend b1(client_options(cluster)), b2(client_options(cluster));
  ElectionOptions o1;
  o1.prefix = "/troupe-test";
  o1.name = "h1";
  ElectionOptions o2 = o1;
  o2.name = "h2";
  Election e1(o1, b1), e2(o2, b2);
  REQUIRE(step_until(e1, [&] { return e1.leading(Clock::now()); }, 5s));
  REQUIRE(step_until(e2, [&] { return e2.holder().has_value(); }, 5s));

  // h1's store writes under whatever term h1 believed it had: the one it
  // won, kept after it was deposed (the late writer).
  int64_t h1_term = e1.term();
  EtcdCheckpointStore s1(client_options(cluster), "/troupe-test", [&] { return h1_term; });
  EtcdCheckpointStore s2(client_options(cluster), "/troupe-test", [&] { return e2.term(); });
  auto empty = s2.load();
  REQUIRE_MESSAGE(empty, empty.status().to_string());
  CHECK_FALSE(*empty);
  REQUIRE(s1.save(state_with("first")).is_ok());
  auto loaded = s2.load();
  REQUIRE(loaded);
  REQUIRE(*loaded);
  CHECK((*loaded)->applications.count("first") == 1);
  // h2 does not lead: it may not write.
  auto refused = s2.save(state_with("not-leader"));
  CHECK(refused.code() == errc::conflict);
  CHECK(refused.message().find("fenced") != std::string::npos);

  // h1 is cut off (no more steps, its lease revoked as etcd would expire
  // it) and h2 takes over and writes.
  REQUIRE(b2.client().revoke(e1.lease()).is_ok());
  REQUIRE(step_until(e2, [&] { return e2.leading(Clock::now()); }, 5s));
  CHECK(e2.term() > h1_term);
  REQUIRE(s2.save(state_with("second")).is_ok());
  auto late = s1.save(state_with("late"));
  CHECK(late.code() == errc::conflict);
  CHECK(late.message().find("fenced: this head's term " + std::to_string(h1_term) + " is over") !=
        std::string::npos);
  CHECK(late.message().find("'h2' leads") != std::string::npos);
  auto now = s1.load();
  REQUIRE(now);
  REQUIRE(*now);
  CHECK((*now)->applications.count("second") == 1);
  CHECK((*now)->applications.count("late") == 0);
  // The list of live nodes beside it is fenced the same way.
  CHECK(s2.load_nodes().empty());  // none written yet
  REQUIRE(s2.save_nodes("h2\nw1\n").is_ok());
  CHECK(s1.load_nodes() == "h2\nw1\n");
  auto late_nodes = s1.save_nodes("h1\n");
  CHECK(late_nodes.code() == errc::conflict);
  CHECK(late_nodes.message().find("the list of live nodes in etcd was not written") !=
        std::string::npos);
  CHECK(s2.load_nodes() == "h2\nw1\n");
}

TEST_CASE("checkpoint in etcd: one member lost changes nothing - without quorum saves are refused and nothing is lost - quorum back and it writes") {
  proc::TempDir dir("etcd-quorum");
  proc::EtcdCluster cluster(dir.path());
  EtcdElectionBackend b(client_options(cluster));
  ElectionOptions o;
  o.prefix = "/troupe-test";
  o.name = "h1";
  Election e(o, b);
  REQUIRE(step_until(e, [&] { return e.leading(Clock::now()); }, 5s));
  EtcdCheckpointStore store(client_options(cluster, 2000ms), "/troupe-test",
                            [&] { return e.term(); });
  REQUIRE(store.save(state_with("a")).is_ok());

  // A member that is not etcd's own leader: losing that one leaves etcd
  // without a leader until it elects another (its election timeout, 500 ms
  // here, and up to twice that), which a write's deadline need not outlast.
  auto raft_leader = cluster.raft_leader();
  REQUIRE(raft_leader < cluster.size());
  size_t lost = (raft_leader + 1) % 3, second = (raft_leader + 2) % 3;
  cluster.kill(lost);
  auto one_lost = store.save(state_with("b"));
  CHECK_MESSAGE(one_lost.is_ok(), one_lost.to_string());

  cluster.kill(second);
  auto no_quorum = store.save(state_with("c"));
  REQUIRE_FALSE(no_quorum.is_ok());
  // The member left took the write and could not commit it: etcd may still
  // commit it once it has a quorum, and the refusal says so. A write no
  // member took is simply not written.
  CHECK(no_quorum.code() == errc::unavailable);
  if (no_quorum.message().find("the checkpoint was not confirmed by etcd") != std::string::npos)
    CHECK(no_quorum.message().find("etcd may still write it once it has a quorum again") !=
          std::string::npos);
  else
    CHECK(no_quorum.message().find("the checkpoint was not written to etcd") != std::string::npos);
  MESSAGE("without quorum: " << no_quorum.to_string());

  cluster.start(second);
  REQUIRE(cluster.has_quorum(20s));
  // The election renews (or wins again) once etcd answers.
  REQUIRE(step_until(e, [&] { return e.leading(Clock::now()); }, 10s));
  REQUIRE(proc::wait_until([&] { return store.save(state_with("d")).is_ok(); }, 10s));
  auto loaded = store.load();
  REQUIRE(loaded);
  REQUIRE(*loaded);
  CHECK((*loaded)->applications.count("d") == 1);
}

TEST_CASE("etcd harness: a killed member comes back with its data - the cluster leaves no process behind") {
  proc::TempDir dir("etcd-harness");
  {
    proc::EtcdCluster cluster(dir.path());
    CHECK(cluster.size() == 3);
    EtcdClient c(client_options(cluster));
    REQUIRE(c.put("/t/kept", "v"));
    cluster.kill(0);
    CHECK_FALSE(cluster.running(0));
    cluster.start(0);
    REQUIRE(proc::wait_until([&] { return cluster.healthy(0); }, 20s));
    EtcdOptions first;
    first.endpoints = {cluster.member(0).client_url()};
    EtcdClient back(first);
    auto kv = back.get("/t/kept");
    REQUIRE_MESSAGE(kv, kv.status().to_string());
    REQUIRE(*kv);
    CHECK((*kv)->value == "v");
    CHECK_FALSE(proc::processes_mentioning(dir.path()).empty());
  }
  CHECK(proc::processes_mentioning(dir.path()).empty());
}

// --- TLS to etcd (issue 42, item 2) ---

namespace {

// A cluster CA with the identities `etcd` (every member's server
// certificate: an identity certificate of runtime/security/certs.hpp
// carries IP:127.0.0.1 and serverAuth + clientAuth) and `h1` (a head's node
// certificate), another CA with `mallory`, and a three-member etcd that
// serves its client URLs over TLS only and wants client certificates of
// the cluster CA.
struct TlsEtcd {
  proc::TempDir dir{"etcd-tls"};
  std::string certs = dir / "certs";
  std::string other = dir / "other";
  std::unique_ptr<proc::EtcdCluster> cluster;

  TlsEtcd() {
    REQUIRE(security::init_ca(certs).is_ok());
    REQUIRE(security::issue_certificate(certs, "etcd", security::Role::node).is_ok());
    REQUIRE(security::issue_certificate(certs, "h1", security::Role::node).is_ok());
    REQUIRE(security::init_ca(other).is_ok());
    REQUIRE(security::issue_certificate(other, "mallory", security::Role::node).is_ok());
    cluster = std::make_unique<proc::EtcdCluster>(
        dir / "etcd", proc::EtcdTlsFiles{certs + "/ca.crt", certs + "/etcd.crt", certs + "/etcd.key"});
  }

  // Options of a client trusting `ca_dir`'s CA and presenting `name` of
  // `cert_dir`.
  EtcdOptions client(const std::string& ca_dir, const std::string& cert_dir,
                     const std::string& name) const {
    EtcdOptions o;
    o.endpoints = cluster->client_urls();
    o.timeout = 2000ms;
    o.tls = EtcdTls{ca_dir + "/ca.crt", cert_dir + "/" + name + ".crt",
                    cert_dir + "/" + name + ".key"};
    return o;
  }
};

bool contains(const Status& st, const std::string& text) {
  return st.message().find(text) != std::string::npos;
}

}  // namespace

TEST_CASE("etcd client over TLS: the cluster's CA and a node certificate - puts - gets and transactions on a TLS etcd") {
  TlsEtcd t;
  REQUIRE(t.cluster->member(0).client_url().rfind("https://127.0.0.1:", 0) == 0);
  EtcdClient c(t.client(t.certs, t.certs, "h1"));
  auto rev = c.put("/tls/k", "v1");
  REQUIRE_MESSAGE(rev, rev.status().to_string());
  CHECK(c.endpoint().rfind("https://", 0) == 0);
  auto got = c.get("/tls/k");
  REQUIRE_MESSAGE(got, got.status().to_string());
  REQUIRE(*got);
  CHECK((*got)->value == "v1");
  auto txn = c.txn({Compare{"/tls/k", Compare::Target::value, 0, "v1"}},
                   {Op::put("/tls/k", "v2"), Op::get("/tls/k")}, {});
  REQUIRE_MESSAGE(txn, txn.status().to_string());
  CHECK(txn->succeeded);
  REQUIRE(txn->gets.size() == 1);
  REQUIRE(txn->gets[0]);
  CHECK(txn->gets[0]->value == "v2");
  // What the client wrote, etcdctl reads with the members' certificate.
  auto args = t.cluster->etcdctl_flags();
  args.insert(args.end(), {"get", "--print-value-only", "/tls/k"});
  auto read = proc::etcdctl(t.cluster->endpoints(), args);
  CHECK(read.exit_code == 0);
  CHECK(read.out == "v2\n");
  // A lease over the same kept-alive connection, then the member changes:
  // the next call makes a new TLS connection to another member.
  auto lease = c.grant(30);
  REQUIRE_MESSAGE(lease, lease.status().to_string());
  auto used = c.endpoint();
  for (size_t i = 0; i < t.cluster->size(); ++i)
    if (t.cluster->member(i).client_url() == used)
      t.cluster->kill(i);
  auto ttl = c.keep_alive(*lease);
  REQUIRE_MESSAGE(ttl, ttl.status().to_string());
  CHECK(c.endpoint() != used);
}

TEST_CASE("etcd client over TLS: another CA's certificate - a member not of the trusted CA - no TLS settings - each refused naming why") {
  TlsEtcd t;
  // mallory's certificate, our CA trusted: the members refuse it.
  auto foreign = EtcdClient(t.client(t.certs, t.other, "mallory")).put("/tls/x", "no");
  REQUIRE_FALSE(foreign);
  CAPTURE(foreign.status().to_string());
  CHECK(foreign.status().code() == errc::unavailable);
  CHECK(contains(foreign.status(), "TLS"));
  CHECK(contains(foreign.status(), "alert"));  // the member's verdict, e.g. "bad certificate"
  for (size_t i = 0; i < t.cluster->size(); ++i)
    CHECK(contains(foreign.status(), t.cluster->member(i).client_url()));
  // Trusting only the other CA: our side refuses the members.
  auto distrust = EtcdClient(t.client(t.other, t.other, "mallory")).get("/tls/x");
  REQUIRE_FALSE(distrust);
  CAPTURE(distrust.status().to_string());
  CHECK(distrust.status().code() == errc::unavailable);
  CHECK(contains(distrust.status(), "TLS handshake failed: certificate verify failed"));
  CHECK(contains(distrust.status(), "unable to get local issuer certificate"));
  // No TLS settings, the members' ports as http:// URLs.
  EtcdOptions plain;
  for (size_t i = 0; i < t.cluster->size(); ++i)
    plain.endpoints.push_back("http://127.0.0.1:" +
                              std::to_string(t.cluster->member(i).client_port));
  auto unencrypted = EtcdClient(plain).get("/tls/x");
  REQUIRE_FALSE(unencrypted);
  CAPTURE(unencrypted.status().to_string());
  CHECK(unencrypted.status().code() == errc::unavailable);
  CHECK(contains(unencrypted.status(), "it may speak TLS only"));
  // Nothing of it was written.
  auto kv = EtcdClient(t.client(t.certs, t.certs, "h1")).get("/tls/x");
  REQUIRE_MESSAGE(kv, kv.status().to_string());
  CHECK_FALSE(*kv);
}

TEST_CASE("etcd client: https endpoints without TLS settings - http endpoints with them - TLS files that do not load - refused before any connection") {
  auto port = std::to_string(proc::free_port());
  EtcdOptions https_only;
  https_only.endpoints = {"https://127.0.0.1:" + port};
  auto r = EtcdClient(https_only).get("/x");
  REQUIRE_FALSE(r);
  CHECK(r.status().code() == errc::invalid_argument);
  CHECK(contains(r.status(), "'https://127.0.0.1:" + port + "' is https but no TLS files"));

  EtcdOptions downgrade;
  downgrade.endpoints = {"https://127.0.0.1:" + port, "http://127.0.0.1:" + port};
  downgrade.tls = EtcdTls{"/nonexistent/ca.crt", "/nonexistent/h1.crt", "/nonexistent/h1.key"};
  r = EtcdClient(downgrade).get("/x");
  REQUIRE_FALSE(r);
  CHECK(r.status().code() == errc::invalid_argument);
  CHECK(contains(r.status(), "'http://127.0.0.1:" + port + "' is plain http but TLS is set"));

  EtcdOptions missing = downgrade;
  missing.endpoints = {"https://127.0.0.1:" + port};
  r = EtcdClient(missing).get("/x");
  REQUIRE_FALSE(r);
  CHECK(r.status().code() == errc::invalid_argument);
  CHECK(contains(r.status(), "etcd TLS: certificate /nonexistent/h1.crt"));

  CHECK(check_endpoints({"https://a:1", "b:2"}, true).is_ok());
  CHECK(check_endpoints({"http://a:1", "b:2"}, false).is_ok());
  // A bare host:port takes the scheme TLS implies.
  auto eps = parse_endpoints("10.0.0.1:2379,https://10.0.0.2:2379", true);
  REQUIRE(eps);
  CHECK(*eps == std::vector<std::string>{"https://10.0.0.1:2379", "https://10.0.0.2:2379"});
  eps = parse_endpoints("10.0.0.1:2379", false);
  REQUIRE(eps);
  CHECK(*eps == std::vector<std::string>{"http://10.0.0.1:2379"});
}
