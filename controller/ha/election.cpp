#include "controller/ha/election.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace troupe::ha {

using Json = nlohmann::json;

namespace {

int64_t ms(Clock::duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}

}  // namespace

std::string leader_key(const std::string& prefix) {
  return prefix + "/leader";
}

std::string candidate_key(const std::string& prefix, const std::string& name) {
  return prefix + "/candidates/" + name;
}

std::string encode_holder(const Holder& h) {
  return Json{{"name", h.name},
              {"node_id", h.node_id},
              {"address", h.address},
              {"since_unix_ms", h.since_unix_ms}}
      .dump();
}

std::optional<Holder> decode_holder(const std::string& value, int64_t term, int64_t lease) {
  Json j = Json::parse(value, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string())
    return std::nullopt;
  Holder h;
  h.name = j["name"].get<std::string>();
  if (j.contains("node_id") && j["node_id"].is_string())
    h.node_id = j["node_id"].get<std::string>();
  if (j.contains("address") && j["address"].is_string())
    h.address = j["address"].get<std::string>();
  if (j.contains("since_unix_ms") && j["since_unix_ms"].is_number_integer())
    h.since_unix_ms = j["since_unix_ms"].get<int64_t>();
  h.term = term;
  h.lease = lease;
  return h;
}

Result<KeyValue> EtcdElectionBackend::create_or_get(const std::string& key,
                                                    const std::string& value, int64_t lease) {
  auto r = client_.txn({Compare{key, Compare::Target::create_revision, 0, {}}},
                       {Op::put(key, value, lease), Op::get(key)}, {Op::get(key)});
  if (!r)
    return r.status();
  if (r->gets.size() != 1 || !r->gets[0])
    return Status(errc::unavailable, "the key " + key + " went away as it was read");
  return *r->gets[0];
}

Status EtcdElectionBackend::remove_if(const std::string& key, int64_t revision) {
  auto r = client_.txn({Compare{key, Compare::Target::create_revision, revision, {}}},
                       {Op::remove(key)}, {});
  return r ? Status() : r.status();
}

const char* to_string(Election::Role role) {
  return role == Election::Role::leader ? "leader" : "follower";
}

Election::Election(ElectionOptions options, ElectionBackend& backend)
    : options_(std::move(options)), backend_(backend) {}

bool Election::leading(Clock::time_point now) const {
  return role_ == Role::leader && now < renewed_ + options_.step_down_after;
}

void Election::lose(const std::string& why) {
  if (role_ == Role::leader) {
    problem_ = "stopped leading: " + why;
    last_loss_ = why;
  } else {
    problem_ = why;
  }
  role_ = Role::follower;
  holder_.reset();
}

void Election::give_up_lease() {
  if (lease_ == 0)
    return;
  // Best effort: when etcd answers again the key goes at once, or at the
  // next step (revoke_stale_leases); an etcd that answers no more expires
  // it by its TTL.
  if (!backend_.revoke(lease_))
    stale_leases_.push_back(lease_);
  lease_ = 0;
}

void Election::revoke_stale_leases() {
  for (auto it = stale_leases_.begin(); it != stale_leases_.end();) {
    auto st = backend_.revoke(*it);
    if (st || st.code() == errc::not_found)
      it = stale_leases_.erase(it);
    else
      ++it;
  }
}

bool Election::is_stale(int64_t lease) const {
  return std::find(stale_leases_.begin(), stale_leases_.end(), lease) != stale_leases_.end();
}

bool Election::renew(Clock::time_point now) {
  auto ttl = backend_.keep_alive(lease_);
  if (ttl) {
    renewed_ = now;
    next_renewal_ = now + options_.keepalive_every;
    return true;
  }
  if (ttl.status().code() == errc::not_found) {
    lose("the lease expired in etcd");
    lease_ = 0;
    name_claimed_ = false;
    return false;
  }
  problem_ = "cannot renew the lease: " + ttl.status().message();
  next_renewal_ = now + options_.keepalive_every / 5;
  return false;
}

Clock::time_point Election::step(Clock::time_point now, int64_t unix_now_ms) {
  if (!refusal_.empty())
    return now + options_.keepalive_every;
  problem_.clear();
  if (!campaigning_)
    return watch(now);
  auto soon = now + options_.keepalive_every / 5;
  // Our own clock first: a leader that could not renew in time stops, and
  // its lease (maybe still alive in etcd) is given up for a fresh one.
  if (role_ == Role::leader && !leading(now)) {
    lose("the lease was not renewed for " + std::to_string(ms(now - renewed_)) + " ms");
    give_up_lease();
    name_claimed_ = false;
    return now;
  }
  revoke_stale_leases();
  if (lease_ == 0) {
    auto lease = backend_.grant(options_.ttl_s);
    if (!lease) {
      lose("no lease from etcd: " + lease.status().message());
      return soon;
    }
    lease_ = *lease;
    renewed_ = now;
    next_renewal_ = now + options_.keepalive_every;
    name_claimed_ = false;
  } else if (now >= next_renewal_) {
    if (!renew(now)) {
      if (role_ == Role::follower)
        holder_.reset();  // no stale answers about who leads
      return lease_ == 0 ? now : soon;
    }
  }
  if (!name_claimed_) {
    auto claim = backend_.create_or_get(candidate_key(options_.prefix, options_.name),
                                        options_.address, lease_);
    if (!claim) {
      lose("cannot claim the name in etcd: " + claim.status().message());
      return soon;
    }
    if (claim->lease != lease_ && is_stale(claim->lease)) {
      // Our own claim under a lease we gave up while etcd did not answer
      // (etcd renews every lease when it elects a leader of its own):
      // revoked as soon as etcd takes it, not another candidate.
      lose("the name's claim is still under this candidate's earlier lease " +
           std::to_string(claim->lease) + "; revoking it");
      return soon;
    }
    if (claim->lease != lease_) {
      if (!name_conflict_since_)
        name_conflict_since_ = now;
      // A restarted candidate meets its own old claim until that lease
      // expires: wait that long before calling it a second candidate.
      auto patience = std::chrono::seconds(options_.ttl_s) + 2 * options_.keepalive_every;
      if (now - *name_conflict_since_ > patience) {
        refusal_ = "another head candidate named '" + options_.name + "' (at " + claim->value +
                   ") holds that name in etcd: every candidate needs its own --ha-name";
        give_up_lease();  // ours is of no use now
        lose(refusal_);
        return now + options_.keepalive_every;
      }
      lose("waiting for the name '" + options_.name + "' held by a candidate at " +
           claim->value + " (an earlier run of this candidate?)");
      return soon;
    }
    name_claimed_ = true;
    name_conflict_since_.reset();
  }
  Holder mine;
  mine.name = options_.name;
  mine.node_id = options_.node_id.empty() ? options_.name : options_.node_id;
  mine.address = options_.address;
  mine.lease = lease_;
  mine.since_unix_ms = unix_now_ms;
  auto key = backend_.create_or_get(leader_key(options_.prefix), encode_holder(mine), lease_);
  if (!key) {
    if (role_ == Role::follower)
      holder_.reset();
    problem_ = "cannot read the election key: " + key.status().message();
    return soon;
  }
  auto holder = decode_holder(key->value, key->create_revision, key->lease);
  if (key->lease == lease_) {
    if (role_ != Role::leader) {
      role_ = Role::leader;
      ++terms_won_;
    }
    holder_ = holder;
    return next_renewal_;
  }
  if (role_ == Role::leader)
    lose("another candidate holds the election key");
  holder_ = holder;
  if (!holder)
    problem_ = "the election key holds something that is not a candidate's value";
  // Followers look again often: the key goes when its lease expires.
  return std::min(next_renewal_, now + options_.keepalive_every / 2);
}

Clock::time_point Election::watch(Clock::time_point now) {
  auto key = backend_.get(leader_key(options_.prefix));
  if (!key) {
    holder_.reset();  // no stale answers about who leads
    problem_ = "cannot read the election key: " + key.status().message();
  } else if (!*key) {
    holder_.reset();
  } else {
    holder_ = decode_holder((*key)->value, (*key)->create_revision, (*key)->lease);
  }
  return now + options_.keepalive_every / 2;
}

Status Election::stand_down() {
  campaigning_ = false;
  return resign();
}

Status Election::resign() {
  Status st;
  if (role_ == Role::leader && holder_)
    st = backend_.remove_if(leader_key(options_.prefix), holder_->term);
  if (lease_ != 0) {
    auto revoked = backend_.revoke(lease_);
    if (st && !revoked)
      st = revoked;
  }
  lease_ = 0;
  revoke_stale_leases();
  name_claimed_ = false;
  role_ = Role::follower;
  holder_.reset();
  return st;
}

}  // namespace troupe::ha
