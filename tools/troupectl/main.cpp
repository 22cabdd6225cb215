// troupectl: the operator's client. Talks to the controller with CAF actor
// messages (never HTTP). Exit codes: 0 success, 1 failed operation, 2 bad usage.
// The --json outputs are a stable interface, documented in docs/troupectl.md.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <nlohmann/json.hpp>

#include "config/config.hpp"
#include "runtime/head_list.hpp"
#include "runtime/resources.hpp"
#include "runtime/security/certs.hpp"
#include "runtime/security/credentials.hpp"
#include "runtime/security/tls.hpp"
#include "runtime/system_setup.hpp"
#include "controller/core/validate.hpp"
#include "node/replica_logs.hpp"
#include "tools/troupectl/args.hpp"
#include "tools/troupectl/client.hpp"
#include "tools/troupectl/new_project.hpp"
#include "tools/troupectl/upload.hpp"

using namespace troupe;
using nlohmann::json;

namespace {

int fail(int code, const std::string& message) {
  std::fprintf(stderr, "troupectl: error: %s\n", message.c_str());
  return code;
}

json resources_json(const std::string& text) {
  json out = json::object();
  if (auto r = parse_resources(text)) {
    for (const auto& [name, amount] : r->amounts)
      out[name] = amount;
  }
  return out;
}

void print_nodes(const std::vector<NodeStatus>& nodes, bool as_json) {
  if (as_json) {
    auto out = json::array();
    for (const auto& n : nodes) {
      out.push_back({{"id", n.id},
                     {"address", n.address},
                     {"state", n.state},
                     {"resources", resources_json(n.resources)},
                     {"last_heartbeat_age_s", n.last_heartbeat_age_ms / 1000.0},
                     {"reason", n.reason},
                     {"pid", n.pid},
                     {"proxy", n.proxy}});
    }
    std::cout << out.dump(2) << "\n";
    return;
  }
  std::printf("%-16s %-22s %-9s %-10s %-28s %s\n", "ID", "ADDRESS", "STATE", "PROXY",
              "RESOURCES", "LAST HEARTBEAT");
  for (const auto& n : nodes) {
    char age[32];
    std::snprintf(age, sizeof(age), "%.1fs ago", n.last_heartbeat_age_ms / 1000.0);
    std::printf("%-16s %-22s %-9s %-10s %-28s %s\n", n.id.c_str(), n.address.c_str(),
                n.state.c_str(), n.proxy.c_str(), n.resources.c_str(), age);
  }
}

// The leader as one line: its node id first, then since when, its term and
// its controller's address ("" when `answer` names none).
std::string leader_line(const json& answer) {
  if (!answer.is_object() || !answer.contains("leader") || !answer["leader"].is_object())
    return "";
  const auto& l = answer["leader"];
  std::time_t since = static_cast<std::time_t>(l.value("since_unix_ms", int64_t{0}) / 1000);
  char when[32];
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&since));
  char line[512];
  std::snprintf(line, sizeof(line), "%s since %s (term %lld, controller at %s%s)",
                l.value("node_id", std::string()).c_str(), when,
                static_cast<long long>(l.value("term", int64_t{0})),
                l.value("address", std::string()).c_str(),
                answer.value("ha", false) ? "" : "; a single head");
  return line;
}

// `troupectl leader`.
int print_leader(const std::string& answer, bool as_json) {
  auto j = json::parse(answer, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return fail(1, "the head answered something that is not JSON: " + answer);
  if (as_json) {
    std::cout << j.dump(2) << "\n";
    return j["leader"].is_object() ? 0 : 1;
  }
  auto line = leader_line(j);
  if (line.empty())
    return fail(1, "no leader: " + j.value("problem", std::string("no leader yet")));
  std::printf("%s\n", line.c_str());
  return 0;
}

// What the connected controller says of who leads (null when it does not
// answer: a controller of an older version).
json leader_of(ControllerClient& client) {
  auto answer = client.leader_json();
  if (!answer)
    return nullptr;
  auto j = json::parse(*answer, nullptr, false);
  return j.is_discarded() ? json() : j;
}

std::string format_time(double unix_s) {
  if (unix_s <= 0)
    return "-";
  std::time_t t = static_cast<std::time_t>(unix_s);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%H:%M:%S", std::localtime(&t));
  return buf;
}

// 0, 0.4, 12.5, 130: one decimal below 100.
std::string format_number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, x < 100 ? "%.1f" : "%.0f", x);
  return buf;
}

// A latency in milliseconds, or "-" when there is none (null).
std::string format_ms(const json& ms) {
  if (!ms.is_number())
    return "-";
  char buf[32];
  const double x = ms.get<double>();
  std::snprintf(buf, sizeof buf, x < 10 ? "%.2f ms" : "%.0f ms", x);
  return buf;
}

size_t running_count(const json& dep) {
  size_t n = 0;
  for (const auto& r : dep.value("replicas", json::array())) {
    if (r.value("state", "") == "RUNNING")
      ++n;
  }
  return n;
}

// "512 MiB", "1.5 GiB": bytes in the largest binary unit they reach.
void print_status(const json& status, bool replicas) {
  if (status.value("recovering", false)) {
    std::printf("the controller is recovering its state after a restart; retry in a moment\n");
    return;
  }
  const auto& apps = status.at("applications");
  if (apps.empty()) {
    std::printf("no applications\n");
    return;
  }
  for (const auto& [name, app] : apps.items()) {
    std::printf("%s  %s  %s\n", name.c_str(), app.value("status", "?").c_str(),
                app.value("route_prefix", "").c_str());
    if (!app.value("message", "").empty())
      std::printf("  %s\n", app.value("message", "").c_str());
    if (app.contains("traffic")) {
      std::string shown;
      for (const auto& [dname, weight] : app.at("traffic").items()) {
        char w[32];
        std::snprintf(w, sizeof w, "%g", weight.get<double>());
        shown += (shown.empty() ? "" : ", ") + dname + "=" + w;
      }
      std::printf("  traffic: %s%s\n", shown.c_str(),
                  app.contains("traffic_key_header")
                      ? (" (by header " + app.value("traffic_key_header", "") + ")").c_str()
                      : "");
    }
    if (app.contains("shadow")) {
      std::string shown;
      for (const auto& [dname, probability] : app.at("shadow").items()) {
        char p[32];
        std::snprintf(p, sizeof p, "%g", probability.get<double>());
        shown += (shown.empty() ? "" : ", ") + dname + "=" + p;
      }
      std::printf("  shadow: %s (copies, answers discarded)\n", shown.c_str());
    }
    if (app.value("open_inference", false))
      std::printf("  open inference: /v2/models/%s (REST and gRPC)\n", name.c_str());
    for (const auto& [dname, dep] : app.at("deployments").items()) {
      std::printf("  %-20s %-13s %zu/%d running", dname.c_str(), dep.value("status", "?").c_str(),
                  running_count(dep), dep.value("target_replicas", 0));
      if (!dep.value("trigger", "").empty())
        std::printf("  (%s)", dep.value("trigger", "").c_str());
      // Where its replicas run, and their memory limit.
      if (dep.contains("isolation")) {
        const uint64_t limit = dep.value("memory_limit_bytes", uint64_t{0});
        std::printf(
            "  %s, %s", dep.value("isolation", "").c_str(),
            limit == 0 ? "no memory limit" : ("memory limit " + format_bytes(limit)).c_str());
      }
      std::printf("\n");
      if (!dep.value("message", "").empty())
        std::printf("    %s\n", dep.value("message", "").c_str());
      // Its load as its replicas last reported it (a controller of an older
      // version sends none).
      if (dep.contains("requests_per_s") && dep.contains("streams")) {
        std::printf("    %s req/s  %s errors/s  p99 %s  in flight %s  streams %s  restarts %s\n",
                    format_number(dep.value("requests_per_s", 0.0)).c_str(),
                    format_number(dep.value("errors_per_s", 0.0)).c_str(),
                    format_ms(dep.value("p99_ms", json())).c_str(),
                    format_number(dep.value("in_flight", 0.0)).c_str(),
                    std::to_string(dep.value("streams", 0)).c_str(),
                    std::to_string(dep.value("restarts", 0)).c_str());
      }
      if (!replicas)
        continue;
      for (const auto& r : dep.value("replicas", json::array())) {
        std::string extra;
        if (r.value("streams", 0) > 0)
          extra += "  streams " + std::to_string(r.value("streams", 0));
        const auto models = r.value("models", json::array());
        if (!models.empty()) {
          extra += "  models:";
          for (const auto& m : models)
            extra += " " + m.get<std::string>();
        }
        std::printf("    %-34s %-10s %-11s %-26s %s%s\n", r.value("id", "").c_str(),
                    r.value("node", "").c_str(), r.value("state", "").c_str(),
                    r.value("version", "").c_str(), format_time(r.value("started", 0.0)).c_str(),
                    extra.c_str());
      }
    }
  }
}

// Polls the status until every declared application is RUNNING (0) or one
// failed (1), printing each deployment's progress when it changes.
int wait_for(ControllerClient& client, const controller::TargetState& declared, double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::map<std::string, std::string> last_line;
  while (true) {
    auto text = client.status_json();
    if (!text)
      return fail(1, text.status().message());
    auto status = json::parse(*text);
    bool all_running = true;
    for (const auto& [name, spec] : declared.applications) {
      auto apps = status.at("applications");
      if (!apps.contains(name)) {
        all_running = false;
        continue;
      }
      const auto& app = apps.at(name);
      for (const auto& [dname, dep] : app.at("deployments").items()) {
        char line[512];
        std::snprintf(line, sizeof(line), "%s/%s: %s, %zu/%d running%s%s", name.c_str(),
                      dname.c_str(), dep.value("status", "?").c_str(), running_count(dep),
                      dep.value("target_replicas", 0), dep.value("message", "").empty() ? "" : ": ",
                      dep.value("message", "").c_str());
        auto key = name + "/" + dname;
        if (last_line[key] != line) {
          std::printf("%s\n", line);
          std::fflush(stdout);
          last_line[key] = line;
        }
        if (dep.value("status", "") == "DEPLOY_FAILED") {
          return fail(1, "deployment " + key + " failed: " + dep.value("message", ""));
        }
      }
      if (app.value("status", "") == "DEPLOY_FAILED") {
        return fail(1, "application " + name + " failed: " + app.value("message", ""));
      }
      if (app.value("status", "") != "RUNNING")
        all_running = false;
    }
    if (all_running) {
      std::printf("all applications are RUNNING\n");
      return 0;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return fail(1,
                  "not every application was RUNNING within " + std::to_string(timeout_s) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));  // poll interval
  }
}

// The replicas `target` names: itself (a replica id has '#'), or every
// replica the controller lists for the application or APP/DEPLOYMENT.
Result<std::vector<std::string>> replicas_of(ControllerClient& client, const std::string& target) {
  if (target.find('#') != std::string::npos)
    return std::vector<std::string>{target};
  auto text = client.status_json();
  if (!text)
    return text.status();
  auto status = json::parse(*text, nullptr, false);
  const auto slash = target.find('/');
  const std::string app = target.substr(0, slash);
  const std::string deployment = slash == std::string::npos ? "" : target.substr(slash + 1);
  if (status.is_discarded() || !status["applications"].contains(app))
    return Status(errc::not_found, "no application '" + app + "'");
  const auto& deps = status["applications"][app]["deployments"];
  if (!deployment.empty() && !deps.contains(deployment))
    return Status(errc::not_found, "application '" + app + "' has no deployment '" + deployment + "'");
  std::vector<std::string> ids;
  for (const auto& [name, dep] : deps.items()) {
    if (!deployment.empty() && name != deployment)
      continue;
    for (const auto& r : dep["replicas"])
      ids.push_back(r.value("id", ""));
  }
  return ids;
}

void print_lines(const std::string& text, const std::string& prefix) {
  if (prefix.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
  } else {
    size_t at = 0;
    while (at < text.size()) {
      size_t nl = text.find('\n', at);
      size_t end = nl == std::string::npos ? text.size() : nl + 1;
      std::printf("[%s] %.*s", prefix.c_str(), static_cast<int>(end - at), text.data() + at);
      at = end;
    }
  }
  std::fflush(stdout);
}

// `troupectl logs`: the last `tail` lines of each replica's log, then with
// `follow` what is appended, read 4 times a second (an application's new
// replicas are picked up from the start of their logs every 2 s) until the
// process is interrupted. One replica: an error reading it fails the
// command; several: it is reported and the others are shown.
int print_logs(ControllerClient& client, const std::string& target, uint32_t tail, bool follow) {
  auto ids = replicas_of(client, target);
  if (!ids)
    return fail(1, ids.status().message());
  const bool single = target.find('#') != std::string::npos;
  if (ids->empty() && !follow)
    return fail(1, "'" + target + "' has no replicas");
  std::map<std::string, uint64_t> offsets;
  for (const auto& id : *ids) {
    auto chunk = client.logs(id, node::kLogTail, tail);
    if (!chunk) {
      if (single)
        return fail(1, chunk.status().message());
      std::fprintf(stderr, "troupectl: warning: %s\n", chunk.status().message().c_str());
      continue;
    }
    print_lines(chunk->text, single ? "" : id);
    offsets[id] = chunk->next_offset;
  }
  for (int round = 1; follow; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));  // the --follow poll interval
    if (!single && round % 8 == 0) {
      if (auto now = replicas_of(client, target)) {
        for (const auto& id : *now)
          offsets.emplace(id, 0);  // a new replica: its log from the start
      }
    }
    for (auto& [id, offset] : offsets) {
      auto chunk = client.logs(id, offset, 0);
      if (!chunk)
        continue;  // its node is busy or gone: tried again next round
      print_lines(chunk->text, single ? "" : id);
      offset = chunk->next_offset;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"troupectl: operate a troupe cluster", "troupectl"};
  app.require_subcommand(1);
  // The global options below are taken after the subcommand too (`troupectl
  // deploy f.yaml --wait --timeout 60`): what a subcommand does not know
  // falls through to this parser. Inherited by every subcommand added later.
  app.fallthrough();
  const char* env_address = std::getenv("TROUPE_ADDRESS");
  std::string address = env_address && *env_address ? env_address : "127.0.0.1:7300";
  double timeout_s = 10.0;
  app.add_option("--address", address,
                 "controller HOST:PORT, or the head candidates' HOST:PORT,HOST:PORT,... (env "
                 "TROUPE_ADDRESS)")
      ->capture_default_str();
  app.add_option("--timeout", timeout_s, "seconds to wait for the controller")
      ->capture_default_str();
  std::string tls_dir;
  std::string tls_name;
  app.add_option("--tls-dir", tls_dir,
                 "talk TLS with the certificates in DIR (ca.crt and your <name>.crt/.key) "
                 "[env TROUPE_TLS_DIR]")
      ->envname("TROUPE_TLS_DIR");
  app.add_option("--tls-name", tls_name,
                 "which certificate in --tls-dir to use (default: the only one besides ca.crt)");

  auto* certs_cmd = app.add_subcommand("certs", "create the cluster CA and issue certificates");
  certs_cmd->require_subcommand(1);
  auto* certs_init = certs_cmd->add_subcommand("init", "create a cluster CA in DIR");
  std::string certs_dir;
  certs_init->add_option("DIR", certs_dir, "directory for ca.crt and ca.key")->required();
  auto* certs_issue = certs_cmd->add_subcommand("issue", "issue a certificate signed by the CA");
  std::string cert_name;
  std::string cert_role = "node";
  int cert_days = 365;
  certs_issue->add_option("DIR", certs_dir, "directory of the CA")->required();
  certs_issue->add_option("--name", cert_name, "node id, or an operator's name")->required();
  certs_issue->add_option("--role", cert_role, "node or operator")
      ->capture_default_str()
      ->check(CLI::IsMember({"node", "operator"}));
  certs_issue->add_option("--days", cert_days, "validity in days")->capture_default_str();
  std::vector<std::string> cert_hosts;
  certs_issue->add_option("--host", cert_hosts,
                          "another IP address or DNS name the certificate is valid for "
                          "(subjectAltName; repeatable), e.g. an etcd member's address");

  bool json_out = false;
  auto* leader_cmd =
      app.add_subcommand("leader", "which head leads the control plane, and since when");
  leader_cmd->add_flag("--json", json_out, "print the JSON object the head answers");
  auto* nodes_cmd = app.add_subcommand("nodes", "list the nodes of the cluster");
  nodes_cmd->add_flag("--json", json_out, "print a JSON array");

  auto* drain_cmd = app.add_subcommand("drain", "mark a node DRAINING (its replicas move away)");
  std::string drain_node;
  drain_cmd->add_option("NODE", drain_node, "node id")->required();

  auto* deploy_cmd = app.add_subcommand(
      "deploy", "declare the applications of a YAML config (others are deleted)");
  std::string deploy_file;
  bool wait = false;
  double wait_timeout_s = 300;
  deploy_cmd->add_option("FILE", deploy_file, "YAML config")->required();
  deploy_cmd->add_flag("--wait", wait, "show progress until every application is RUNNING");
  deploy_cmd->add_option("--wait-timeout", wait_timeout_s, "seconds --wait waits at most")
      ->capture_default_str();
  std::string if_generation_text;
  deploy_cmd->add_option("--if-generation", if_generation_text,
                         "deploy only if the cluster's target state is still at generation N "
                         "(as printed by deploy, scale, traffic, rollback and status --json); "
                         "refused otherwise, naming the current generation");

  auto* status_cmd = app.add_subcommand("status", "applications, deployments and replicas");
  std::string status_app;
  status_cmd->add_option("APP", status_app, "only this application");
  status_cmd->add_flag("--json", json_out, "print JSON (see docs/troupectl.md)");

  auto* logs_cmd = app.add_subcommand(
      "logs", "a replica's log, or those of every replica of an application or deployment");
  std::string logs_target;
  bool logs_follow = false;
  std::string logs_tail_text = "100";
  logs_cmd
      ->add_option("TARGET", logs_target,
                   "REPLICA_ID, APP or APP/DEPLOYMENT (several replicas: each line is prefixed "
                   "with [REPLICA_ID])")
      ->required();
  logs_cmd->add_flag("-f,--follow", logs_follow,
                     "then print new lines as they are written (4 reads a second) until "
                     "interrupted");
  logs_cmd->add_option("--tail", logs_tail_text, "lines of each log to print first")
      ->capture_default_str();

  auto* config_cmd = app.add_subcommand("config", "print the declared config as YAML");

  auto* delete_cmd =
      app.add_subcommand("delete", "delete an application, or one deployment of one");
  std::string delete_app;
  delete_cmd
      ->add_option("TARGET", delete_app,
                   "APP, or APP/DEPLOYMENT (not the ingress, not one that carries traffic or is a "
                   "shadow)")
      ->required();

  auto* scale_cmd = app.add_subcommand(
      "scale", "set the replica count of one deployment (not an autoscaled one)");
  std::string scale_target;
  std::string scale_count;
  scale_cmd->add_option("APP/DEPLOYMENT", scale_target, "the deployment")->required();
  scale_cmd->add_option("N", scale_count, "replicas")->required();

  auto* traffic_cmd = app.add_subcommand(
      "traffic", "set an application's traffic split without a redeploy (weights sum to 1)");
  std::string traffic_app;
  std::vector<std::string> traffic_items;
  traffic_cmd->add_option("APP", traffic_app, "application name")->required();
  traffic_cmd->add_option("NAME=W", traffic_items, "deployment and weight, e.g. Hello=0.9 Canary=0.1")
      ->required();

  auto* rollback_cmd = app.add_subcommand(
      "rollback",
      "deploy an application's last good declaration again (the one it last ran with every "
      "deployment HEALTHY)");
  std::string rollback_app;
  rollback_cmd->add_option("APP", rollback_app, "application name")->required();
  rollback_cmd->add_flag("--wait", wait, "show progress until the application is RUNNING");
  rollback_cmd->add_option("--wait-timeout", wait_timeout_s, "seconds --wait waits at most")
      ->capture_default_str();

  auto* shutdown_cmd = app.add_subcommand("shutdown", "delete every application");
  bool shutdown_nodes = false;
  shutdown_cmd->add_flag("--nodes", shutdown_nodes, "then stop every node process too");

  auto* kill_cmd = app.add_subcommand("kill", "send an exit (kill) to an actor: chaos testing");
  std::string kill_kind;
  std::string kill_id;
  kill_cmd->add_option("KIND", kill_kind, "replica, proxy, agent or controller")
      ->required()
      ->check(CLI::IsMember({"replica", "proxy", "agent", "controller"}));
  kill_cmd->add_option("ID", kill_id, "replica id, or node id for proxy/agent");

  ctl::NewCommand new_command;
  ctl::add_new_command(app, new_command);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    return fail(2, e.what());
  }
  if (*new_command.command)
    return ctl::run_new_command(new_command);  // local: no controller involved
  if (*certs_cmd) {
    // Local: no controller involved.
    if (*certs_init) {
      auto st = security::init_ca(certs_dir);
      if (!st)
        return fail(1, st.message());
      std::printf("cluster CA created in %s (keep ca.key secret)\n", certs_dir.c_str());
      return 0;
    }
    auto role = security::parse_role(cert_role);
    if (!role)
      return fail(2, role.status().message());
    auto st = security::issue_certificate(certs_dir, cert_name, *role, cert_days, cert_hosts);
    if (!st)
      return fail(1, st.message());
    std::printf("issued %s/%s.crt (%s, %d days)\n", certs_dir.c_str(), cert_name.c_str(),
                cert_role.c_str(), cert_days);
    return 0;
  }
  auto heads = parse_endpoints(address);
  if (!heads)
    return fail(2, "--address: " + heads.status().message());
  const Endpoint* endpoint = &heads->front();
  if (!(timeout_s > 0))
    return fail(2, "--timeout must be > 0 seconds");
  if (*kill_cmd && kill_kind != "controller" && kill_id.empty()) {
    return fail(2, "kill " + kill_kind + " needs an ID");
  }

  // Validate a config and every argument's value before contacting anyone:
  // bad input never reaches the cluster.
  std::optional<config::DeployConfig> declared;
  std::vector<ctl::LocalLibrary> uploads;  // libraries named by a path in it
  std::optional<uint64_t> if_generation;
  if (*deploy_cmd) {
    if (!if_generation_text.empty()) {
      auto g = ctl::parse_count(if_generation_text, "--if-generation", UINT64_MAX);
      if (!g)
        return fail(1, g.status().message());
      if_generation = *g;
    }
    auto loaded = config::load_config_file(deploy_file);
    if (!loaded)
      return fail(1, loaded.status().message());
    declared = std::move(loaded.value());
    auto local = ctl::prepare_uploads(declared->state, deploy_file);
    if (!local)
      return fail(1, local.status().message());
    uploads = std::move(local.value());
    // Not an error: the rest of the file deploys as it would without them.
    if (auto ignored = config::ignored_http_fields(declared->http))
      std::fprintf(stderr, "troupectl: warning: %s\n", ignored->c_str());
  }
  std::optional<ctl::DeploymentRef> delete_ref;
  if (*delete_cmd && delete_app.find('/') != std::string::npos) {
    auto ref = ctl::parse_deployment_ref(delete_app, "APP/DEPLOYMENT");
    if (!ref)
      return fail(1, ref.status().message());
    delete_ref = *ref;
  }
  uint32_t logs_tail = 0;
  if (*logs_cmd) {
    auto n = ctl::parse_count(logs_tail_text, "--tail", 1000000);
    if (!n)
      return fail(1, n.status().message());
    logs_tail = static_cast<uint32_t>(*n);
    if (logs_target.find('#') == std::string::npos && logs_target.find('/') != std::string::npos) {
      if (auto ref = ctl::parse_deployment_ref(logs_target, "APP/DEPLOYMENT"); !ref)
        return fail(1, ref.status().message());
    }
  }
  std::map<std::string, double> traffic_weights;
  if (*traffic_cmd) {
    auto w = ctl::parse_weights(traffic_items);
    if (!w)
      return fail(1, w.status().message());
    traffic_weights = std::move(w.value());
  }
  if (*rollback_cmd) {
    if (auto name = ctl::parse_app_name(rollback_app, "APP"); !name)
      return fail(1, name.status().message());
  }
  ctl::DeploymentRef scale_ref;
  uint32_t scale_replicas = 0;
  if (*scale_cmd) {
    auto ref = ctl::parse_deployment_ref(scale_target, "APP/DEPLOYMENT");
    if (!ref)
      return fail(1, ref.status().message());
    scale_ref = *ref;
    auto n = ctl::parse_count(scale_count, "N", controller::kMaxReplicas);
    if (!n)
      return fail(1, n.status().message());
    scale_replicas = static_cast<uint32_t>(*n);
  }

  caf::actor_system_config cfg;
  configure_actor_system(cfg, TransportOptions{});
  std::optional<security::Identity> identity;
  if (!tls_dir.empty()) {
    auto files = security::find_tls_files(tls_dir, tls_name);
    if (!files)
      return fail(2, "--tls-dir: " + files.status().message());
    if (tls_name.empty()) {
      auto base = files->certificate_file.substr(files->certificate_file.rfind('/') + 1);
      tls_name = base.substr(0, base.size() - 4);  // "<name>.crt"
    }
    if (auto st = security::configure_tls(cfg, tls_dir, tls_name); !st)
      return fail(1, "--tls-dir: " + st.message());
    auto loaded = security::load_identity(tls_dir, tls_name, std::time(nullptr));
    if (!loaded)
      return fail(1, "--tls-dir: " + loaded.status().message());
    identity = std::move(loaded.value());
  }
  caf::actor_system sys{cfg};
  if (*leader_cmd) {
    auto answer = ControllerClient::leader(sys, *heads, timeout_s);
    if (!answer)
      return fail(1, answer.status().message());
    return print_leader(*answer, json_out);
  }
  auto client = ControllerClient::connect(sys, *heads, timeout_s, identity);
  if (!client) {
    if (identity) {
      // CAF says nothing about a refused TLS handshake: ask OpenSSL why.
      auto why = security::diagnose_tls(endpoint->host, endpoint->port, tls_dir, tls_name,
                                        std::chrono::milliseconds(2000));
      if (!why)
        return fail(1, client.status().message() + "; TLS: " + why.message());
    } else if (client.status().message().find("disconnect_during_handshake") !=
               std::string::npos) {
      // A TLS controller hangs up on a plain-text client mid-handshake.
      return fail(1, client.status().message() +
                         " (the controller may require TLS: give --tls-dir DIR with a "
                         "certificate of its cluster CA)");
    }
    return fail(1, client.status().message());
  }

  if (*nodes_cmd) {
    auto nodes = client->nodes();
    if (!nodes)
      return fail(1, nodes.status().message());
    print_nodes(*nodes, json_out);
    if (!json_out) {
      if (auto line = leader_line(leader_of(*client)); !line.empty())
        std::printf("\nleader: %s\n", line.c_str());
    }
    return 0;
  }
  if (*drain_cmd) {
    auto st = client->drain(drain_node);
    if (!st)
      return fail(1, st.message());
    std::string state = "DRAINING";
    if (auto nodes = client->nodes()) {
      for (const auto& n : *nodes) {
        if (n.id == drain_node)
          state = n.state;
      }
    }
    if (state == "DEAD") {
      std::printf(
          "node %s was UNREACHABLE: it is DEAD now and its replicas are replaced on "
          "other nodes; it is DRAINING if it comes back\n",
          drain_node.c_str());
    } else {
      std::printf("node %s is DRAINING\n", drain_node.c_str());
    }
    return 0;
  }
  if (*deploy_cmd) {
    for (const auto& library : uploads) {
      auto held = client->library_size(library.sha256);
      if (!held)
        return fail(1, "upload of " + library.path + " failed: " + held.status().message());
      auto sent = ctl::upload(library, *held,
                              [&](const std::string& sha256, uint64_t total, uint64_t offset,
                                  const std::string& piece) {
                                return client->upload_piece(sha256, total, offset, piece);
                              });
      if (!sent)
        return fail(1, sent.message());
      if (*held != library.bytes.size()) {
        std::printf("uploaded %s (%zu bytes, sha256 %s)\n", library.path.c_str(),
                    library.bytes.size(), library.sha256.c_str());
      }
    }
    auto result = client->apply(declared->state, if_generation);
    if (!result)
      return fail(1, result.status().message());
    auto summary = json::parse(*result);
    if (!summary.value("changed", false)) {
      std::printf("unchanged: the cluster already runs this config (generation %llu)\n",
                  static_cast<unsigned long long>(summary.value("generation", 0ULL)));
    } else {
      std::printf("accepted (generation %llu)\n",
                  static_cast<unsigned long long>(summary.value("generation", 0ULL)));
      for (const auto& [name, app] : summary.at("applications").items()) {
        for (const auto& [dep, kind] : app.at("deployments").items()) {
          std::printf("  %s/%s: %s\n", name.c_str(), dep.c_str(), kind.get<std::string>().c_str());
        }
      }
    }
    if (!wait)
      return 0;
    return wait_for(*client, declared->state, wait_timeout_s);
  }
  if (*status_cmd) {
    auto text = client->status_json();
    if (!text)
      return fail(1, text.status().message());
    auto status = json::parse(*text);
    if (!status_app.empty()) {
      if (!status["applications"].contains(status_app)) {
        return fail(1, "no application named '" + status_app + "'");
      }
      status["applications"] = json{{status_app, status["applications"][status_app]}};
    }
    auto leader = leader_of(*client);
    if (json_out) {
      if (leader.is_object())
        status["leader"] = leader["leader"];
      std::cout << status.dump(2) << "\n";
    } else {
      if (auto line = leader_line(leader); !line.empty())
        std::printf("leader: %s\n", line.c_str());
      print_status(status, true);
    }
    return 0;
  }
  if (*config_cmd) {
    auto state = client->config();
    if (!state)
      return fail(1, state.status().message());
    config::DeployConfig out;
    out.state = std::move(state.value());
    out.state.generation = 0;
    std::cout << config::to_yaml(out);
    return 0;
  }
  if (*delete_cmd && delete_ref) {
    auto st = client->delete_deployment(delete_ref->app, delete_ref->deployment);
    if (!st)
      return fail(1, st.message());
    std::printf("deployment %s/%s is being deleted\n", delete_ref->app.c_str(),
                delete_ref->deployment.c_str());
    return 0;
  }
  if (*scale_cmd) {
    auto r = client->scale(scale_ref.app, scale_ref.deployment, scale_replicas);
    if (!r)
      return fail(1, r.status().message());
    std::printf("%s: %s/%s has %u replicas as its target (generation %llu)\n",
                r->changed ? "accepted" : "unchanged", scale_ref.app.c_str(),
                scale_ref.deployment.c_str(), scale_replicas,
                static_cast<unsigned long long>(r->generation));
    return 0;
  }
  if (*traffic_cmd) {
    auto g = client->set_traffic(traffic_app, traffic_weights);
    if (!g)
      return fail(1, g.status().message());
    std::string shown;
    for (const auto& [name, weight] : traffic_weights) {
      char w[32];
      std::snprintf(w, sizeof w, "%g", weight);
      shown += (shown.empty() ? "" : ", ") + name + "=" + w;
    }
    std::printf("traffic of %s: %s (generation %llu)\n", traffic_app.c_str(), shown.c_str(),
                static_cast<unsigned long long>(*g));
    return 0;
  }
  if (*rollback_cmd) {
    auto r = client->rollback(rollback_app);
    if (!r)
      return fail(1, r.status().message());
    std::printf("rolled back %s to generation %llu's declaration (generation %llu)\n",
                rollback_app.c_str(), static_cast<unsigned long long>(r->from_generation),
                static_cast<unsigned long long>(r->generation));
    if (!wait)
      return 0;
    controller::TargetState watched;
    watched.applications[rollback_app].name = rollback_app;
    return wait_for(*client, watched, wait_timeout_s);
  }
  if (*delete_cmd) {
    auto st = client->delete_application(delete_app);
    if (!st)
      return fail(1, st.message());
    std::printf("application %s is being deleted\n", delete_app.c_str());
    return 0;
  }
  if (*shutdown_cmd) {
    auto st = client->shutdown(shutdown_nodes);
    if (!st)
      return fail(1, st.message());
    std::printf("every application is being deleted%s\n",
                shutdown_nodes ? "; the nodes stop once their replicas are gone" : "");
    return 0;
  }
  if (*logs_cmd)
    return print_logs(*client, logs_target, logs_tail, logs_follow);
  if (*kill_cmd) {
    auto st = client->kill(kill_kind, kill_id);
    if (!st)
      return fail(1, st.message());
    std::printf("sent kill to %s %s\n", kill_kind.c_str(), kill_id.c_str());
    return 0;
  }
  return fail(2, "no command given");
}
