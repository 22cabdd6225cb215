// Router: model multiplexing. A request that names a model goes to a replica
// holding it with room (the least loaded of those); otherwise to one that will
// load it; what the replicas hold comes from snapshots and answers, the newer
// list winning. Deterministic: seeded randomness, no threads.
#include <doctest/doctest.h>

#include <map>
#include <set>

#include "proxy/router.hpp"

using namespace troupe;
using namespace troupe::proxy;

namespace {

ReplicaEndpoint holding(const std::string& id, const std::string& node, uint32_t max,
                        std::vector<std::string> models, uint64_t seq = 1) {
  ReplicaEndpoint e;
  e.replica_id = id;
  e.node_id = node;
  e.max_ongoing_requests = max;
  e.model_ids = std::move(models);
  e.model_ids_seq = seq;
  return e;
}

RoutingSnapshot snapshot(std::vector<ReplicaEndpoint> replicas, uint64_t seq = 1) {
  RoutingSnapshot s;
  s.epoch = 1;
  s.seq = seq;
  s.full = seq == 1;
  s.routes = {{"/m", "m", "Host"}};
  s.routes_changed = true;
  s.deployments = {{"m", "Host", std::move(replicas), -1}};
  return s;
}

const std::string kHost = deployment_key("m", "Host");

SlotPtr admit(Router& r, const std::string& model, const std::vector<std::string>& exclude = {}) {
  auto adm = r.admit(
      kHost, exclude, [](SlotPtr) {}, model);
  REQUIRE(adm.kind == Router::Admit::assigned);
  return adm.slot;
}

std::vector<std::string> models_of(Router& r, const std::string& replica) {
  for (const auto& d : r.deployments()) {
    for (const auto& rep : d.replicas) {
      if (rep.replica_id == replica)
        return rep.model_ids;
    }
  }
  return {"<no such replica>"};
}

}  // namespace

TEST_CASE("router multiplex: a replica holding the model with room is chosen - whatever the seed") {
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    CAPTURE(seed);
    Router r({"n1", seed});
    r.apply(snapshot({holding("a", "n1", 4, {"m1", "m2"}), holding("b", "n2", 4, {"m3"}),
                      holding("c", "n2", 4, {"m4", "m5"}), holding("d", "n1", 4, {})}));
    CHECK(admit(r, "m3")->replica_id == "b");  // remote, but it holds the model
    CHECK(admit(r, "m5")->replica_id == "c");
    CHECK(admit(r, "m1")->replica_id == "a");
  }
}

TEST_CASE("router multiplex: among the holders the least loaded - then the local one") {
  Router r({"n1", 3});
  r.apply(snapshot(
      {holding("a", "n2", 8, {"m1"}), holding("b", "n1", 8, {"m1"}), holding("c", "n1", 8, {})}));
  auto first = admit(r, "m1");
  CHECK(first->replica_id == "b");  // equally loaded: local
  CHECK(admit(r, "m1")->replica_id == "a");
  CHECK(admit(r, "m1")->replica_id == "b");
  // c holds nothing: never chosen for m1 while a holder has room.
}

TEST_CASE(
    "router multiplex: a full holder - the fallback picks another replica - which is then noted as "
    "holding it") {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    CAPTURE(seed);
    Router r({"n1", seed});
    r.apply(snapshot(
        {holding("a", "n1", 1, {"m1"}), holding("b", "n1", 2, {"m2"}), holding("c", "n1", 2, {})}));
    auto busy = admit(r, "m1");
    REQUIRE(busy->replica_id == "a");
    // a is at max_ongoing_requests: m1 goes elsewhere, preferably to c (it
    // holds no model only it has; b holds the only copy of m2).
    auto other = admit(r, "m1");
    CHECK(other->replica_id == "c");
    CHECK(models_of(r, "c") == std::vector<std::string>{"m1"});
    // The next request for m1 follows it to c (a is still full) without an
    // answer or a snapshot in between.
    CHECK(admit(r, "m1")->replica_id == "c");
    // Excluded (a retry): a replica that does not hold it.
    CHECK(admit(r, "m1", {"c"})->replica_id == "b");
  }
}

TEST_CASE(
    "router multiplex: an unknown model goes to the replica with the fewest models - the same on "
    "every router") {
  std::map<std::string, int> chosen;
  for (int model = 0; model < 40; ++model) {
    std::set<std::string> by_seed;
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      Router r({"n1", seed});
      r.apply(snapshot({holding("a", "n1", 4, {"m1", "m2"}), holding("b", "n1", 4, {"m3"}),
                        holding("c", "n1", 4, {"m4"}), holding("d", "n1", 4, {"m5", "m6"})}));
      by_seed.insert(admit(r, "x" + std::to_string(model))->replica_id);
    }
    CHECK(by_seed.size() == 1);  // rendezvous hashing, not the router's randomness
    ++chosen[*by_seed.begin()];
  }
  // b and c hold one model each, a and d two.
  CHECK(chosen["a"] == 0);
  CHECK(chosen["d"] == 0);
  CHECK(chosen["b"] > 0);
  CHECK(chosen["c"] > 0);
}

TEST_CASE("router multiplex: a replica whose models are all held elsewhere loads the new one") {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    CAPTURE(seed);
    Router r({"n1", seed});
    // m1 is on a and on b; c and d hold the only copies of theirs.
    r.apply(snapshot({holding("a", "n1", 4, {"m1", "m2"}), holding("b", "n1", 4, {"m1", "m3"}),
                      holding("c", "n1", 4, {"m4", "m5"}), holding("d", "n1", 4, {"m6", "m7"})}));
    auto s = admit(r, "m8");
    CHECK((s->replica_id == "a" || s->replica_id == "b"));
  }
}

TEST_CASE("router multiplex: no model id - the usual power of two choices") {
  Router r({"n1", 5});
  r.apply(snapshot({holding("a", "n1", 100, {"m1"}), holding("b", "n1", 100, {})}));
  std::map<std::string, int> load;
  for (int i = 0; i < 20; ++i)
    ++load[admit(r, "")->replica_id];
  CHECK(load["a"] == 10);
  CHECK(load["b"] == 10);
  CHECK(models_of(r, "b").empty());
}

TEST_CASE("router multiplex: answers and snapshots update the lists - the higher seq wins") {
  Router r({"n1", 9});
  r.apply(snapshot({holding("a", "n1", 4, {"m1"}, 5), holding("b", "n1", 4, {"m2"}, 3)}));
  auto slot = admit(r, "m2");
  REQUIRE(slot->replica_id == "b");
  // b's answer: it loaded m3 and evicted m2 (its list number 4).
  r.learn_models(slot, 4, {"m3"});
  CHECK(models_of(r, "b") == std::vector<std::string>{"m3"});
  // An older answer changes nothing.
  r.learn_models(slot, 3, {"m2"});
  CHECK(models_of(r, "b") == std::vector<std::string>{"m3"});
  // A snapshot with an older list for b (the controller lags) neither.
  r.apply(snapshot({holding("a", "n1", 4, {"m1"}, 5), holding("b", "n1", 4, {"m2"}, 3)}, 2));
  CHECK(models_of(r, "b") == std::vector<std::string>{"m3"});
  // A newer one does.
  r.apply(snapshot({holding("a", "n1", 4, {"m1"}, 5), holding("b", "n1", 4, {"m3", "m4"}, 6)}, 3));
  CHECK(models_of(r, "b") == std::vector<std::string>{"m3", "m4"});
  CHECK(admit(r, "m4")->replica_id == "b");
  CHECK(admit(r, "m1")->replica_id == "a");
}

TEST_CASE(
    "router multiplex: a queued request for a model is placed on its holder when a slot frees") {
  Router r({"n1", 11});
  r.apply(snapshot({holding("a", "n1", 1, {"m1"}), holding("b", "n1", 1, {"m2"})}));
  auto on_a = admit(r, "m1");
  auto on_b = admit(r, "m2");
  REQUIRE(on_a->replica_id == "a");
  SlotPtr resumed;
  auto adm = r.admit(
      kHost, {}, [&](SlotPtr s) { resumed = std::move(s); }, "m2");
  REQUIRE(adm.kind == Router::Admit::queued);
  // a frees first, but the waiter wants m2: still placed (a has room, nobody
  // else does: the fallback), and a is noted as loading m2.
  for (auto& f : r.release(on_a, Outcome::answered))
    f();
  REQUIRE(resumed);
  CHECK(resumed->replica_id == "a");
  CHECK(models_of(r, "a") == std::vector<std::string>{"m1", "m2"});
}

TEST_CASE("router multiplex: a replica that never reported models gets at most 4 noted") {
  Router r({"n1", 13});
  ReplicaEndpoint plain;
  plain.replica_id = "a";
  plain.node_id = "n1";
  plain.max_ongoing_requests = 1000;
  r.apply(snapshot({plain}));
  for (int i = 0; i < 100; ++i)
    admit(r, "random-" + std::to_string(i));
  CHECK(models_of(r, "a").size() == 4);
}
