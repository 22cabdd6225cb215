// Crash: crashes on request, to show fault containment. With `isolation:
// process` (the default) a crash kills only its own replica, which is
// replaced through the normal crash path; with `in_process` it would take the
// whole troupe-node down.
//
// Constructor: init args {"constructor": "segv" | "abort" | "exit"} crash it
// that way (a start that never finishes); without that key it starts
// normally.
//
// handle(), by query parameter:
//   print=TEXT  first writes TEXT and a newline to stdout (the replica's log)
//   mode=segv   writes through a null pointer (SIGSEGV)
//   mode=abort  std::abort() (SIGABRT)
//   mode=exit   std::exit(3)
//   mode=stack  unbounded recursion: a stack overflow (SIGSEGV)
//   mode=alloc  allocates mb=N MiB (default 1024) in 1 MiB chunks, touches
//               every page and keeps them, then answers {allocated_mb, total_mb,
//               replica_id, pid}: past a memory limit the replica is killed
//   no mode     {"replica_id", "pid", "ok": true}
// Any other mode, or an mb that is not an integer in [0, 1048576], is a 400.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <troupe/deployment.hpp>

#include "example_util.hpp"

namespace {

constexpr size_t kChunk = 1024 * 1024;
constexpr int64_t kMaxMb = 1024 * 1024;  // 1 TiB: far beyond any real limit

// Never set: the recursion's exit the compiler cannot see through, so it
// neither warns about infinite recursion nor drops the frames.
volatile bool g_never = false;

void crash_segv() {
  // Both the pointer and its target volatile: the compiler can neither prove
  // the pointer null nor drop the store.
  volatile int* volatile target = nullptr;
  *target = 1;
}

// 64 KiB per frame; the use of `frame` after the call keeps it from being a
// tail call or a loop, so the stack grows until it overflows.
[[gnu::noinline]] int recurse(int depth) {
  volatile char frame[64 * 1024];
  frame[0] = static_cast<char>(depth);
  frame[sizeof(frame) - 1] = static_cast<char>(depth);
  if (g_never)
    return frame[0];
  return recurse(depth + 1) + frame[sizeof(frame) - 1];
}

// "segv", "abort" and "exit" crash the process that way; anything else
// returns false.
bool crash_by_name(const std::string& how) {
  if (how == "segv") {
    crash_segv();
  } else if (how == "abort") {
    std::abort();
  } else if (how == "exit") {
    std::exit(3);
  } else {
    return false;
  }
  return true;  // only reached if the null-pointer write did not fault
}


}  // namespace

class Crash : public troupe::Deployment {
 public:
  Crash(const troupe::Json& init_args, const troupe::ReplicaContext& ctx) : ctx_(ctx) {
    if (!init_args.is_object() || !init_args.contains("constructor"))
      return;
    const auto& how = init_args.at("constructor");
    if (!how.is_string() || !crash_by_name(how.get<std::string>())) {
      throw std::invalid_argument(
          "Crash: args.constructor must be \"segv\", \"abort\" or \"exit\", got " + how.dump());
    }
  }

  troupe::Response handle(const troupe::Request& request) override {
    const std::string print = request.query_param("print", "");
    if (!print.empty()) {
      std::printf("%s\n", print.c_str());
      std::fflush(stdout);
    }
    const std::string mode = request.query_param("mode", "");
    if (mode.empty()) {
      return troupe::Response::json(
          {{"replica_id", ctx_.replica_id}, {"pid", static_cast<int64_t>(getpid())}, {"ok", true}});
    }
    if (crash_by_name(mode))
      return troupe::Response::json({{"error", "the crash did not happen"}}, 500);
    if (mode == "stack")
      return troupe::Response::json({{"depth", recurse(0)}}, 500);  // never returns
    if (mode == "alloc")
      return allocate(request.query_param("mb", "1024"));
    return troupe::Response::json(
        {{"error", "mode must be segv, abort, exit, stack or alloc, got '" + mode + "'"}}, 400);
  }

 private:
  troupe::Response allocate(const std::string& text) {
    const int64_t mb = troupe_examples::parse_bounded(text, kMaxMb);
    if (mb < 0) {
      return troupe::Response::json(
          {{"error",
            "mb must be an integer in [0, " + std::to_string(kMaxMb) + "], got '" + text + "'"}},
          400);
    }
    std::vector<std::unique_ptr<char[]>> chunks;
    chunks.reserve(static_cast<size_t>(mb));
    for (int64_t i = 0; i < mb; ++i) {
      std::unique_ptr<char[]> chunk(new char[kChunk]);
      std::memset(chunk.get(), 0x5a, kChunk);  // not 0: every page is really written
      chunks.push_back(std::move(chunk));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& chunk : chunks)
      kept_.push_back(std::move(chunk));
    return troupe::Response::json({{"allocated_mb", mb},
                                   {"total_mb", static_cast<int64_t>(kept_.size())},
                                   {"replica_id", ctx_.replica_id},
                                   {"pid", static_cast<int64_t>(getpid())}});
  }

  const troupe::ReplicaContext ctx_;  // immutable: safe to read from any thread
  std::mutex mutex_;
  std::vector<std::unique_ptr<char[]>> kept_;  // every chunk allocated so far
};

TROUPE_DEPLOYMENT(Crash)
