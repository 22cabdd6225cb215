// The HTTP proxy of a troupe-node: an HTTP server (http_server.hpp) whose
// requests are routed (router.hpp) to replicas, and an actor that receives
// the controller's snapshots.
//
// Data path, per request: parsed on an io thread; route, replica choice and
// in-flight accounting without any actor hop (the router is shared under a
// mutex); then either
//   - a frame on the replica's data channel, for a replica process of this
//     node (runtime/data_channel.hpp): written by the io thread, answered on
//     that io thread's lane of the channel, read by its own event loop — no
//     other thread of the node touches the request; or
//   - one CAF request to the replica (other nodes' replicas, in-process
//     replicas, requests too large for a frame), sent and answered on the
//     same io thread through an actor_companion whose mailbox is the io
//     thread's event loop (so the reply costs no scheduler hop either).
//
// The proxy actor (give actor() to AgentOptions::proxy):
//   (snapshot, RoutingSnapshot)  from the controller: applied to the router;
//                                replicas in it are monitored, and a down
//                                replica is never chosen again and its
//                                in-flight requests are retried elsewhere
//   (health)              -> (ok)
//   (call, string app, string deployment, HttpRequest, double timeout_s)
//                         -> (HttpResponse)  a deployment handle's call from
//                                another process, as Proxy::caller() (the
//                                keeper() takes it too and delegates it here)
// If the proxy actor dies it is restarted; the new one subscribes to the last
// controller it heard from, presenting the last snapshot id it holds.
//
// Retries: a replica that refuses a request (at its limit, stopping) is not
// counted against it (see call.cpp: refused(), attempts.hpp). A replica that dies while
// it has the request in flight is a crash of the request (its handle went
// down - also with the connection to its node or process, which is what a
// crash of user code looks like when it takes its process down - or the
// request failed with request_receiver_down or an exit reason): the request
// may be what kills replicas (a "query of death"), so after one crash it is
// retried once on another replica, and after a second it is answered 502 and
// never sent again (a WARNING names its method, path and id;
// troupe_proxy_requests_crashed_total counts it). Losses that are not the
// request's fault (a bounce for lack of a route, the connection to the head
// lost, replicas on nodes the controller declared DEAD, a handle lost with
// the connection to the controller's node, a handle whose replica had
// exited before the request reached it) count against max_attempts only.
//
// Answers: 404 (no route, JSON body), 400/413/431 (see http_server.hpp), 503
// with Retry-After (queue full, no replica took the request after
// max_attempts, or the deployment is gone), 504 (request timeout), 502 (a
// request that crashed two replicas: JSON body naming its request id; or a
// transport failure other than the above). The ingress (options.server)
// answers the load balancer's probes /-/readyz (alias /-/healthz) and
// /-/livez, and 404 for every other /-/ path: /-/routes, /-/metrics and the
// dashboard are served on the admin listener (options.admin, admin.cpp), by
// default on loopback only, so the cluster's state is not shown to the
// service's clients.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "proxy/access_log.hpp"
#include "proxy/http_server.hpp"
#include "runtime/keeper.hpp"
#include "runtime/status.hpp"
#include "runtime/wire.hpp"

namespace troupe::metrics {
class Registry;
}

namespace troupe::channel {
class Registry;
}

namespace troupe::proxy {

class DataTls;

// The admin listener's defaults: loopback, a port the kernel picks, one io
// thread that blocks when idle.
ServerOptions admin_server_defaults();

struct ProxyOptions {
  std::string node_id;
  ServerOptions server;
  // The admin listener (admin.cpp): /-/metrics, /-/routes, the dashboard
  // and its state, and the probes. Port 0: any free port (admin_port()).
  ServerOptions admin = admin_server_defaults();
  // Used when the controller's snapshot carries none (request_timeout_s 0);
  // 0: no timeout.
  double request_timeout_s = 0;
  // Replicas that may be lost with one request before it is answered 503.
  // A request that crashes two replicas is answered 502 before that bound
  // (see "Retries" above). (Refusals by a replica at its limit are retried
  // with a backoff, see call.cpp: refused().)
  uint32_t max_attempts = 5;
  // Bound of a CAF request when no request timeout applies; answered with 504.
  double max_request_time_s = 3600;
  // The data channels of this node's replica processes (filled by the node
  // agent): a request to a local replica that has one goes over it, see
  // runtime/data_channel.hpp. Empty: every request goes over CAF.
  std::shared_ptr<channel::Registry> channels;
  // How the keeper restarts a proxy actor that died (runtime/keeper.hpp,
  // runtime/keeper_actor.hpp); when it gives up it logs why, calls
  // `on_give_up` with the message (from the keeper's thread; troupe-node then
  // stops and exits with an error) and quits, as every keeper does: the proxy
  // has no actor then, so no new route tables.
  RestartPolicy restart_policy;
  std::function<void(const std::string&)> on_give_up;
  // Serve the cluster's dashboard: /-/dashboard (the page) and
  // /-/dashboard/state (what it shows, asked of the controller). The head's
  // proxy does unless troupe-node --no-dashboard.
  bool dashboard = false;
  // Connect to the peer listeners the snapshots name (proxy/peers.cpp): a
  // worker's proxy does; the head's does not need to, every node being
  // connected to the head already.
  bool connect_peers = true;
  // Serve this worker's replicas to other workers' proxies on a data port
  // (proxy/peer_server.cpp): TCP on server.bind, a port the kernel picks,
  // frames of the data channel, a connection admitted only with the token
  // the node's peer actor hands out. troupe-node: a worker without TLS.
  bool data_port = false;
  // TLS on the data port and on the connections to other workers' data
  // ports (proxy/data_tls.hpp); null: plain TCP. troupe-node: a worker
  // with --tls-dir.
  std::shared_ptr<DataTls> data_tls;
  // The access log (proxy/access_log.hpp); null: none.
  std::shared_ptr<AccessLog> access_log;
  // The node's metrics (runtime/metrics.hpp), served at /-/metrics; empty:
  // the proxy's own only.
  std::shared_ptr<metrics::Registry> registry;
};

class Proxy {
 public:
  // Listens on options.server.bind:port and starts serving (503 on
  // /-/readyz until the first snapshot). The error names the address.
  static Result<std::unique_ptr<Proxy>> start(caf::actor_system& sys, ProxyOptions options);
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  // The proxy actor (the current one: it changes when it is restarted).
  ProxyActor actor() const;
  uint16_t port() const;
  // The HTTPS port (0: none; ServerOptions::tls).
  uint16_t https_port() const;
  // Reads the HTTPS port's files again now (the next connections use them);
  // the error says why the previous ones stay. OK without HTTPS.
  Status reload_tls();
  // Where the admin listener listens (see ProxyOptions::admin).
  uint16_t admin_port() const;
  size_t io_threads() const;
  // The data port (0: none) and the token a connection must present there.
  uint16_t data_port() const;
  std::string data_token() const;
  // Stops serving, drops open connections and stops the actors. Call before
  // the actor system ends. Idempotent.
  // Restarts the proxy actor when it dies; takes (subscribe, controller)
  // from the node agent and subscribes whichever proxy actor is current, and
  // (call, ...) requests (see above), delegated to the current proxy actor:
  // the stable handle to give a replica process.
  ProxyKeeperActor keeper() const;
  void stop();
  // The node is stopping (SIGTERM): /-/readyz answers 503 from now on while
  // the proxy keeps serving until stop().
  void shutting_down();
  // The last step before stop(): no new connection is accepted, and every
  // answer from now on says "Connection: close" (a keep-alive client opens
  // its next connection elsewhere); requests in flight go on.
  void stop_accepting();
  // Requests being served now (HTTP and handle calls).
  int64_t in_flight() const;

  // Deployment handles (include/troupe/deployment.hpp, "Deployment handles"):
  // routes `request` to a replica of (app, deployment) exactly like an HTTP
  // request of that application (placement, queue, retries, timeout, metrics),
  // without a route prefix. timeout_s > 0 replaces the request timeout for
  // this call. `done` runs exactly once, on an io thread (or on the calling
  // thread when the proxy is stopped or gone), with the replica's answer or
  // the proxy's error answer: 404 unknown deployment, 503 (queue full, no
  // replica after retries, no route table yet, shutting down), 504 timeout,
  // 502 (the call crashed two replicas: it is not retried again).
  // Never blocks; callable from any thread; the Caller holds the proxy
  // weakly, so it may outlive it.
  using CallDone = std::function<void(HttpResponse)>;
  using Caller = std::function<void(const std::string& app, const std::string& deployment,
                                    HttpRequest request, double timeout_s, CallDone done)>;
  Caller caller() const;

  struct Core;

 private:
  explicit Proxy(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  std::shared_ptr<Core> core_;
};

}  // namespace troupe::proxy
