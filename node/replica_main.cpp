// troupe-replica: one replica of a deployment in its own process, so that a
// crash, abort, exit or stack overflow in user code ends this process only.
// Started by a node agent (node/node_agent.cpp), never by hand:
//   1. it dies with its node (PR_SET_PDEATHSIG) and exits at once if the
//      node already died before that was set;
//   2. it reads its one-time secret from stdin — the node writes it after
//      the memory limit holds, so no user code runs unlimited;
//   3. it connects to the node's replica gate over the socket the node
//      passed through its doorbell (--gate-fd, runtime/gate_link.hpp: no
//      port), proves itself with the secret and gets its ReplicaSpec, the
//      node's metrics sink and proxy (for deployment handles);
//   4. it spawns the replica actor (replica/replica_actor.hpp) and attaches
//      its handle; from then on the controller and the proxies talk to it
//      through the agent's forwarding handle;
//   5. with --channel-lanes, requests come over its data channel
//      (runtime/data_channel.hpp), whose ends the node passed as fds 3
//      (requests), 4 (inject) and 5... (one answer lane per proxy io thread);
//   6. it exits 0 when the replica actor stops (a graceful stop), 1 when the
//      node goes away, kExitMemoryLimit when an allocation fails.
// stdout and stderr (its logs, and whatever user code prints) go to the
// node's <state-dir>/logs/replicas/<replica-id>.log.
#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "node/process_supervisor.hpp"
#include "node/replica_user.hpp"
#include "replica/handle_transport.hpp"
#include "replica/plugin/plugin_loader.hpp"
#include "replica/replica_actor.hpp"
#include "runtime/data_channel.hpp"
#include "runtime/forwarder.hpp"
#include "runtime/gate_link.hpp"
#include "runtime/log.hpp"
#include "runtime/metrics.hpp"
#include "runtime/system_setup.hpp"
#include "runtime/wire.hpp"

using namespace troupe;

namespace {

[[noreturn]] void out_of_memory() {
  static const char message[] = "troupe-replica: an allocation failed: out of memory\n";
  (void)!::write(2, message, sizeof(message) - 1);
  std::_Exit(node::kExitMemoryLimit);
}

// Waits until process `pid` has exited, at most `limit`.
void wait_for_exit(pid_t pid, std::chrono::milliseconds limit) {
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0)
    return;  // gone already
  pollfd p{fd, POLLIN, 0};
  (void)::poll(&p, 1, static_cast<int>(limit.count()));
  ::close(fd);
}

// How long a replica whose connection to its node was lost tries to attach
// again (AgentOptions::reattach_timeout_s, the node's side, is as long).
constexpr std::chrono::seconds kReattachFor{10};

// What the node answers a replica process that proves itself.
struct Welcome {
  ReplicaGateActor gate;
  ReplicaSpec spec;
  MetricsSinkActor sink;
  ProxyKeeperActor proxy;
};

// Rings the doorbell, takes the connection the node passes through it,
// reaches the node's replica gate over it and says hello with the secret;
// empty with `why` set when that fails.
std::optional<Welcome> meet_node(caf::actor_system& sys, caf::scoped_actor& self, int gate_fd,
                                 const std::string& replica_id, const std::string& secret,
                                 std::chrono::seconds timeout, std::string& why) {
  if (auto rung = gate_link::ring(gate_fd); !rung) {
    why = "cannot ask the node for a connection: " + rung.message();
    return std::nullopt;
  }
  auto fd = gate_link::take_fd(gate_fd, timeout);
  if (!fd) {
    why = "no connection to the node: " + fd.status().message();
    return std::nullopt;
  }
  auto gate = gate_link::connect(sys, self, std::move(fd.value()), timeout);
  if (!gate) {
    why = gate.status().message();
    return std::nullopt;
  }
  Welcome w;
  w.gate = caf::actor_cast<ReplicaGateActor>(std::move(gate.value()));
  bool welcomed = false;
  self->request(w.gate, timeout, replica_hello_atom::value, replica_id, secret)
      .receive(
          [&](ReplicaSpec& s, MetricsSinkActor& k, ProxyKeeperActor& p) {
            w.spec = std::move(s);
            w.sink = std::move(k);
            w.proxy = std::move(p);
            welcomed = true;
          },
          [&](caf::error& err) { why = "the node refused us: " + from_caf_error(err).message(); });
  if (!welcomed)
    return std::nullopt;
  return w;
}

// Hands the replica's handle to the node; false with `why` set when refused.
bool attach(caf::scoped_actor& self, const ReplicaGateActor& gate, const std::string& replica_id,
            const std::string& secret, const ReplicaActor& replica, std::chrono::seconds timeout,
            std::string& why) {
  bool attached = false;
  self->request(gate, timeout, replica_attach_atom::value, replica_id, secret, replica)
      .receive([&](caf::ok_atom) { attached = true; },
               [&](caf::error& err) {
                 why = "the node refused the replica: " + from_caf_error(err).message();
               });
  return attached;
}

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "troupe-replica: error: %s\n", message.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

// The command line troupe-node gives this process.
struct Args {
  int gate_fd = -1;
  int64_t run_as_uid = -1;
  int64_t run_as_gid = -1;
  std::string replica_id;
  std::string node_id;
  pid_t parent_pid = 0;
  std::vector<std::string> plugin_path;
  std::string library_cache;
  std::string log_level = "info";
  std::string log_format = "text";
  size_t channel_lanes = 0;
  size_t channel_max_frame = 0;
};

// The arguments, or the exit code of a bad command line.
std::optional<int> parse_args(int argc, char** argv, Args& a) {
  CLI::App app{"troupe-replica: one replica in its own process (started by troupe-node)"};
  app.add_option("--gate-fd", a.gate_fd,
                 "the doorbell through which the node passes connections to it")
      ->required();
  app.add_option("--run-as-uid", a.run_as_uid, "become this user before any user code runs");
  app.add_option("--run-as-gid", a.run_as_gid, "with this group");
  app.add_option("--replica-id", a.replica_id, "the replica this process runs")->required();
  app.add_option("--node-id", a.node_id, "the node that started it")->required();
  app.add_option("--parent-pid", a.parent_pid, "pid of that node's troupe-node")->required();
  app.add_option("--plugin-path", a.plugin_path, "directories of deployment libraries");
  app.add_option("--library-cache", a.library_cache,
                 "the node's cache of libraries pinned by their SHA-256");
  app.add_option("--log-level", a.log_level, "trace, debug, info, warn, error");
  app.add_option("--log-format", a.log_format, "text or json");
  app.add_option("--channel-lanes", a.channel_lanes,
                 "answer lanes of the data channel passed as fds 3, 4, 5...; 0: none");
  app.add_option("--channel-max-frame", a.channel_max_frame,
                 "the data channel's largest frame in bytes");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return std::nullopt;
}

// With --run-as-uid: becomes that user for good (node/replica_user.hpp),
// before it reads its secret or loads any user code; the uid change clears
// PR_SET_PDEATHSIG, so it is set again.
void become_replica_user(const Args& a) {
  if (a.run_as_uid < 0)
    return;
  if (a.run_as_gid < 0)
    fail("--run-as-uid needs --run-as-gid");
  if (auto st = node::drop_to(static_cast<uid_t>(a.run_as_uid), static_cast<gid_t>(a.run_as_gid));
      !st)
    fail("cannot become uid " + std::to_string(a.run_as_uid) + ": " + st.message());
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // Its working directory (the node's replica log directory) is the node's.
  if (::chdir("/") != 0)
    fail("chdir /: " + std::string(std::strerror(errno)));
}

// The data channel whose ends the node passed as fds 3, 4 and 5...; empty
// without --channel-lanes.
std::shared_ptr<channel::ReplicaEnd> open_data_channel(const Args& a) {
  if (a.channel_lanes == 0)
    return nullptr;
  constexpr int kFirst = 3;
  for (int fd = kFirst; fd < kFirst + 2 + static_cast<int>(a.channel_lanes); ++fd) {
    if (::fcntl(fd, F_GETFD) < 0)
      fail("--channel-lanes: fd " + std::to_string(fd) + " is not open");
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  if (a.channel_max_frame < sizeof(channel::FrameHeader))
    fail("--channel-max-frame is missing or too small");
  std::vector<int> lanes;
  for (size_t i = 0; i < a.channel_lanes; ++i)
    lanes.push_back(kFirst + 2 + static_cast<int>(i));
  return std::make_shared<channel::ReplicaEnd>(kFirst, kFirst + 1, std::move(lanes),
                                               a.channel_max_frame);
}

// The replica of this process, attached to its node; then the wait for its
// end, attaching again when the connection to the node is lost.
class ReplicaProcess {
 public:
  ReplicaProcess(caf::actor_system& sys, const Args& a, std::string secret,
                 std::shared_ptr<channel::ReplicaEnd> data_channel)
      : sys_(sys), a_(a), secret_(std::move(secret)), data_channel_(std::move(data_channel)),
        self_(sys) {}

  // Spawns the replica and attaches it; exits the process on failure.
  void start();
  // Until the replica stops (0 on a graceful stop) or the node is gone (1).
  int run();

 private:
  replica::ReplicaOptions replica_options(const Welcome& welcome);
  void watch_replica_actor();
  // The node dropped the connection: true once attached again.
  bool attach_again(const caf::error& reason);
  void replica_stopped(const caf::error& reason);

  caf::actor_system& sys_;
  const Args& a_;
  std::string secret_;
  std::shared_ptr<channel::ReplicaEnd> data_channel_;
  caf::scoped_actor self_;
  std::shared_ptr<spdlog::logger> log_ = log::get("replica");
  ReplicaGateActor gate_;
  // The node's actors, behind local forwarders: pointed at their new remote
  // handles when this process attaches again after a lost connection.
  std::shared_ptr<ForwardTarget> sink_target_;
  std::shared_ptr<ForwardTarget> proxy_target_;
  ReplicaActor replica_;
  caf::actor inner_;
  int exit_code_ = 0;
};

replica::ReplicaOptions ReplicaProcess::replica_options(const Welcome& welcome) {
  sink_target_ = std::make_shared<ForwardTarget>(caf::actor_cast<caf::actor>(welcome.sink));
  proxy_target_ = std::make_shared<ForwardTarget>(caf::actor_cast<caf::actor>(welcome.proxy));
  replica::ReplicaOptions options;
  options.spec = welcome.spec;
  options.node_id = a_.node_id;
  options.loader = std::make_shared<PluginLoader>(a_.plugin_path, a_.library_cache);
  options.metrics_sink = caf::actor_cast<MetricsSinkActor>(spawn_forwarder(sys_, sink_target_));
  options.channel = data_channel_;
  // The node serves this process's metrics: the replica sends them with
  // every metrics report.
  options.registry = std::make_shared<metrics::Registry>();
  options.report_registry = true;
  if (welcome.proxy) {
    auto proxy = caf::actor_cast<ProxyKeeperActor>(spawn_forwarder(sys_, proxy_target_));
    options.handles = replica::make_handle_transport(replica::make_remote_proxy_call(sys_, proxy),
                                                     replica::make_remote_proxy_stream(sys_, proxy),
                                                     replica::make_remote_proxy_cancel(proxy));
  }
  return options;
}

// The handle is an actor pool that ends with `out_of_workers` whatever ended
// its replica actor: watch the replica actor itself, whose exit reason tells
// a graceful stop (user_shutdown) from a fault.
void ReplicaProcess::watch_replica_actor() {
  self_->request(caf::actor_cast<caf::actor>(replica_), std::chrono::seconds(10),
                 caf::sys_atom::value, caf::get_atom::value)
      .receive(
          [&](std::vector<caf::actor>& workers) {
            if (!workers.empty())
              inner_ = workers.front();
          },
          [&](caf::error& err) { fail("cannot reach the replica actor: " + sys_.render(err)); });
  if (!inner_)
    fail("the replica actor is gone before it started");
  self_->monitor(inner_);
}

void ReplicaProcess::start() {
  std::string why;
  auto first =
      meet_node(sys_, self_, a_.gate_fd, a_.replica_id, secret_, std::chrono::seconds(10), why);
  if (!first)
    fail(why);
  gate_ = first->gate;
  self_->monitor(gate_);
  const ReplicaSpec spec = first->spec;
  replica_ = replica::spawn_replica(sys_, replica_options(*first));
  first.reset();
  watch_replica_actor();
  if (!attach(self_, gate_, a_.replica_id, secret_, replica_, std::chrono::seconds(10), why))
    fail(why);
  log_->info("replica {} of {}/{} runs in process {}", a_.replica_id, spec.app, spec.deployment,
             ::getpid());
}

void ReplicaProcess::replica_stopped(const caf::error& reason) {
  exit_code_ = reason == caf::exit_reason::user_shutdown ? 0 : 1;
  log_->info("replica {} stopped ({})", a_.replica_id, sys_.render(reason));
  if (exit_code_ == 0 && data_channel_) {
    // Told to stop: requests the proxy wrote after the replica's last read
    // are lost with the process, not crashed by it. (A full lane drops this,
    // and its requests count as a crash.)
    for (size_t i = 0; i < data_channel_->lanes(); ++i)
      channel::send_control(data_channel_->answer_fd(i), channel::Kind::closing, 0, 0);
  }
}

// Usually the node died: PR_SET_PDEATHSIG ends this process a moment after
// its sockets closed, and connecting again fails meanwhile. A node that still
// runs dropped the connection (it was frozen past its connection timeout,
// say): connect again and attach the same replica actor again, for as long as
// the node waits for it.
bool ReplicaProcess::attach_again(const caf::error& reason) {
  log_->warn("lost the connection to node {} ({}); connecting again", a_.node_id,
             sys_.render(reason));
  std::string why;
  auto until = std::chrono::steady_clock::now() + kReattachFor;
  while (std::chrono::steady_clock::now() < until && ::getppid() == a_.parent_pid) {
    auto back =
        meet_node(sys_, self_, a_.gate_fd, a_.replica_id, secret_, std::chrono::seconds(2), why);
    if (back) {
      sink_target_->set(caf::actor_cast<caf::actor>(back->sink));
      proxy_target_->set(caf::actor_cast<caf::actor>(back->proxy));
      if (attach(self_, back->gate, a_.replica_id, secret_, replica_, std::chrono::seconds(2),
                 why)) {
        gate_ = back->gate;
        self_->monitor(gate_);
        log_->info("attached again to node {}", a_.node_id);
        return true;
      }
    }
    log_->debug("not attached again yet: {}", why);
    wait_for_exit(a_.parent_pid, std::chrono::milliseconds(250));
  }
  log_->warn("could not attach again to node {} ({}); exiting", a_.node_id,
             ::getppid() == a_.parent_pid ? why : std::string("the node is gone"));
  return false;
}

int ReplicaProcess::run() {
  bool done = false;
  while (!done) {
    self_->receive([&](caf::down_msg& dm) {
      if (dm.source == inner_.address()) {
        replica_stopped(dm.reason);
        done = true;
      } else if (dm.source == gate_.address() && !attach_again(dm.reason)) {
        exit_code_ = 1;
        done = true;
      }
    });
  }
  return exit_code_;
}

}  // namespace

int main(int argc, char** argv) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // A write to a closed pipe or socket (its log, once the node is gone) is
  // an error to handle, not a reason to die.
  ::signal(SIGPIPE, SIG_IGN);
  Args a;
  if (auto code = parse_args(argc, argv, a))
    return *code;
  become_replica_user(a);
  // The node died between starting us and PR_SET_PDEATHSIG taking hold.
  if (::getppid() != a.parent_pid)
    return 1;
  auto data_channel = open_data_channel(a);
  if (a.gate_fd < 0 || ::fcntl(a.gate_fd, F_SETFD, FD_CLOEXEC) != 0)
    fail("--gate-fd: fd " + std::to_string(a.gate_fd) + " is not open");
  std::set_new_handler(out_of_memory);
  std::string secret;
  if (!std::getline(std::cin, secret) || secret.empty())
    fail("no secret on stdin: troupe-replica is started by troupe-node only");

  log::Options log_options;
  log_options.level = a.log_level;
  log_options.format = a.log_format;
  log_options.process = a.replica_id;
  if (auto st = log::init(log_options); !st)
    fail(st.message());

  caf::actor_system_config cfg;
  // Heartbeats, so that the node notices a frozen replica process; but no
  // connection timeout on this side: a node that is frozen (SIGSTOP, a
  // starved or migrated host) comes back to find its replicas serving, and a
  // node that dies takes this process with it (PR_SET_PDEATHSIG).
  TransportOptions transport;
  transport.connection_timeout_s = 0;
  configure_actor_system(cfg, transport);
  caf::actor_system sys{cfg};
  ReplicaProcess process(sys, a, std::move(secret), std::move(data_channel));
  process.start();
  int exit_code = process.run();
  // Threads still inside user code would keep ~actor_system waiting: the
  // process ends here.
  log::shutdown();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(exit_code);
}
