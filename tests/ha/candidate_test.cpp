// Head candidates at run time (controller/ha/candidate.hpp) on a real
// three-member etcd: who leads, a candidate that stops without resigning,
// one that resigns, quorum lost and back, a name taken twice. Every wait
// has a deadline.
#include "controller/ha/candidate.hpp"

#include <doctest/doctest.h>

#include "tools/common/etcd_cluster.hpp"
#include "tools/common/process.hpp"
#include "tools/common/temp_dir.hpp"

using namespace troupe;
using namespace troupe::ha;
using namespace std::chrono_literals;

namespace {

// What the callbacks of one candidate saw, with when.
struct Events {
  std::mutex mu;
  std::vector<std::pair<std::string, Clock::time_point>> seen;
  void add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    seen.emplace_back(what, Clock::now());
  }
  std::optional<Clock::time_point> last(const std::string& prefix) {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = seen.rbegin(); it != seen.rend(); ++it)
      if (it->first.rfind(prefix, 0) == 0)
        return it->second;
    return std::nullopt;
  }
  size_t count(const std::string& prefix) {
    std::lock_guard<std::mutex> lock(mu);
    size_t n = 0;
    for (auto& e : seen)
      n += e.first.rfind(prefix, 0) == 0;
    return n;
  }
};

struct Head {
  Events events;
  std::unique_ptr<Candidate> candidate;
  Head(const proc::EtcdCluster& cluster, const std::string& name) {
    ElectionOptions e;
    e.prefix = "/troupe-test";
    e.name = name;
    e.address = name + ":7300";
    EtcdOptions o;
    o.endpoints = cluster.client_urls();
    o.timeout = 1000ms;
    CandidateCallbacks cb;
    cb.on_lead = [this](int64_t term) { events.add("lead " + std::to_string(term)); };
    cb.on_follow = [this](const std::string& why) { events.add("follow " + why); };
    candidate = std::make_unique<Candidate>(e, o, cb);
  }
  bool leading() { return candidate->leading_term() != 0; }
};

size_t leaders(std::vector<std::unique_ptr<Head>>& heads) {
  size_t n = 0;
  for (auto& h : heads)
    n += h->candidate && h->leading();
  return n;
}

}  // namespace

TEST_CASE("candidate: one of three leads - one stopped without resigning is followed after its lease - one that resigns at once") {
  proc::TempDir dir("etcd-candidates");
  proc::EtcdCluster cluster(dir.path());
  std::vector<std::unique_ptr<Head>> heads;
  for (const char* name : {"h1", "h2", "h3"})
    heads.push_back(std::make_unique<Head>(cluster, name));
  REQUIRE(proc::wait_until([&] { return leaders(heads) == 1; }, 10s));
  size_t first = 0;
  while (!heads[first]->leading())
    ++first;
  CHECK(heads[first]->events.count("lead ") == 1);
  // A follower names the leader from its next look at etcd, which may come
  // after the leader took its term: awaited, not assumed.
  auto& follower = *heads[(first + 1) % 3]->candidate;
  REQUIRE(proc::wait_until([&] { return follower.view().leader.has_value(); }, 5s));
  auto view = follower.view();
  REQUIRE(view.leader);
  CHECK(view.leader->name == "h" + std::to_string(first + 1));
  CHECK_FALSE(view.leading);

  // Stopped without resigning (what a kill -9 leaves): the others wait out
  // its lease, then one leads.
  heads[first]->candidate->stop(false);
  auto stopped = Clock::now();
  heads[first]->candidate.reset();
  REQUIRE(proc::wait_until([&] { return leaders(heads) == 1; }, 6s));
  auto took = Clock::now() - stopped;
  MESSAGE("led again after " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                             << " ms");
  CHECK(took >= 1000ms);
  CHECK(took <= 3500ms);
  size_t second = 0;
  while (!heads[second]->candidate || !heads[second]->leading())
    ++second;

  // A graceful stop resigns: the last one leads at its next look.
  heads[second]->candidate->stop(true);
  auto resigned = Clock::now();
  CHECK(heads[second]->events.count("follow resigned") == 1);
  heads[second]->candidate.reset();
  REQUIRE(proc::wait_until([&] { return leaders(heads) == 1; }, 3s));
  CHECK(Clock::now() - resigned <= 1000ms);
}

TEST_CASE("candidate: without quorum the leader stops by its clock before its lease can run out - with quorum back a leader within seconds") {
  proc::TempDir dir("etcd-candidate-quorum");
  proc::EtcdCluster cluster(dir.path());
  std::vector<std::unique_ptr<Head>> heads;
  heads.push_back(std::make_unique<Head>(cluster, "h1"));
  REQUIRE(proc::wait_until([&] { return heads[0]->leading(); }, 10s));
  heads.push_back(std::make_unique<Head>(cluster, "h2"));
  REQUIRE(proc::wait_until([&] { return heads[1]->candidate->view().leader.has_value(); }, 5s));

  cluster.kill(1);
  cluster.kill(2);
  auto lost = Clock::now();
  // Stopped 1.5 s after its last renewal at the latest, even while its
  // thread waits for etcd. That renewal may come up to 0.5 s (one interval)
  // before the loss, or after it: etcd's leader renews leases itself, and
  // a leader cut off from its quorum goes on doing so until it notices,
  // within its election timeout (0.5 s here). (A new etcd leader extends
  // every lease by its TTL, so the lease outlives the stop.)
  REQUIRE(proc::wait_until([&] { return !heads[0]->leading(); }, 5s));
  auto stopped = Clock::now() - lost;
  MESSAGE("stopped leading " << std::chrono::duration_cast<std::chrono::milliseconds>(stopped).count()
                             << " ms after quorum was lost");
  CHECK(stopped <= 2600ms);
  REQUIRE(proc::wait_until([&] { return heads[0]->events.count("follow ") == 1; }, 2s));
  CHECK(heads[0]->candidate->leading_term() == 0);
  CHECK(leaders(heads) == 0);
  // Without quorum no one leads, and a follower names no leader.
  REQUIRE(proc::wait_until([&] { return !heads[1]->candidate->view().leader.has_value(); }, 5s));
  CHECK(leaders(heads) == 0);

  cluster.start(1);
  cluster.start(2);
  auto back = Clock::now();
  REQUIRE(proc::wait_until([&] { return leaders(heads) == 1; }, 15s));
  MESSAGE("a leader " << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - back).count()
                      << " ms after the members were started again");
  CHECK(Clock::now() - back <= 10s);
}

TEST_CASE("candidate: a second candidate with a name in use refuses - the first leads on") {
  proc::TempDir dir("etcd-candidate-name");
  proc::EtcdCluster cluster(dir.path());
  std::vector<std::unique_ptr<Head>> heads;
  heads.push_back(std::make_unique<Head>(cluster, "h1"));
  REQUIRE(proc::wait_until([&] { return heads[0]->leading(); }, 10s));
  heads.push_back(std::make_unique<Head>(cluster, "h1"));
  REQUIRE(proc::wait_until([&] { return !heads[1]->candidate->view().refusal.empty(); }, 8s));
  CHECK(heads[1]->candidate->view().refusal.find("another head candidate named 'h1'") !=
        std::string::npos);
  CHECK(heads[0]->leading());
  CHECK(heads[1]->events.count("lead ") == 0);
  CHECK(heads[0]->events.count("follow ") == 0);
}
