// The C++ API for writing a troupe deployment.
//
// A deployment is a class derived from troupe::Deployment, compiled into a
// shared library and registered with TROUPE_DEPLOYMENT(ClassName). A config
// names it by a path relative to the config file,
// `import_path: ./build/libmy_models.so:ClassName`: `troupectl deploy`
// uploads the library to the controller, which pins it by its SHA-256, and
// every node that runs a replica of it fetches that build. A bare file name,
// `import_path: libmy_models.so:ClassName`, names a library in the nodes'
// plugin directories (`--plugin-path`).
//
//   #include <troupe/deployment.hpp>
//
//   class Hello : public troupe::Deployment {
//    public:
//     Hello(const troupe::Json& /*args*/, const troupe::ReplicaContext& ctx) : ctx_(ctx) {}
//     void reconfigure(const troupe::Json& user_config) override {
//       std::lock_guard<std::mutex> lock(mutex_);
//       greeting_ = user_config.value("greeting", "hello");
//     }
//     troupe::Response handle(const troupe::Request& /*request*/) override {
//       std::lock_guard<std::mutex> lock(mutex_);
//       return troupe::Response::text(greeting_ + " from " + ctx_.replica_id + "\n");
//     }
//    private:
//     troupe::ReplicaContext ctx_;
//     std::mutex mutex_;
//     std::string greeting_ = "hello";
//   };
//   TROUPE_DEPLOYMENT(Hello)
//
// Construction: the class is built with `(const Json& init_args, const
// ReplicaContext& ctx)` when it has that constructor, else with `(const Json&
// init_args)`. init_args are the application's `args` from the config (an
// empty object when there are none).
//
// Threading: the constructor, reconfigure() and check_health() run on the
// replica's control thread, one at a time; handle() runs on the replica's
// request threads, up to max_ongoing_requests of them at once, possibly while
// reconfigure() or check_health() runs. Guard shared state accordingly (a
// mutex or atomics). User code never runs on the threads of the controller
// or the node agent. handle() may block: an `isolation: in_process`
// replica's handle() runs on the node proxy's io thread while its calls are
// short (a hand-off to a request thread would cost more than the call), and
// on its request threads for a while once they are not; an io thread that
// stays in a handle() for more than 2 ms has its other connections taken
// over by another thread, so a call that waits holds up nobody else. A
// deployment that declares its handler non-blocking (Deployment::
// nonblocking() below) is always called on the io thread, also for requests
// from other nodes' proxies, and a process-isolated one's runs on one
// request loop.
//
// Errors: an exception from the constructor, or from the reconfigure() that
// follows it, is a start failure whose message reaches the deployment's
// status; from a later reconfigure() it fails that update and the error is
// reported to the controller; from check_health() it marks the replica
// unhealthy; from handle() it becomes a 500 response carrying the message,
// and the replica lives on.
//
// Self-contained: everything here is inline, so a plugin needs no symbol from
// the host executable and can be linked with -Wl,--no-undefined. A plugin and
// the node must be built with the same compiler ABI and nlohmann_json, since
// Json and std::string objects cross the boundary.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe {

// Bumped whenever this header changes in a way that breaks binary
// compatibility; a library built against another version is refused.
// 2: ReplicaContext carries the handle transport (deployment handles).
// 3: ReplicaContext carries max_num_models_per_replica and the model
//    multiplexing listener (ModelCache).
// 4: streaming answers (Response::stream, StreamWriter) and cancellation
//    (Request::control, RequestControl).
// 5: Deployment::nonblocking() (a new virtual function: the vtable changed).
// 6: ReplicaContext carries the user metrics (MetricsSink) and the log
//    (LogSink) of the replica.
// 7: Deployment::handle_batch() (request batching) and
//    DeploymentFactory::batches.
constexpr uint32_t kDeploymentAbiVersion = 7;

// Model multiplexing (Ray Serve's): the request header that names the model a
// request is for, and troupe's own spelling of it. Header names compare
// case-insensitively; the first one present wins.
constexpr const char* kMultiplexedModelIdHeader = "serve_multiplexed_model_id";
constexpr const char* kModelIdHeader = "X-Troupe-Model-Id";

using Json = nlohmann::json;
using Headers = std::vector<std::pair<std::string, std::string>>;

namespace detail {

inline char ascii_lower(char c) {
  return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c;
}

inline bool ascii_iequals(const std::string& a, const std::string& b) {
  if (a.size() != b.size())
    return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (ascii_lower(a[i]) != ascii_lower(b[i]))
      return false;
  }
  return true;
}

inline int hex_value(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

// Form decoding: "%41" -> 'A', '+' -> ' '. A '%' not followed by two hex
// digits is kept as is rather than rejected: a query is user input.
inline std::string form_decode(const std::string& in, std::size_t begin, std::size_t end) {
  std::string out;
  out.reserve(end - begin);
  for (std::size_t i = begin; i < end; ++i) {
    char c = in[i];
    if (c == '+') {
      out.push_back(' ');
    } else if (c == '%' && i + 2 < end && hex_value(in[i + 1]) >= 0 && hex_value(in[i + 2]) >= 0) {
      out.push_back(char(hex_value(in[i + 1]) * 16 + hex_value(in[i + 2])));
      i += 2;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace detail

// --- Cancellation and deadlines ---------------------------------------------
//
// Every request a replica runs has a RequestControl (Request::control): it is
// cancelled when the client went away (closed its connection, or the caller
// of a deployment handle gave up), when the proxy answered 504 because the
// deadline passed, or by the deadline itself (the application's
// request_timeout_s, shortened by X-Request-Timeout-Seconds or inherited from
// the caller of a handle). A handler that works for long should look at it and
// stop early: what it would produce nobody reads any more, and its request
// slot is held until it returns.
//
//   for (int step = 0; step < steps; ++step) {
//     if (request.cancelled()) return troupe::Response::text("cancelled", 499);
//     work(step);
//   }
//   // or, instead of sleeping:
//   if (request.wait_cancelled(std::chrono::milliseconds(200))) ...
//
// A queued request whose client left is dropped by the proxy and never
// reaches a replica.
class RequestControl {
 public:
  using Clock = std::chrono::steady_clock;

  explicit RequestControl(Clock::time_point deadline = Clock::time_point::max())
      : deadline_(deadline) {}
  RequestControl(const RequestControl&) = delete;
  RequestControl& operator=(const RequestControl&) = delete;

  // The deadline of the request; time_point::max() when it has none.
  Clock::time_point deadline() const { return deadline_; }

  // True once the request was cancelled or its deadline passed.
  bool cancelled() const {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cancelled_)
        return true;
    }
    return deadline_ != Clock::time_point::max() && Clock::now() >= deadline_;
  }

  // Waits up to `timeout` (and never past the deadline) for the request to
  // be cancelled; true when it is. Use it instead of sleeping.
  template <class Rep, class Period>
  bool wait_cancelled(std::chrono::duration<Rep, Period> timeout) const {
    auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout);
    if (deadline_ < until)
      until = deadline_;
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_until(lock, until, [&] { return cancelled_; });
    lock.unlock();
    return cancelled();
  }

  // Calls `f` once when the request is cancelled (on a runtime thread: keep
  // it short and never block in it), or at once when it is already. The
  // deadline passing by itself does not call it until the proxy cancels the
  // request (at its 504, moments later).
  void on_cancel(std::function<void()> f) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cancelled_) {
      callbacks_.push_back(std::move(f));
      return;
    }
    lock.unlock();
    f();
  }

  // True when the request's deadline passed (whether or not the runtime
  // cancelled it yet); false for a request cancelled because its client
  // left.
  bool timed_out() const {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (timed_out_)
        return true;
    }
    return deadline_ != Clock::time_point::max() && Clock::now() >= deadline_;
  }

  // Cancels the request (the runtime does; also usable by tests): because its
  // deadline passed (`deadline_passed`), else because its client left.
  // Idempotent.
  void cancel(bool deadline_passed = false) {
    std::vector<std::function<void()>> callbacks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cancelled_)
        return;
      cancelled_ = true;
      timed_out_ = deadline_passed;
      callbacks.swap(callbacks_);
    }
    changed_.notify_all();
    for (auto& f : callbacks)
      f();
  }

 private:
  const Clock::time_point deadline_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  bool cancelled_ = false;
  bool timed_out_ = false;
  std::vector<std::function<void()>> callbacks_;
};

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string path;    // after the application's route prefix; starts with '/'
  std::string query;   // raw query string without '?', e.g. "ms=10&x=1"
  Headers headers;
  std::string body;

  // Value of the first header of that name, compared case-insensitively
  // (ASCII), or "" when there is none.
  std::string header(const std::string& name) const {
    for (const auto& [key, value] : headers) {
      if (detail::ascii_iequals(key, name))
        return value;
    }
    return "";
  }

  // Value of the first query parameter whose decoded name is `name`, decoded
  // ('%XX' escapes, '+' as space), or `fallback` when the parameter is absent.
  // A parameter without '=' ("?verbose") has the value "".
  std::string query_param(const std::string& name, const std::string& fallback = "") const {
    std::size_t pos = 0;
    while (pos <= query.size()) {
      std::size_t end = query.find('&', pos);
      if (end == std::string::npos)
        end = query.size();
      if (end > pos) {
        std::size_t eq = query.find('=', pos);
        if (eq == std::string::npos || eq > end)
          eq = end;
        if (detail::form_decode(query, pos, eq) == name) {
          return eq < end ? detail::form_decode(query, eq + 1, end) : std::string();
        }
      }
      pos = end + 1;
    }
    return fallback;
  }

  // The model this request is for (model multiplexing, see ModelCache): the
  // value of the `serve_multiplexed_model_id` header (Ray Serve's), else of
  // `X-Troupe-Model-Id`; "" when the request names none. The proxies route a
  // request that names a model to a replica that holds it.
  std::string multiplexed_model_id() const {
    std::string id = header(kMultiplexedModelIdHeader);
    return id.empty() ? header(kModelIdHeader) : id;
  }

  // Set by the runtime for every request it runs (see RequestControl); null
  // in a Request built by hand, which is never cancelled and has no deadline.
  std::shared_ptr<RequestControl> control;

  bool cancelled() const { return control && control->cancelled(); }
  // Waits up to `timeout` for cancellation (never past the deadline); true
  // when the request is cancelled. Without a control it just waits.
  template <class Rep, class Period>
  bool wait_cancelled(std::chrono::duration<Rep, Period> timeout) const {
    if (control)
      return control->wait_cancelled(timeout);
    std::mutex m;
    std::condition_variable never;
    std::unique_lock<std::mutex> lock(m);
    never.wait_for(lock, timeout, [] { return false; });
    return false;
  }
  // The request's deadline; time_point::max() when it has none.
  std::chrono::steady_clock::time_point deadline() const {
    return control ? control->deadline() : std::chrono::steady_clock::time_point::max();
  }
};

// --- Streaming answers ---------------------------------------------------------
//
// A handler that produces its answer over time (tokens of a generated text,
// server-sent events, a large export) returns Response::streaming() or
// Response::event_stream() with a producer. The runtime sends the status and
// headers first, then runs the producer on the same request thread; each
// write() goes to the client as it is written (chunked transfer encoding),
// through the proxy of any node and across nodes.
//
//   troupe::Response handle(const troupe::Request& request) override {
//     int n = std::stoi(request.query_param("n", "5"));
//     return troupe::Response::event_stream([n, &request](troupe::StreamWriter& out) {
//       for (int i = 0; i < n; ++i) {
//         if (!out.event(std::to_string(i)))
//           return;  // the client is gone: stop producing
//         if (request.wait_cancelled(std::chrono::milliseconds(200)))
//           return;
//       }
//     });
//   }
//
// Flow control: write() blocks while the client is a bounded window behind
// (a slow client slows the producer; memory stays bounded on every hop).
// write() returns false when the stream cannot go on — the client went away,
// the request was cancelled or its deadline passed — and the producer should
// return then. A producer that throws ends the stream early: the client sees
// an incomplete body (no final chunk), never a clean end. The request (and
// everything handle() captured by reference from it) stays valid while the
// producer runs. A streamed answer is never retried on another replica: its
// first bytes may have reached the client. Through a deployment handle,
// call() gets a streamed answer whole, as one Response; stream() reads it
// piece by piece (ResponseStream).
class StreamWriter {
 public:
  virtual ~StreamWriter() = default;

  // Sends `chunk` as it is (an empty chunk sends nothing). Blocks while the
  // window is full; false when the stream cannot go on.
  virtual bool write(std::string_view chunk) = 0;

  // True once the request was cancelled (see RequestControl).
  virtual bool cancelled() const = 0;

  // One server-sent event (text/event-stream): an optional `event:` name and
  // `id:`, then every line of `data` as a `data:` line, then a blank line.
  bool event(std::string_view data, std::string_view event_name = {}, std::string_view id = {}) {
    std::string text;
    text.reserve(data.size() + event_name.size() + id.size() + 24);
    if (!event_name.empty())
      text.append("event: ").append(event_name).append("\n");
    if (!id.empty())
      text.append("id: ").append(id).append("\n");
    std::size_t pos = 0;
    for (;;) {
      std::size_t end = data.find('\n', pos);
      std::string_view line =
          data.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos);
      if (!line.empty() && line.back() == '\r')
        line.remove_suffix(1);
      text.append("data: ").append(line).append("\n");
      if (end == std::string_view::npos)
        break;
      pos = end + 1;
    }
    text.append("\n");
    return write(text);
  }
};

struct Response {
  int status = 200;
  Headers headers;
  std::string body;
  // Set by streaming()/event_stream(): the answer is streamed (see
  // StreamWriter) and `body` is not sent.
  std::function<void(StreamWriter&)> stream;

  // A streamed answer of `content_type`, whose body is what `produce` writes.
  static Response streaming(std::function<void(StreamWriter&)> produce,
                            std::string content_type = "application/octet-stream",
                            int status = 200) {
    Response response;
    response.status = status;
    response.headers.emplace_back("Content-Type", std::move(content_type));
    response.stream = std::move(produce);
    return response;
  }

  // Server-sent events: a streamed "text/event-stream" answer that caches
  // nowhere (write events with StreamWriter::event()).
  static Response event_stream(std::function<void(StreamWriter&)> produce) {
    Response response = streaming(std::move(produce), "text/event-stream");
    response.headers.emplace_back("Cache-Control", "no-cache");
    return response;
  }

  // `body` as "text/plain; charset=utf-8".
  static Response text(std::string body, int status = 200) {
    Response response;
    response.status = status;
    response.headers.emplace_back("Content-Type", "text/plain; charset=utf-8");
    response.body = std::move(body);
    return response;
  }

  // `value` serialized compactly as "application/json". Invalid UTF-8 in
  // strings is replaced by U+FFFD instead of throwing.
  static Response json(const Json& value, int status = 200) {
    Response response;
    response.status = status;
    response.headers.emplace_back("Content-Type", "application/json");
    response.body = value.dump(-1, ' ', false, Json::error_handler_t::replace);
    return response;
  }
};

// --- Deployment handles (composition) ---------------------------------------
//
// A handle calls another deployment of the same application. The call goes to
// the HTTP proxy of the replica's own node and is routed exactly like an HTTP
// request of that application, only to the named deployment instead of the
// ingress: power of two choices over the replicas of every node (local ones
// preferred when equally loaded), max_ongoing_requests per replica, the
// deployment's bounded queue, retries on another replica when one dies or
// refuses, the application's request_timeout_s, and the proxy's metrics.
//
//   auto upper = ctx.handle("Upper");                  // keep it, it is cheap to copy
//   troupe::Request r;
//   r.body = "hi";
//   troupe::Response a = upper.call(r);                // blocks this request thread
//   std::future<troupe::Response> f = upper.call_async(r);  // or in parallel
//
// Errors are responses, never exceptions, with the proxy's status codes and a
// JSON body {"error": ..., "request_id": ...}: 404 when the application has no
// deployment of that name, 503 (with Retry-After) when its queue is full or no
// replica took the call after the retries, or when the node has no route table
// yet or is shutting down, 504 when the timeout passed. A response the called
// deployment gives (any status) is returned as it is.
//
// The request's path is what the called deployment sees as Request::path (""
// means "/"); an empty method is sent as "GET". X-Request-Id: a call made on
// a request thread of handle() carries the id of the request being handled,
// so one client request keeps one id through every deployment it reaches
// (unless the request given to the handle has an X-Request-Id header of its
// own); elsewhere (the constructor, a thread of your own) the proxy makes one.
// Deadlines: a call made on a request thread of handle() inherits what is
// left of that request's deadline and never gets more (a handle's own
// timeout can only shorten it); a call made after the deadline passed
// answers 504 at once, without reaching the proxy. Cancellation: in a
// replica process (isolation: process, the default), a call made on a
// request thread of handle() is cancelled when that request's client leaves
// (the callee sees Request::cancelled(); the call answers 499).
//
// A blocking call holds the calling request thread: a deployment that calls
// itself, or two that call each other, can run out of request threads and
// wait for their timeout. Handles work only in a replica run by troupe-node;
// with a ReplicaContext built by hand (tests) every call answers 503 unless
// `handles` is set.

// The answer of a streaming handle call as it arrives (DeploymentHandle::
// stream(), ResponseStream). Implemented by the runtime (and by tests).
class StreamSource {
 public:
  virtual ~StreamSource() = default;
  // Block until the answer's head is there.
  virtual int status() = 0;
  virtual const Headers& headers() = 0;
  // The next piece of the body (blocks until it is there); false at the end.
  virtual bool next(std::string& chunk) = 0;
  // After next() returned false: true when the answer ended whole.
  virtual bool complete() = 0;
  // The caller stops reading: the callee is cancelled; next() returns false.
  virtual void cancel() = 0;
};

namespace detail {

// A whole answer (or an error answer) read as a stream of one piece.
class WholeAnswer : public StreamSource {
 public:
  explicit WholeAnswer(std::future<Response> answer) : answer_(std::move(answer)) {}
  int status() override { return get().status; }
  const Headers& headers() override { return get().headers; }
  bool next(std::string& chunk) override {
    Response& r = get();
    if (taken_ || r.body.empty()) {
      taken_ = true;
      return false;
    }
    taken_ = true;
    chunk = std::move(r.body);
    return true;
  }
  bool complete() override { return true; }
  void cancel() override { taken_ = true; }

 private:
  Response& get() {
    if (!ready_) {
      response_ = answer_.get();
      ready_ = true;
    }
    return response_;
  }
  std::future<Response> answer_;
  Response response_;
  bool ready_ = false;
  bool taken_ = false;
};

}  // namespace detail

// The transport of handles. Implemented by the runtime (and by tests); user
// code only calls it through DeploymentHandle.
class HandleTransport {
 public:
  virtual ~HandleTransport() = default;
  // Routes `request` to a replica of (app, deployment); timeout_s > 0
  // replaces the application's request timeout for this call. The future
  // always gets a Response, never an exception.
  virtual std::future<Response> call(const std::string& app, const std::string& deployment,
                                     Request request, double timeout_s) const = 0;
  // The same call, its answer read as it arrives. This default reads the
  // whole answer (a transport that cannot stream).
  virtual std::shared_ptr<StreamSource> stream(const std::string& app,
                                               const std::string& deployment, Request request,
                                               double timeout_s) const {
    return std::make_shared<detail::WholeAnswer>(
        call(app, deployment, std::move(request), timeout_s));
  }
};

// The answer of DeploymentHandle::stream(), read piece by piece as the called
// deployment streams it (a whole answer, or an error answer of the proxy,
// reads as one piece). Flow control reaches the producer: it waits while the
// reader is a window behind. Dropping a stream before its end cancels the
// called request.
//
//   troupe::ResponseStream in = ctx.handle("Ticker").stream(r);
//   std::string piece;
//   while (in.next(piece))
//     if (!out.write(piece)) break;   // relays it to this request's client
//   bool whole = in.complete();
class ResponseStream {
 public:
  explicit ResponseStream(std::shared_ptr<StreamSource> source) : source_(std::move(source)) {}
  ResponseStream(ResponseStream&&) = default;
  ResponseStream& operator=(ResponseStream&&) = default;
  ResponseStream(const ResponseStream&) = delete;
  ResponseStream& operator=(const ResponseStream&) = delete;
  ~ResponseStream() {
    if (source_ && !ended_)
      source_->cancel();
  }

  // The answer's status and headers (block until the head arrived).
  int status() { return source_->status(); }
  const Headers& headers() { return source_->headers(); }
  // The next piece; false at the end of the answer.
  bool next(std::string& chunk) {
    if (ended_)
      return false;
    if (source_->next(chunk))
      return true;
    ended_ = true;
    return false;
  }
  // After next() returned false: whether the answer ended whole (false when
  // the callee failed mid-stream, its replica was lost, the deadline passed
  // or the stream was cancelled).
  bool complete() { return ended_ && source_->complete(); }
  void cancel() {
    if (!ended_)
      source_->cancel();
    ended_ = true;
  }

 private:
  std::shared_ptr<StreamSource> source_;
  bool ended_ = false;
};

class DeploymentHandle {
 public:
  DeploymentHandle() = default;
  DeploymentHandle(std::shared_ptr<const HandleTransport> transport, std::string app,
                   std::string deployment, double timeout_s = 0)
      : transport_(std::move(transport)),
        app_(std::move(app)),
        deployment_(std::move(deployment)),
        timeout_s_(timeout_s) {}

  const std::string& app() const { return app_; }
  const std::string& deployment() const { return deployment_; }
  double timeout_s() const { return timeout_s_; }

  const std::string& multiplexed_model_id() const { return model_id_; }

  // The same handle with its own timeout for every call (seconds; 0: the
  // application's request_timeout_s).
  DeploymentHandle with_timeout(double seconds) const {
    DeploymentHandle h(transport_, app_, deployment_, seconds > 0 ? seconds : 0);
    h.model_id_ = model_id_;
    return h;
  }

  // The same handle, every call of which is for model `model_id` (Ray
  // Serve's handle.options(multiplexed_model_id=...)): the request gets the
  // serve_multiplexed_model_id header (replacing one it has), and is routed
  // to a replica that holds the model when one has room. "": none.
  DeploymentHandle with_multiplexed_model_id(std::string model_id) const {
    DeploymentHandle h = *this;
    h.model_id_ = std::move(model_id);
    return h;
  }

  // Starts the call and returns at once; the future always gets a Response.
  std::future<Response> call_async(Request request) const {
    if (!transport_)
      return unavailable();
    return transport_->call(app_, deployment_, prepared(std::move(request)), timeout_s_);
  }

  // Blocks until the answer (or the error response) is there.
  Response call(Request request) const { return call_async(std::move(request)).get(); }

  // Starts the call and returns at once; its answer is read as the called
  // deployment streams it (see ResponseStream). Errors read as their error
  // answer, like call().
  ResponseStream stream(Request request) const {
    if (!transport_)
      return ResponseStream(std::make_shared<detail::WholeAnswer>(unavailable()));
    return ResponseStream(
        transport_->stream(app_, deployment_, prepared(std::move(request)), timeout_s_));
  }

 private:
  static std::future<Response> unavailable() {
    std::promise<Response> unavailable;
    unavailable.set_value(Response::json(
        Json{{"error",
              "no handle transport: deployment handles work only in a replica run by "
              "troupe-node"}},
        503));
    return unavailable.get_future();
  }

  // The request with the handle's model id header.
  Request prepared(Request request) const {
    if (!model_id_.empty()) {
      Headers kept;
      for (auto& h : request.headers) {
        if (!detail::ascii_iequals(h.first, kMultiplexedModelIdHeader) &&
            !detail::ascii_iequals(h.first, kModelIdHeader))
          kept.push_back(std::move(h));
      }
      kept.emplace_back(kMultiplexedModelIdHeader, model_id_);
      request.headers = std::move(kept);
    }
    return request;
  }

  std::shared_ptr<const HandleTransport> transport_;
  std::string app_;
  std::string deployment_;
  double timeout_s_ = 0;
  std::string model_id_;
};


// --- Metrics and logs of user code ---------------------------------------------
//
// A deployment exports counters, gauges and histograms of its own through its
// ReplicaContext. The runtime adds the labels application, deployment and
// replica, and each node serves them at its proxy's /-/metrics with troupe's
// own metrics:
//
//   Model(const troupe::Json&, const troupe::ReplicaContext& ctx)
//       : hits_(ctx.counter("model_cache_hits_total", "Lookups served from the cache.")),
//         size_(ctx.histogram("model_batch_size", "Requests per batch.", {1, 2, 4, 8, 16})) {}
//   ... hits_->inc(); size_->observe(batch.size());
//
// Names follow Prometheus (letters, digits, '_' and ':', not starting with a
// digit); a bad name, a label named application, deployment or replica, or a
// name already used with another type throws std::invalid_argument from the
// call. Asking again for the same name and labels returns the same metric.
// The metrics are thread-safe; make them once (in the constructor), not per
// request. Without a runtime (a unit test building the class by hand) the
// calls return working metrics that nobody exports.
//
// ctx.log(level, message) writes a line to the replica's log (what
// `troupectl logs REPLICA_ID` shows), with the id of the request the calling
// thread handles, if any.

using Labels = std::map<std::string, std::string>;

class Counter {
 public:
  virtual ~Counter() = default;
  // `by` >= 0; a negative increment is ignored.
  virtual void inc(double by) = 0;
  void inc() { inc(1.0); }
  virtual double value() const = 0;
};

class Gauge {
 public:
  virtual ~Gauge() = default;
  virtual void set(double value) = 0;
  virtual void add(double by) = 0;  // negative to decrease
  void inc() { add(1.0); }
  void dec() { add(-1.0); }
  virtual double value() const = 0;
};

class Histogram {
 public:
  virtual ~Histogram() = default;
  virtual void observe(double value) = 0;
};

// Implemented by the runtime (and by detail::LocalMetrics below).
class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  virtual std::shared_ptr<Counter> counter(const std::string& name, const std::string& help,
                                           const Labels& labels) = 0;
  virtual std::shared_ptr<Gauge> gauge(const std::string& name, const std::string& help,
                                       const Labels& labels) = 0;
  // `buckets`: upper bounds, ascending (+Inf is implicit).
  virtual std::shared_ptr<Histogram> histogram(const std::string& name, const std::string& help,
                                               const std::vector<double>& buckets,
                                               const Labels& labels) = 0;
};

enum class LogLevel { debug, info, warn, error };

// Implemented by the runtime.
class LogSink {
 public:
  virtual ~LogSink() = default;
  virtual void write(LogLevel level, const std::string& message) = 0;
};

namespace detail {

// Metrics kept in the object only: what a ReplicaContext without a runtime
// gives (unit tests). Checks names like the runtime does.
class LocalMetrics : public MetricsSink {
 public:
  std::shared_ptr<Counter> counter(const std::string& name, const std::string&,
                                   const Labels& labels) override {
    return find<LocalCounter>(name, 'c', labels);
  }
  std::shared_ptr<Gauge> gauge(const std::string& name, const std::string&,
                               const Labels& labels) override {
    return find<LocalGauge>(name, 'g', labels);
  }
  std::shared_ptr<Histogram> histogram(const std::string& name, const std::string&,
                                       const std::vector<double>&, const Labels& labels) override {
    return find<LocalHistogram>(name, 'h', labels);
  }

  static void check_name(const std::string& name, bool label) {
    bool ok = !name.empty() && !(name[0] >= '0' && name[0] <= '9');
    for (char c : name) {
      bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || (!label && c == ':');
      ok = ok && letter;
    }
    if (!ok)
      throw std::invalid_argument("'" + name + "' is not a valid Prometheus " +
                                  (label ? "label" : "metric") + " name");
    if (label && (name == "application" || name == "deployment" || name == "replica"))
      throw std::invalid_argument("the label '" + name +
                                  "' is set by troupe: a user metric cannot set it");
  }

 private:
  struct LocalCounter : Counter {
    std::atomic<double> v{0};
    void inc(double by) override {
      if (by < 0)
        return;
      double old = v.load();
      while (!v.compare_exchange_weak(old, old + by)) {
      }
    }
    double value() const override { return v.load(); }
  };
  struct LocalGauge : Gauge {
    std::atomic<double> v{0};
    void set(double value) override { v.store(value); }
    void add(double by) override {
      double old = v.load();
      while (!v.compare_exchange_weak(old, old + by)) {
      }
    }
    double value() const override { return v.load(); }
  };
  struct LocalHistogram : Histogram {
    void observe(double) override {}
  };

  template <class T>
  std::shared_ptr<T> find(const std::string& name, char type, const Labels& labels) {
    check_name(name, false);
    for (const auto& kv : labels)
      check_name(kv.first, true);
    std::lock_guard<std::mutex> lock(mutex_);
    auto t = types_.emplace(name, type).first;
    if (t->second != type)
      throw std::invalid_argument("the metric '" + name + "' exists with another type");
    auto& slot = metrics_[{name, labels}];
    if (!slot)
      slot = std::make_shared<T>();
    return std::static_pointer_cast<T>(slot);
  }

  std::mutex mutex_;
  std::map<std::string, char> types_;
  std::map<std::pair<std::string, Labels>, std::shared_ptr<void>> metrics_;
};

}  // namespace detail

// --- Model multiplexing -------------------------------------------------------
//
// One deployment serves many models (Ray Serve's serve.multiplexed): a request
// names its model in the `serve_multiplexed_model_id` header (or
// `X-Troupe-Model-Id`; Request::multiplexed_model_id()), each replica keeps at
// most max_num_models_per_replica models loaded in a ModelCache, and the
// proxies send a request to a replica that already holds its model (when one
// has room under max_ongoing_requests; else to the less loaded of two, as
// usual, which then loads it).
//
//   class ModelHost : public troupe::Deployment {
//    public:
//     ModelHost(const troupe::Json&, const troupe::ReplicaContext& ctx)
//         : models_(ctx, [](const std::string& id) { return load_model(id); }) {}
//     troupe::Response handle(const troupe::Request& request) override {
//       std::shared_ptr<Model> m = models_.get(request.multiplexed_model_id());
//       ...
//     }
//    private:
//     troupe::ModelCache<Model> models_;
//   };
//
// A cache built from the ReplicaContext reports the ids it holds to the
// runtime by itself (whenever they change), which tells the controller and
// the proxies: user code cannot forget it. Use one such cache per replica.

struct ReplicaContext;

// Told the ids of the models a replica holds whenever they change.
// Implemented by the runtime (ReplicaContext::models) and by tests.
class ModelIdsListener {
 public:
  virtual ~ModelIdsListener() = default;
  // `model_ids`: every model held now, most recently used first; called when
  // a model was loaded or evicted (not when only the order changed). Called
  // with the cache's lock held, so calls come in the order of the changes:
  // keep it short and never call back into the cache.
  virtual void models_changed(const std::vector<std::string>& model_ids) = 0;
};

// A thread-safe LRU cache of loaded models. get(id) returns the model, and
// on a miss calls the loader (outside the cache's lock, so other models are
// served meanwhile); concurrent misses for the same id wait for one load.
// Before a load, and again when it ends, the least recently used loaded
// models are evicted so that at most `capacity` models are held (loads in
// progress are not evicted; a model in use by a request stays alive until the
// request drops its shared_ptr). A loader that throws fails every get()
// waiting for that load with its exception (a 500 for those requests), and
// the next get() tries again.
template <class T>
class ModelCache {
 public:
  using Loader = std::function<std::shared_ptr<T>(const std::string& model_id)>;
  using OnChange = std::function<void(const std::vector<std::string>& model_ids)>;

  // The usual form: capacity from ctx.max_num_models_per_replica (the
  // deployment's option; -1: unlimited) and changes reported to ctx.models.
  ModelCache(const ReplicaContext& ctx, Loader loader);

  // Without a ReplicaContext (tests, or a cache of your own): `capacity` 0
  // means unlimited; `on_change` is called like ModelIdsListener.
  ModelCache(std::size_t capacity, Loader loader, OnChange on_change = nullptr)
      : capacity_(capacity), loader_(std::move(loader)), on_change_(std::move(on_change)) {}

  ModelCache(const ModelCache&) = delete;
  ModelCache& operator=(const ModelCache&) = delete;

  struct Lookup {
    std::shared_ptr<T> model;
    // True when the model was loaded already when get() was called; false
    // when this call loaded it or waited for a load in progress.
    bool hit = false;
  };

  // The model `model_id`, loaded if needed; rethrows the loader's exception.
  // An empty id is refused (std::invalid_argument): a request that names no
  // model has nothing to look up.
  Lookup lookup(const std::string& model_id) {
    if (model_id.empty())
      throw std::invalid_argument("no multiplexed model id: the request has no " +
                                  std::string(kMultiplexedModelIdHeader) + " header");
    std::unique_lock<std::mutex> lock(mutex_);
    auto it = entries_.find(model_id);
    if (it != entries_.end()) {
      Entry& e = it->second;
      if (e.loaded) {
        touch(it);
        return {e.model, true};
      }
      std::shared_future<std::shared_ptr<T>> pending = e.pending;
      lock.unlock();
      return {pending.get(), false};  // the loader's exception, if it threw
    }
    // A miss: make room first (a model is big; the new one needs the memory).
    evict_beyond(capacity_ == 0 ? 0 : capacity_ - 1);
    std::promise<std::shared_ptr<T>> promise;
    Entry& e = entries_[model_id];
    e.pending = promise.get_future().share();
    lock.unlock();
    std::shared_ptr<T> model;
    try {
      model = loader_(model_id);
    } catch (...) {
      lock.lock();
      entries_.erase(model_id);
      lock.unlock();
      promise.set_exception(std::current_exception());
      throw;
    }
    lock.lock();
    auto done = entries_.find(model_id);
    done->second.loaded = true;
    done->second.model = model;
    lru_.push_front(model_id);
    done->second.position = lru_.begin();
    evict_beyond(capacity_);  // loads that ran at once may have overfilled it
    notify();
    lock.unlock();
    promise.set_value(model);
    return {std::move(model), false};
  }

  std::shared_ptr<T> get(const std::string& model_id) { return lookup(model_id).model; }

  // The ids of the loaded models, most recently used first.
  std::vector<std::string> model_ids() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return {lru_.begin(), lru_.end()};
  }

  std::size_t capacity() const { return capacity_; }

 private:
  struct Entry {
    bool loaded = false;
    std::shared_ptr<T> model;
    std::shared_future<std::shared_ptr<T>> pending;
    typename std::list<std::string>::iterator position;
  };
  using Iterator = typename std::map<std::string, Entry>::iterator;

  void touch(Iterator it) {
    // Only the order changes: not worth a report (routing needs the set).
    if (it->second.position != lru_.begin())
      lru_.splice(lru_.begin(), lru_, it->second.position);
  }

  // Evicts least recently used loaded models until at most `keep` are
  // loaded; 0 with an unlimited cache keeps everything.
  void evict_beyond(std::size_t keep) {
    if (capacity_ == 0)
      return;
    bool changed = false;
    while (lru_.size() > keep) {
      entries_.erase(lru_.back());
      lru_.pop_back();
      changed = true;
    }
    if (changed)
      notify();
  }

  void notify() {
    if (on_change_)
      on_change_(std::vector<std::string>(lru_.begin(), lru_.end()));
  }

  const std::size_t capacity_;
  const Loader loader_;
  const OnChange on_change_;
  mutable std::mutex mutex_;
  std::map<std::string, Entry> entries_;
  std::list<std::string> lru_;  // loaded ids, most recently used first
};

// Where a replica runs, passed to constructors that take it. Values are
// fixed for the replica's lifetime; a new version means a new replica.
struct ReplicaContext {
  std::string app;         // application name, e.g. "greeter"
  std::string deployment;  // deployment name, e.g. "Hello"
  std::string replica_id;  // unique within the cluster, e.g. "greeter#Hello#a1b2c3"
  std::string node_id;     // the node the replica runs on
  std::string version;     // the deployment's code version
  // Set by the runtime; see "Deployment handles" above.
  std::shared_ptr<const HandleTransport> handles;
  // The deployment's max_num_models_per_replica (-1: unlimited), for a
  // ModelCache built from this context.
  int32_t max_num_models_per_replica = -1;
  // Set by the runtime: where a ModelCache built from this context reports
  // the models it holds. May be empty (nothing is reported).
  std::shared_ptr<ModelIdsListener> models = nullptr;
  // Set by the runtime: where this replica's own metrics and log lines go.
  // Without a runtime, metrics nobody exports (kept in this context and its
  // copies), and log() writes to stderr.
  std::shared_ptr<MetricsSink> metrics = std::make_shared<detail::LocalMetrics>();
  std::shared_ptr<LogSink> logger = nullptr;

  std::shared_ptr<Counter> counter(const std::string& name, const std::string& help,
                                   const Labels& labels = {}) const {
    return sink().counter(name, help, labels);
  }
  std::shared_ptr<Gauge> gauge(const std::string& name, const std::string& help,
                               const Labels& labels = {}) const {
    return sink().gauge(name, help, labels);
  }
  std::shared_ptr<Histogram> histogram(const std::string& name, const std::string& help,
                                       const std::vector<double>& buckets,
                                       const Labels& labels = {}) const {
    return sink().histogram(name, help, buckets, labels);
  }

  void log(LogLevel level, const std::string& message) const {
    if (logger) {
      logger->write(level, message);
      return;
    }
    static const char* const names[] = {"debug", "info", "warn", "error"};
    std::fprintf(stderr, "[%s] %s: %s\n", names[static_cast<int>(level)], replica_id.c_str(),
                 message.c_str());
  }

  // A handle to the deployment `deployment` of this replica's application.
  // Whether it exists is known only when it is called (404).
  DeploymentHandle handle(const std::string& deployment) const {
    return DeploymentHandle(handles, app, deployment);
  }

  // The sink of counter() and its kin: `metrics`, or when someone emptied
  // it, one that keeps nothing between calls.
  MetricsSink& sink() const {
    if (metrics)
      return *metrics;
    thread_local detail::LocalMetrics scratch;
    return scratch;
  }
};

template <class T>
ModelCache<T>::ModelCache(const ReplicaContext& ctx, Loader loader)
    : ModelCache(ctx.max_num_models_per_replica > 0
                     ? static_cast<std::size_t>(ctx.max_num_models_per_replica)
                     : 0,
                 std::move(loader),
                 ctx.models
                     ? OnChange([listener = ctx.models](const std::vector<std::string>& ids) {
                         listener->models_changed(ids);
                       })
                     : OnChange()) {}

class Deployment {
 public:
  virtual ~Deployment() = default;

  // Called once after construction with the deployment's user_config (when
  // it has one), and again whenever only the user_config changes: the replica
  // is not restarted.
  virtual void reconfigure(const Json& user_config) { (void)user_config; }

  // Called every health_check_period_s. Throw to report the replica unhealthy.
  virtual void check_health() {}

  virtual Response handle(const Request& request) = 0;

  // Return true to declare that handle() never blocks: it only computes
  // (microseconds, not milliseconds), with no sleeps, no I/O or waits on
  // other threads (short critical sections excepted), no
  // Request::wait_cancelled() and no deployment handle call whose answer it
  // waits for. Then no thread is woken to run a request, which is most of
  // what a small request costs otherwise:
  //   - `isolation: in_process`: the node's HTTP proxy calls handle()
  //     directly on its io thread and writes the answer, always (a blocking
  //     handler is called so only while its calls are short, see
  //     "Threading" above); a request from another node's proxy runs on the
  //     thread that reads it from the network, and its answer goes straight
  //     back;
  //   - `isolation: process` (the default): the replica's process runs
  //     handle() on one request loop, which reads the requests that wait
  //     and writes their answers in batches, instead of on a pool of
  //     max_ongoing_requests threads; such a replica runs one call at a time.
  // The rest is unchanged: max_ongoing_requests and the proxy's queue bound
  // the calls in flight, an exception is a 500, a stopping replica takes no
  // new request, and a streamed answer's producer runs on a thread of its
  // own (it may block on flow control). What differs: a call that runs
  // cannot be cancelled (Request::cancelled() is true only once its deadline
  // passed), and a handler that does block stalls every request behind it
  // (the proxy logs a warning when an inline call takes longer than 10 ms).
  // Asked once, on a runtime thread, after the constructor and the first
  // reconfigure(): return a constant.
  virtual bool nonblocking() const { return false; }

  // Request batching (Ray Serve's @serve.batch): with the deployment's
  // max_batch_size above 1, the replica collects requests and calls this
  // with up to max_batch_size of them at once, instead of handle() for each:
  // one call amortizes what every call costs (a model's setup, a pass over
  // its weights), which is where batching's throughput comes from. Return
  // one Response per request, in their order; a request whose input is bad
  // gets its own error Response (a 400), not an exception, so that the other
  // requests of its batch are answered. An exception, or a vector of another
  // size, answers 500 to every request of the batch. A batch's answers must
  // be whole (a Response::stream is answered 500).
  //
  // A batch closes when it holds max_batch_size requests or when its oldest
  // request has waited batch_wait_timeout_s (`auto`: a wait fitted to the
  // load, none at light load). Requests cancelled or past their deadline
  // before their batch runs are left out of it. Batches run one at a time,
  // on a thread of the replica's own; the requests of a batch share it, so
  // Request::cancelled() of one of them says only that that one is gone.
  //
  // A class that does not override this cannot be configured with
  // max_batch_size above 1 or `batch_wait_timeout_s: auto` (TROUPE_DEPLOYMENT
  // records whether it does: DeploymentFactory::batches). This default,
  // never called by the runtime then, calls handle() for each request.
  virtual std::vector<Response> handle_batch(const std::vector<Request>& requests) {
    std::vector<Response> out;
    out.reserve(requests.size());
    for (const auto& r : requests)
      out.push_back(handle(r));
    return out;
  }
};

// What TROUPE_DEPLOYMENT exports for each class. Layout is part of the ABI;
// abi_version stays the first member forever, so a loader can read it before
// trusting anything else.
struct DeploymentFactory {
  uint32_t abi_version;
  const char* class_name;
  // Throws whatever the constructor throws.
  std::unique_ptr<Deployment> (*create)(const Json& init_args, const ReplicaContext& ctx);
  // Whether the class overrides Deployment::handle_batch() (itself or in a
  // base class of its own): only then may its deployment batch.
  bool batches;
};

// Name of the exported symbol for a class: "troupe_deployment_<Class>".
inline std::string deployment_symbol(const std::string& class_name) {
  return "troupe_deployment_" + class_name;
}

namespace detail {

// Builds T with (init_args, ctx) when it has that constructor, else with
// (init_args); used by TROUPE_DEPLOYMENT.
template <class T>
std::unique_ptr<Deployment> construct_deployment(const Json& init_args, const ReplicaContext& ctx) {
  static_assert(std::is_base_of<Deployment, T>::value,
                "TROUPE_DEPLOYMENT: the class must derive from troupe::Deployment");
  if constexpr (std::is_constructible<T, const Json&, const ReplicaContext&>::value) {
    return std::unique_ptr<Deployment>(new T(init_args, ctx));
  } else {
    static_assert(std::is_constructible<T, const Json&>::value,
                  "TROUPE_DEPLOYMENT: the class needs a constructor taking "
                  "(const troupe::Json&, const troupe::ReplicaContext&) or (const troupe::Json&)");
    (void)ctx;
    return std::unique_ptr<Deployment>(new T(init_args));
  }
}

// True when T (or a base class of it other than Deployment) declares
// handle_batch(): &T::handle_batch is then a member of that class.
template <class T>
constexpr bool overrides_handle_batch() {
  return !std::is_same<decltype(&T::handle_batch), decltype(&Deployment::handle_batch)>::value;
}

}  // namespace detail

}  // namespace troupe

// Exports `extern "C" const troupe::DeploymentFactory* troupe_deployment_CLASS()`.
// Use once per class, at global scope, in the library's source; CLASS must be
// an unqualified name (bring a namespaced class in with `using`).
#define TROUPE_DEPLOYMENT(CLASS)                                                                 \
  extern "C" __attribute__((visibility("default")))                                              \
  const ::troupe::DeploymentFactory* troupe_deployment_##CLASS() {                               \
    static const ::troupe::DeploymentFactory factory{                                            \
        ::troupe::kDeploymentAbiVersion, #CLASS, &::troupe::detail::construct_deployment<CLASS>, \
        ::troupe::detail::overrides_handle_batch<CLASS>()};                                      \
    return &factory;                                                                             \
  }
