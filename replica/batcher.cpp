#include "replica/batcher.hpp"

#include <algorithm>
#include <exception>
#include <utility>

namespace troupe::replica {

namespace {

double batch_seconds(BatchQueue::Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Moving averages: a new measurement weighs a fifth.
double moving_average(double mean, double sample) { return mean == 0 ? sample : 0.8 * mean + 0.2 * sample; }

// A gap longer than this between two arrivals counts as this long: one quiet
// minute must not make the average mean "light load" for the next hundred
// requests.
constexpr double kLongestGap = 1.0;

// The status that ends a queued request before it ran, or 0 while it may run.
int ended_status(const Request& request) {
  if (!request.control || !request.control->cancelled())
    return 0;
  const auto deadline = request.control->deadline();
  return deadline != RequestControl::Clock::time_point::max() &&
                 RequestControl::Clock::now() >= deadline
             ? 504
             : 499;
}

Response batch_error(const std::string& message, int status) {
  return Response::json(Json{{"error", message}}, status);
}

}  // namespace

// --- BatchQueue -------------------------------------------------------------

void BatchQueue::push(Request request, std::function<void(Response)> done, Clock::time_point now) {
  if (last_arrival_)
    interarrival_s_ = moving_average(interarrival_s_, std::min(batch_seconds(now - *last_arrival_), kLongestGap));
  last_arrival_ = now;
  items_.push_back(Item{std::move(request), std::move(done), now});
}

double BatchQueue::wait_s() const {
  if (!options_.adaptive)
    return options_.wait_s;
  if (options_.max_batch_size <= 1 || batch_s_ == 0 || interarrival_s_ == 0 ||
      interarrival_s_ >= batch_s_)
    return 0;
  return std::min({static_cast<double>(options_.max_batch_size - 1) * interarrival_s_, batch_s_,
                   kAdaptiveCap});
}

std::optional<BatchQueue::Clock::time_point> BatchQueue::closes_at() const {
  if (items_.empty())
    return std::nullopt;
  const auto& oldest = items_.front().arrived;
  if (items_.size() >= std::max<size_t>(1, options_.max_batch_size))
    return oldest;
  return oldest + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait_s()));
}

BatchQueue::Taken BatchQueue::take(Clock::time_point now, bool idle) {
  Taken taken;
  for (auto it = items_.begin(); it != items_.end();) {
    if (int status = ended_status(it->request)) {
      taken.dropped.emplace_back(std::move(*it), status);
      it = items_.erase(it);
    } else {
      ++it;
    }
  }
  auto closes = closes_at();
  if (!idle || !closes || now < *closes)
    return taken;
  const size_t n = std::min(items_.size(), std::max<size_t>(1, options_.max_batch_size));
  taken.batch.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    taken.batch.push_back(std::move(items_.front()));
    items_.pop_front();
  }
  return taken;
}

std::vector<BatchQueue::Item> BatchQueue::drain() {
  std::vector<Item> all(std::make_move_iterator(items_.begin()),
                        std::make_move_iterator(items_.end()));
  items_.clear();
  return all;
}

void BatchQueue::ran(Clock::duration took) {
  batch_s_ = moving_average(batch_s_, batch_seconds(took));
}

// --- Batcher ----------------------------------------------------------------

Batcher::Batcher(BatchOptions options, Run run, bool threaded,
                 std::function<Clock::time_point()> now, Observe observe)
    : run_(std::move(run)), now_(std::move(now)), observe_(std::move(observe)), queue_(options) {
  if (threaded)
    thread_ = std::thread([this] { loop(); });
}

void Batcher::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
}

void Batcher::run() {
  loop();
}

Batcher::~Batcher() {
  stop();
  if (thread_.joinable())
    thread_.join();
  std::vector<BatchQueue::Item> left;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    left = queue_.drain();
  }
  for (auto& item : left)
    item.done(batch_error("the replica is stopping", 503));
  if (!left.empty() && answered_)
    answered_();
}

void Batcher::on_answered(std::function<void()> f) {
  answered_ = std::move(f);
}

void Batcher::submit(Request request, std::function<void(Response)> done) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push(std::move(request), std::move(done), now_());
    // The runner is woken only when this request changes what it waits
    // for: the first of a batch (it sleeps with no deadline) or one that
    // makes its batch close sooner (full, or a shorter adaptive wait). A
    // wake-up per request would cost a context switch per request; a
    // runner in a batch looks at the queue when it is done anyway.
    if (sleeping_) {
      const auto closes = queue_.closes_at();
      wake = closes && *closes < sleeping_until_;
    }
  }
  if (wake)
    changed_.notify_one();
}

void Batcher::set_options(BatchOptions options) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.set_options(options);
  }
  changed_.notify_one();
}

BatchOptions Batcher::options() {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.options();
}

size_t Batcher::queued() {
  std::lock_guard<std::mutex> lock(mutex_);
  return queue_.size();
}

size_t Batcher::step() {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto now = now_();
  auto taken = queue_.take(now, true);
  lock.unlock();
  deliver(taken, now);
  return taken.batch.size();
}

void Batcher::deliver(BatchQueue::Taken& taken, Clock::time_point closed) {
  drop(taken.dropped);
  if (!taken.batch.empty())
    run_batch(taken.batch, closed);
  if ((!taken.dropped.empty() || !taken.batch.empty()) && answered_)
    answered_();
}

void Batcher::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    const auto now = now_();
    auto taken = queue_.take(now, true);
    if (!taken.dropped.empty() || !taken.batch.empty()) {
      lock.unlock();
      deliver(taken, now);
      lock.lock();
      continue;
    }
    const auto at = queue_.closes_at();
    sleeping_ = true;
    sleeping_until_ = at ? *at : Clock::time_point::max();
    if (at)
      changed_.wait_until(lock, *at);
    else
      changed_.wait(lock);
    sleeping_ = false;
  }
}

void Batcher::drop(std::vector<std::pair<BatchQueue::Item, int>>& dropped) {
  for (auto& [item, status] : dropped)
    item.done(batch_error(status == 504 ? "the deadline passed before the request's batch ran"
                                  : "cancelled before the request's batch ran",
                    status));
}

void Batcher::run_batch(std::vector<BatchQueue::Item>& batch, Clock::time_point closed) {
  std::vector<Request> requests;
  requests.reserve(batch.size());
  for (auto& item : batch)
    requests.push_back(std::move(item.request));
  const double waited = batch_seconds(closed - batch.front().arrived);
  const auto start = now_();
  std::vector<Response> answers;
  std::string failure;
  try {
    answers = run_(requests);
  } catch (const std::exception& e) {
    failure = e.what();
  } catch (...) {
    failure = "handle_batch threw something that is not a std::exception";
  }
  const auto took = now_() - start;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.ran(took);
  }
  if (observe_)
    observe_(batch.size(), waited);
  if (failure.empty() && answers.size() != batch.size())
    failure = "handle_batch returned " + std::to_string(answers.size()) + " answers for " +
              std::to_string(batch.size()) + " requests";
  for (size_t i = 0; i < batch.size(); ++i)
    batch[i].done(failure.empty() ? std::move(answers[i]) : batch_error(failure, 500));
}

}  // namespace troupe::replica
