// The head candidates' election, as plain C++ driven step by step with an
// explicit clock (docs/architecture.md, "High availability").
//
// Every candidate holds an etcd lease (TTL ttl, renewed every
// keepalive_every) and campaigns by creating the election key with it in
// a transaction that succeeds only while the key does not exist: the one
// whose key exists leads, for as long as its lease lives; the others
// follow and read who leads. The key's create revision is the leader's
// term: the checkpoint's writes are guarded by it (fencing,
// controller/ha/etcd_checkpoint_store.hpp), so a deposed leader's late
// write fails.
//
// A leader stops leading by its own clock before etcd can have expired
// its lease for the others: leading() is false from renewed + step_down_after
// on, where `renewed` is when the last successful renewal was sent (etcd
// counts the lease's TTL from when it received it, later). It then gives
// the lease up and campaigns anew with a fresh one.
//
// A name is one candidate: each claims `<prefix>/candidates/<name>` with its
// lease; a second candidate of the same name waits until the first one's
// lease could have expired (a restarted candidate meets its old claim) and
// then refuses for good (refusal()).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "controller/ha/etcd_client.hpp"
#include "runtime/status.hpp"

namespace troupe::ha {

using Clock = std::chrono::steady_clock;

// Who holds the election key: what the key's value says and its term.
struct Holder {
  std::string name;
  std::string address;  // where its controller listens ("host:port")
  int64_t term = 0;     // the key's create revision
  int64_t lease = 0;
  int64_t since_unix_ms = 0;  // when it took the lead (its own clock)
  std::string node_id;        // the candidate's node id (troupectl leader)
};

// The election key's value: a small JSON object.
std::string encode_holder(const Holder& h);
std::optional<Holder> decode_holder(const std::string& value, int64_t term, int64_t lease);

// What the election needs of etcd: EtcdElectionBackend below over an
// EtcdClient, a fake in the unit tests.
class ElectionBackend {
 public:
  virtual ~ElectionBackend() = default;
  virtual Result<int64_t> grant(int64_t ttl_s) = 0;
  // The TTL granted again; not_found once the lease is gone.
  virtual Result<int64_t> keep_alive(int64_t lease) = 0;
  virtual Status revoke(int64_t lease) = 0;
  // Creates `key` = `value` with `lease` unless the key exists: the key as
  // it is afterwards (ours when created).
  virtual Result<KeyValue> create_or_get(const std::string& key, const std::string& value,
                                         int64_t lease) = 0;
  virtual Result<std::optional<KeyValue>> get(const std::string& key) = 0;
  // Deletes `key` if its create revision is `revision`.
  virtual Status remove_if(const std::string& key, int64_t revision) = 0;
};

class EtcdElectionBackend final : public ElectionBackend {
 public:
  explicit EtcdElectionBackend(EtcdOptions options) : client_(std::move(options)) {}
  Result<int64_t> grant(int64_t ttl_s) override { return client_.grant(ttl_s); }
  Result<int64_t> keep_alive(int64_t lease) override { return client_.keep_alive(lease); }
  Status revoke(int64_t lease) override { return client_.revoke(lease); }
  Result<KeyValue> create_or_get(const std::string& key, const std::string& value,
                                 int64_t lease) override;
  Result<std::optional<KeyValue>> get(const std::string& key) override { return client_.get(key); }
  Status remove_if(const std::string& key, int64_t revision) override;
  EtcdClient& client() { return client_; }

 private:
  EtcdClient client_;
};

struct ElectionOptions {
  std::string prefix = "/troupe";  // the cluster's keys in etcd
  std::string name;                // --ha-name
  std::string node_id;             // the candidate's node id
  std::string address;             // this candidate's controller address
  int64_t ttl_s = 2;
  Clock::duration keepalive_every = std::chrono::milliseconds(500);
  // Leading ends this long after the last renewal was sent: below the TTL,
  // so that a leader cut off from etcd has stopped before another can lead.
  Clock::duration step_down_after = std::chrono::milliseconds(1500);
};

// The keys of a cluster's election under `prefix`.
std::string leader_key(const std::string& prefix);
std::string candidate_key(const std::string& prefix, const std::string& name);

class Election {
 public:
  enum class Role { follower, leader };

  Election(ElectionOptions options, ElectionBackend& backend);

  // One round: renews the lease when due, claims the name, campaigns when
  // not leading, checks the key when leading. Calls etcd (blocking, each
  // call bounded by the backend's timeout); `now` is when the round began.
  // Returns when the next round is due.
  Clock::time_point step(Clock::time_point now, int64_t unix_now_ms);

  // Leading at `now`: the key is ours and the lease was renewed recently
  // enough (see the top of this file). Cheap: the controller asks it
  // before every write.
  bool leading(Clock::time_point now) const;
  // Until when leading() holds without another renewal (the epoch when
  // not leading).
  Clock::time_point leading_until() const {
    return role_ == Role::leader ? renewed_ + options_.step_down_after : Clock::time_point{};
  }
  Role role() const { return role_; }
  // The holder of the key as last read (ours while leading); none when no
  // one leads or etcd could not be read.
  const std::optional<Holder>& holder() const { return holder_; }
  int64_t term() const { return role_ == Role::leader && holder_ ? holder_->term : 0; }
  int64_t lease() const { return lease_; }
  // How many times this candidate took the lead.
  uint64_t terms_won() const { return terms_won_; }
  // Why the last round could not do its work ("" when it could): etcd
  // unreachable, the lease lost, ...
  const std::string& problem() const { return problem_; }
  // Why this candidate last stopped leading ("" if it never did).
  const std::string& last_loss() const { return last_loss_; }
  // Set for good when another candidate holds this name: the message.
  const std::string& refusal() const { return refusal_; }
  const ElectionOptions& options() const { return options_; }

  // Gives up the lead at once (graceful stop): deletes the key if still
  // ours and revokes the lease, so that another candidate leads without
  // waiting for the TTL.
  Status resign();
  // resign(), and campaign no more: later steps only read who leads (no
  // lease, no name claim), so that a head that is stopping still names the
  // leader that follows it.
  Status stand_down();
  bool campaigning() const { return campaigning_; }

 private:
  void lose(const std::string& why);
  bool renew(Clock::time_point now);
  // Drops lease_, revoking it; one etcd did not take is kept in
  // stale_leases_ and revoked again at every step until etcd takes it.
  void give_up_lease();
  void revoke_stale_leases();
  bool is_stale(int64_t lease) const;
  Clock::time_point watch(Clock::time_point now);

  ElectionOptions options_;
  ElectionBackend& backend_;
  Role role_ = Role::follower;
  int64_t lease_ = 0;
  Clock::time_point renewed_{};  // when the last successful renewal was sent
  Clock::time_point next_renewal_{};
  bool name_claimed_ = false;
  std::optional<Clock::time_point> name_conflict_since_;
  std::optional<Holder> holder_;
  uint64_t terms_won_ = 0;
  std::string problem_;
  std::string last_loss_;
  std::string refusal_;
  bool campaigning_ = true;
  // Leases this candidate gave up while etcd did not answer: etcd renews
  // every lease when it elects a leader of its own, so such a lease (and
  // the keys it holds: the election key, the name's claim) can outlive the
  // outage by a whole TTL unless it is revoked.
  std::vector<int64_t> stale_leases_;
};

const char* to_string(Election::Role role);

}  // namespace troupe::ha
