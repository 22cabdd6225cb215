#include "node/node_options.hpp"

#include <unistd.h>

#include <filesystem>

#include <CLI/CLI.hpp>

#include "controller/ha/etcd_client.hpp"
#include "runtime/head_list.hpp"

namespace troupe {

std::string default_plugin_dir(const std::string& executable) {
  namespace fs = std::filesystem;
  const fs::path prefix = fs::path(executable).parent_path().parent_path();
  const fs::path installed = (prefix / "lib" / "troupe" / "plugins").lexically_normal();
  const fs::path build_tree = (prefix / "plugins").lexically_normal();
  std::error_code ec;
  if (fs::is_directory(installed, ec))
    return installed.string();
  if (fs::is_directory(build_tree, ec))
    return build_tree.string();
  return installed.string();
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

Resources detect_machine_resources() {
  Resources r;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_size = sysconf(_SC_PAGESIZE);
  r.amounts["cpu"] = cores > 0 ? static_cast<double>(cores) : 1.0;
  if (pages > 0 && page_size > 0)
    r.amounts["mem"] = static_cast<double>(pages) * page_size;
  return r;
}

namespace {

// What the command line gives as text, checked and converted after parsing.
struct RawArgs {
  std::string join;
  std::string resources;
  std::string plugin_path;
  std::string ha_etcd;
};

// The node's role, where it listens and what it stores.
void add_node_options(CLI::App& app, NodeOptions& o, RawArgs& raw) {
  auto* head = app.add_flag("--head", o.head, "run the controller on this node");
  auto* join_opt = app.add_option(
      "--join", raw.join,
      "HOST:PORT of the head node to join; the head candidates of a highly available cluster: "
      "HOST:PORT,HOST:PORT,... (the leader is found among them)");
  head->excludes(join_opt);
  auto* port_opt = app.add_option("--port", o.port, "head: port the controller listens on")
                       ->capture_default_str();
  port_opt->excludes(join_opt);
  auto* peer_port_opt =
      app.add_option("--peer-port", o.peer_port,
                     "worker: port other workers connect to, to reach this node's replicas "
                     "directly rather than through the head (0: any free port)")
          ->capture_default_str();
  peer_port_opt->excludes(head);
  app.add_option("--bind", o.bind, "address to listen on")->capture_default_str();
  app.add_option("--advertise", o.advertise,
                 "address other nodes reach this one by (default: --bind; for 0.0.0.0 or ::, "
                 "this host's address on its route to the head)");
  app.add_option("--state-dir", o.state_dir, "directory for logs, node id and checkpoints");
  app.add_option("--node-id", o.node_id, "name of this node (default: kept in the state dir)");
  app.add_option("--resources", raw.resources, "capacity, e.g. cpu=4,mem=8G (default: detected)");
}

// The HTTP proxy, the timings of membership and stopping, and the logs.
void add_serving_options(CLI::App& app, NodeOptions& o) {
  app.add_option("--http-port", o.http_port, "port of this node's HTTP proxy")
      ->capture_default_str();
  app.add_option("--admin-port", o.admin_port,
                 "port of this node's admin listener: /-/metrics, /-/routes and, on the head, "
                 "the dashboard (0: any free port, logged)")
      ->capture_default_str();
  app.add_option("--https-port", o.https_port,
                 "port of this node's HTTPS proxy, on --bind (0: none; needs --https-cert and "
                 "--https-key)")
      ->capture_default_str();
  app.add_option("--grpc-port", o.grpc_port,
                 "port of this node's gRPC ingress, on --bind: HTTP/2 (over TLS with "
                 "--https-cert), every unary "
                 "and server-streaming method routed by its 'application' metadata (0: none; "
                 "docs/grpc.md)")
      ->capture_default_str();
  app.add_option("--https-cert", o.https_cert,
                 "PEM certificate chain the HTTPS port presents: the service's own, not the "
                 "cluster CA's (read again when it changes, and on SIGHUP)");
  app.add_option("--https-key", o.https_key, "PEM private key of --https-cert");
  app.add_option("--https-client-ca", o.https_client_ca,
                 "PEM CA certificates: HTTPS clients must present a certificate one of them "
                 "signed (default: no client certificates)");
  app.add_option("--admin-bind", o.admin_bind,
                 "address of the admin listener (off loopback: HTTPS with client certificates "
                 "of the cluster with --tls-dir, else it needs --insecure)")
      ->capture_default_str();
  app.add_option("--proxy-body-limit", o.proxy_body_limit,
                 "bytes: larger request bodies are answered 413")
      ->capture_default_str();
  app.add_option("--request-timeout", o.proxy_request_timeout_s,
                 "seconds before the proxy answers 504, unless http_options set one (0: none)")
      ->capture_default_str();
  app.add_option("--proxy-io-threads", o.proxy_io_threads, "event-loop threads of the HTTP proxy")
      ->capture_default_str();
  app.add_option("--proxy-idle-timeout", o.proxy_idle_timeout_s,
                 "seconds a slow HTTP client may take to send a request, and an idle one "
                 "may hold a connection unless http_options set keep_alive_timeout_s")
      ->capture_default_str();
  app.add_option("--node-timeout", o.node_timeout_s,
                 "seconds without heartbeat before a node is DEAD")
      ->capture_default_str();
  app.add_option("--unreachable-share", o.unreachable_share,
                 "nodes lost within one node timeout beyond this share of all nodes (and at "
                 "least --unreachable-min-nodes) are UNREACHABLE, not DEAD: the head is the "
                 "likely one cut off, so their replicas stay where they are (1: never)")
      ->capture_default_str();
  app.add_option("--unreachable-min-nodes", o.unreachable_min_nodes,
                 "the fewest nodes lost together that can make them UNREACHABLE")
      ->capture_default_str();
  app.add_option("--unreachable-timeout", o.unreachable_timeout_s,
                 "seconds an UNREACHABLE node may stay lost before it is DEAD and its "
                 "replicas are replaced (troupectl drain: at once)")
      ->capture_default_str();
  app.add_option("--heartbeat-interval", o.heartbeat_interval_s,
                 "seconds between a node's heartbeats")
      ->capture_default_str();
  app.add_option("--basp-heartbeat-interval", o.basp_heartbeat_interval_s,
                 "seconds between CAF transport heartbeats")
      ->capture_default_str();
  app.add_option("--basp-connection-timeout", o.basp_connection_timeout_s,
                 "seconds of silence before CAF drops a connection")
      ->capture_default_str();
  app.add_option("--shutdown-grace", o.shutdown_grace_s,
                 "seconds to stop gracefully on SIGTERM (after the drain delay) before forcing")
      ->capture_default_str();
  app.add_option("--drain-delay", o.drain_delay_s,
                 "seconds a node keeps serving on SIGTERM while /-/readyz answers 503, before it "
                 "stops accepting connections (0: none)")
      ->capture_default_str();
  app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  app.add_option("--log-format", o.log_format,
                 "text, or json: one JSON object per line (also for replica processes)")
      ->capture_default_str();
  app.add_option("--access-log", o.access_log,
                 "a line per request the proxy answers: on, errors (status 400 and above) or off; "
                 "into <state-dir>/logs/access.log")
      ->capture_default_str();
}

// Deployment code, TLS, the head's limits.
void add_code_and_head_options(CLI::App& app, NodeOptions& o, RawArgs& raw,
                               const std::string& default_plugin_dir) {
  app.add_option("--plugin-path", raw.plugin_path,
                 "colon-separated directories of deployment libraries (default: " +
                     (default_plugin_dir.empty() ? std::string("none") : default_plugin_dir) + ")");
  app.add_option("--library-cache", o.library_cache,
                 "directory of the deployment libraries this node fetched from the controller "
                 "(default: <state-dir>/library-cache, else one under the temp dir)");
  app.add_option("--replica-binary", o.replica_binary,
                 "troupe-replica executable for replica processes (default: next to troupe-node)");
  app.add_option("--replica-user", o.replica_user,
                 "run replica processes as this user, without the node's keys and state "
                 "(default when troupe-node runs as root: troupe-replica, if that user exists) "
                 "[env TROUPE_REPLICA_USER]")
      ->envname("TROUPE_REPLICA_USER");
  app.add_option("--tls-dir", o.tls_dir,
                 "TLS with mutual certificate authentication: directory with ca.crt and "
                 "<node-id>.crt/.key (troupectl certs) [env TROUPE_TLS_DIR]")
      ->envname("TROUPE_TLS_DIR");
  app.add_flag("!--no-dashboard", o.dashboard,
               "head: do not serve the cluster dashboard (/-/dashboard) on the admin port");
  app.add_flag("--insecure", o.insecure,
               "allow a non-loopback --bind without TLS (anyone who reaches the port could "
               "deploy code)");
  app.add_option("--max-replicas-per-deployment", o.max_replicas_per_deployment,
                 "head: the most replicas one deployment may ask for")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1000000u));
  app.add_option("--max-replicas-total", o.max_replicas_total,
                 "head: the most replicas all deployments together may ask for")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, uint64_t{10000000}));
  app.add_option("--max-config-bytes", o.max_config_bytes,
                 "head: the largest encoded config accepted")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1024}, uint64_t{1} << 30));
  app.add_option("--recovery-window", o.recovery_window_s,
                 "head: after a restart, seconds to wait for nodes to report their replicas, "
                 "counted again from each node that does (at most ten times this)")
      ->capture_default_str();
  app.add_option("--ha-etcd", raw.ha_etcd,
                 "head: run as one of several head candidates, the checkpoint and the election in "
                 "this etcd cluster (client URLs, comma-separated; host:port is http, or https "
                 "with --tls-dir, which then presents this node's certificate) "
                 "[env TROUPE_HA_ETCD]")
      ->envname("TROUPE_HA_ETCD");
  app.add_option("--ha-name", o.ha_name,
                 "head: this candidate's name in the election, unique among the candidates");
  app.add_option("--ha-lease-ttl", o.ha_lease_ttl_s,
                 "head candidate: seconds of the election lease (whole seconds, 1-60); a leader cut "
                 "off from etcd stops after 3/4 of it, another leads after it")
      ->capture_default_str();
  app.add_option("--ha-prefix", o.ha_prefix, "head: the cluster's keys in etcd")
      ->capture_default_str();
}

// The highly available head's etcd, name and prefix.
Status check_ha(NodeOptions& o, const RawArgs& raw) {
  if (raw.ha_etcd.empty()) {
    if (!o.ha_name.empty())
      return Status(errc::invalid_argument, "--ha-name needs --ha-etcd URL[,URL...]");
    return Status::ok();
  }
  if (!o.head)
    return Status(errc::invalid_argument, "--ha-etcd is for head candidates: give --head");
  if (o.ha_name.empty())
    return Status(errc::invalid_argument,
                  "--ha-etcd needs --ha-name NAME, unique among the head candidates");
  if (auto st = validate_node_id(o.ha_name); !st)
    return Status(errc::invalid_argument, "--ha-name: " + st.message());
  if (!(o.ha_lease_ttl_s >= 1 && o.ha_lease_ttl_s <= 60) ||
      o.ha_lease_ttl_s != static_cast<double>(static_cast<int64_t>(o.ha_lease_ttl_s)))
    return Status(errc::invalid_argument,
                  "--ha-lease-ttl must be a whole number of seconds between 1 and 60");
  if (o.ha_prefix.empty() || o.ha_prefix.front() != '/' ||
      o.ha_prefix.find_first_of(" \t\n") != std::string::npos)
    return Status(errc::invalid_argument,
                  "--ha-prefix '" + o.ha_prefix + "' must start with / and hold no spaces");
  // With --tls-dir the head speaks TLS to etcd (a bare host:port is https)
  // and refuses an http:// member rather than send the cluster's state in
  // the clear.
  const bool tls = !o.tls_dir.empty();
  auto eps = ha::parse_endpoints(raw.ha_etcd, tls);
  if (!eps)
    return Status(errc::invalid_argument, "--ha-etcd: " + eps.status().message());
  if (auto st = ha::check_endpoints(*eps, tls); !st)
    return Status(errc::invalid_argument, "--ha-etcd: " + st.message());
  o.ha_etcd = *eps;
  return Status::ok();
}

Status invalid(std::string what) {
  return Status(errc::invalid_argument, std::move(what));
}

// The role, the ports, the node id and the resources.
Status check_node(NodeOptions& o, const RawArgs& raw) {
  if (!o.head && raw.join.empty())
    return invalid("give either --head or --join HOST:PORT");
  if (!raw.join.empty()) {
    auto eps = parse_endpoints(raw.join);
    if (!eps)
      return invalid("--join: " + eps.status().message());
    o.heads = *eps;
    o.join = o.heads.front();
  }
  if (o.head && o.state_dir.empty())
    return invalid("--head needs --state-dir DIR");
  if (o.head && o.port == 0)
    return invalid("--port 0 is not allowed: the head needs a known port");
  if (o.http_port == 0)
    return invalid("--http-port 0 is not allowed");
  if (!o.node_id.empty()) {
    auto st = validate_node_id(o.node_id);
    if (!st)
      return invalid("--node-id: " + st.message());
  }
  if (raw.resources.empty()) {
    o.resources = detect_machine_resources();
  } else {
    auto r = parse_resources(raw.resources);
    if (!r)
      return invalid("--resources: " + r.status().message());
    o.resources = *r;
  }
  return Status::ok();
}

// Durations, formats and the proxy's bounds.
Status check_serving(const NodeOptions& o) {
  auto positive = [&](const char* name, double v) -> Status {
    if (!(v > 0) || v > 86400) {
      return Status(errc::invalid_argument, std::string(name) + " " + std::to_string(v) +
                                                " must be > 0 and <= 86400 seconds");
    }
    return Status::ok();
  };
  for (auto [name, value] : {std::pair<const char*, double>{"--node-timeout", o.node_timeout_s},
                             {"--heartbeat-interval", o.heartbeat_interval_s},
                             {"--basp-heartbeat-interval", o.basp_heartbeat_interval_s},
                             {"--basp-connection-timeout", o.basp_connection_timeout_s},
                             {"--shutdown-grace", o.shutdown_grace_s}}) {
    auto st = positive(name, value);
    if (!st)
      return st;
  }
  if (o.log_format != "text" && o.log_format != "json")
    return invalid("--log-format '" + o.log_format + "' is not one of text, json");
  if (o.access_log != "on" && o.access_log != "errors" && o.access_log != "off")
    return invalid("--access-log '" + o.access_log + "' is not one of on, errors, off");
  if (!(o.drain_delay_s >= 0) || o.drain_delay_s > 86400)
    return invalid("--drain-delay must be between 0 and 86400 seconds");
  if (!(o.proxy_request_timeout_s >= 0) || o.proxy_request_timeout_s > 86400)
    return invalid("--request-timeout must be between 0 and 86400 seconds");
  if (o.proxy_io_threads < 1 || o.proxy_io_threads > 64)
    return invalid("--proxy-io-threads must be between 1 and 64");
  if (o.proxy_body_limit < 1)
    return invalid("--proxy-body-limit must be at least 1 byte");
  if (o.https_port == 0 &&
      (!o.https_cert.empty() || !o.https_key.empty() || !o.https_client_ca.empty()))
    return invalid("--https-cert, --https-key and --https-client-ca need --https-port");
  if (o.https_port != 0 && (o.https_cert.empty() || o.https_key.empty()))
    return invalid("--https-port needs --https-cert FILE and --https-key FILE");
  if (o.https_port != 0 && o.https_port == o.http_port)
    return invalid("--https-port " + std::to_string(o.https_port) + " is also --http-port");
  if (o.grpc_port != 0 && (o.grpc_port == o.http_port || o.grpc_port == o.https_port))
    return invalid("--grpc-port " + std::to_string(o.grpc_port) + " is also --" +
                   (o.grpc_port == o.http_port ? "http-port" : "https-port"));
  if (auto st = positive("--proxy-idle-timeout", o.proxy_idle_timeout_s); !st)
    return st;
  return Status::ok();
}

std::vector<std::string> split_plugin_path(std::string plugin_path,
                                           const std::string& default_plugin_dir) {
  std::vector<std::string> out;
  if (plugin_path.empty())
    plugin_path = default_plugin_dir;
  std::size_t start = 0;
  while (start < plugin_path.size()) {
    auto end = plugin_path.find(':', start);
    if (end == std::string::npos)
      end = plugin_path.size();
    if (end > start)
      out.push_back(plugin_path.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// The head's recovery window, exposure without TLS, the advertised address.
Status check_exposure(const NodeOptions& o) {
  if (!(o.recovery_window_s >= 0) || o.recovery_window_s > 600) {
    return invalid("--recovery-window must be between 0 and 600 seconds");
  }
  if (!is_loopback(o.bind) && !o.insecure && o.tls_dir.empty()) {
    return invalid("--bind " + o.bind +
                   " is not a loopback address: without TLS anyone who reaches it could deploy "
                   "code or kill actors; give --tls-dir DIR, or --insecure to accept that");
  }
  // The admin listener shows the cluster's whole state: off loopback it
  // speaks TLS with client certificates of the cluster (--tls-dir), or plain
  // HTTP to whoever reaches it (--insecure).
  if (!is_loopback(o.admin_bind) && o.tls_dir.empty() && !o.insecure) {
    return invalid("--admin-bind " + o.admin_bind +
                   " is not a loopback address: anyone who reaches it would see the cluster's "
                   "state and metrics; give --insecure to accept that");
  }
  if (!o.advertise.empty() && is_wildcard(o.advertise)) {
    return invalid("--advertise " + o.advertise +
                   " is not an address others can reach: give this host's own address");
  }
  if (o.heartbeat_interval_s >= o.node_timeout_s) {
    return invalid("--heartbeat-interval must be shorter than --node-timeout");
  }
  if (!(o.unreachable_share >= 0) || o.unreachable_share > 1) {
    return invalid("--unreachable-share must be between 0 and 1 (1: never UNREACHABLE)");
  }
  if (o.unreachable_min_nodes < 1) {
    return invalid("--unreachable-min-nodes must be at least 1");
  }
  if (!(o.unreachable_timeout_s > o.node_timeout_s) || o.unreachable_timeout_s > 86400) {
    return invalid(
        "--unreachable-timeout must be longer than --node-timeout and at most "
        "86400 seconds");
  }
  return Status::ok();
}

}  // namespace

Result<NodeOptions> parse_node_options(int argc, const char* const* argv,
                                       const std::string& default_plugin_dir) {
  NodeOptions o;
  RawArgs raw;
  CLI::App app{"troupe-node: runs a node agent (and, with --head, the controller)", "troupe-node"};
  add_node_options(app, o, raw);
  add_serving_options(app, o);
  add_code_and_head_options(app, o, raw, default_plugin_dir);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    o.show_help = true;
    o.help_text = app.help();
    return o;
  } catch (const CLI::ParseError& e) {
    return Result<NodeOptions>(errc::invalid_argument, e.what());
  }

  if (auto st = check_node(o, raw); !st)
    return st;
  if (auto st = check_serving(o); !st)
    return st;
  if (auto st = check_ha(o, raw); !st)
    return st;
  o.plugin_path = split_plugin_path(raw.plugin_path, default_plugin_dir);
  if (auto st = check_exposure(o); !st)
    return st;
  return o;
}

}  // namespace troupe
