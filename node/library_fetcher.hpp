// The node agent's library cache (issue 21), as a plain class: makes sure the
// cache holds a pinned library before a replica that pins it starts, fetching
// it from the controller in pieces when neither the cache nor this node's
// plugin path has it, and drops what no replica uses any more.
//
// Plain C++ (no CAF, no logging): the controller is reached through a Source
// the caller implements (the agent, with CAF requests), and what is worth a
// line in the log is handed back as Notes for the caller to write. One
// thread at a time (the agent actor's).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runtime/libraries.hpp"
#include "runtime/status.hpp"

namespace troupe::node {

// The library an import path ("<name>@<sha256>:<Class>") pins, if any.
std::optional<libraries::Pinned> pinned_library(const std::string& import_path);

class LibraryFetcher {
 public:
  // A line for the caller's log, and what it reports for the caller to
  // count (troupe_library_cache_events_total): a library fetched whole from
  // the controller, or a cached copy refused because its content no longer
  // hashes to its pin.
  struct Note {
    enum class Level { info, error };
    enum class Event { none, fetched, cached_copy_refused };
    Level level = Level::info;
    std::string text;
    Event event = Event::none;
  };
  using Notes = std::vector<Note>;

  // The controller, for the libraries this node has nowhere else. Each call
  // answers through its reply exactly once, now or later (an error Status
  // when the request failed); the reply returns the Notes of what the
  // fetcher did with the answer, for the caller to log. A fetch asks the
  // Source it started with for all of its pieces.
  struct Source {
    using SizeReply = std::function<Notes(Result<uint64_t>)>;
    using PieceReply = std::function<Notes(Result<std::string>)>;
    virtual ~Source() = default;
    // The size of the library `sha256` the controller holds (0: none).
    virtual void size(const std::string& sha256, SizeReply reply) = 0;
    // Up to libraries::kChunkBytes of it from `offset` (empty: none there).
    virtual void piece(const std::string& sha256, uint64_t offset, PieceReply reply) = 0;
  };

  struct Options {
    std::string cache_dir;                 // AgentOptions::library_cache
    std::vector<std::string> plugin_path;  // AgentOptions::plugin_path
    double retention_s = 3600;             // library_cache_retention_s
    double prune_interval_s = 600;         // library_cache_prune_interval_s
    // The clocks prune() reads; empty: std::chrono::steady_clock::now and
    // the system's time (seconds since the epoch).
    std::function<std::chrono::steady_clock::time_point()> steady_now;
    std::function<double()> wall_now_s;
  };

  using Done = std::function<void(const Status&)>;

  // What ensure() did; `done` has been called unless `joined` or
  // `fetching`.
  enum class Ensured {
    joined,    // a fetch of it was under way: `done` is called when it ends
    reused,    // the cached copy, verified before and unchanged since: ok
    verified,  // the cached copy, whose content was hashed now: ok
    copied,    // this node's plugin path had it: done(what putting it in the cache gave)
    failed,    // done(an error), before asking the controller
    fetching,  // asked the Source: `done` is called when the fetch ends
  };
  struct EnsureReport {
    Ensured how = Ensured::failed;
    Notes notes;
  };

  explicit LibraryFetcher(Options options);
  LibraryFetcher(const LibraryFetcher&) = delete;
  LibraryFetcher& operator=(const LibraryFetcher&) = delete;

  // Makes sure the cache holds `pin`, then calls `done` (every caller
  // waiting for the same library once, with the same outcome): a cached
  // copy verified before with an unchanged stamp is used as it is; else the
  // cached copy is verified, and one whose content does not hash to the pin
  // is refused (a Note) and replaced; else this node's plugin path may hold
  // the same build; else `source` (null: the controller is not connected)
  // has it. `source` is not used when a fetch of `pin` is under way.
  EnsureReport ensure(const libraries::Pinned& pin, std::shared_ptr<Source> source, Done done);

  // At most every prune_interval_s (by steady_now; the first call looks):
  // removes the cached libraries (and pieces of fetches) that neither `used`
  // nor a fetch under way names and whose file was written retention_s or
  // more ago (by wall_now_s), and forgets that they were verified. Returns
  // the hashes it removed.
  std::vector<std::string> prune(const std::set<std::string>& used);

  // Whether a fetch of `sha256` is under way (someone waits for it).
  bool fetching(const std::string& sha256) const;

 private:
  Notes fetch_piece(std::shared_ptr<Source> source, const libraries::Pinned& pin, uint64_t total,
                    uint64_t offset);
  Notes on_size(const std::shared_ptr<Source>& source, const libraries::Pinned& pin,
                Result<uint64_t> size);
  Notes on_piece(const std::shared_ptr<Source>& source, const libraries::Pinned& pin,
                 uint64_t total, uint64_t offset, Result<std::string> piece);
  // Calls every waiter of `sha256` once, with `outcome`.
  void finish(const std::string& sha256, const Status& outcome);

  Options options_;
  // Per library (sha256): what waits for it while it is being made ready.
  std::map<std::string, std::vector<Done>> waiters_;
  // Cached libraries whose content was checked, and the file's stamp then:
  // checked again only once the file changed.
  std::map<std::string, libraries::LibraryDir::Stamp> verified_;
  // When prune() last looked.
  std::optional<std::chrono::steady_clock::time_point> pruned_at_;
  // The cache: one object for all the pieces of a fetch, which keeps the
  // running hash of each (LibraryDir::append).
  libraries::LibraryDir cache_;
  // Replies handed to a Source check it: an answer that arrives after this
  // object is gone does nothing.
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
};

}  // namespace troupe::node
