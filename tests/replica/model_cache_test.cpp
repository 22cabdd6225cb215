// troupe::ModelCache (include/troupe/deployment.hpp): LRU order, the capacity,
// concurrent misses for one id loading once, failed loads, and the reports
// of the held ids (to the ReplicaContext's listener).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <troupe/deployment.hpp>

using namespace troupe;

namespace {

using Ids = std::vector<std::string>;

struct Loads {
  std::mutex mutex;
  std::vector<std::string> order;
  void add(const std::string& id) {
    std::lock_guard<std::mutex> lock(mutex);
    order.push_back(id);
  }
};

struct Recorder : ModelIdsListener {
  std::mutex mutex;
  std::vector<Ids> reports;
  void models_changed(const Ids& ids) override {
    std::lock_guard<std::mutex> lock(mutex);
    reports.push_back(ids);
  }
};

}  // namespace

TEST_CASE("ModelCache: least recently used evicted beyond the capacity - hits do not load") {
  Loads loads;
  std::vector<Ids> reports;
  ModelCache<std::string> cache(
      2,
      [&](const std::string& id) {
        loads.add(id);
        return std::make_shared<std::string>("model " + id);
      },
      [&](const Ids& ids) { reports.push_back(ids); });
  CHECK(*cache.get("a") == "model a");
  CHECK(*cache.get("b") == "model b");
  CHECK(cache.model_ids() == Ids{"b", "a"});
  CHECK(cache.lookup("a").hit);  // a is now the most recently used
  CHECK(cache.model_ids() == Ids{"a", "b"});
  auto c = cache.lookup("c");  // evicts b
  CHECK_FALSE(c.hit);
  CHECK(cache.model_ids() == Ids{"c", "a"});
  CHECK(cache.lookup("a").hit);
  CHECK_FALSE(cache.lookup("b").hit);  // loaded again, evicting c
  CHECK(cache.model_ids() == Ids{"b", "a"});
  CHECK(loads.order == Ids{"a", "b", "c", "b"});
  // Reports: every load and eviction, never an order change alone.
  CHECK(reports == std::vector<Ids>{{"a"}, {"b", "a"}, {"a"}, {"c", "a"}, {"a"}, {"b", "a"}});
  CHECK_THROWS_AS(cache.get(""), std::invalid_argument);
}

TEST_CASE("ModelCache: capacity 1 - and 0 means unlimited") {
  int loaded = 0;
  auto loader = [&](const std::string& id) {
    ++loaded;
    return std::make_shared<std::string>(id);
  };
  ModelCache<std::string> one(1, loader);
  one.get("a");
  one.get("b");
  CHECK(one.model_ids() == Ids{"b"});
  ModelCache<std::string> unlimited(0, loader);
  for (int i = 0; i < 50; ++i)
    unlimited.get("m" + std::to_string(i));
  CHECK(unlimited.model_ids().size() == 50);
  CHECK(loaded == 52);
}

TEST_CASE("ModelCache: concurrent misses for one id load it once - others are served meanwhile") {
  std::atomic<int> loads_of_a{0};
  std::mutex gate_mutex;
  std::condition_variable gate;
  bool open = false;
  ModelCache<std::string> cache(4, [&](const std::string& id) {
    if (id == "a") {
      ++loads_of_a;
      std::unique_lock<std::mutex> lock(gate_mutex);
      gate.wait(lock, [&] { return open; });
    }
    return std::make_shared<std::string>(id);
  });
  std::vector<std::thread> threads;
  std::atomic<int> hits{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      auto found = cache.lookup("a");
      CHECK(*found.model == "a");
      hits += found.hit ? 1 : 0;
    });
  }
  // While a loads, b is loaded and served (the loader runs outside the lock).
  CHECK(*cache.get("b") == "b");
  CHECK(cache.model_ids() == Ids{"b"});
  {
    std::lock_guard<std::mutex> lock(gate_mutex);
    open = true;
  }
  gate.notify_all();
  for (auto& t : threads)
    t.join();
  CHECK(loads_of_a == 1);
  // Those that arrived during the load waited for it: not hits. (A thread
  // scheduled only after the load ended finds it loaded.)
  CHECK(hits < 8);
  CHECK(cache.lookup("a").hit);
}

TEST_CASE("ModelCache: the held ids never exceed the capacity - under concurrent load") {
  std::atomic<size_t> most{0};
  ModelCache<int> cache(
      2,
      [](const std::string&) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        return std::make_shared<int>(1);
      },
      [&](const Ids& ids) {
        size_t n = ids.size();
        size_t seen = most.load();
        while (n > seen && !most.compare_exchange_weak(seen, n)) {
        }
      });
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        cache.get("m" + std::to_string((i * 7 + t) % 5));
        CHECK(cache.model_ids().size() <= 2);
      }
    });
  }
  for (auto& t : threads)
    t.join();
  CHECK(most.load() <= 2);
  CHECK(cache.model_ids().size() <= 2);
}

TEST_CASE("ModelCache: a loader that throws fails that get - the next get loads again") {
  int calls = 0;
  ModelCache<std::string> cache(2, [&](const std::string& id) {
    if (++calls == 1)
      throw std::runtime_error("disk on fire");
    return std::make_shared<std::string>(id);
  });
  CHECK_THROWS_WITH(cache.get("a"), "disk on fire");
  CHECK(cache.model_ids().empty());
  CHECK(*cache.get("a") == "a");
  CHECK(calls == 2);
}

TEST_CASE(
    "ModelCache: built from a ReplicaContext it takes the capacity and reports to ctx.models") {
  auto recorder = std::make_shared<Recorder>();
  ReplicaContext ctx;
  ctx.max_num_models_per_replica = 1;
  ctx.models = recorder;
  ModelCache<std::string> cache(
      ctx, [](const std::string& id) { return std::make_shared<std::string>(id); });
  CHECK(cache.capacity() == 1);
  cache.get("x");
  cache.get("y");
  CHECK(recorder->reports == std::vector<Ids>{{"x"}, {}, {"y"}});
  // -1 (the default): unlimited; no listener: nothing reported, no crash.
  ModelCache<std::string> unlimited(
      ReplicaContext{}, [](const std::string& id) { return std::make_shared<std::string>(id); });
  CHECK(unlimited.capacity() == 0);
  unlimited.get("x");
}

TEST_CASE(
    "Request::multiplexed_model_id reads serve_multiplexed_model_id - else X-Troupe-Model-Id") {
  Request r;
  CHECK(r.multiplexed_model_id().empty());
  r.headers = {{"x-troupe-model-id", "alt"}};
  CHECK(r.multiplexed_model_id() == "alt");
  r.headers.emplace_back("Serve_Multiplexed_Model_Id", "ray");
  CHECK(r.multiplexed_model_id() == "ray");
}

namespace {

struct CapturingTransport : HandleTransport {
  mutable Request last;
  std::future<Response> call(const std::string&, const std::string&, Request request,
                             double) const override {
    last = std::move(request);
    std::promise<Response> p;
    p.set_value(Response::text("ok"));
    return p.get_future();
  }
};

}  // namespace

TEST_CASE(
    "DeploymentHandle::with_multiplexed_model_id sets the header of every call - replacing one "
    "given") {
  auto transport = std::make_shared<CapturingTransport>();
  DeploymentHandle h(transport, "app", "Host");
  auto m = h.with_multiplexed_model_id("m7").with_timeout(3);
  CHECK(m.multiplexed_model_id() == "m7");
  CHECK(m.timeout_s() == 3);
  Request r;
  r.headers = {{"X-Troupe-Model-Id", "old"}, {"Accept", "*/*"}};
  m.call(r);
  CHECK(transport->last.headers == Headers{{"Accept", "*/*"}, {kMultiplexedModelIdHeader, "m7"}});
  CHECK(transport->last.multiplexed_model_id() == "m7");
  h.call(r);  // the plain handle leaves the request alone
  CHECK(transport->last.headers == r.headers);
}
