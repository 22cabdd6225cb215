// What the proxy shares between its io threads and its actors (internal to
// proxy/): Proxy::Core, and per io thread an IoThread with its transports.
// Where each part is implemented (proxy/README.md has the table):
//   proxy.{hpp,cpp}       Proxy (start, stop) and Core::on_request
//   http_server.{hpp,cpp} the Beast server, one io_context per io thread;
//                         HTTP and HTTPS connections on the same threads
//   tls_context.{hpp,cpp} TLS contexts read again when their files change
//                         (the HTTPS port's; data_tls.{hpp,cpp} the data ports')
//   router.{hpp,cpp}      the routing decisions (plain C++)
//   call.{hpp,cpp}        the call state machine (dispatch, send, retries,
//                         timeouts, fail-over) and Core's fail-over entries
//   attempts.{hpp,cpp}    the retry decisions (plain C++)
//   transport.hpp         the transports' interface; answer_path.cpp the one
//                         path their answers take back into the call
//   paths.hpp             the transports of an io thread:
//   inline_path.cpp       non-blocking in-process replicas, on the io thread
//   channel_path.cpp      requests and answers over replica data channels
//   peer_client.cpp       requests to another worker's data port
//   caf_path.cpp          requests over CAF through the io thread's companion
//   peer_server.cpp       this worker's data port
//   frame_conn.hpp        the framed connection of both sides of a data port
//   peer_frames.hpp       what both sides share: the failure frame, the listener
//   streams.cpp           streamed answers (credits, chunks, ends)
//   shadow.cpp            shadow traffic
//   handle_calls.{hpp,cpp} deployment handle calls (Core::call, ReplyTo)
//   peers.cpp             the proxy actor's direct connections to workers
//   proxy_actor.cpp       the proxy actor and its keeper
//   admin.cpp             the admin listener: /-/routes, /-/metrics, the dashboard;
//                         the probes /-/readyz, /-/livez (also on the ingress)
//   metrics.{hpp,cpp}, access_log.{hpp,cpp}, http_fields.{hpp,cpp}
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <spdlog/spdlog.h>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/string.hpp>
#include <caf/actor_companion.hpp>
#include <caf/all.hpp>
#include <caf/scoped_execution_unit.hpp>

#include "proxy/call.hpp"
#include "proxy/http_fields.hpp"
#include "proxy/metrics.hpp"
#include "proxy/paths.hpp"
#include "proxy/proxy.hpp"
#include "proxy/router.hpp"
#include "runtime/data_channel.hpp"
#include "runtime/log.hpp"
#include "runtime/wire.hpp"

namespace troupe::proxy {

struct IoThread;
struct DataPort;

// Seconds to wait before connecting again to a peer's data port or peer
// listener after `failures` failures in a row: 2, 4, ... 30.
inline uint32_t reconnect_backoff_s(uint32_t failures) {
  return std::min<uint32_t>(30, 1u << std::min<uint32_t>(failures, 5));
}

// Everything the proxy shares between its io threads and its actor.
// The deployment of `route` a request goes to: its traffic split's pick, by
// the key header's value when the route names one and the request carries
// it, else at random (this io thread's own generator); `route` itself
// without a split. proxy.cpp.
const Route& split_target(const Route& route, const Request& req);

// Drops a client's own troupe-oip* headers from a request to a model's
// application: only the node marks a call as the Open Inference Protocol's
// (oip_path.cpp).
void drop_oip_marks(Request& req);

struct Proxy::Core : public Handler, public std::enable_shared_from_this<Proxy::Core> {
  caf::actor_system* sys = nullptr;
  ProxyOptions options;
  Router router;
  Metrics metrics;
  std::unique_ptr<HttpServer> server;
  // The admin listener (admin.cpp) and what answers its requests.
  std::unique_ptr<Handler> admin;
  std::unique_ptr<HttpServer> admin_server;
  std::vector<std::unique_ptr<IoThread>> workers;
  std::shared_ptr<spdlog::logger> log = troupe::log::get("proxy");
  std::atomic<double> snapshot_timeout_s{0};
  std::string id_prefix;

  // Every post to an io thread from another thread (the proxy actor, CAF's
  // threads answering, a slot freed elsewhere) holds this shared and checks
  // io_closed: stop() closes it (exclusively) before the io_contexts go, so
  // nothing is posted to a destroyed io_context. (A down message handled by
  // the proxy actor while stop() destroyed the server did exactly that: a
  // SIGSEGV at shutdown.)
  std::shared_mutex io_mutex;
  bool io_closed = false;
  template <class F>
  bool post(asio::io_context* io, F&& f) {
    std::shared_lock<std::shared_mutex> lock(io_mutex);
    if (io_closed)
      return false;
    asio::post(*io, std::forward<F>(f));
    return true;
  }

  mutable std::mutex actor_mutex;
  ProxyActor actor;           // the current proxy actor
  ProxyKeeperActor keeper;    // restarts it
  ControllerActor controller;  // last one that pushed a snapshot
  bool stopped = false;
  // Readiness (/-/readyz): this node is drained (from the snapshots), or it
  // is shutting down (Proxy::shutting_down()).
  std::atomic<bool> draining{false};
  std::atomic<bool> shutting_down{false};

  // Direct connections to other workers (peers.cpp), by their node id: the
  // peer listeners the snapshots name. Touched by the proxy actor only (it
  // outlives a restart of the actor: the connections do too).
  struct PeerLink {
    PeerEndpoint endpoint;
    caf::node_id node;      // the CAF node it answered from (kept after a loss)
    caf::actor_addr actor;  // its peer actor while connected, monitored
    bool connecting = false;
    uint32_t failures = 0;  // attempts failed since the last success
  };
  std::map<std::string, PeerLink> peers;
  // The data port (peer_server.cpp): this worker's listener for other workers'
  // requests (null: none) and the token they must present; and the data
  // ports of the peers, by node id, learned from their peer actors (set by
  // the proxy actor, read by the io threads when `data_ports_version`
  // changed).
  std::shared_ptr<DataPort> data_port;
  uint16_t data_port_number = 0;
  std::string data_token;
  using DataPortEndpoint = proxy::DataPortEndpoint;
  std::mutex data_ports_mutex;
  std::map<std::string, DataPortEndpoint> data_ports;
  std::atomic<uint64_t> data_ports_version{0};
  void set_data_port(const std::string& node_id, std::optional<DataPortEndpoint> ep);
  // A node this proxy has (or had) a direct connection to: a troupe-node
  // process, not a replica process. Proxy actor only.
  bool is_peer_node(const caf::node_id& node) const;
  // The nodes connected directly right now. Proxy actor only.
  std::set<caf::node_id> direct_nodes() const;

  explicit Core(ProxyOptions o);
  ~Core() override;

  static RouterOptions router_options(const ProxyOptions& o);

  void on_request(ExchangePtr exchange) override;  // proxy.cpp
  // A call on the gRPC port (Exchange::grpc()): routed by its application's
  // name instead of a path; proxy.cpp.
  void on_grpc_call(ExchangePtr exchange, IoThread* w, std::chrono::steady_clock::time_point start,
                    std::string id);
  // The Open Inference Protocol (oip_path.cpp, docs/inference.md): a REST
  // path under /v2 or a method of inference.GRPCInferenceService, answered
  // by the node (server health and metadata) or routed to the application
  // named as the model, when an application declares `open_inference`.
  // False, having done nothing, when none does: the request is routed as
  // any other.
  bool on_oip_rest(ExchangePtr& exchange, IoThread* w, std::chrono::steady_clock::time_point start,
                   std::string_view path, std::string_view query, std::string& id);
  bool on_oip_grpc(ExchangePtr& exchange, IoThread* w, std::chrono::steady_clock::time_point start,
                   std::string& id);
  // The deadline a request asks for (X-Request-Timeout-Seconds, or
  // grpc-timeout on the gRPC port), never past the application's
  // request_timeout_s; an error naming the header when it is malformed.
  Result<double> asked_deadline(const Request& req, bool grpc) const;
  // The request of `exchange`, routed to `to` (`route` itself or the target
  // its split picked), becomes a Call and starts; proxy.cpp.
  void launch(ExchangePtr exchange, IoThread* w, std::chrono::steady_clock::time_point start,
              const Route& route, const Route* to, std::shared_ptr<const RouteTable> table,
              std::string path, std::string query, double timeout_s, std::string id);
  // Sends `r`, an answer the proxy gives itself (no replica asked), with the
  // request's id, counted in the metrics (troupe_grpc_* too for a gRPC call)
  // and the access log; on the exchange's io thread `w`.
  void answer_local(Exchange& exchange, IoThread& w, std::chrono::steady_clock::time_point start,
                    std::string_view method, std::string_view path, const std::string& id,
                    Response&& r);
  // The troupe_http_* metrics and access log line of a request the proxy
  // answered itself, on io thread `w`.
  void log_local(IoThread& w, std::string_view method, std::string_view path,
                 std::string_view id, int status, double seconds);
  // /-/dashboard/state: asks the controller (admin.cpp); `done` answers on
  // the exchange's io thread.
  void dashboard_state(ExchangePtr exchange, const std::string& id,
                       std::function<void(Response&&)> done);
  void on_rejected(int status) override { metrics.observe("", status, 0); }
  void on_tls_refused(const char* reason) override { metrics.tls_refused(reason); }
  // A deployment handle's call (Proxy::caller()); handle_calls.cpp.
  void call(const std::string& app, const std::string& deployment, HttpRequest request,
            double timeout_s, CallDone done);
  // Both kinds of handle calls: `make` builds the call's exchange for the io
  // thread that takes it (null when the proxy is stopped).
  // The caller of the handle call `key` (its HttpRequest::call_key) gave
  // up: cancelled like an HTTP client that left (client_gone).
  void cancel_handle_call(uint64_t key);
  void start_handle_call(const std::string& app, const std::string& deployment,
                         HttpRequest request, double timeout_s,
                         const std::function<ExchangePtr(IoThread*)>& make);
  std::atomic<size_t> next_call_worker{0};

  void run(std::vector<std::function<void()>>& ready) {
    for (auto& f : ready)
      f();
  }
  // call.cpp: a replica's handle went down with `reason` (remote_link_unreachable:
  // with the connection to its node; user_shutdown: it was told to stop).
  void replica_down(const caf::actor_addr& addr, const caf::error& reason);
  // call.cpp: Router::Applied::lost: replicas on nodes declared DEAD.
  void replicas_lost(const std::vector<SlotPtr>& lost);
  // call.cpp: the connection to the controller's node dropped. This node
  // reaches the nodes it has no direct connection to (`direct`: see peers)
  // through the head: requests in flight on their replicas are lost with it
  // (neither answered nor bounced, and the handles of those nodes' replicas
  // do not go down). Those on directly connected nodes go on.
  void hub_lost(const std::set<caf::node_id>& direct);
  // call.cpp: the controller's handle died with the connection to its node
  // (true at once, while hub_lost() waits for its down message).
  bool hub_unreachable();
  // (metrics, reporter, deployments' queued + in flight) to the controller,
  // for autoscaling: every deployment in one message.
  void report_load(std::vector<DeploymentLoad> loads) {
    ControllerActor to;
    {
      std::lock_guard<std::mutex> lock(actor_mutex);
      to = controller;
    }
    if (to && !loads.empty())
      caf::anon_send(to, metrics_atom::value, reporter_id(), std::move(loads));
  }
  std::string reporter_id() const { return options.node_id + "/proxy"; }
  double request_timeout_s() const {
    double t = snapshot_timeout_s.load(std::memory_order_relaxed);
    return t > 0 ? t : options.request_timeout_s;
  }
};

// What a relayed handle call's exchange takes from its caller (handle_calls.cpp).
struct Relay {
  virtual ~Relay() = default;
  virtual void credit(uint64_t bytes) = 0;
  virtual void cancel() = 0;
};

// Per io thread: the companion actor that sends requests to replicas and
// receives their answers on this thread, the calls in flight here, and the
// transports that carry them (paths.hpp).
struct IoThread {
  Proxy::Core* core = nullptr;
  size_t index = 0;
  asio::io_context* io = nullptr;
  caf::actor companion_handle;
  caf::actor_companion* companion = nullptr;
  std::unique_ptr<caf::scoped_execution_unit> unit;
  std::vector<Call*> active;
  uint64_t next_id = 0;
  uint64_t next_call = 0;
  // The transports, in the order send() offers them an attempt, and the
  // serving side of the data port.
  InlinePath inline_path{*this};
  ChannelPath channels{*this};
  PeerClient peers{*this};
  CafPath caf{*this};
  PeerServer served{*this};
  // Streamed handle calls relayed to their callers (handle_calls.cpp), by
  // the key their pieces carry.
  std::unordered_map<uint64_t, std::weak_ptr<Relay>> relays;
  // Handle calls by their caller's key (Call::caller_key), so that the caller
  // can cancel them; the sweep forgets those that ended.
  std::unordered_map<uint64_t, std::weak_ptr<Call>> handle_calls;
  std::unique_ptr<asio::steady_timer> sweeper;
  // When this io thread last ran its sweep (steady clock, ns): the proxy's
  // health check tells a stalled io thread by it.
  std::atomic<int64_t> last_sweep_ns{0};
  // This thread's access log lines not yet written (AccessLog::add).
  AccessBatch access_batch;

  IoThread() = default;
  IoThread(const IoThread&) = delete;
  IoThread& operator=(const IoThread&) = delete;

  void track(Call* c) {
    c->active_index = active.size();
    active.push_back(c);
  }
  void untrack(Call* c) {
    if (c->active_index == SIZE_MAX)
      return;
    Call* last = active.back();
    active[c->active_index] = last;
    last->active_index = c->active_index;
    active.pop_back();
    c->active_index = SIZE_MAX;
  }
  // A request id for a request that brings none: the proxy's random prefix,
  // this io thread's index and a counter.
  std::string new_request_id();
  // A call key (HttpRequest::call_key): unique per proxy (this io thread's
  // index and a counter) and, with the proxy's random base, between proxies.
  uint64_t new_key() { return core_key_base + (uint64_t(index) << 48) + ++next_call; }
  uint64_t core_key_base = 0;
};

// peer_server.cpp: opens the data port (Core::data_port) when the options ask
// for it (it accepts once the io threads run); closes it and drops every
// connection of the data ports once the io threads have ended (stop()).
Status open_data_port(Proxy::Core& core);
void close_data_ports(Proxy::Core& core);

// admin.cpp: the answer to a request for /-/<endpoint> (404 for an unknown one).
Response admin_response(Proxy::Core& core, boost::beast::string_view path, const std::string& id);
// The probes a load balancer needs (/-/readyz, /-/healthz, /-/livez): the
// only /-/ paths the ingress answers.
bool is_probe(boost::beast::string_view path);
// The admin listener's handler: admin_response(), and /-/dashboard/state.
std::unique_ptr<Handler> make_admin_handler(Proxy::Core& core);
// The dashboard page (proxy/dashboard.html, compiled in).
const std::string& dashboard_page();

// proxy_actor.cpp: the proxy actor (applies snapshots, monitors replicas,
// answers health and handle calls) and the keeper that restarts it.
using core_ptr = std::shared_ptr<Proxy::Core>;
// Their own messages besides their interfaces: the proxy's once-a-second load
// report and its retry of a direct connection to a peer node (peers.cpp).
using ProxyImpl =
    ProxyActor::extend<caf::reacts_to<tick_atom>, caf::reacts_to<reconnect_atom, std::string>>;
ProxyImpl::behavior_type proxy_actor(ProxyImpl::pointer self, core_ptr core);
// peers.cpp, for the proxy actor: connect to the peer listeners a snapshot
// names and forget the nodes it lists DEAD; retry one (reconnect_atom); and a
// down message of a peer actor (true when `source` was one).
void peers_from_snapshot(ProxyImpl::pointer self, const core_ptr& core,
                         const RoutingSnapshot& snap);
void peer_retry(ProxyImpl::pointer self, const core_ptr& core, const std::string& node_id);
bool peer_down(ProxyImpl::pointer self, const core_ptr& core, const caf::actor_addr& source);
// Monitors the peer actors again (a restarted proxy actor).
void watch_peers(ProxyImpl::pointer self, const core_ptr& core);
ProxyKeeperActor spawn_proxy_keeper(caf::actor_system& sys, const core_ptr& core);

}  // namespace troupe::proxy
