#include "node/library_fetcher.hpp"

#include <ctime>
#include <utility>

namespace troupe::node {

namespace {

std::string what_of(const libraries::Pinned& pin) {
  return "library " + libraries::pinned(pin.name, pin.sha256);
}

}  // namespace

std::optional<libraries::Pinned> pinned_library(const std::string& import_path) {
  return libraries::split_pinned(import_path.substr(0, import_path.find(':')));
}

LibraryFetcher::LibraryFetcher(Options options)
    : options_(std::move(options)), cache_(options_.cache_dir, false) {
  if (!options_.steady_now)
    options_.steady_now = [] { return std::chrono::steady_clock::now(); };
  if (!options_.wall_now_s)
    options_.wall_now_s = [] { return static_cast<double>(std::time(nullptr)); };
}

void LibraryFetcher::finish(const std::string& sha256, const Status& outcome) {
  auto it = waiters_.find(sha256);
  if (it == waiters_.end())
    return;
  auto waiters = std::move(it->second);
  waiters_.erase(it);
  for (auto& f : waiters)
    f(outcome);
}

bool LibraryFetcher::fetching(const std::string& sha256) const {
  return waiters_.count(sha256) != 0;
}

LibraryFetcher::EnsureReport LibraryFetcher::ensure(const libraries::Pinned& pin,
                                                    std::shared_ptr<Source> source, Done done) {
  EnsureReport report;
  auto& waiters = waiters_[pin.sha256];
  waiters.push_back(std::move(done));
  if (waiters.size() > 1) {
    report.how = Ensured::joined;  // a fetch of it is under way
    return report;
  }
  const std::string what = what_of(pin);
  if (auto st_open = cache_.open(); !st_open) {
    finish(pin.sha256, st_open);
    return report;
  }
  auto stamp = cache_.stamp_of(pin.sha256);
  if (auto it = verified_.find(pin.sha256);
      stamp && it != verified_.end() && it->second == *stamp) {
    report.how = Ensured::reused;
    finish(pin.sha256, Status::ok());
    return report;
  }
  auto cached = cache_.verify(pin.sha256);
  if (cached && *cached) {
    if (stamp)
      verified_[pin.sha256] = *stamp;
    report.how = Ensured::verified;
    finish(pin.sha256, Status::ok());
    return report;
  }
  verified_.erase(pin.sha256);
  if (!cached) {
    if (cached.status().code() != errc::corrupt) {
      finish(pin.sha256, cached.status());
      return report;
    }
    report.notes.push_back(
        {Note::Level::error,
         "refused the cached " + what + ": " + cached.status().message() + "; fetching it again",
         Note::Event::cached_copy_refused});
  }
  if (auto local = libraries::locate(options_.plugin_path, pin.name)) {
    auto sha = libraries::sha256_file(*local);
    if (sha && *sha == pin.sha256) {
      report.how = Ensured::copied;
      finish(pin.sha256, cache_.put_file(pin.sha256, *local));
      return report;
    }
  }
  if (!source) {
    finish(pin.sha256, Status(errc::unavailable, what + " is not in this node's cache and the "
                                                        "controller is not connected"));
    return report;
  }
  report.how = Ensured::fetching;
  std::weak_ptr<int> alive = alive_;
  auto* self = this;
  source->size(pin.sha256, [=](Result<uint64_t> size) -> Notes {
    if (alive.expired())
      return {};
    return self->on_size(source, pin, std::move(size));
  });
  return report;
}

LibraryFetcher::Notes LibraryFetcher::on_size(const std::shared_ptr<Source>& source,
                                              const libraries::Pinned& pin, Result<uint64_t> size) {
  const std::string what = what_of(pin);
  if (!size) {
    finish(pin.sha256, Status(errc::unavailable, "cannot fetch " + what + " from the controller: " +
                                                     size.status().message()));
    return {};
  }
  if (*size == 0) {
    finish(pin.sha256, Status(errc::not_found, "the controller has no " + what));
    return {};
  }
  return fetch_piece(source, pin, *size, 0);
}

// Asks for the library from `offset` on (of `total` bytes); the cache checks
// the content's hash when the last piece is in.
LibraryFetcher::Notes LibraryFetcher::fetch_piece(std::shared_ptr<Source> source,
                                                  const libraries::Pinned& pin, uint64_t total,
                                                  uint64_t offset) {
  std::weak_ptr<int> alive = alive_;
  auto* self = this;
  source->piece(pin.sha256, offset, [=](Result<std::string> piece) -> Notes {
    if (alive.expired())
      return {};
    return self->on_piece(source, pin, total, offset, std::move(piece));
  });
  return {};
}

LibraryFetcher::Notes LibraryFetcher::on_piece(const std::shared_ptr<Source>& source,
                                               const libraries::Pinned& pin, uint64_t total,
                                               uint64_t offset, Result<std::string> piece) {
  const std::string what = what_of(pin);
  if (!piece) {
    finish(pin.sha256, Status(errc::unavailable, "cannot fetch " + what + " from the controller: " +
                                                     piece.status().message()));
    return {};
  }
  if (piece->empty()) {
    finish(pin.sha256,
           Status(errc::io_error, what + ": the controller sent " + std::to_string(offset) +
                                      " of " + std::to_string(total) + " bytes"));
    return {};
  }
  auto got = cache_.append(pin.sha256, total, offset, *piece);
  if (!got) {
    // A hash mismatch included: refused, never loaded.
    Notes notes{{Note::Level::error, what + ": " + got.status().message()}};
    finish(pin.sha256, Status(got.status().code(), what + ": " + got.status().message()));
    return notes;
  }
  if (*got < total)
    return fetch_piece(source, pin, total, *got);
  Notes notes{{Note::Level::info,
               "fetched " + what + " (" + std::to_string(total) + " bytes) from the controller",
               Note::Event::fetched}};
  finish(pin.sha256, Status::ok());
  return notes;
}

std::vector<std::string> LibraryFetcher::prune(const std::set<std::string>& used) {
  const auto now = options_.steady_now();
  if (options_.cache_dir.empty() ||
      (pruned_at_ && now - *pruned_at_ < std::chrono::duration<double>(options_.prune_interval_s)))
    return {};
  pruned_at_ = now;
  std::set<std::string> keep = used;
  for (const auto& [sha, waiting] : waiters_)
    keep.insert(sha);
  auto stale =
      libraries::stale_libraries(cache_.list(), keep, options_.wall_now_s(), options_.retention_s);
  for (const auto& sha : stale) {
    cache_.remove(sha);
    verified_.erase(sha);
  }
  return stale;
}

}  // namespace troupe::node
