// Command line of troupe-node, parsed and validated before anything starts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/address.hpp"
#include "runtime/resources.hpp"
#include "runtime/status.hpp"

namespace troupe {

struct NodeOptions {
  bool head = false;
  std::optional<Endpoint> join;  // set for worker nodes: the first of `heads`
  std::vector<Endpoint> heads;   // --join's list: the head, or its candidates
  uint16_t port = 7300;          // head: where the controller is published
  // Worker: where other workers connect to reach its replicas directly (a
  // CAF listener, over TLS like the head's); 0: any free port.
  uint16_t peer_port = 0;
  std::string bind = "127.0.0.1";
  // The address other nodes reach this one by (empty: --bind, or for a
  // wildcard --bind the address of this host's route to the head).
  std::string advertise;
  std::string state_dir;  // required for the head
  std::string node_id;    // empty: from <state-dir>/node_id, else generated
  Resources resources;    // default: this machine's cores and memory
  uint16_t http_port = 8000;
  // The admin listener (proxy/admin.cpp): /-/metrics, /-/routes, the
  // dashboard; loopback by default. Port 0: any free port (logged).
  std::string admin_bind = "127.0.0.1";
  uint16_t admin_port = 8265;
  // HTTPS on a second port of the proxy (0: none), with the service's own
  // certificate chain and key; with a client CA, clients must present a
  // certificate it signed. Files read again when they change, and on SIGHUP.
  uint16_t https_port = 0;
  // The gRPC ingress (HTTP/2 without TLS; proxy/grpc_server.hpp); 0: none.
  uint16_t grpc_port = 0;
  std::string https_cert;
  std::string https_key;
  std::string https_client_ca;
  // HTTP proxy: largest accepted request body (413 beyond), default request
  // timeout when the deployed http_options give none (0: none), event-loop
  // threads, and how long an idle or slow client may keep a connection (the
  // idle time between requests only while the deployed http_options give no
  // keep_alive_timeout_s).
  uint64_t proxy_body_limit = 16u << 20;
  double proxy_request_timeout_s = 0;
  uint32_t proxy_io_threads = 1;
  double proxy_idle_timeout_s = 60;
  double node_timeout_s = 5.0;
  // Eviction with judgement (controller/membership.hpp, LossJudgement).
  double unreachable_share = 0.5;
  uint32_t unreachable_min_nodes = 2;
  double unreachable_timeout_s = 60.0;
  double heartbeat_interval_s = 1.0;
  double basp_heartbeat_interval_s = 1.0;
  double basp_connection_timeout_s = 5.0;
  double shutdown_grace_s = 5.0;
  // On SIGTERM: seconds the node keeps serving while /-/readyz says 503, so
  // that a load balancer stops sending before the node stops listening.
  double drain_delay_s = 3.0;
  std::string log_level = "info";
  // "text" or "json" (runtime/log.hpp), for the node and its replica processes.
  std::string log_format = "text";
  // The proxy's access log (proxy/access_log.hpp): "on", "errors" or "off".
  std::string access_log = "on";
  // Directories where import_path libraries are looked up.
  std::vector<std::string> plugin_path;
  // Where the node keeps the deployment libraries it fetched from the
  // controller (runtime/libraries.hpp); empty: <state-dir>/library-cache, or
  // without a state dir a directory of its own under the system's temp dir.
  std::string library_cache;
  // Head: seconds to collect re-registering nodes' replicas after a restart.
  double recovery_window_s = 3.0;
  // Head, highly available (controller/ha/): the etcd members' client URLs
  // (empty: the single head with its RocksDB checkpoint), this candidate's
  // name in the election, and the cluster's key prefix in etcd. With
  // --tls-dir every URL is https (a bare host:port becomes https://, an
  // http:// one is refused) and the head presents its node certificate.
  std::vector<std::string> ha_etcd;
  std::string ha_name;
  std::string ha_prefix = "/troupe";
  // The election lease's TTL in seconds (--ha-lease-ttl): renewed every
  // quarter of it; the leader stops leading three quarters of it after its
  // last renewal. Shorter fails over faster; it must outlast etcd's own
  // leader election (its --election-timeout, 1 s by default, and up to
  // twice that), or the loss of etcd's leader also changes troupe's.
  double ha_lease_ttl_s = 2.0;
  // The head's admin listener serves the dashboard (/-/dashboard);
  // --no-dashboard.
  bool dashboard = true;
  // Accept a non-loopback --bind without TLS (logged as a warning).
  bool insecure = false;
  // TLS between processes, with certificates from this directory (ca.crt
  // and <node-id>.crt/.key); empty: no TLS.
  std::string tls_dir;
  // troupe-replica, started for every replica of `isolation: process`;
  // "": the one next to troupe-node.
  std::string replica_binary;
  // Replica processes run as this user (node/replica_user.hpp); "" : the
  // default (troupe-replica when the node runs as root and that user exists).
  std::string replica_user;
  // Head: caps on what one config may ask for.
  uint32_t max_replicas_per_deployment = 1000;
  uint64_t max_replicas_total = 10000;
  uint64_t max_config_bytes = 4 * 1024 * 1024;

  bool show_help = false;
  std::string help_text;
};

// Parses argv (argv[0] is the program name). Errors are one line naming the
// problem; the caller prints it and exits with code 2.
// `default_plugin_dir` is used when --plugin-path is not given.
Result<NodeOptions> parse_node_options(int argc, const char* const* argv,
                                       const std::string& default_plugin_dir = "");

// The default --plugin-path of the troupe-node at `executable` (its own
// path), found from where it is, so that an installed or moved node never
// names the tree it was built in: `<prefix>/lib/troupe/plugins` when the
// node is `<prefix>/bin/troupe-node` of an install (the package's
// /usr/lib/troupe/plugins, which holds the example deployments), else
// `<prefix>/plugins` (a build tree: build/bin, build/plugins). When neither
// exists, the install's, which then holds nothing.
std::string default_plugin_dir(const std::string& executable);

// 127.0.0.0/8, ::1 and localhost.
bool is_loopback(const std::string& host);

// cpu=<online cores>,mem=<physical memory>.
Resources detect_machine_resources();

}  // namespace troupe
