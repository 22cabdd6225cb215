// A real etcd cluster on loopback for the tests and the chaos tool: each
// member its own etcd process (Debian's etcd-server, /usr/bin/etcd), with
// its own data directory and log, on ports from free_port(). Members can be
// killed, stopped and started again as faults; every member still running
// is stopped by the destructor, also when a test fails. Plain C++ and
// POSIX over proc::Child (tools/common/process.hpp); health is asked of
// etcdctl (etcd-client), so nothing here links troupe.
//
// With EtcdTlsFiles the members serve their client URLs over TLS only
// (https, --client-cert-auth: clients must present a certificate of the
// CA); the peer URLs stay plain http on loopback. The harness does not make
// the certificate: the caller issues it from its cluster CA. An identity
// certificate of runtime/security/certs.hpp (security::issue_certificate,
// `troupectl certs issue`) fits as it is: it carries subjectAltName
// IP:127.0.0.1 and extendedKeyUsage serverAuth + clientAuth, and etcd 3.4
// needs both (its JSON gateway dials the member's own gRPC server with the
// server certificate as a client certificate). So no `openssl` command is
// run here.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tools/common/process.hpp"

namespace troupe::proc {

// The files of TLS on the members' client URLs (PEM).
struct EtcdTlsFiles {
  std::string ca_file;    // --trusted-ca-file: clients' certificates must chain to it
  std::string cert_file;  // --cert-file: every member's, and etcdctl's client certificate
  std::string key_file;   // --key-file
};

struct EtcdMember {
  std::string name;  // m1, m2, ...
  uint16_t client_port = 0;
  uint16_t peer_port = 0;
  std::string data_dir;
  std::string log_path;
  Child process;
  bool started_once = false;
  bool tls = false;  // the client URL is https
  // Where the client URL listens: loopback, or an address of this host
  // that other network namespaces reach (the chaos tool's bridge).
  std::string client_host = "127.0.0.1";
  std::string client_url() const {
    return (tls ? "https://" : "http://") + client_host + ":" + std::to_string(client_port);
  }
  std::string peer_url() const { return "http://127.0.0.1:" + std::to_string(peer_port); }
};

// `etcdctl --endpoints <endpoints> <args...>` with ETCDCTL_API=3 (whatever the
// driver's environment says), killed at `timeout`.
RunResult etcdctl(const std::string& endpoints, const std::vector<std::string>& args,
                  std::chrono::milliseconds timeout = std::chrono::seconds(10));

class EtcdCluster {
 public:
  // Starts `members` members as one new cluster, with heartbeat and
  // election timeouts for fast failover (50 ms, 500 ms); throws
  // std::runtime_error naming the member and the tail of its log when the
  // cluster is not healthy within `ready_within`.
  explicit EtcdCluster(const std::string& dir, size_t members = 3,
                       std::chrono::milliseconds ready_within = std::chrono::seconds(20));
  // The same with TLS on the client URLs (see the top of this file).
  EtcdCluster(const std::string& dir, EtcdTlsFiles tls, size_t members = 3,
              std::chrono::milliseconds ready_within = std::chrono::seconds(20));
  // The same with the client URLs on `client_host` (an IPv4 address of this
  // host) instead of 127.0.0.1; `tls` may be empty.
  EtcdCluster(const std::string& dir, std::optional<EtcdTlsFiles> tls, std::string client_host,
              size_t members = 3, std::chrono::milliseconds ready_within = std::chrono::seconds(20));
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  size_t size() const { return members_.size(); }
  EtcdMember& member(size_t i) { return members_.at(i); }
  const EtcdMember& member(size_t i) const { return members_.at(i); }
  // Of every member, running or not.
  std::vector<std::string> client_urls() const;
  std::string endpoints() const;  // client_urls() joined with ','
  // etcdctl's options to reach the members: with TLS --cacert, --cert and
  // --key (the members' own files), else none.
  std::vector<std::string> etcdctl_flags() const;

  void kill(size_t i);   // SIGKILL, reaped
  void stop(size_t i);   // SIGTERM, waits for the exit
  void start(size_t i);  // again, with its data, ports and name
  bool running(size_t i) { return members_.at(i).process.running(); }
  // `etcdctl endpoint health` of member i exits 0.
  bool healthy(size_t i, std::chrono::milliseconds timeout = std::chrono::seconds(2));
  // Waits until a majority of the members is healthy.
  bool has_quorum(std::chrono::milliseconds within);
  // The member that is etcd's own (Raft) leader, as `etcdctl endpoint
  // status` reports it; size() when none of the running members says so.
  size_t raft_leader();
  std::string log_tail(size_t i, size_t lines = 30) const;

 private:
  void start_all(size_t members, std::chrono::milliseconds ready_within);
  std::vector<std::string> argv(size_t i, bool existing) const;
  std::string dir_;
  std::optional<EtcdTlsFiles> tls_;
  std::string client_host_ = "127.0.0.1";
  std::string token_;
  std::vector<EtcdMember> members_;
};

}  // namespace troupe::proc
