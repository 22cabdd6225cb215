// A local test harness for deployments: builds an application's deployments
// in this process, wires their handles to each other directly, and lets a
// unit test call the ingress with a Request and look at the Response. No
// actors, no proxy, no cluster, no troupe-node: header-only, so a test links
// nothing but the user's code (and nlohmann_json, like deployment.hpp; -ldl
// on a libc older than glibc 2.34 for App::from_config).
//
//   #include <troupe/testing.hpp>
//
//   troupe::testing::App app("compose");              // the application's name
//   app.add<Gateway>("Gateway");                      // the first one added is the ingress
//   app.add<Upper>("Upper");
//   app.add<Hello>("Hello", {}, {{"greeting", "hi"}});  // init_args, user_config
//   troupe::Response r = app.get("/?text=Hi");         // GET the ingress
//   CHECK(r.status == 200);
//
// Or from a config, with the classes loaded from the built libraries exactly
// as troupe-node loads them (see App::from_config):
//
//   auto app = troupe::testing::App::from_config(troupe::Json::parse(R"({
//       "name": "compose", "import_path": "libtroupe_examples.so:Gateway",
//       "deployments": [{"name": "Gateway"}, {"name": "Upper"}, {"name": "Reverse"}]})"),
//       {"/path/to/build/plugins"});
//
// What it does as the runtime does (include/troupe/deployment.hpp): one
// instance per deployment, built with (init_args, ctx) or (init_args); then
// reconfigure(user_config) when the deployment has a user_config; then
// nonblocking() asked once. An exception from any of these propagates out of
// add() (the runtime would report a start failure). handle() throwing is a
// 500 with {"error": "handler raised: ..."}, as in a replica. A handle call
// (ctx.handle("Upper").call(r)) runs the other instance's handle() on a
// thread of its own, so call_async() calls run in parallel; an unknown
// deployment answers 404 like the proxy; an empty method is "GET" and an
// empty path "/". A streamed answer (Response::streaming) is read whole by
// call(), into Response::body (a producer that throws: kStreamErrorHeader).
//
// What it does not do: replicas (one instance per deployment, whatever
// num_replicas says), queues and max_ongoing_requests, retries, routing by
// route prefix (the path given is the one handle() sees), request timeouts
// (a request has a RequestControl without a deadline unless the test gives
// one; Request::control is the test's to cancel), health-check periods (call
// check_health() yourself), process isolation (a crash is the test's crash).
// Metrics and logs stay in the ReplicaContext: context(name).counter(...)
// returns the deployment's own counter, and ctx.log() lines are kept for
// logs(name).
#pragma once

#include <dlfcn.h>

#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <troupe/deployment.hpp>

namespace troupe::testing {

// A log line of a deployment (ctx.log()).
struct LogLine {
  LogLevel level;
  std::string message;
};

// Set on an answer of App::call() (and of a handle call) whose stream's
// producer threw: the runtime's client would see that body end early,
// without its final chunk. The value is the exception's message.
constexpr const char* kStreamErrorHeader = "X-Troupe-Testing-Stream-Error";

namespace detail {

// A StreamWriter that keeps everything: a streamed answer read whole.
class CollectingWriter : public StreamWriter {
 public:
  bool write(std::string_view chunk) override {
    body.append(chunk.data(), chunk.size());
    return true;
  }
  bool cancelled() const override { return false; }
  std::string body;
};

class KeptLog : public LogSink {
 public:
  void write(LogLevel level, const std::string& message) override {
    std::lock_guard<std::mutex> lock(mutex_);
    lines_.push_back({level, message});
  }
  std::vector<LogLine> lines() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return lines_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<LogLine> lines_;
};

inline Response error_json(int status, const std::string& message) {
  return Response::json(Json{{"error", message}, {"request_id", ""}}, status);
}

// Runs handle() as a replica does: defaults for method and path, a
// RequestControl when the request has none, an exception as a 500, and a
// streamed answer read whole.
inline Response run_handle(Deployment& instance, Request request) {
  if (request.method.empty())
    request.method = "GET";
  if (request.path.empty())
    request.path = "/";
  if (!request.control)
    request.control = std::make_shared<RequestControl>();
  Response response;
  try {
    response = instance.handle(request);
  } catch (const std::exception& e) {
    return Response::json(Json{{"error", std::string("handler raised: ") + e.what()}}, 500);
  } catch (...) {
    return Response::json(Json{{"error", "handler raised a non-standard exception"}}, 500);
  }
  if (!response.stream)
    return response;
  // A client of the runtime sees the status first, then the body end early
  // when the producer throws: here the body is what was written, and the
  // header kStreamErrorHeader says why it ended early.
  CollectingWriter out;
  auto produce = std::move(response.stream);
  response.stream = nullptr;
  try {
    produce(out);
  } catch (const std::exception& e) {
    response.headers.emplace_back(kStreamErrorHeader, e.what());
  } catch (...) {
    response.headers.emplace_back(kStreamErrorHeader, "non-standard exception");
  }
  response.body = std::move(out.body);
  return response;
}

// What the App and its handles share: the instances by deployment name. The
// handles hold it weakly (the instances hold the handles: no cycle).
struct AppState {
  struct Entry {
    std::shared_ptr<Deployment> instance;
    std::shared_ptr<ReplicaContext> ctx;
    std::shared_ptr<KeptLog> log;
    bool nonblocking = false;
  };
  std::string name;
  std::string node_id;
  mutable std::mutex mutex;
  std::map<std::string, Entry> deployments;
  std::vector<std::string> order;  // of construction
  std::vector<void*> libraries;    // dlopen()ed by from_config

  std::shared_ptr<Deployment> find(const std::string& deployment) const {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = deployments.find(deployment);
    return it == deployments.end() ? nullptr : it->second.instance;
  }
};

// Handle calls go straight to the other in-process instance.
class DirectTransport : public HandleTransport {
 public:
  explicit DirectTransport(std::weak_ptr<AppState> state) : state_(std::move(state)) {}

  std::future<Response> call(const std::string& app, const std::string& deployment,
                             Request request, double timeout_s) const override {
    auto state = state_.lock();
    std::shared_ptr<Deployment> target;
    if (state && state->name == app)
      target = state->find(deployment);
    if (!target) {
      std::promise<Response> missing;
      missing.set_value(error_json(404, "application " + app + " has no deployment " + deployment));
      return missing.get_future();
    }
    if (timeout_s > 0 && !request.control) {
      // The deadline is the handler's to read (Request::deadline()); the
      // harness does not answer 504 by itself.
      request.control = std::make_shared<RequestControl>(
          RequestControl::Clock::now() +
          std::chrono::duration_cast<RequestControl::Clock::duration>(
              std::chrono::duration<double>(timeout_s)));
    }
    return std::async(std::launch::async, [target, request = std::move(request)]() mutable {
      return run_handle(*target, std::move(request));
    });
  }

 private:
  std::weak_ptr<AppState> state_;
};

}  // namespace detail

class App {
 public:
  // `name`: the application's name (ReplicaContext::app); `node_id`: what
  // ReplicaContext::node_id says.
  explicit App(std::string name = "app", std::string node_id = "test-node")
      : state_(std::make_shared<detail::AppState>()) {
    state_->name = std::move(name);
    state_->node_id = std::move(node_id);
    transport_ = std::make_shared<detail::DirectTransport>(state_);
  }

  // Movable (from_config() returns one), not assignable: the deployments of
  // an App go in the reverse order of their construction, with it.
  App(App&&) = default;
  App& operator=(App&&) = delete;
  App(const App&) = delete;
  App& operator=(const App&) = delete;

  // Deployments are destroyed in the reverse order of their construction;
  // the libraries from_config() opened stay loaded until then.
  ~App() {
    if (!state_)
      return;
    std::vector<std::string> order;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      order = state_->order;
    }
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      detail::AppState::Entry gone;
      {
        std::lock_guard<std::mutex> lock(state_->mutex);
        auto found = state_->deployments.find(*it);
        gone = std::move(found->second);
        state_->deployments.erase(found);
      }
      // `gone` (the instance) is destroyed here, outside the lock: its
      // destructor may still call other deployments.
    }
    for (void* library : state_->libraries)
      dlclose(library);
  }

  // Builds deployment `deployment` of class T, as TROUPE_DEPLOYMENT would.
  // The first deployment added is the ingress (see set_ingress()).
  // `user_config` null: the deployment has none (reconfigure() is not
  // called). Throws what the constructor or reconfigure() throws, and
  // std::invalid_argument for a name used twice.
  template <class T>
  App& add(const std::string& deployment, const Json& init_args = Json::object(),
           const Json& user_config = nullptr) {
    return add(deployment, &troupe::detail::construct_deployment<T>, init_args, user_config);
  }

  // The same with a factory (what TROUPE_DEPLOYMENT exports, or one from a
  // library). Its ABI version must be this header's.
  App& add(const std::string& deployment, const DeploymentFactory& factory,
           const Json& init_args = Json::object(), const Json& user_config = nullptr) {
    if (factory.abi_version != kDeploymentAbiVersion) {
      throw std::invalid_argument("deployment " + deployment + ": class " + factory.class_name +
                                  " was built for deployment ABI " +
                                  std::to_string(factory.abi_version) + ", this header is " +
                                  std::to_string(kDeploymentAbiVersion));
    }
    return add(deployment, factory.create, init_args, user_config);
  }

  // An application of a config, as JSON: the fields of one entry of a
  // config's `applications` (name, import_path, args, deployments with
  // name, import_path, args and user_config; other fields are ignored), or a
  // whole config ({"applications": [...]}) with `app_name` naming the one to
  // build (empty: the only one). YAML is a superset of JSON, so a config
  // written in JSON deploys with `troupectl deploy` as it is. The rules are
  // the config's: the application's import_path names the ingress class, a
  // deployment without import_path is the class of its own name in the
  // application's library, the ingress gets the application's args. Each
  // library is loaded with dlopen() from the first of `plugin_dirs` that has
  // it, like troupe-node's --plugin-path. Throws std::invalid_argument on a
  // bad config, a missing library or class, or another ABI version.
  static App from_config(const Json& config, const std::vector<std::string>& plugin_dirs,
                         const std::string& app_name = "") {
    const Json& spec = pick_application(config, app_name);
    auto text = [&](const Json& obj, const char* key) -> std::string {
      if (!obj.contains(key))
        return "";
      if (!obj.at(key).is_string())
        throw std::invalid_argument(std::string("config: '") + key + "' must be a string");
      return obj.at(key).get<std::string>();
    };
    const std::string name = text(spec, "name");
    const std::string import = text(spec, "import_path");
    if (name.empty() || import.empty())
      throw std::invalid_argument("config: an application needs a name and an import_path");
    const auto colon = import.find(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == import.size())
      throw std::invalid_argument("config: import_path '" + import +
                                  "' is not LIBRARY:CLASS (e.g. libmy_models.so:Hello)");
    const std::string library = import.substr(0, colon);
    const std::string ingress = import.substr(colon + 1);
    const Json app_args = spec.value("args", Json::object());
    Json deployments = spec.value("deployments", Json::array());
    if (!deployments.is_array() || deployments.empty())
      deployments = Json::array({Json{{"name", ingress}}});

    App app(name);
    // The ingress first: it is what call() reaches.
    std::vector<Json> ordered;
    for (const auto& d : deployments) {
      if (!d.is_object() || text(d, "name").empty())
        throw std::invalid_argument("config: every deployment needs a name");
      if (text(d, "name") == ingress)
        ordered.insert(ordered.begin(), d);
      else
        ordered.push_back(d);
    }
    for (const auto& d : ordered) {
      const std::string dname = text(d, "name");
      std::string dimport = text(d, "import_path");
      if (dimport.empty())
        dimport = dname == ingress ? import : library + ":" + dname;
      const auto c = dimport.find(':');
      if (c == std::string::npos || c == 0 || c + 1 == dimport.size())
        throw std::invalid_argument("config: import_path '" + dimport + "' is not LIBRARY:CLASS");
      Json args = d.contains("args") ? d.at("args") : d.value("init_args", Json());
      if (args.is_null())
        args = dname == ingress ? app_args : Json::object();
      const Json user_config = d.value("user_config", Json());
      app.add(dname, app.load(dimport.substr(0, c), dimport.substr(c + 1), plugin_dirs), args,
              user_config);
    }
    return app;
  }

  // Which deployment call() and get() reach; the first one added unless set.
  App& set_ingress(const std::string& deployment) {
    ingress_ = deployment;
    return *this;
  }
  const std::string& ingress() const { return ingress_; }
  const std::string& name() const { return state_->name; }

  // Calls the ingress's handle() on this thread, as a replica would run it
  // (see the top of this file). A deployment that does not exist: 404.
  Response call(Request request) const { return call(ingress_, std::move(request)); }
  Response call(const std::string& deployment, Request request) const {
    auto target = state_->find(deployment);
    if (!target)
      return detail::error_json(404, "application " + state_->name + " has no deployment " +
                                         deployment);
    return detail::run_handle(*target, std::move(request));
  }

  // GET of "PATH?QUERY" on the ingress, e.g. get("/?text=Hi").
  Response get(const std::string& target) const { return call(request("GET", target)); }
  // POST of `body` to "PATH?QUERY" on the ingress.
  Response post(const std::string& target, std::string body) const {
    return call(request("POST", target, std::move(body)));
  }

  // A Request of `method` for "PATH?QUERY".
  static Request request(std::string method, const std::string& target, std::string body = "") {
    Request r;
    r.method = std::move(method);
    const auto q = target.find('?');
    r.path = target.substr(0, q);
    if (q != std::string::npos)
      r.query = target.substr(q + 1);
    r.body = std::move(body);
    return r;
  }

  // A handle to a deployment of this application, like ctx.handle(): what a
  // test uses to call a deployment the way another deployment would.
  DeploymentHandle handle(const std::string& deployment) const {
    return DeploymentHandle(transport_, state_->name, deployment);
  }

  // Calls reconfigure(user_config), as the runtime does when only the
  // user_config changed; throws what it throws (a failed update).
  void reconfigure(const std::string& deployment, const Json& user_config) {
    entry(deployment).instance->reconfigure(user_config);
  }

  // Calls check_health(): "" when the deployment is healthy, else the message
  // of what it threw (the runtime would mark the replica unhealthy).
  std::string check_health(const std::string& deployment) {
    try {
      entry(deployment).instance->check_health();
    } catch (const std::exception& e) {
      return e.what()[0] ? e.what() : "unhealthy";
    } catch (...) {
      return "unhealthy: non-standard exception";
    }
    return "";
  }

  // The instance (to inspect its state: dynamic_cast it to its class), its
  // ReplicaContext (its metrics: asking for a metric again returns the same
  // one), what nonblocking() answered, and the lines it logged.
  Deployment& instance(const std::string& deployment) { return *entry(deployment).instance; }
  const ReplicaContext& context(const std::string& deployment) {
    return *entry(deployment).ctx;
  }
  bool nonblocking(const std::string& deployment) { return entry(deployment).nonblocking; }
  std::vector<LogLine> logs(const std::string& deployment) {
    return entry(deployment).log->lines();
  }

  // The deployments' names, in the order they were built.
  std::vector<std::string> deployments() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->order;
  }

 private:
  using Create = std::unique_ptr<Deployment> (*)(const Json&, const ReplicaContext&);

  App& add(const std::string& deployment, Create create, const Json& init_args,
           const Json& user_config) {
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      if (state_->deployments.count(deployment))
        throw std::invalid_argument("deployment " + deployment + " was added already");
    }
    auto ctx = std::make_shared<ReplicaContext>();
    ctx->app = state_->name;
    ctx->deployment = deployment;
    ctx->replica_id = state_->name + "#" + deployment + "#test";
    ctx->node_id = state_->node_id;
    ctx->version = "test";
    ctx->handles = transport_;
    auto log = std::make_shared<detail::KeptLog>();
    ctx->logger = log;
    detail::AppState::Entry e;
    e.ctx = ctx;
    e.log = log;
    e.instance = std::shared_ptr<Deployment>(create(init_args, *ctx));
    if (!user_config.is_null())
      e.instance->reconfigure(user_config);
    e.nonblocking = e.instance->nonblocking();
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->deployments.emplace(deployment, std::move(e));
    state_->order.push_back(deployment);
    if (ingress_.empty())
      ingress_ = deployment;
    return *this;
  }

  detail::AppState::Entry& entry(const std::string& deployment) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto it = state_->deployments.find(deployment);
    if (it == state_->deployments.end())
      throw std::invalid_argument("application " + state_->name + " has no deployment " +
                                  deployment);
    return it->second;
  }

  static const Json& pick_application(const Json& config, const std::string& app_name) {
    if (!config.is_object())
      throw std::invalid_argument("config: expected a JSON object");
    if (!config.contains("applications"))
      return config;
    const Json& apps = config.at("applications");
    if (!apps.is_array() || apps.empty())
      throw std::invalid_argument("config: 'applications' must be a non-empty list");
    if (app_name.empty()) {
      if (apps.size() != 1)
        throw std::invalid_argument("config: it has several applications; name the one to build");
      return apps.at(0);
    }
    for (const auto& a : apps) {
      if (a.is_object() && a.value("name", "") == app_name)
        return a;
    }
    throw std::invalid_argument("config: no application named " + app_name);
  }

  // The factory of `class_name` in `library`, from the first plugin dir that
  // has the library (opened once per App).
  const DeploymentFactory& load(const std::string& library, const std::string& class_name,
                                const std::vector<std::string>& plugin_dirs) {
    if (library.find('/') != std::string::npos)
      throw std::invalid_argument("config: library '" + library +
                                  "' must be a file name in a plugin dir");
    std::string errors;
    for (const auto& dir : plugin_dirs) {
      const std::string path = dir + "/" + library;
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!handle) {
        errors += std::string("; ") + dlerror();
        continue;
      }
      state_->libraries.push_back(handle);  // dlopen counts: closed as often as opened
      using Symbol = const DeploymentFactory* (*)();
      auto symbol =
          reinterpret_cast<Symbol>(dlsym(handle, deployment_symbol(class_name).c_str()));
      if (!symbol)
        throw std::invalid_argument(path + " has no deployment class " + class_name +
                                    " (no TROUPE_DEPLOYMENT(" + class_name + "))");
      return *symbol();
    }
    throw std::invalid_argument("library " + library + " is in none of the plugin dirs" + errors);
  }

  std::shared_ptr<detail::AppState> state_;
  std::shared_ptr<detail::DirectTransport> transport_;
  std::string ingress_;
};

}  // namespace troupe::testing
