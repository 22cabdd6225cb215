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

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "controller/controller_actor.hpp"
#include "controller/controller_metrics.hpp"
#include "controller/core/checkpoint_store.hpp"
#include "node/head_supervisor.hpp"
#include "node/node_agent.hpp"
#include "node/node_options.hpp"
#include "node/process_supervisor.hpp"
#include "node/peer_listener.hpp"
#include "node/replica_gate.hpp"
#include "proxy/proxy.hpp"
#include "replica/handle_transport.hpp"
#include "replica/plugin/plugin_loader.hpp"
#include "runtime/data_channel.hpp"
#include "runtime/log.hpp"
#include "runtime/metrics.hpp"
#include "runtime/security/credentials.hpp"
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

}  // namespace

int main(int argc, char** argv) {
  // Every thread inherits this mask, so only the main loop below sees the
  // signals; blocked first, so a SIGTERM during start-up is not lost to the
  // default action.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::error_code ec;
  auto executable = std::filesystem::read_symlink("/proc/self/exe", ec);
  auto parsed =
      parse_node_options(argc, argv, ec ? std::string() : default_plugin_dir(executable.string()));
  if (!parsed)
    return usage_error(parsed.status().message());
  NodeOptions o = std::move(parsed.value());
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
  // A corrupt or unreadable checkpoint stops the head before anything runs.
  std::shared_ptr<controller::CheckpointStore> checkpoint;
  if (o.head) {
    auto opened = controller::open_checkpoint(o.state_dir);
    if (!opened) {
      std::fprintf(stderr, "troupe-node: error: %s\n", opened.status().message().c_str());
      return 1;
    }
    checkpoint = std::move(opened.value());
  }
  log::Options log_options;
  log_options.level = o.log_level;
  log_options.format = o.log_format;
  log_options.process = o.node_id;
  if (!o.state_dir.empty()) {
    log_options.file = (fs::path(o.state_dir) / "logs" / "troupe-node.log").string();
  }
  if (auto st = log::init(log_options); !st)
    return usage_error(st.message());
  auto log = log::get("node");
  if (o.insecure && !is_loopback(o.bind)) {
    log->warn(
        "INSECURE: listening on {} without TLS: anyone who reaches this node can deploy "
        "code and kill actors",
        o.bind);
  }

  int exit_code = 0;
  {
    caf::actor_system_config cfg;
    configure_actor_system(
        cfg, TransportOptions{o.basp_heartbeat_interval_s, o.basp_connection_timeout_s});
    // TLS: CAF's OpenSSL module with this node's certificate; write requests
    // are then signed with it and checked against the cluster CA.
    std::optional<security::Identity> identity;
    if (!o.tls_dir.empty()) {
      if (auto st = security::configure_tls(cfg, o.tls_dir, o.node_id); !st) {
        log::shutdown();
        return usage_error("--tls-dir: " + st.message());
      }
      auto loaded = security::load_identity(o.tls_dir, o.node_id, std::time(nullptr));
      if (!loaded) {
        log::shutdown();
        return usage_error("--tls-dir: " + loaded.status().message());
      }
      identity = std::move(loaded.value());
      log->info(
          "TLS on: certificate '{}' ({}), peers must present a certificate of this "
          "cluster's CA",
          identity->name, security::to_string(identity->role));
      // CAF's OpenSSL transport drops a failed handshake silently: name the
      // peer and the reason here.
      security::on_handshake_failure([tls_log = log::get("tls")](const auto& f) {
        if (f.accepting)
          tls_log->warn("refused TLS peer {}: {}", f.peer, f.reason);
        else
          tls_log->warn("TLS handshake with {} failed: {}", f.peer, f.reason);
      });
    }
    caf::actor_system sys{cfg};

    // A keeper that gave up (the controller's or the agent's: it died again
    // and again) stops the node, which then exits with an error.
    struct GaveUp {
      std::mutex mutex;
      std::string message;  // empty: none gave up
    };
    auto gave_up = std::make_shared<GaveUp>();
    auto on_give_up = [gave_up](const std::string& message) {
      std::lock_guard<std::mutex> lock(gave_up->mutex);
      if (gave_up->message.empty())
        gave_up->message = message;
    };
    auto give_up_message = [gave_up] {
      std::lock_guard<std::mutex> lock(gave_up->mutex);
      return gave_up->message;
    };

    // The HTTP proxy listens first: a port in use stops the node before any
    // actor runs.
    // The node's metrics, served by its proxy at /-/metrics: the proxy's,
    // the agent's, the in-process replicas', the replica processes' reports
    // and, on the head, the controller's (docs/observability.md).
    auto registry = std::make_shared<metrics::Registry>();
    proxy::ProxyOptions popts;
    popts.registry = registry;
    popts.node_id = o.node_id;
    popts.server.bind = o.bind;
    popts.server.port = o.http_port;
    popts.server.io_threads = o.proxy_io_threads;
    popts.server.body_limit = o.proxy_body_limit;
    popts.server.idle_timeout_s = o.proxy_idle_timeout_s;
    popts.request_timeout_s = o.proxy_request_timeout_s;
    // Requests reach this node's replica processes over their data channels.
    auto channels = std::make_shared<channel::Registry>();
    popts.channels = channels;
    popts.on_give_up = on_give_up;
    popts.dashboard = o.head && o.dashboard;
    popts.connect_peers = !o.head;
    // A worker serves other workers' requests to its replicas on a data port
    // (proxy/peer_data.cpp); not with TLS, whose clusters keep CAF's
    // encrypted connections for that.
    popts.data_port = !o.head && o.tls_dir.empty();
    if (auto mode = proxy::parse_access_log_mode(o.access_log);
        mode && mode.value() != proxy::AccessLogMode::off) {
      std::string file;
      if (!o.state_dir.empty())
        file = (fs::path(o.state_dir) / "logs" / "access.log").string();
      auto opened = proxy::AccessLog::open(mode.value(), file, o.node_id, o.log_format == "json");
      if (!opened) {
        log::shutdown();
        return usage_error(opened.status().message());
      }
      popts.access_log = std::move(opened.value());
    }
    auto started = proxy::Proxy::start(sys, popts);
    if (!started) {
      log::shutdown();
      return usage_error(started.status().message());
    }
    auto http_proxy = std::move(started.value());

    // The head's controller runs under a supervisor that restarts it over
    // the checkpoint if it dies.
    HeadSupervisorActor supervisor;
    if (o.head) {
      SupervisorOptions sopts;
      sopts.controller.node_timeout_s = o.node_timeout_s;
      sopts.controller.recovery_window_s = o.recovery_window_s;
      sopts.controller.state_dir = o.state_dir;
      sopts.controller.plugin_dirs = o.plugin_path;
      sopts.controller.metrics = std::make_shared<controller::ControllerMetrics>(registry);
      if (identity)
        sopts.controller.ca_pem = identity->ca_pem;
      sopts.controller.limits.max_replicas_per_deployment = o.max_replicas_per_deployment;
      sopts.controller.limits.max_replicas_total = o.max_replicas_total;
      sopts.controller.limits.max_config_bytes = o.max_config_bytes;
      sopts.store = checkpoint;
      sopts.bind = o.bind;
      sopts.port = o.port;
      sopts.on_give_up = on_give_up;
      auto started_supervisor = start_head_supervisor(sys, sopts);
      if (!started_supervisor) {
        http_proxy->stop();
        log::shutdown();
        return usage_error(started_supervisor.status().message());
      }
      supervisor = *started_supervisor;
      log->info("controller listening on {}:{}", o.bind, o.port);
    }
    // Replica processes: started and reaped by the supervisor, they reach this
    // node through the replica gate on loopback.
    struct KeeperRef {
      std::mutex mutex;
      AgentKeeperActor keeper;
    };
    auto keeper_ref = std::make_shared<KeeperRef>();
    auto keeper_of = [keeper_ref] {
      std::lock_guard<std::mutex> lock(keeper_ref->mutex);
      return keeper_ref->keeper;
    };
    node::SupervisorOptions sup_options;
    if (!o.state_dir.empty())
      sup_options.log_dir = (fs::path(o.state_dir) / "logs" / "replicas").string();
    sup_options.on_exit = [keeper_of](const std::string& id, const node::ProcessExit& exit) {
      if (auto keeper = keeper_of()) {
        caf::anon_send(keeper, replica_exit_atom::value, id, static_cast<int32_t>(exit.pid),
                       exit.describe(), exit.clean());
      }
    };
    auto started_processes = node::ProcessSupervisor::start(std::move(sup_options));
    if (!started_processes) {
      http_proxy->stop();
      if (supervisor)
        caf::anon_send_exit(supervisor, caf::exit_reason::user_shutdown);
      log::shutdown();
      return usage_error(started_processes.status().message());
    }
    std::shared_ptr<node::ProcessSupervisor> processes = std::move(started_processes.value());
    auto gate = node::spawn_replica_gate(sys, keeper_of);
    auto gate_port = security::publish(caf::actor_cast<caf::actor>(gate), 0, "127.0.0.1");
    if (!gate_port) {
      caf::anon_send_exit(gate, caf::exit_reason::user_shutdown);
      http_proxy->stop();
      if (supervisor)
        caf::anon_send_exit(supervisor, caf::exit_reason::user_shutdown);
      log::shutdown();
      return usage_error("cannot open the replica port on 127.0.0.1: " + sys.render(gate_port.error()));
    }
    log->info("replica processes reach this node on 127.0.0.1:{}", *gate_port);
    // A worker: other workers reach its replicas over a direct connection.
    std::optional<node::PeerListener> peer;
    if (!o.head) {
      auto opened = node::open_peer_listener(sys, o.node_id, o.bind, o.peer_port,
                                             http_proxy->data_port(), http_proxy->data_token());
      if (!opened) {
        caf::anon_send_exit(gate, caf::exit_reason::user_shutdown);
        http_proxy->stop();
        log::shutdown();
        return usage_error(opened.status().message());
      }
      peer = *opened;
    }
    // What the other nodes are told to connect to: never a wildcard.
    const std::string advertised =
        o.advertise.empty() ? advertised_host(o.bind, o.join) : o.advertise;
    if (peer)
      log->info("other workers reach this node on {}:{} (data port {})", advertised, peer->port,
                http_proxy->data_port() == 0 ? std::string("none")
                                             : std::to_string(http_proxy->data_port()));

    // Pinned deployment libraries this node fetched (runtime/libraries.hpp).
    std::string library_cache = o.library_cache;
    if (library_cache.empty()) {
      std::error_code ec;
      library_cache = !o.state_dir.empty()
                          ? (fs::path(o.state_dir) / "library-cache").string()
                          : (fs::temp_directory_path(ec) /
                             ("troupe-" + std::to_string(::getuid())) / o.node_id / "library-cache")
                                .string();
    }
    AgentOptions aopts;
    aopts.info.id = o.node_id;
    aopts.info.host = advertised;
    aopts.info.http_port = o.http_port;
    aopts.info.peer_port = peer ? peer->port : 0;
    aopts.info.resources = o.resources.to_string();
    aopts.info.pid = static_cast<int32_t>(::getpid());
    aopts.local_supervisor = supervisor;
    if (o.join)
      aopts.controller_endpoint = *o.join;
    aopts.heartbeat_interval_s = o.heartbeat_interval_s;
    aopts.library_cache = library_cache;
    aopts.loader = std::make_shared<PluginLoader>(o.plugin_path, library_cache);
    aopts.proxy = http_proxy->keeper();
    aopts.handles = replica::make_handle_transport(http_proxy->caller());
    aopts.identity = identity;
    aopts.processes = processes;
    aopts.replica_binary = replica_binary(o);
    aopts.gate_port = *gate_port;
    aopts.plugin_path = o.plugin_path;
    aopts.tls_dir = o.tls_dir;
    aopts.log_level = o.log_level;
    aopts.log_format = o.log_format;
    aopts.channels = channels;
    aopts.registry = registry;
    aopts.node_log_file = log_options.file;
    aopts.channel_lanes = http_proxy->io_threads();
    aopts.on_give_up = on_give_up;
    auto agent = spawn_node_agent(sys, aopts);
    {
      std::lock_guard<std::mutex> lock(keeper_ref->mutex);
      keeper_ref->keeper = agent;
    }
    log->info("node {} started ({}; http port {}; resources {})", o.node_id,
              o.head ? "head" : "worker joining " + o.join->to_string(), o.http_port,
              o.resources.to_string());

    int sig = 0;
    std::string failure;
    while (sig != SIGINT && sig != SIGTERM) {
      timespec wait{0, 200 * 1000 * 1000};
      sig = sigtimedwait(&signals, nullptr, &wait);
      failure = give_up_message();
      if (!failure.empty())
        break;
    }
    if (!failure.empty()) {
      log->critical("stopping the node: {}", failure);
      std::fprintf(stderr, "troupe-node: error: %s\n", failure.c_str());
      exit_code = 1;
    } else {
      log->info("received {}; stopping (drain delay {:.1f} s, then grace {:.1f} s)",
                sig == SIGINT ? "SIGINT" : "SIGTERM", o.drain_delay_s, o.shutdown_grace_s);
    }
    using steady = std::chrono::steady_clock;
    auto after = [](steady::time_point from, double s) {
      return from + std::chrono::duration_cast<steady::duration>(std::chrono::duration<double>(s));
    };
    auto left_until = [](steady::time_point t) {
      return std::max(0.0, std::chrono::duration<double>(t - steady::now()).count());
    };
    const auto stop_began = steady::now();
    const auto drain_ends = after(stop_began, failure.empty() ? o.drain_delay_s : 0.0);
    const auto grace_ends = after(drain_ends, o.shutdown_grace_s);
    // Not ready from now on (/-/readyz 503); the proxy keeps serving.
    http_proxy->shutting_down();
    // User code blocked in a handler would keep ~actor_system waiting for its
    // thread forever; past the grace period the process exits regardless.
    std::thread([limit = left_until(grace_ends) + 5, log, exit_code] {
      std::this_thread::sleep_for(std::chrono::duration<double>(limit));
      log->error("stopping did not complete in time; exiting now");
      log->flush();
      std::_Exit(exit_code);
    }).detach();
    // A second SIGINT or SIGTERM forces the stop: the replica processes die
    // with the node (PR_SET_PDEATHSIG).
    std::thread([signals, log] {
      int again = 0;
      while (again != SIGINT && again != SIGTERM)
        again = sigwaitinfo(&signals, nullptr);
      log->warn("received a second {}; stopping now", again == SIGINT ? "SIGINT" : "SIGTERM");
      log->flush();
      std::_Exit(1);
    }).detach();
    {
      caf::scoped_actor self{sys};
      if (failure.empty()) {
        // The controller replaces this node's replicas on other nodes first,
        // then stops them here, while the drain delay runs. At most until
        // half the grace: the rest is for the replicas left and the requests
        // in flight.
        double budget = left_until(after(drain_ends, o.shutdown_grace_s / 2));
        self->request(agent, seconds_as(budget + 1), leave_atom::value, budget)
            .receive([&](std::string& what) { log->info("moving the replicas: {}", what); },
                     [&](caf::error& err) {
                       log->warn("moving the replicas failed: {}", sys.render(err));
                     });
        if (steady::now() < drain_ends) {
          log->info("serving for {:.1f} s more (drain delay)", left_until(drain_ends));
          std::this_thread::sleep_until(drain_ends);
        }
      }
      // Nothing new from here: answers close their connections.
      http_proxy->stop_accepting();
      double grace = std::max(left_until(grace_ends), 0.1);
      self->request(agent, seconds_as(grace + 3), shutdown_atom::value, grace)
          .receive([](caf::ok_atom) {},
                   [&](caf::error& err) {
                     log->warn("graceful stop of the agent failed: {}", sys.render(err));
                   });
      self->send_exit(agent, caf::exit_reason::user_shutdown);
      if (supervisor) {
        self->request(supervisor, std::chrono::seconds(2), shutdown_atom::value)
            .receive([](caf::ok_atom) {}, [](caf::error&) {});
        self->send_exit(supervisor, caf::exit_reason::user_shutdown);
      }
    }
    // Requests the proxy still has in flight (on other nodes' replicas, or
    // retried there) finish within the grace before their connections close.
    if (auto left = http_proxy->in_flight(); left > 0) {
      log->info("waiting for {} requests in flight (at most until the grace ends)", left);
      while (http_proxy->in_flight() > 0 && std::chrono::steady_clock::now() < grace_ends)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (auto still = http_proxy->in_flight(); still > 0)
        log->warn("{} requests still in flight when the grace ended; closing them", still);
    }
    // Whatever replica process is left (it ignored its stop) dies now.
    processes->shutdown();
    caf::anon_send_exit(gate, caf::exit_reason::user_shutdown);
    if (peer)
      caf::anon_send_exit(peer->actor, caf::exit_reason::user_shutdown);
    {
      std::lock_guard<std::mutex> lock(keeper_ref->mutex);
      keeper_ref->keeper = nullptr;
    }
    http_proxy->stop();
    if (!security::tls_enabled(sys))
      sys.middleman().close(*gate_port);
    if (peer && !security::tls_enabled(sys))
      sys.middleman().close(peer->port);
    if (supervisor && !security::tls_enabled(sys))
      sys.middleman().close(o.port);
  }
  log->info("stopped");
  log::shutdown();
  return exit_code;
}
