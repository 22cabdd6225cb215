// troupe-node: one process per machine. Runs the node agent and, with
// --head, the controller (published on --port).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <nlohmann/json.hpp>

#include "controller/controller_actor.hpp"
#include "controller/controller_metrics.hpp"
#include "controller/core/checkpoint_store.hpp"
#include "node/ha_head.hpp"
#include "node/head_supervisor.hpp"
#include "node/node_agent.hpp"
#include "node/node_options.hpp"
#include "node/peer_listener.hpp"
#include "node/process_supervisor.hpp"
#include "node/replica_gate.hpp"
#include "node/replica_user.hpp"
#include "proxy/data_tls.hpp"
#include "proxy/proxy.hpp"
#include "proxy/tls_context.hpp"
#include "replica/handle_transport.hpp"
#include "replica/plugin/plugin_loader.hpp"
#include "runtime/data_channel.hpp"
#include "runtime/gate_link.hpp"
#include "runtime/head_list.hpp"
#include "runtime/log.hpp"
#include "runtime/metrics.hpp"
#include "runtime/security/credentials.hpp"
#include "runtime/security/openssl_util.hpp"
#include "runtime/security/tls.hpp"
#include "runtime/system_setup.hpp"
#include "runtime/time.hpp"

namespace fs = std::filesystem;
using namespace troupe;

namespace {

int usage_error(const std::string& message) {
  std::fprintf(stderr, "troupe-node: error: %s\n", message.c_str());
  return 2;
}

// Creates the state directory and checks that it is writable; resolves the
// node id (given > stored in the state dir > "head" / generated) and stores it
// so a restarted node keeps its identity.
Status prepare_state(NodeOptions& o) {
  if (!o.state_dir.empty()) {
    std::error_code ec;
    fs::create_directories(fs::path(o.state_dir) / "logs", ec);
    if (ec) {
      return Status(errc::io_error,
                    "state dir '" + o.state_dir + "' cannot be created: " + ec.message());
    }
    auto probe = fs::path(o.state_dir) / ".write-test";
    {
      std::ofstream out(probe);
      if (!out || !(out << "ok") || !out.flush()) {
        return Status(errc::io_error, "state dir '" + o.state_dir + "' is not writable");
      }
    }
    fs::remove(probe, ec);
  }
  auto id_file = o.state_dir.empty() ? fs::path() : fs::path(o.state_dir) / "node_id";
  if (o.node_id.empty() && !id_file.empty() && fs::exists(id_file)) {
    std::ifstream in(id_file);
    std::getline(in, o.node_id);
    if (auto st = validate_node_id(o.node_id); !st) {
      return Status(errc::corrupt, "'" + id_file.string() + "': " + st.message());
    }
  }
  if (o.node_id.empty()) {
    if (o.head) {
      o.node_id = "head";
    } else {
      std::random_device rd;
      char buf[16];
      std::snprintf(buf, sizeof(buf), "node-%06x", rd() & 0xffffff);
      o.node_id = buf;
    }
  }
  if (!id_file.empty()) {
    std::ofstream out(id_file, std::ios::trunc);
    if (!(out << o.node_id << '\n')) {
      return Status(errc::io_error, "cannot write '" + id_file.string() + "'");
    }
  }
  return Status::ok();
}

// CAF publishes with SO_REUSEPORT (needed to restart the head at once after a
// crash), which would let two heads share a port. Binding a plain socket first
// tells whether another process listens there.
Status check_port_free(const std::string& bind, uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return Status(errc::io_error, std::strerror(errno));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (::inet_pton(AF_INET, bind.c_str(), &addr.sin_addr) != 1) {
    ::close(fd);
    return Status(errc::invalid_argument, "--bind '" + bind + "' is not an IPv4 address");
  }
  int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int err = errno;
  ::close(fd);
  if (rc != 0) {
    return Status(errc::unavailable, "cannot listen on " + bind + ":" + std::to_string(port) +
                                         ": " + std::strerror(err));
  }
  return Status::ok();
}

// troupe-replica: --replica-binary, else next to this executable.
std::string replica_binary(const NodeOptions& o) {
  if (!o.replica_binary.empty())
    return o.replica_binary;
  std::error_code ec;
  auto self = fs::read_symlink("/proc/self/exe", ec);
  if (ec)
    return "troupe-replica";
  return (self.parent_path() / "troupe-replica").string();
}

// A keeper that gave up (the controller's, the agent's or the proxy's: it
// died again and again) stops the node, which then exits with an error.
class GaveUp {
 public:
  void set(const std::string& message) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (message_.empty())
      message_ = message;
  }
  std::string message() {
    std::lock_guard<std::mutex> lock(mutex_);
    return message_;
  }

 private:
  std::mutex mutex_;
  std::string message_;  // empty: none gave up
};

// The node agent's keeper, for those that start before it (the process
// supervisor's exit reports, the replica gate): empty until it runs and
// after it stopped.
class KeeperRef {
 public:
  void set(AgentKeeperActor keeper) {
    std::lock_guard<std::mutex> lock(mutex_);
    keeper_ = std::move(keeper);
  }
  AgentKeeperActor get() {
    std::lock_guard<std::mutex> lock(mutex_);
    return keeper_;
  }

 private:
  std::mutex mutex_;
  AgentKeeperActor keeper_;
};

// TLS: CAF's OpenSSL module with this node's certificate; write requests are
// then signed with it and checked against the cluster CA.
Result<std::optional<security::Identity>> configure_tls(
    caf::actor_system_config& cfg, const NodeOptions& o,
    const std::shared_ptr<spdlog::logger>& log) {
  if (o.tls_dir.empty())
    return std::optional<security::Identity>();
  if (auto st = security::configure_tls(cfg, o.tls_dir, o.node_id); !st)
    return Status(st.code(), "--tls-dir: " + st.message());
  auto loaded = security::load_identity(o.tls_dir, o.node_id, std::time(nullptr));
  if (!loaded)
    return Status(loaded.status().code(), "--tls-dir: " + loaded.status().message());
  log->info("TLS on: certificate '{}' ({}), peers must present a certificate of this cluster's CA",
            loaded->name, security::to_string(loaded->role));
  // CAF's OpenSSL transport drops a failed handshake silently: name the peer
  // and the reason here.
  security::on_handshake_failure([tls_log = log::get("tls")](const auto& f) {
    if (f.accepting)
      tls_log->warn("refused TLS peer {}: {}", f.peer, f.reason);
    else
      tls_log->warn("TLS handshake with {} failed: {}", f.peer, f.reason);
  });
  return std::optional<security::Identity>(std::move(loaded.value()));
}

// Pinned deployment libraries this node fetched (runtime/libraries.hpp).
std::string library_cache_dir(const NodeOptions& o) {
  if (!o.library_cache.empty())
    return o.library_cache;
  if (!o.state_dir.empty())
    return (fs::path(o.state_dir) / "library-cache").string();
  std::error_code ec;
  return (fs::temp_directory_path(ec) / ("troupe-" + std::to_string(::getuid())) / o.node_id /
          "library-cache")
      .string();
}

// The parts of a running troupe-node, in the order they start. When a part
// cannot start, abort() ends those that did and the node exits 2.
class Node {
 public:
  Node(const NodeOptions& o, caf::actor_system& sys, std::optional<security::Identity> identity,
       std::string log_file, std::optional<node::RunAs> replica_user)
      : o_(o),
        sys_(sys),
        identity_(std::move(identity)),
        log_file_(std::move(log_file)),
        replica_user_(replica_user) {}

  // Starts every part; an error names what did not start (nothing is left
  // running then).
  Status start(std::shared_ptr<controller::CheckpointStore> checkpoint) {
    Status st = start_proxy();
    if (st && o_.head)
      st = start_head(std::move(checkpoint));
    if (st)
      st = start_replica_processes();
    if (st && !o_.head)
      st = open_peer();
    if (!st) {
      abort();
      return st;
    }
    start_agent();
    log_->info(
        "node {} started ({}; http port {}{}; admin {}:{}{}; resources {})", o_.node_id,
        o_.head ? "head" : "worker joining " + to_string(o_.heads), o_.http_port,
        (o_.https_port ? ", https port " + std::to_string(o_.https_port) : std::string()) +
            (o_.grpc_port ? ", grpc port " + std::to_string(o_.grpc_port) : std::string()),
        o_.admin_bind, proxy_->admin_port(),
        !o_.tls_dir.empty() && !is_loopback(o_.admin_bind) ? " (HTTPS, client certificates)" : "",
        o_.resources.to_string());
    return Status::ok();
  }

  // Until SIGINT or SIGTERM, or a keeper gives up: what it said then ("" on
  // a signal, which `sig` names).
  std::string wait(const sigset_t& signals, int& sig) {
    sig = 0;
    while (sig != SIGINT && sig != SIGTERM) {
      timespec wait{0, 200 * 1000 * 1000};
      sig = sigtimedwait(&signals, nullptr, &wait);
      if (sig == SIGHUP)
        reload();
      if (auto failure = gave_up_->message(); !failure.empty())
        return failure;
      if (ha_head_) {
        if (auto refusal = ha_head_->view().refusal; !refusal.empty())
          return "this head candidate cannot campaign: " + refusal;
      }
    }
    return "";
  }

  // SIGHUP: the HTTPS port's certificate, key and client CA read again (they
  // are also when a file changes; this forces it).
  void reload() {
    if (o_.https_port == 0) {
      log_->info("SIGHUP: nothing to reload (no --https-port)");
      return;
    }
    if (auto st = proxy_->reload_tls(); !st)
      log_->error("SIGHUP: the HTTPS port keeps its certificate: {}", st.message());
    else
      log_->info("SIGHUP: the HTTPS port's certificate read again from {}", o_.https_cert);
  }

  // Stops in order: not ready, the replicas moved (on a signal) during the
  // drain delay, no new connections, the agent's graceful stop within the
  // grace, the controller, the requests in flight, then every part.
  void stop(const sigset_t& signals, const std::string& failure, int exit_code);

 private:
  Status start_proxy();
  Status secure_admin(proxy::ServerOptions& admin);
  Status start_head(std::shared_ptr<controller::CheckpointStore> checkpoint);
  Status start_ha_head(SupervisorOptions sopts);
  Status start_replica_processes();
  Status open_peer();
  void start_agent();
  void abort();
  void stop_agent_and_controller(const std::string& failure, double drain_delay_s, double grace_s);
  void wait_in_flight(std::chrono::steady_clock::time_point until);
  void leave(caf::scoped_actor& self, std::chrono::steady_clock::time_point retry_until,
             double budget_s);

  const NodeOptions& o_;
  caf::actor_system& sys_;
  std::optional<security::Identity> identity_;
  std::string log_file_;
  // Who replica processes run as (node/replica_user.hpp); empty: as the node.
  std::optional<node::RunAs> replica_user_;
  std::shared_ptr<spdlog::logger> log_ = log::get("node");
  std::shared_ptr<GaveUp> gave_up_ = std::make_shared<GaveUp>();
  std::function<void(const std::string&)> on_give_up_ = [g = gave_up_](const std::string& m) {
    g->set(m);
  };
  // The node's metrics, served by its proxy at /-/metrics: the proxy's, the
  // agent's, the in-process replicas', the replica processes' reports and,
  // on the head, the controller's (docs/observability.md).
  std::shared_ptr<metrics::Registry> registry_ = std::make_shared<metrics::Registry>();
  // Requests reach this node's replica processes over their data channels.
  std::shared_ptr<channel::Registry> channels_ = std::make_shared<channel::Registry>();
  std::unique_ptr<proxy::Proxy> proxy_;
  HeadSupervisorActor supervisor_;
  std::unique_ptr<HaHead> ha_head_;  // --ha-etcd: supervisor_ is its actor
  std::shared_ptr<KeeperRef> keeper_ref_ = std::make_shared<KeeperRef>();
  std::shared_ptr<node::ProcessSupervisor> processes_;
  ReplicaGateActor gate_;
  const std::set<std::string> gate_types_ = sys_.message_types<ReplicaGateActor>();
  std::optional<node::PeerListener> peer_;
  std::string advertised_;
  AgentKeeperActor agent_;
};

// Off loopback with --tls-dir the admin listener speaks HTTPS only, with the
// node's certificate, and takes clients with a certificate of the cluster's
// CA; their role (proxy/admin.cpp) decides what they may read.
Status Node::secure_admin(proxy::ServerOptions& admin) {
  auto files = security::find_tls_files(o_.tls_dir, o_.node_id);
  if (!files)
    return Status(files.status().code(), "--tls-dir: " + files.status().message());
  auto tls = proxy::ServerTls::load(files->certificate_file, files->key_file, files->ca_file);
  if (!tls)
    return Status(tls.status().code(), "admin listener TLS: " + tls.status().message());
  admin.tls = std::move(tls.value());
  admin.tls_only = true;
  admin.describe_client = [](ssl_st* ssl) -> std::string {
    X509* cert = SSL_get_peer_certificate(ssl);
    if (cert == nullptr)
      return "";
    auto role = security::detail::role_of(cert);
    X509_free(cert);
    return role ? security::to_string(role.value()) : "";
  };
  return Status::ok();
}

// The HTTP proxy listens first: a port in use stops the node before any
// actor runs.
Status Node::start_proxy() {
  proxy::ProxyOptions popts;
  popts.registry = registry_;
  popts.node_id = o_.node_id;
  popts.server.bind = o_.bind;
  popts.server.port = o_.http_port;
  popts.admin.bind = o_.admin_bind;
  popts.admin.port = o_.admin_port;
  if (!o_.tls_dir.empty() && !is_loopback(o_.admin_bind)) {
    if (auto st = secure_admin(popts.admin); !st)
      return st;
  }
  if (o_.https_port != 0) {
    auto tls = proxy::ServerTls::load(o_.https_cert, o_.https_key, o_.https_client_ca);
    if (!tls)
      return tls.status();
    popts.server.tls = std::move(tls.value());
    popts.server.https_port = o_.https_port;
  }
  if (o_.grpc_port != 0) {
    popts.server.grpc = true;
    popts.server.grpc_port = o_.grpc_port;
  }
  popts.server.io_threads = o_.proxy_io_threads;
  popts.server.body_limit = o_.proxy_body_limit;
  popts.server.idle_timeout_s = o_.proxy_idle_timeout_s;
  popts.request_timeout_s = o_.proxy_request_timeout_s;
  popts.channels = channels_;
  popts.on_give_up = on_give_up_;
  popts.dashboard = o_.head && o_.dashboard;
  popts.connect_peers = !o_.head;
  // A worker serves other workers' requests to its replicas on a data port
  // (proxy/peer_server.cpp); with --tls-dir, over TLS with the node's
  // certificate, and so are its connections to other workers' data ports.
  popts.data_port = !o_.head;
  if (!o_.tls_dir.empty() && !o_.head) {
    auto tls = proxy::DataTls::load(o_.tls_dir, o_.node_id);
    if (!tls)
      return Status(tls.status().code(), "--tls-dir: " + tls.status().message());
    popts.data_tls = std::move(tls.value());
  }
  if (auto mode = proxy::parse_access_log_mode(o_.access_log);
      mode && mode.value() != proxy::AccessLogMode::off) {
    std::string file;
    if (!o_.state_dir.empty())
      file = (fs::path(o_.state_dir) / "logs" / "access.log").string();
    auto opened = proxy::AccessLog::open(mode.value(), file, o_.node_id, o_.log_format == "json");
    if (!opened)
      return opened.status();
    popts.access_log = std::move(opened.value());
  }
  auto started = proxy::Proxy::start(sys_, popts);
  if (!started)
    return started.status();
  proxy_ = std::move(started.value());
  return Status::ok();
}

// A single head always leads (leader_atom; a head candidate answers from
// its election, node/ha_head.hpp).
std::string single_head_leadership(const NodeOptions& o) {
  auto since = std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count();
  nlohmann::json leader{{"name", o.node_id},
                        {"node_id", o.node_id},
                        {"address", (o.advertise.empty() ? advertised_host(o.bind, std::nullopt)
                                                         : o.advertise) +
                                        ":" + std::to_string(o.port)},
                        {"term", 0},
                        {"since_unix_ms", since}};
  return nlohmann::json{{"ha", false},
                        {"leading", true},
                        {"asked", {{"name", o.node_id}, {"node_id", o.node_id}}},
                        {"leader", leader},
                        {"problem", ""}}
      .dump();
}

// The head's controller runs under a supervisor that restarts it over the
// checkpoint if it dies.
Status Node::start_head(std::shared_ptr<controller::CheckpointStore> checkpoint) {
  SupervisorOptions sopts;
  sopts.controller.node_timeout_s = o_.node_timeout_s;
  sopts.controller.unreachable_share = o_.unreachable_share;
  sopts.controller.unreachable_min_nodes = o_.unreachable_min_nodes;
  sopts.controller.unreachable_timeout_s = o_.unreachable_timeout_s;
  sopts.controller.recovery_window_s = o_.recovery_window_s;
  sopts.controller.state_dir = o_.state_dir;
  sopts.controller.plugin_dirs = o_.plugin_path;
  sopts.controller.metrics = std::make_shared<controller::ControllerMetrics>(registry_);
  if (identity_)
    sopts.controller.ca_pem = identity_->ca_pem;
  sopts.controller.limits.max_replicas_per_deployment = o_.max_replicas_per_deployment;
  sopts.controller.limits.max_replicas_total = o_.max_replicas_total;
  sopts.controller.limits.max_config_bytes = o_.max_config_bytes;
  sopts.store = std::move(checkpoint);
  sopts.bind = o_.bind;
  sopts.port = o_.port;
  sopts.on_give_up = on_give_up_;
  if (!o_.ha_etcd.empty())
    return start_ha_head(std::move(sopts));
  sopts.controller.leadership = [leadership = single_head_leadership(o_)] { return leadership; };
  auto started = start_head_supervisor(sys_, sopts);
  if (!started)
    return started.status();
  supervisor_ = *started;
  log_->info("controller listening on {}:{}", o_.bind, o_.port);
  return Status::ok();
}

// A head candidate: it campaigns in etcd and publishes a controller on its
// port only while it leads (node/ha_head.hpp). With --tls-dir it speaks
// TLS to etcd with the cluster's CA and this node's own certificate (the
// files CAF's TLS uses, resolved the same way).
Status Node::start_ha_head(SupervisorOptions sopts) {
  HaHeadOptions h;
  if (!o_.tls_dir.empty()) {
    auto files = security::find_tls_files(o_.tls_dir, o_.node_id);
    if (!files)
      return Status(files.status().code(), "--tls-dir: " + files.status().message());
    h.etcd.tls = ha::EtcdTls{files->ca_file, files->certificate_file, files->key_file};
  }
  h.controller = std::move(sopts.controller);
  h.bind = sopts.bind;
  h.port = sopts.port;
  h.restart_policy = sopts.restart_policy;
  h.on_give_up = sopts.on_give_up;
  h.election.prefix = o_.ha_prefix;
  h.election.ttl_s = static_cast<int64_t>(o_.ha_lease_ttl_s);
  auto ttl = std::chrono::milliseconds(h.election.ttl_s * 1000);
  h.election.keepalive_every = ttl / 4;
  h.election.step_down_after = ttl * 3 / 4;
  h.election.name = o_.ha_name;
  h.election.node_id = o_.node_id;
  h.election.address = (o_.advertise.empty() ? advertised_host(o_.bind, std::nullopt) : o_.advertise) +
                       ":" + std::to_string(o_.port);
  h.etcd.endpoints = o_.ha_etcd;
  ha_head_ = HaHead::start(sys_, h);
  supervisor_ = ha_head_->actor();
  std::string members;
  for (const auto& e : o_.ha_etcd)
    members += (members.empty() ? "" : ",") + e;
  log_->info("head candidate '{}' ({}) campaigning in etcd {} under {}{}", o_.ha_name,
             h.election.address, members, o_.ha_prefix,
             h.etcd.tls ? " (TLS, certificate " + h.etcd.tls->certificate_file + ")" : "");
  return Status::ok();
}

// Replica processes: started and reaped by the process supervisor; they
// reach this node's replica gate over socket pairs (runtime/gate_link.hpp).
Status Node::start_replica_processes() {
  node::SupervisorOptions sup_options;
  if (!o_.state_dir.empty())
    sup_options.log_dir = (fs::path(o_.state_dir) / "logs" / "replicas").string();
  sup_options.on_exit = [ref = keeper_ref_](const std::string& id, const node::ProcessExit& exit) {
    if (auto keeper = ref->get()) {
      caf::anon_send(keeper, replica_exit_atom::value, id, static_cast<int32_t>(exit.pid),
                     exit.describe(), exit.clean());
    }
  };
  // A replica process asks for a connection to the gate (at its start, and
  // when this node dropped the one it had): runtime/gate_link.hpp.
  sup_options.on_doorbell = [this](const std::string& id, int doorbell) {
    if (auto offered = gate_link::offer_connection(sys_, caf::actor_cast<caf::actor>(gate_),
                                                   gate_types_, doorbell);
        !offered)
      log_->warn("replica process {}: no connection to the node offered: {}", id,
                 offered.message());
  };
  auto started = node::ProcessSupervisor::start(std::move(sup_options));
  if (!started)
    return started.status();
  processes_ = std::move(started.value());
  gate_ = node::spawn_replica_gate(sys_, [ref = keeper_ref_] { return ref->get(); });
  log_->info("replica processes reach this node over socket pairs it passes them (no port)");
  return Status::ok();
}

// A worker: other workers reach its replicas over a direct connection.
Status Node::open_peer() {
  auto opened = node::open_peer_listener(sys_, o_.node_id, o_.bind, o_.peer_port,
                                         proxy_->data_port(), proxy_->data_token());
  if (!opened)
    return opened.status();
  peer_ = *opened;
  return Status::ok();
}

void Node::start_agent() {
  // What the other nodes are told to connect to: never a wildcard.
  advertised_ = o_.advertise.empty() ? advertised_host(o_.bind, o_.join) : o_.advertise;
  if (peer_) {
    log_->info("other workers reach this node on {}:{} (data port {}{})", advertised_, peer_->port,
               proxy_->data_port() == 0 ? std::string("none") : std::to_string(proxy_->data_port()),
               o_.tls_dir.empty() ? "" : ", TLS");
  }
  auto library_cache = library_cache_dir(o_);
  AgentOptions aopts;
  aopts.info.id = o_.node_id;
  aopts.info.host = advertised_;
  aopts.info.http_port = o_.http_port;
  aopts.info.peer_port = peer_ ? peer_->port : 0;
  aopts.info.resources = o_.resources.to_string();
  aopts.info.pid = static_cast<int32_t>(::getpid());
  aopts.info.head_mode = o_.join ? (o_.heads.size() > 1 ? HeadMode::head_list : HeadMode::one_head)
                        : ha_head_ ? HeadMode::candidate
                                   : HeadMode::single_head;
  if (o_.join) {
    aopts.controller_endpoints = o_.heads;
  } else if (ha_head_) {
    // A head candidate's agent reaches the controller as a worker's does,
    // starting at its own port: while it does not lead, its follower there
    // names the leader (runtime/head_list.hpp).
    aopts.controller_endpoints = {Endpoint{advertised_, o_.port}};
  } else {
    aopts.local_supervisor = supervisor_;
  }
  aopts.heartbeat_interval_s = o_.heartbeat_interval_s;
  aopts.library_cache = library_cache;
  aopts.loader = std::make_shared<PluginLoader>(o_.plugin_path, library_cache);
  aopts.proxy = proxy_->keeper();
  aopts.handles = replica::make_handle_transport(proxy_->caller());
  aopts.identity = identity_;
  aopts.processes = processes_;
  aopts.replica_binary = replica_binary(o_);
  if (replica_user_) {
    aopts.replica_uid = static_cast<int64_t>(replica_user_->uid);
    aopts.replica_gid = static_cast<int64_t>(replica_user_->gid);
  }
  aopts.plugin_path = o_.plugin_path;
  aopts.log_level = o_.log_level;
  aopts.log_format = o_.log_format;
  aopts.channels = channels_;
  aopts.registry = registry_;
  aopts.node_log_file = log_file_;
  aopts.channel_lanes = proxy_->io_threads();
  aopts.on_give_up = on_give_up_;
  agent_ = spawn_node_agent(sys_, aopts);
  keeper_ref_->set(agent_);
}

void Node::abort() {
  if (gate_)
    caf::anon_send_exit(gate_, caf::exit_reason::user_shutdown);
  if (proxy_)
    proxy_->stop();
  if (supervisor_)
    caf::anon_send_exit(supervisor_, caf::exit_reason::user_shutdown);
  if (ha_head_)
    ha_head_->stop(true);
}

// The controller replaces this node's replicas on other nodes first (on a
// signal, not after a keeper gave up), then stops them here, while the drain
// delay runs; then the agent stops what is left within the grace.
void Node::stop_agent_and_controller(const std::string& failure, double drain_delay_s,
                                     double grace_s) {
  using steady = std::chrono::steady_clock;
  const auto drain_ends = steady::now() + seconds_as(drain_delay_s);
  const auto grace_ends = drain_ends + seconds_as(grace_s);
  auto left_until = [](steady::time_point t) {
    return std::max(0.0, std::chrono::duration<double>(t - steady::now()).count());
  };
  caf::scoped_actor self{sys_};
  if (failure.empty()) {
    // A leading head candidate hands the lead over first: another leads
    // within a look, not after this node's drain, and moves its replicas.
    auto retry_until = drain_ends;
    if (ha_head_ && ha_head_->leading()) {
      log_->info("handing the lead over before stopping");
      ha_head_->hand_over();
      // Its agent reaches the next leader within about a second.
      retry_until = std::max(drain_ends, steady::now() + std::chrono::seconds(2));
    } else if (ha_head_) {
      // A stopping candidate campaigns no more: it must not take the lead
      // (from a leader that stops too) while it drains.
      ha_head_->hand_over();
    }
    // At most until half the grace: the rest is for the replicas left and
    // the requests in flight.
    double budget = left_until(drain_ends + seconds_as(grace_s / 2));
    leave(self, retry_until, budget);
    if (steady::now() < drain_ends) {
      log_->info("serving for {:.1f} s more (drain delay)", left_until(drain_ends));
      std::this_thread::sleep_until(drain_ends);
    }
  }
  // Nothing new from here: answers close their connections.
  proxy_->stop_accepting();
  double grace = std::max(left_until(grace_ends), 0.1);
  self->request(agent_, seconds_as(grace + 3), shutdown_atom::value, grace)
      .receive([](caf::ok_atom) {},
               [&](caf::error& err) {
                 log_->warn("graceful stop of the agent failed: {}", sys_.render(err));
               });
  self->send_exit(agent_, caf::exit_reason::user_shutdown);
  if (supervisor_) {
    self->request(supervisor_, std::chrono::seconds(2), shutdown_atom::value)
        .receive([](caf::ok_atom) {}, [](caf::error&) {});
    self->send_exit(supervisor_, caf::exit_reason::user_shutdown);
  }
  // The lead handed over at once: another candidate need not wait out the
  // lease.
  if (ha_head_)
    ha_head_->stop(true);
}

// Asks the controller, through the agent, to move this node's replicas
// first. A head candidate that just handed the lead over asks again while
// its agent has not reached the next leader yet (at most until the drain
// ends).
void Node::leave(caf::scoped_actor& self, std::chrono::steady_clock::time_point retry_until,
                 double budget_s) {
  while (true) {
    std::string what;
    self->request(agent_, seconds_as(budget_s + 1), leave_atom::value, budget_s)
        .receive([&](std::string& answer) { what = std::move(answer); },
                 [&](caf::error& err) { what = "failed: " + sys_.render(err); });
    bool unreached = what.rfind("not registered", 0) == 0 ||
                     what.rfind("the move did not finish", 0) == 0;
    if (!ha_head_ || !unreached || std::chrono::steady_clock::now() >= retry_until) {
      log_->info("moving the replicas: {}", what);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// Requests the proxy still has in flight (on other nodes' replicas, or
// retried there) finish within the grace before their connections close.
void Node::wait_in_flight(std::chrono::steady_clock::time_point until) {
  auto left = proxy_->in_flight();
  if (left == 0)
    return;
  log_->info("waiting for {} requests in flight (at most until the grace ends)", left);
  while (proxy_->in_flight() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (auto still = proxy_->in_flight(); still > 0)
    log_->warn("{} requests still in flight when the grace ended; closing them", still);
}

void Node::stop(const sigset_t& signals, const std::string& failure, int exit_code) {
  const double drain_delay_s = failure.empty() ? o_.drain_delay_s : 0.0;
  const auto grace_ends =
      std::chrono::steady_clock::now() + seconds_as(drain_delay_s + o_.shutdown_grace_s);
  // Not ready from now on (/-/readyz 503); the proxy keeps serving.
  proxy_->shutting_down();
  // User code blocked in a handler would keep ~actor_system waiting for its
  // thread forever; past the grace period the process exits regardless.
  std::thread([limit = drain_delay_s + o_.shutdown_grace_s + 5, log = log_, exit_code] {
    std::this_thread::sleep_for(std::chrono::duration<double>(limit));
    log->error("stopping did not complete in time; exiting now");
    log->flush();
    std::_Exit(exit_code);
  }).detach();
  // A second SIGINT or SIGTERM forces the stop: the replica processes die
  // with the node (PR_SET_PDEATHSIG).
  std::thread([signals, log = log_] {
    int again = 0;
    while (again != SIGINT && again != SIGTERM)
      again = sigwaitinfo(&signals, nullptr);
    log->warn("received a second {}; stopping now", again == SIGINT ? "SIGINT" : "SIGTERM");
    log->flush();
    std::_Exit(1);
  }).detach();
  stop_agent_and_controller(failure, drain_delay_s, o_.shutdown_grace_s);
  wait_in_flight(grace_ends);
  // Whatever replica process is left (it ignored its stop) dies now.
  processes_->shutdown();
  caf::anon_send_exit(gate_, caf::exit_reason::user_shutdown);
  if (peer_)
    caf::anon_send_exit(peer_->actor, caf::exit_reason::user_shutdown);
  keeper_ref_->set(AgentKeeperActor());
  proxy_->stop();
  if (!security::tls_enabled(sys_)) {
    if (peer_)
      sys_.middleman().close(peer_->port);
    if (supervisor_)
      sys_.middleman().close(o_.port);
  }
}

// Start-up before any actor: the options, the state dir, the head's port
// and checkpoint, the log. An exit code when the node must not start.
std::optional<int> prepare(int argc, char** argv, NodeOptions& o,
                           std::shared_ptr<controller::CheckpointStore>& checkpoint,
                           log::Options& log_options, std::optional<node::RunAs>& replica_user) {
  std::error_code ec;
  auto executable = std::filesystem::read_symlink("/proc/self/exe", ec);
  auto parsed =
      parse_node_options(argc, argv, ec ? std::string() : default_plugin_dir(executable.string()));
  if (!parsed)
    return usage_error(parsed.status().message());
  o = std::move(parsed.value());
  if (o.show_help) {
    std::fputs(o.help_text.c_str(), stdout);
    return 0;
  }
  if (auto st = prepare_state(o); !st)
    return usage_error(st.message());
  if (o.head) {
    if (auto st = check_port_free(o.bind, o.port); !st)
      return usage_error(st.message());
  }
  if (o.head && o.ha_etcd.empty()) {
    // A corrupt or unreadable checkpoint stops the head before anything runs.
    auto opened = controller::open_checkpoint(o.state_dir);
    if (!opened) {
      std::fprintf(stderr, "troupe-node: error: %s\n", opened.status().message().c_str());
      return 1;
    }
    checkpoint = std::move(opened.value());
  }
  log_options.level = o.log_level;
  log_options.format = o.log_format;
  log_options.process = o.node_id;
  if (!o.state_dir.empty())
    log_options.file = (fs::path(o.state_dir) / "logs" / "troupe-node.log").string();
  if (auto st = log::init(log_options); !st)
    return usage_error(st.message());
  if (o.insecure && !is_loopback(o.bind)) {
    log::get("node")->warn(
        "INSECURE: listening on {} without TLS: anyone who reaches this node can deploy "
        "code and kill actors",
        o.bind);
  }
  auto isolated = node::isolate_replicas(
      {o.replica_user, o.state_dir, library_cache_dir(o), o.plugin_path, o.tls_dir});
  if (!isolated)
    return usage_error(isolated.status().message());
  replica_user = isolated->user;
  if (!isolated->warning.empty())
    log::get("node")->warn("{}", isolated->warning);
  if (replica_user) {
    log::get("node")->info("replica processes run as user {} (uid {}, gid {})", replica_user->name,
                           replica_user->uid, replica_user->gid);
  }
  return std::nullopt;
}

// The node from its actor system's start to its end: the exit code.
// `started`: whether it ran (and so stopped).
int run(const NodeOptions& o, const sigset_t& signals,
        std::shared_ptr<controller::CheckpointStore> checkpoint, const std::string& log_file,
        const std::optional<node::RunAs>& replica_user, bool& started) {
  auto log = log::get("node");
  caf::actor_system_config cfg;
  configure_actor_system(
      cfg, TransportOptions{o.basp_heartbeat_interval_s, o.basp_connection_timeout_s});
  auto identity = configure_tls(cfg, o, log);
  if (!identity)
    return usage_error(identity.status().message());
  caf::actor_system sys{cfg};
  Node node(o, sys, std::move(identity.value()), log_file, replica_user);
  if (auto st = node.start(std::move(checkpoint)); !st)
    return usage_error(st.message());
  started = true;
  int sig = 0;
  auto failure = node.wait(signals, sig);
  int exit_code = 0;
  if (!failure.empty()) {
    log->critical("stopping the node: {}", failure);
    std::fprintf(stderr, "troupe-node: error: %s\n", failure.c_str());
    exit_code = 1;
  } else {
    log->info("received {}; stopping (drain delay {:.1f} s, then grace {:.1f} s)",
              sig == SIGINT ? "SIGINT" : "SIGTERM", o.drain_delay_s, o.shutdown_grace_s);
  }
  node.stop(signals, failure, exit_code);
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  // Every thread inherits this mask, so only the main loop sees the signals;
  // blocked first, so a SIGTERM during start-up is not lost to the default
  // action.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  NodeOptions o;
  std::shared_ptr<controller::CheckpointStore> checkpoint;
  log::Options log_options;
  std::optional<node::RunAs> replica_user;
  if (auto code = prepare(argc, argv, o, checkpoint, log_options, replica_user))
    return *code;
  bool started = false;
  int exit_code = run(o, signals, std::move(checkpoint), log_options.file, replica_user, started);
  if (started)
    log::get("node")->info("stopped");
  log::shutdown();
  return exit_code;
}
