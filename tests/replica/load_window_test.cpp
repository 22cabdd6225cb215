// What a replica reports of its load besides requests in flight
// (replica/load_window.hpp): errors since it started, streams in progress,
// and the interval's p99 of handler time, from log-scale buckets.
#include "replica/load_window.hpp"

#include <doctest/doctest.h>

#include <thread>
#include <vector>

using troupe::replica::LoadWindow;

TEST_CASE("load window: the p99 of an interval is within a bucket of the true one - then starts over") {
  LoadWindow w;
  auto empty = w.take();
  CHECK(empty.requests == 0);
  CHECK(empty.p99_s < 0);  // nothing finished
  // 990 fast requests (1 ms) and 10 slow ones (80 ms): the p99 is 1 ms; with
  // 20 slow ones it is 80 ms.
  for (int i = 0; i < 990; ++i)
    w.record(false, 0.001);
  for (int i = 0; i < 10; ++i)
    w.record(true, 0.080);
  auto t = w.take();
  CHECK(t.requests == 1000);
  CHECK(t.errors == 10);
  CHECK(t.p99_s >= 0.001);
  CHECK(t.p99_s < 0.001 * 1.1);
  for (int i = 0; i < 980; ++i)
    w.record(false, 0.001);
  for (int i = 0; i < 20; ++i)
    w.record(false, 0.080);
  t = w.take();
  CHECK(t.requests == 1000);
  CHECK(t.errors == 10);  // since the replica started
  CHECK(t.p99_s >= 0.080);
  CHECK(t.p99_s < 0.080 * 1.1);
  // The next interval has nothing yet.
  t = w.take();
  CHECK(t.requests == 0);
  CHECK(t.p99_s < 0);
}

TEST_CASE("load window: the buckets cover 1 us to minutes - each at most 9 percent wider than the one before") {
  CHECK(LoadWindow::bucket_of(0) == 0);
  CHECK(LoadWindow::bucket_of(-1) == 0);
  CHECK(LoadWindow::bucket_of(5e-7) == 0);
  CHECK(LoadWindow::bucket_of(1e9) == LoadWindow::kBuckets - 1);
  for (double s : {2e-6, 3.3e-5, 0.0042, 0.25, 1.0, 17.0, 100.0}) {
    CAPTURE(s);
    int i = LoadWindow::bucket_of(s);
    CHECK(LoadWindow::upper_bound_s(i) >= s * (1 - 1e-12));
    CHECK(LoadWindow::upper_bound_s(i - 1) < s);
    CHECK(LoadWindow::upper_bound_s(i) / LoadWindow::upper_bound_s(i - 1) < 1.091);
  }
  // A single request is its own p99.
  LoadWindow w;
  w.record(false, 0.0042);
  auto t = w.take();
  CHECK(t.p99_s >= 0.0042);
  CHECK(t.p99_s < 0.0042 * 1.1);
}

TEST_CASE("load window: streams in progress - and requests recorded from many threads are all counted") {
  LoadWindow w;
  w.stream_started();
  w.stream_started();
  CHECK(w.take().streams == 2);
  w.stream_ended();
  CHECK(w.take().streams == 1);
  w.stream_ended();
  CHECK(w.take().streams == 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&w] {
      for (int i = 0; i < 10000; ++i)
        w.record(i % 100 == 0, 0.0005);
    });
  }
  for (auto& t : threads)
    t.join();
  auto taken = w.take();
  CHECK(taken.requests == 40000);
  CHECK(taken.errors == 400);
}
