#include "controller/ha/etcd_checkpoint_store.hpp"

#include <algorithm>

#include "controller/ha/election.hpp"
#include "controller/store/codec.hpp"

namespace troupe::ha {

std::string checkpoint_key(const std::string& prefix) {
  return prefix + "/checkpoint";
}

std::string nodes_key(const std::string& prefix) {
  return prefix + "/nodes";
}

EtcdCheckpointStore::EtcdCheckpointStore(
    EtcdOptions options, std::string prefix, std::function<int64_t()> term,
    std::function<std::chrono::steady_clock::time_point()> lead_ends)
    : client_(options),
      prefix_(std::move(prefix)),
      term_(std::move(term)),
      lead_ends_(std::move(lead_ends)),
      timeout_(options.timeout) {}

Status EtcdCheckpointStore::save(const controller::TargetState& state) {
  std::string bytes = controller::encode_target_state(state);
  if (bytes.size() > kMaxCheckpointBytes)
    return Status(errc::invalid_argument,
                  "the target state is " + std::to_string(bytes.size()) +
                      " bytes; the checkpoint in etcd takes at most " +
                      std::to_string(kMaxCheckpointBytes) + " (nothing was written)");
  return fenced_put(checkpoint_key(prefix_), bytes, "the checkpoint");
}

Status EtcdCheckpointStore::save_nodes(const std::string& content) {
  return fenced_put(nodes_key(prefix_), content, "the list of live nodes");
}

std::string EtcdCheckpointStore::load_nodes() {
  auto kv = client_.get(nodes_key(prefix_));
  if (!kv || !*kv)
    return "";
  return (*kv)->value;
}

Status EtcdCheckpointStore::fenced_put(const std::string& target, const std::string& bytes,
                                       const std::string& what) {
  int64_t term = term_ ? term_() : 0;
  if (term == 0)
    return Status(errc::conflict,
                  "fenced: this head does not lead; " + what + " in etcd was not written");
  auto key = leader_key(prefix_);
  auto timeout = timeout_;
  if (lead_ends_) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        lead_ends_() - std::chrono::steady_clock::now());
    timeout = std::clamp(left, std::chrono::milliseconds(100), timeout_);
  }
  client_.set_timeout(timeout);
  auto r = client_.txn({Compare{key, Compare::Target::create_revision, term, {}}},
                       {Op::put(target, bytes)}, {Op::get(key)});
  // errc::unavailable either way: to a caller errc::timeout reads as its own
  // request's deadline.
  if (!r && r.status().code() == errc::timeout)
    return Status(errc::unavailable,
                  what + " was not confirmed by etcd: " + r.status().message() +
                      "; etcd may still write it once it has a quorum again, so the change is "
                      "not applied here, and `troupectl status` shows what holds once a leader "
                      "answers");
  if (!r)
    return Status(r.status().code(),
                  what + " was not written to etcd: " + r.status().message());
  if (!r->succeeded) {
    std::string now = "no one leads";
    if (!r->gets.empty() && r->gets[0]) {
      auto h = decode_holder(r->gets[0]->value, r->gets[0]->create_revision, r->gets[0]->lease);
      now = h ? "'" + h->name + "' leads in term " + std::to_string(h->term)
              : "the election key holds something else";
    }
    return Status(errc::conflict, "fenced: this head's term " + std::to_string(term) +
                                      " is over (" + now + "); " + what +
                                      " in etcd was not written");
  }
  return {};
}

Result<std::optional<controller::TargetState>> EtcdCheckpointStore::load() {
  auto kv = client_.get(checkpoint_key(prefix_));
  if (!kv)
    return Status(kv.status().code(),
                  "cannot read the checkpoint from etcd: " + kv.status().message());
  if (!*kv)
    return std::optional<controller::TargetState>();
  auto state = controller::decode_target_state((*kv)->value);
  if (!state)
    return Status(state.status().code(),
                  "etcd key " + checkpoint_key(prefix_) + ": " + state.status().message());
  return std::optional<controller::TargetState>(std::move(*state));
}

}  // namespace troupe::ha
