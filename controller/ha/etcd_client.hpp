// A client of etcd's v3 API through its JSON gateway (HTTP/1.1, the
// `/v3/...` endpoints every etcd 3.4 member serves on its client URL):
// leases, ranges, puts and transactions — what the head's election
// (controller/ha/election.hpp) and the checkpoint in etcd
// (controller/ha/etcd_checkpoint_store.hpp) need, nothing else. Why the
// gateway and not gRPC: docs/dependencies.md.
//
// Synchronous: every call runs on the caller's thread, bounded by the
// client's timeout, over one kept-alive connection to one member at a
// time. A member that cannot be reached, times out or answers that it has
// no leader makes the call go on to the next member within the same call
// (each member once); the member that answered is kept for the next call.
// Not thread-safe: one client per thread (the election's keep-alives must
// never wait behind a checkpoint write).
//
// TLS (EtcdOptions::tls, https:// endpoints): each new connection loads the
// CA, certificate and key files again (a renewed certificate applies to the
// next connection), verifies the member's certificate against the CA and
// the endpoint's host name or IP address against its subjectAltName, and
// presents the client certificate; the handshake is bounded by the call's
// deadline. A refused handshake is that member's failure: its reason
// (OpenSSL's, e.g. "certificate verify failed (IP address mismatch)") goes
// into the error and the call goes on to the next member.
//
// Errors: errc::timeout when a member may have taken the request without
// confirming it (it went out and no answer came, or etcd said it timed
// out: etcd may still apply a write once it has a quorum again; the
// deadline passing counts so too), errc::unavailable when no member took it
// (every member's reason in the message either way), errc::not_found
// for a lease etcd does not know (expired or revoked), errc::internal for
// an answer that is not what the API documents, errc::invalid_argument for
// endpoints whose scheme does not match the TLS settings (never a silent
// downgrade to plain http) or TLS files that do not load.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/status.hpp"

namespace troupe::ha {

// The files of a TLS client of etcd: PEM, as troupectl certs writes them
// (troupe-node with --tls-dir: <tls-dir>/ca.crt and the node's own
// <name>.crt / <name>.key, security::find_tls_files()).
struct EtcdTls {
  std::string ca_file;           // the members' certificates must chain to it
  std::string certificate_file;  // presented to the members (etcd's --client-cert-auth)
  std::string key_file;
};

struct EtcdOptions {
  // Client URLs of the members: "http://host:port" without `tls`,
  // "https://host:port" with it (check_endpoints()); a bare "host:port" is
  // taken with the scheme `tls` implies.
  std::vector<std::string> endpoints;
  // The whole of one call, all members tried included.
  std::chrono::milliseconds timeout{1000};
  // Unset: plain http. Set: every endpoint must be https.
  std::optional<EtcdTls> tls;
};

// Parses "URL[,URL...]" (the --ha-etcd value) into URLs with their scheme:
// "http://host:port", "https://host:port", or a bare "host:port", which
// means https when `tls` (the head has the cluster's certificates) and http
// otherwise. invalid_argument naming the entry that is none of these.
Result<std::vector<std::string>> parse_endpoints(const std::string& list, bool tls = false);

// invalid_argument naming the first endpoint whose scheme does not match
// `tls`: an https:// member without TLS files, or a plain http:// member
// while TLS is set (the traffic would go unencrypted). Bare host:port
// entries match either.
Status check_endpoints(const std::vector<std::string>& endpoints, bool tls);

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

// One comparison of a transaction: the key's `target` equals `number`
// (create/mod revision, version, lease) or `value`. A key that does not
// exist has create_revision 0, version 0.
struct Compare {
  enum class Target { create_revision, mod_revision, version, value, lease };
  std::string key;
  Target target = Target::create_revision;
  int64_t number = 0;
  std::string value;
};

// One operation of a transaction.
struct Op {
  enum class Kind { put, get, remove };
  Kind kind = Kind::get;
  std::string key;
  std::string value;  // put
  int64_t lease = 0;  // put: the key goes with this lease (0: none)
  static Op put(std::string key, std::string value, int64_t lease = 0) {
    return Op{Kind::put, std::move(key), std::move(value), lease};
  }
  static Op get(std::string key) { return Op{Kind::get, std::move(key), {}, 0}; }
  static Op remove(std::string key) { return Op{Kind::remove, std::move(key), {}, 0}; }
};

struct TxnResult {
  bool succeeded = false;
  int64_t revision = 0;  // the store's revision after the transaction
  // One entry per get of the branch that ran, in order: the key, or none.
  std::vector<std::optional<KeyValue>> gets;
};

class EtcdClient {
 public:
  explicit EtcdClient(EtcdOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // A new lease of `ttl_s` seconds: its id.
  Result<int64_t> grant(int64_t ttl_s);
  // Renews `lease`: the TTL etcd granted again (s); not_found once the
  // lease expired or was revoked.
  Result<int64_t> keep_alive(int64_t lease);
  // Revokes `lease` and deletes every key attached to it (ok when it was
  // gone already).
  Status revoke(int64_t lease);
  // A key's current value (a linearizable read), or none.
  Result<std::optional<KeyValue>> get(const std::string& key);
  // The store's revision after the put.
  Result<int64_t> put(const std::string& key, const std::string& value, int64_t lease = 0);
  Result<TxnResult> txn(const std::vector<Compare>& compare, const std::vector<Op>& success,
                        const std::vector<Op>& failure);

  // The member that answered last ("" before the first answer).
  std::string endpoint() const;
  const EtcdOptions& options() const { return options_; }
  // The bound of the calls from now on (EtcdOptions::timeout).
  void set_timeout(std::chrono::milliseconds timeout) { options_.timeout = timeout; }

  // For tests and the JSON gateway's own encoding of keys and values.
  static std::string base64_encode(const std::string& bytes);
  static bool base64_decode(const std::string& text, std::string& bytes);

 private:
  using Clock = std::chrono::steady_clock;
  struct Connection;
  struct Attempt;
  // POSTs `body` (JSON) to `path` of a member: the answer's JSON text.
  Result<std::string> call(const std::string& path, const std::string& body);
  // One request to `member`, by `until`, on conn_ (opened when there is
  // none for that member).
  Attempt request(size_t member, const std::string& path, const std::string& body,
                  Clock::time_point until);
  // Opens conn_ to `member` (TCP, then TLS with `options_.tls`):
  // invalid_argument when the TLS files do not load (the same for every
  // member), unavailable with the member's reason otherwise.
  Status connect(size_t member, Clock::time_point until);

  EtcdOptions options_;
  size_t current_ = 0;  // the member to try first
  std::unique_ptr<Connection> conn_;
  std::string answered_;
};

}  // namespace troupe::ha
