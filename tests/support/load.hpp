// Closed-loop HTTP load for integration tests: clients that send one GET
// after the other through nodes' proxies while a fault happens, recording
// every outcome.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/http_client.hpp"

namespace troupe::testing {

// Closed-loop clients, each sending one GET after the other through one
// node's proxy, recording every outcome.
class Load {
 public:
  struct Outcome {
    int status = 0;  // 0: no answer within the client's timeout
    double seconds = 0;
    std::string body;
  };

  Load(std::vector<uint16_t> ports, std::string target, double timeout_s)
      : target_(std::move(target)) {
    for (auto port : ports) {
      threads_.emplace_back([this, port, timeout_s] {
        while (!stop_) {
          auto start = std::chrono::steady_clock::now();
          auto r = http_get(port, target_, timeout_s);
          Outcome o;
          o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          if (r) {
            o.status = r->status;
            o.body = r->body;
          }
          std::lock_guard<std::mutex> lock(mutex_);
          outcomes_.push_back(std::move(o));
        }
      });
    }
  }
  ~Load() { stop(); }

  void stop() {
    stop_ = true;
    for (auto& t : threads_) {
      if (t.joinable())
        t.join();
    }
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mutex_);
    return outcomes_.size();
  }
  std::vector<Outcome> outcomes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return outcomes_;
  }

 private:
  std::string target_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::vector<Outcome> outcomes_;
  std::vector<std::thread> threads_;
};

}  // namespace troupe::testing
