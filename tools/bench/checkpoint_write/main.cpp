// checkpoint_write: how long the controller's write-ahead checkpoint takes.
//
// Measures synced RocksCheckpointStore::save() latency (p50/p99/max) for a
// small state (10 applications) and a large one (1,000 deployments with
// realistic configs), where each save changes one application — the common
// case — and, for comparison, the same saves as one whole-state value under a
// single key. Then the startup path for the large state: open, load(), and a
// whole-state decode, plus encoded sizes.
//
//   checkpoint_write [--dir DIR] [--iterations N]
//
// Without --dir a fresh directory under /tmp is used and removed at the end.
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <CLI/CLI.hpp>

#include "controller/store/codec.hpp"
#include "controller/store/rocks_checkpoint_store.hpp"
#include "tools/common/temp_dir.hpp"

using namespace troupe;
using namespace troupe::controller;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// A deployment as a user would write it: JSON init args and user config of a
// few hundred bytes, a code version hash, resources, autoscaling on half.
DeploymentSpec realistic_deployment(int app, int index) {
  DeploymentSpec d;
  d.name = "deployment_" + std::to_string(index);
  d.import_path = "libapp_" + std::to_string(app) + ".so:Model" + std::to_string(index);
  d.init_args = R"({"model_path": "/models/app)" + std::to_string(app) +
                R"(/weights-v3.bin", "batch_size": 32, "max_sequence_length": 2048, )"
                R"("tokenizer": {"name": "bpe", "vocab_size": 50257}, "device": "cpu"})";
  d.code_version = "3f9c2a7e41b8d0c65e2f1a9b7c4d3e2f10a9b8c" + std::to_string(index % 10);
  d.config.num_replicas = 2 + static_cast<uint32_t>(index % 4);
  d.config.max_ongoing_requests = 16;
  d.config.max_queued_requests = 1000;
  d.config.user_config =
      R"({"threshold": 0.85, "temperature": 0.7, "top_k": 40, "labels": ["spam", "ham", )"
      R"("unknown"], "feature_flags": {"cache": true, "fast_path": false}, "timeout_ms": 1500})";
  if (index % 2 == 0) {
    AutoscalingConfig a;
    a.min_replicas = 1;
    a.max_replicas = 20;
    a.initial_replicas = 2;
    a.target_ongoing_requests = 4.0;
    a.upscale_smoothing_factor = 1.5;
    d.config.autoscaling_config = a;
  }
  d.config.resources.amounts = {{"cpu", 2.0}, {"mem", 4.0 * 1024 * 1024 * 1024}};
  if (index % 5 == 0) {
    d.config.resources.amounts["gpu"] = 1.0;
  }
  d.config.max_replicas_per_node = 4;
  return d;
}

TargetState make_state(int apps, int deployments_per_app) {
  TargetState s;
  s.target_capacity = 100.0;
  for (int a = 0; a < apps; ++a) {
    ApplicationSpec app;
    app.name = "app_" + std::to_string(a);
    app.route_prefix = "/" + app.name;
    app.ingress = "deployment_0";
    for (int d = 0; d < deployments_per_app; ++d) {
      app.deployments.push_back(realistic_deployment(a, d));
    }
    s.applications.emplace(app.name, std::move(app));
  }
  return s;
}

// The change a user makes most often: one application's replica count.
void change_one_application(TargetState& s, int i) {
  auto it = std::next(s.applications.begin(), i % static_cast<int>(s.applications.size()));
  auto& d = it->second.deployments.front();
  d.config.num_replicas = 1 + (d.config.num_replicas % 7);
  s.generation += 1;
}

struct Stats {
  double p50 = 0, p99 = 0, max = 0;
};

Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    auto i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
    return v[std::min(i, v.size() - 1)];
  };
  return {at(0.50), at(0.99), v.back()};
}

size_t deployment_count(const TargetState& s) {
  size_t n = 0;
  for (const auto& [name, app] : s.applications) {
    n += app.deployments.size();
  }
  return n;
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "checkpoint_write: %s\n", what.c_str());
  std::exit(1);
}

// Saves `iterations` times through the store, one changed application each.
std::vector<double> bench_store(const std::string& path, TargetState state, int iterations) {
  auto store = RocksCheckpointStore::open(path);
  if (!store) {
    fail(store.status().to_string());
  }
  if (auto st = (*store)->save(state); !st) {  // the first save writes everything
    fail(st.to_string());
  }
  std::vector<double> ms;
  for (int i = 0; i < iterations; ++i) {
    change_one_application(state, i);
    auto start = Clock::now();
    auto st = (*store)->save(state);
    ms.push_back(ms_since(start));
    if (!st) {
      fail(st.to_string());
    }
  }
  return ms;
}

// The alternative layout: the whole state as one value, synced.
std::vector<double> bench_single_key(const std::string& path, TargetState state, int iterations) {
  rocksdb::Options options;
  options.create_if_missing = true;
  rocksdb::DB* raw = nullptr;
  if (auto s = rocksdb::DB::Open(options, path, &raw); !s.ok()) {
    fail(s.ToString());
  }
  std::unique_ptr<rocksdb::DB> db(raw);
  rocksdb::WriteOptions sync;
  sync.sync = true;
  std::vector<double> ms;
  for (int i = 0; i < iterations; ++i) {
    change_one_application(state, i);
    auto start = Clock::now();
    auto s = db->Put(sync, "state", encode_target_state(state));
    ms.push_back(ms_since(start));
    if (!s.ok()) {
      fail(s.ToString());
    }
  }
  if (auto s = db->Close(); !s.ok()) {
    fail(s.ToString());
  }
  return ms;
}

void row(const char* name, const TargetState& s, const std::vector<double>& ms) {
  auto st = stats(ms);
  std::printf("%-34s %5zu %6zu %9.3f %9.3f %9.3f\n", name, s.applications.size(),
              deployment_count(s), st.p50, st.p99, st.max);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  int iterations = 200;
  CLI::App cli{"checkpoint_write: how long the controller's write-ahead checkpoint takes",
               "checkpoint_write"};
  cli.add_option("--dir", dir, "RocksDB directory (default: a fresh one under /tmp, removed)");
  cli.add_option("--iterations", iterations, "saves measured per case")->capture_default_str();
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli.exit(e) == 0 ? 0 : 2;  // --help: 0; bad usage: 2
  }
  if (iterations < 1) {
    fail("--iterations must be at least 1");
  }
  // Without --dir: a directory of its own, removed at the end.
  std::optional<troupe::proc::TempDir> own_dir;
  if (dir.empty()) {
    own_dir.emplace("troupe-checkpoint-bench");
    dir = own_dir->path();
  } else {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    for (const char* sub : {"small", "large", "large-single-key"}) {
      if (std::filesystem::exists(dir + "/" + sub)) {
        fail(dir + "/" + sub + " exists; give an empty --dir");
      }
    }
  }

  const auto small = make_state(10, 2);
  const auto large = make_state(100, 10);

  std::printf(
      "checkpoint_write: %d synced saves per case, each changing one application; dir %s\n\n",
      iterations, dir.c_str());
  std::printf("%-34s %5s %6s %9s %9s %9s\n", "save latency (ms)", "apps", "deps", "p50", "p99",
              "max");
  row("per-application keys, small", small, bench_store(dir + "/small", small, iterations));
  row("per-application keys, large", large, bench_store(dir + "/large", large, iterations));
  row("one whole-state key, large", large,
      bench_single_key(dir + "/large-single-key", large, iterations));

  // Startup with the large state: a fresh store object over the database the
  // large run left behind.
  auto start = Clock::now();
  auto store = RocksCheckpointStore::open(dir + "/large");
  const double open_ms = ms_since(start);
  if (!store) {
    fail(store.status().to_string());
  }
  start = Clock::now();
  auto loaded = (*store)->load();
  const double load_ms = ms_since(start);
  if (!loaded || !loaded->has_value()) {
    fail("load of the large state failed: " + loaded.status().to_string());
  }
  store->reset();

  const auto whole = encode_target_state(large);
  start = Clock::now();
  auto decoded = decode_target_state(whole);
  const double decode_ms = ms_since(start);
  if (!decoded || *decoded != large) {
    fail("whole-state decode did not round-trip");
  }
  start = Clock::now();
  size_t per_app_bytes = 0;
  for (const auto& [name, app] : large.applications) {
    per_app_bytes += encode_application(app).size();
  }
  const double encode_all_ms = ms_since(start);
  const size_t one_app = encode_application(large.applications.begin()->second).size();
  const size_t head = encode_head(large, 100).size();

  std::printf("\nlarge state (%zu applications, %zu deployments):\n", large.applications.size(),
              deployment_count(large));
  std::printf("  encoded whole state             %9zu bytes (%.0f bytes/deployment)\n",
              whole.size(), static_cast<double>(whole.size()) / deployment_count(large));
  std::printf("  per-application records, total  %9zu bytes\n", per_app_bytes);
  std::printf("  one save's batch (1 app + head) %9zu bytes\n", one_app + head);
  std::printf("  startup: open %.3f ms, load() %.3f ms (read + decode + checks)\n", open_ms,
              load_ms);
  std::printf("  decode of the whole-state record %.3f ms\n", decode_ms);
  std::printf("  encode of every application (CPU part of each save) %.3f ms\n", encode_all_ms);
  return 0;
}
