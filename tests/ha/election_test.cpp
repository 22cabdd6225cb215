// The head candidates' election (controller/ha/election.hpp) driven step by
// step on a fake clock against a fake etcd: leases expire by that clock,
// and each candidate's view of etcd can be cut off.
#include "controller/ha/election.hpp"

#include <map>

#include <doctest/doctest.h>

using namespace troupe;
using namespace troupe::ha;
using namespace std::chrono_literals;

namespace {

// etcd's leases and keys as far as the election uses them.
struct FakeEtcd {
  Clock::time_point now{};
  int64_t revision = 1;
  int64_t next_lease = 100;
  struct Lease {
    int64_t ttl_s;
    Clock::time_point expires;
  };
  std::map<int64_t, Lease> leases;
  std::map<std::string, KeyValue> keys;

  // What etcd does as time passes: expired leases go with their keys.
  void expire() {
    for (auto it = leases.begin(); it != leases.end();) {
      if (it->second.expires <= now) {
        drop_keys(it->first);
        it = leases.erase(it);
      } else {
        ++it;
      }
    }
  }
  void drop_keys(int64_t lease) {
    for (auto k = keys.begin(); k != keys.end();) {
      if (k->second.lease == lease)
        k = keys.erase(k);
      else
        ++k;
    }
  }
  bool lease_alive(int64_t lease) {
    expire();
    return leases.count(lease) != 0;
  }
  // What etcd does when it elects a leader of its own (quorum back): every
  // lease gets its whole TTL again.
  void renew_all() {
    for (auto& [id, lease] : leases)
      lease.expires = now + std::chrono::seconds(lease.ttl_s);
  }
};

// One candidate's connection to the fake etcd; `reachable` false: every
// call fails as an unreachable etcd does.
struct FakeBackend : ElectionBackend {
  FakeEtcd& etcd;
  bool reachable = true;
  explicit FakeBackend(FakeEtcd& e) : etcd(e) {}

  Status cut() const { return Status(errc::unavailable, "no etcd member answered (fake)"); }

  Result<int64_t> grant(int64_t ttl_s) override {
    if (!reachable)
      return cut();
    etcd.expire();
    int64_t id = etcd.next_lease++;
    etcd.leases[id] = FakeEtcd::Lease{ttl_s, etcd.now + std::chrono::seconds(ttl_s)};
    return id;
  }
  Result<int64_t> keep_alive(int64_t lease) override {
    if (!reachable)
      return cut();
    if (!etcd.lease_alive(lease))
      return Status(errc::not_found, "lease expired");
    auto& l = etcd.leases[lease];
    l.expires = etcd.now + std::chrono::seconds(l.ttl_s);
    return l.ttl_s;
  }
  Status revoke(int64_t lease) override {
    if (!reachable)
      return cut();
    etcd.drop_keys(lease);
    etcd.leases.erase(lease);
    return {};
  }
  Result<KeyValue> create_or_get(const std::string& key, const std::string& value,
                                 int64_t lease) override {
    if (!reachable)
      return cut();
    etcd.expire();
    auto it = etcd.keys.find(key);
    if (it == etcd.keys.end()) {
      if (lease != 0 && etcd.leases.count(lease) == 0)
        return Status(errc::not_found, "lease not found");
      ++etcd.revision;
      KeyValue kv{key, value, etcd.revision, etcd.revision, 1, lease};
      it = etcd.keys.emplace(key, kv).first;
    }
    return it->second;
  }
  Result<std::optional<KeyValue>> get(const std::string& key) override {
    if (!reachable)
      return cut();
    etcd.expire();
    auto it = etcd.keys.find(key);
    if (it == etcd.keys.end())
      return std::optional<KeyValue>();
    return std::optional<KeyValue>(it->second);
  }
  Status remove_if(const std::string& key, int64_t revision) override {
    if (!reachable)
      return cut();
    auto it = etcd.keys.find(key);
    if (it != etcd.keys.end() && it->second.create_revision == revision)
      etcd.keys.erase(it);
    return {};
  }
};

ElectionOptions options(const std::string& name) {
  ElectionOptions o;
  o.name = name;
  o.address = name + ".example:7300";
  return o;  // TTL 2 s, renewals every 0.5 s, stepping down 1.5 s after one
}

// Candidates on one fake etcd, stepped in rounds of `tick` on its clock.
struct World {
  FakeEtcd etcd;
  struct Candidate {
    std::unique_ptr<FakeBackend> backend;
    std::unique_ptr<Election> election;
    bool running = true;
  };
  std::vector<Candidate> candidates;

  Election& add(const std::string& name) {
    Candidate c;
    c.backend = std::make_unique<FakeBackend>(etcd);
    c.election = std::make_unique<Election>(options(name), *c.backend);
    candidates.push_back(std::move(c));
    return *candidates.back().election;
  }
  Election& at(size_t i) { return *candidates[i].election; }
  FakeBackend& backend(size_t i) { return *candidates[i].backend; }
  int64_t unix_ms() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(etcd.now.time_since_epoch())
        .count();
  }
  // Every running candidate takes one step, then the clock moves on.
  void round(Clock::duration tick = 100ms) {
    for (auto& c : candidates)
      if (c.running)
        c.election->step(etcd.now, unix_ms());
    etcd.now += tick;
  }
  int leaders() {
    int n = 0;
    for (auto& c : candidates)
      if (c.running && c.election->leading(etcd.now))
        ++n;
    return n;
  }
};

}  // namespace

TEST_CASE("election: the first candidate leads - the others follow and know where it is") {
  World w;
  w.add("h1");
  w.add("h2");
  w.add("h3");
  w.round();
  CHECK(w.at(0).leading(w.etcd.now));
  CHECK(w.at(0).role() == Election::Role::leader);
  CHECK(w.at(0).terms_won() == 1);
  for (size_t i : {1, 2}) {
    CHECK_FALSE(w.at(i).leading(w.etcd.now));
    REQUIRE(w.at(i).holder());
    CHECK(w.at(i).holder()->name == "h1");
    CHECK(w.at(i).holder()->address == "h1.example:7300");
    CHECK(w.at(i).holder()->term == w.at(0).term());
  }
  CHECK(w.at(0).term() > 0);
  // Renewals keep it leading for as long as etcd answers.
  for (int i = 0; i < 100; ++i) {
    w.round();
    CHECK(w.leaders() == 1);
  }
  CHECK(w.at(0).leading(w.etcd.now));
  CHECK(w.at(0).terms_won() == 1);
}

TEST_CASE("election: a leader cut off from etcd stops before its lease can expire there - another then leads") {
  World w;
  w.add("h1");
  w.add("h2");
  w.round();
  REQUIRE(w.at(0).leading(w.etcd.now));
  for (int i = 0; i < 7; ++i)
    w.round();
  int64_t first_term = w.at(0).term();
  int64_t lease = w.at(0).lease();
  w.backend(0).reachable = false;
  auto cut_at = w.etcd.now;
  std::optional<Clock::time_point> stopped, expired, taken;
  for (int i = 0; i < 400 && !taken; ++i) {
    w.round(10ms);
    if (!stopped && !w.at(0).leading(w.etcd.now))
      stopped = w.etcd.now;
    if (!expired && !w.etcd.lease_alive(lease))
      expired = w.etcd.now;
    if (w.at(1).leading(w.etcd.now))
      taken = w.etcd.now;
    CHECK(w.leaders() <= 1);
  }
  REQUIRE(stopped);
  REQUIRE(expired);
  REQUIRE(taken);
  // h1 stopped by its own clock at least a third of the TTL before etcd
  // expired its lease; h2 led only after that, within the TTL plus a
  // follower's look at the key.
  CHECK(*expired - *stopped >= 400ms);
  CHECK(*taken >= *expired);
  CHECK(*taken - cut_at <= 2600ms);
  CHECK(w.at(0).last_loss().find("the lease was not renewed for 1500 ms") != std::string::npos);
  CHECK(w.at(0).problem().find("no etcd member answered") != std::string::npos);
  CHECK(w.at(1).term() > first_term);

  SUBCASE("after the heal the old leader follows the new one") {
    w.backend(0).reachable = true;
    for (int i = 0; i < 20; ++i)
      w.round();
    CHECK_FALSE(w.at(0).leading(w.etcd.now));
    REQUIRE(w.at(0).holder());
    CHECK(w.at(0).holder()->name == "h2");
    CHECK(w.at(1).leading(w.etcd.now));
    CHECK(w.leaders() == 1);
    CHECK(w.at(0).problem().empty());
  }
}

TEST_CASE("election: a follower that cannot read etcd names no leader - it says why") {
  World w;
  w.add("h1");
  w.add("h2");
  w.round();
  REQUIRE(w.at(1).holder());
  w.backend(1).reachable = false;
  for (int i = 0; i < 10; ++i)
    w.round();
  CHECK_FALSE(w.at(1).holder());
  CHECK_FALSE(w.at(1).leading(w.etcd.now));
  CHECK(w.at(1).problem().find("no etcd member answered") != std::string::npos);
  CHECK(w.at(0).leading(w.etcd.now));
}

TEST_CASE("election: a leader that resigns hands over at once") {
  World w;
  w.add("h1");
  w.add("h2");
  w.round();
  REQUIRE(w.at(0).leading(w.etcd.now));
  CHECK(w.at(0).resign().is_ok());
  w.candidates[0].running = false;
  CHECK_FALSE(w.at(0).leading(w.etcd.now));
  // h2's next look at the key: the key is gone, and h2 takes it.
  auto at = w.etcd.now;
  while (!w.at(1).leading(w.etcd.now) && w.etcd.now - at < 1s)
    w.round(10ms);
  CHECK(w.at(1).leading(w.etcd.now));
  CHECK(w.etcd.now - at <= 500ms);
}

TEST_CASE("election: a leader that stands down hands over at once - and then names the next leader") {
  World w;
  w.add("h1");
  w.add("h2");
  w.round();
  REQUIRE(w.at(0).leading(w.etcd.now));
  CHECK(w.at(0).stand_down().is_ok());
  CHECK_FALSE(w.at(0).campaigning());
  CHECK_FALSE(w.at(0).leading(w.etcd.now));
  CHECK(w.at(0).lease() == 0);
  auto at = w.etcd.now;
  while (!w.at(1).leading(w.etcd.now) && w.etcd.now - at < 1s)
    w.round(10ms);
  CHECK(w.at(1).leading(w.etcd.now));
  CHECK(w.etcd.now - at <= 500ms);
  // h1 keeps looking: it names h2, holds no lease and never campaigns again,
  // also once h2's key is gone.
  w.round();
  REQUIRE(w.at(0).holder().has_value());
  CHECK(w.at(0).holder()->name == "h2");
  CHECK(w.at(0).lease() == 0);
  CHECK(w.at(1).resign().is_ok());
  w.candidates[1].running = false;
  for (int i = 0; i < 50; ++i)
    w.round();
  CHECK_FALSE(w.at(0).leading(w.etcd.now));
  CHECK_FALSE(w.at(0).holder().has_value());
  CHECK(w.at(0).lease() == 0);
  // Cut off from etcd it names nobody rather than a stale leader.
  w.add("h3");
  for (int i = 0; i < 3; ++i)
    w.round();
  REQUIRE(w.at(0).holder().has_value());
  w.backend(0).reachable = false;
  w.round();
  CHECK_FALSE(w.at(0).holder().has_value());
  CHECK(w.at(0).problem().find("cannot read the election key") != std::string::npos);
}

TEST_CASE("election: quorum lost and back - leases given up meanwhile are revoked at once - not waited out") {
  World w;
  w.add("h1");
  w.add("h2");
  w.round();
  REQUIRE(w.at(0).leading(w.etcd.now));
  // No etcd for 3 s: h1 stops leading by its clock; its lease (and the
  // election key, its name's claim) cannot be revoked meanwhile.
  w.backend(0).reachable = false;
  w.backend(1).reachable = false;
  for (int i = 0; i < 30; ++i)
    w.round();
  CHECK(w.leaders() == 0);
  // Quorum back: etcd renews every lease, h1's old one included.
  w.etcd.renew_all();
  w.backend(0).reachable = true;
  w.backend(1).reachable = true;
  auto back = w.etcd.now;
  while (w.leaders() == 0 && w.etcd.now - back < 3s)
    w.round(10ms);
  CHECK(w.leaders() == 1);
  // Within a look or two, not the old lease's TTL (2 s).
  CHECK(w.etcd.now - back <= 500ms);
  for (int i = 0; i < 50; ++i)
    w.round();
  // h1 met its own old claim and did not take itself for a second h1.
  CHECK(w.at(0).refusal().empty());
  CHECK(w.at(1).refusal().empty());
  CHECK(w.leaders() == 1);
}

TEST_CASE("election: a candidate killed without resigning is replaced once its lease expired") {
  World w;
  w.add("h1");
  w.add("h2");
  w.round();
  REQUIRE(w.at(0).leading(w.etcd.now));
  w.candidates[0].running = false;  // kill -9: nothing more from it
  auto killed = w.etcd.now;
  while (!w.at(1).leading(w.etcd.now) && w.etcd.now - killed < 5s)
    w.round(10ms);
  REQUIRE(w.at(1).leading(w.etcd.now));
  CHECK(w.etcd.now - killed >= 1500ms);  // not before the lease could end
  CHECK(w.etcd.now - killed <= 2600ms);
}

TEST_CASE("election: a second candidate with the same name waits out the first one's lease - then refuses for good") {
  World w;
  w.add("h1");
  w.round();
  REQUIRE(w.at(0).leading(w.etcd.now));
  w.add("h1");
  for (int i = 0; i < 20; ++i) {  // 2 s: the first one's claim might be stale
    w.round();
    CHECK(w.at(1).refusal().empty());
    CHECK_FALSE(w.at(1).leading(w.etcd.now));
  }
  CHECK(w.at(1).problem().find("waiting for the name 'h1'") != std::string::npos);
  for (int i = 0; i < 20; ++i)
    w.round();
  CHECK(w.at(1).refusal().find("another head candidate named 'h1'") != std::string::npos);
  CHECK(w.at(1).refusal().find("--ha-name") != std::string::npos);
  CHECK(w.at(1).lease() == 0);
  CHECK(w.at(0).leading(w.etcd.now));
  CHECK(w.leaders() == 1);
}

TEST_CASE("election: a restarted candidate takes its name back once its old lease expired") {
  World w;
  w.add("h1");
  w.add("h2");
  w.round();
  REQUIRE(w.at(0).leading(w.etcd.now));
  w.candidates[0].running = false;
  w.add("h1");  // the same candidate, restarted at once
  for (int i = 0; i < 50; ++i)
    w.round();
  CHECK(w.at(2).refusal().empty());
  CHECK(w.leaders() == 1);
  // Its old claim went with the old lease; it now follows h2, who led first.
  CHECK(w.at(1).leading(w.etcd.now));
  REQUIRE(w.at(2).holder());
  CHECK(w.at(2).holder()->name == "h2");
  CHECK(w.at(2).problem().empty());
}

TEST_CASE("election: no etcd at the start - the candidate keeps trying and says so - then leads") {
  World w;
  w.add("h1");
  w.backend(0).reachable = false;
  for (int i = 0; i < 10; ++i)
    w.round();
  CHECK_FALSE(w.at(0).leading(w.etcd.now));
  CHECK(w.at(0).problem().find("no lease from etcd") != std::string::npos);
  w.backend(0).reachable = true;
  w.round();
  CHECK(w.at(0).leading(w.etcd.now));
  CHECK(w.at(0).problem().empty());
}

TEST_CASE("election: the election key's value names the holder and its address") {
  Holder h{"h1", "10.0.0.1:7300", 42, 7, 1700000000000, "node-1"};
  auto back = decode_holder(encode_holder(h), 42, 7);
  REQUIRE(back);
  CHECK(back->name == "h1");
  CHECK(back->node_id == "node-1");
  CHECK(back->address == "10.0.0.1:7300");
  CHECK(back->term == 42);
  CHECK(back->lease == 7);
  CHECK(back->since_unix_ms == 1700000000000);
  CHECK_FALSE(decode_holder("not json", 1, 1));
  CHECK_FALSE(decode_holder("{\"address\":\"x\"}", 1, 1));
}
