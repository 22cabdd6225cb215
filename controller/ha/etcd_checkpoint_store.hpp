// The controller's checkpoint in etcd, for heads that run with --ha-etcd:
// the same Cap'n Proto bytes as the RocksDB store's (controller/store/codec.hpp,
// one whole-TargetState record under `<prefix>/checkpoint`), written in a
// transaction guarded by the writer's term (the create revision of the
// election key, controller/ha/election.hpp): a head that no longer leads
// cannot overwrite what the new leader wrote (fencing). A write etcd
// acknowledged is on a quorum of members (etcd syncs its log before it
// answers): the write-ahead rule of CheckpointStore holds.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "controller/core/checkpoint_store.hpp"
#include "controller/ha/etcd_client.hpp"

namespace troupe::ha {

// The largest record written: etcd refuses requests above its
// --max-request-bytes (1.5 MiB by default), and the JSON gateway carries the
// bytes in base64 (4/3 as many).
inline constexpr size_t kMaxCheckpointBytes = 1u << 20;

std::string checkpoint_key(const std::string& prefix);
std::string nodes_key(const std::string& prefix);

class EtcdCheckpointStore final : public controller::CheckpointStore {
 public:
  // `term` says under which term a save may write: the leader's current
  // term, 0 when this head does not lead (save() then refuses at once).
  // `lead_ends` (optional): when the lead ends by the head's own clock; a
  // write waits for etcd at most until then (and at most options.timeout),
  // so that its answer comes before the head stops its controller.
  EtcdCheckpointStore(EtcdOptions options, std::string prefix, std::function<int64_t()> term,
                      std::function<std::chrono::steady_clock::time_point()> lead_ends = {});

  // errc::conflict "fenced" when the election key is not (any longer) the
  // one of `term`: nothing was written. errc::unavailable when etcd did
  // not confirm the write: "was not written" when no member took it, "was
  // not confirmed" when one may have taken it (etcd may still write it once
  // it has a quorum again; the message says so). The caller applies nothing.
  Status save(const controller::TargetState& state) override;
  Result<std::optional<controller::TargetState>> load() override;

  // The ids of the live nodes (controller/shell/recovery_gate.hpp), under
  // `<prefix>/nodes`, written under the same fence: a next leader waits for
  // exactly these nodes in its recovery window. load_nodes() is "" when
  // there is none or etcd cannot be read (the window then runs in full).
  Status save_nodes(const std::string& content);
  std::string load_nodes();

 private:
  // Puts `bytes` at `key` if the election key is still of this head's term.
  Status fenced_put(const std::string& key, const std::string& bytes, const std::string& what);

  EtcdClient client_;
  std::string prefix_;
  std::function<int64_t()> term_;
  std::function<std::chrono::steady_clock::time_point()> lead_ends_;
  std::chrono::milliseconds timeout_;  // options.timeout
};

}  // namespace troupe::ha
