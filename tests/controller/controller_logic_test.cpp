// The controller's state and what every call and event does to it, driven
// without the actor: the test plays the actor's part (it runs the commands
// update() returns by answering for the agents and replicas itself) on a fake
// clock. Actor handles come from actors that end as soon as they are spawned:
// only their identity matters.
#include "controller/shell/controller_logic.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include <doctest/doctest.h>

#include <set>
#include <spdlog/sinks/ostream_sink.h>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <nlohmann/json.hpp>

#include "controller/store/codec.hpp"
#include "tests/controller/fakes.hpp"
#include "tests/support/any_handle.hpp"
#include "tests/support/temp_dir.hpp"
#include "runtime/auth.hpp"
#include "runtime/security/certs.hpp"
#include "runtime/security/credentials.hpp"

using namespace troupe;
using namespace troupe::controller;
using namespace troupe::controller::testing;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

struct Fixture {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  std::shared_ptr<FakeClock> clock = std::make_shared<FakeClock>();
  std::shared_ptr<CheckpointStore> store = std::make_shared<MemoryStore>();
  std::ostringstream log_text;
  std::shared_ptr<spdlog::logger> log;
  std::vector<caf::actor> monitored;
  std::vector<caf::actor_addr> demonitored;
  ControllerOptions options;
  std::unique_ptr<ControllerLogic> logic;

  Fixture() {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(log_text);
    sink->set_pattern("%l %v");
    log = std::make_shared<spdlog::logger>("logic-test", sink);
    options.recovery_window_s = 3.0;
    options.proxy_health_period_s = 1.0;
    options.proxy_unhealthy_after = 3;
  }

  // Builds the controller; true when it waits for nodes (a checkpoint to
  // recover), else it is ready.
  bool start() {
    logic = std::make_unique<ControllerLogic>(
        options, store, clock, 0x5eed0000000000ffull,
        [this](const caf::actor& a) { monitored.push_back(a); },
        [this](const caf::actor_addr& a) { demonitored.push_back(a); }, log);
    if (logic->start())
      return true;
    auto finished = logic->finish_recovery();
    REQUIRE(finished);
    CHECK(*finished);
    return false;
  }

  test::AnyHandle handle() {
    return test::AnyHandle(sys.spawn([] {}));
  }

  ControllerLogic::Registration register_node(const std::string& id,
                                              const test::AnyHandle& agent,
                                              const std::vector<HostedReplicaInfo>& hosted = {}) {
    troupe::NodeInfo info{id, "127.0.0.1", 8001, "cpu=4", 4242, kProtocolVersion};
    auto reg = logic->register_node(info, agent, hosted, Credential{});
    REQUIRE_MESSAGE(reg, reg.status().to_string());
    return *reg;
  }

  Result<DeployResult> deploy(const ApplicationSpec& app) {
    return logic->deploy(encode_application(app), Credential{});
  }

  // One reconcile as the actor runs it: the commands with how each is to be
  // executed (what needs no message is fed back already).
  std::vector<std::pair<Command, ControllerLogic::Execution>> reconcile() {
    std::vector<std::pair<Command, ControllerLogic::Execution>> out;
    for (const auto& cmd : logic->update())
      out.emplace_back(cmd, logic->plan(cmd));
    logic->log_status_changes();
    return out;
  }
  // reconcile() without the health watches (a running replica's node is
  // told to check it at the tick after it started).
  std::vector<std::pair<Command, ControllerLogic::Execution>> reconcile_except_checks() {
    auto out = reconcile();
    out.erase(
        std::remove_if(out.begin(), out.end(),
                       [](const auto& r) { return r.first.kind == CommandKind::watch_health; }),
        out.end());
    return out;
  }

  // The starts of one reconcile (health checks left out).
  std::vector<Command> starts() {
    std::vector<Command> out;
    for (const auto& [cmd, run] : reconcile_except_checks()) {
      if (cmd.kind == CommandKind::start)
        out.push_back(cmd);
    }
    return out;
  }

  // Deploys `app` on node n1 (registered with `agent`) and answers the spawn
  // and the constructor like a replica that starts at once: its handle.
  test::AnyHandle running_replica(const test::AnyHandle& agent, std::string* replica_id) {
    register_node("n1", agent);
    REQUIRE(deploy(make_app("a", "/a", {make_deployment("D", 1)})));
    auto runs = reconcile();
    REQUIRE(runs.size() == 1);
    const auto& [cmd, run] = runs.front();
    REQUIRE(run.action == CommandAction::spawn);
    CHECK(run.agent == agent);
    auto replica = handle();
    logic->actors().remember_replica(cmd.replica_id, cmd.node_id, replica);
    logic->core().on_replica_ready(cmd.replica_id, cmd.version);
    reconcile();
    *replica_id = cmd.replica_id;
    return replica;
  }

  // Time passing as in the actor: a tick every tick_interval_s, and a
  // heartbeat from each of `beating` every 0.5 s.
  void ticks(double seconds, const std::vector<std::string>& beating = {}) {
    int steps = static_cast<int>(seconds / options.tick_interval_s + 0.5);
    for (int i = 1; i <= steps; ++i) {
      clock->advance(options.tick_interval_s);
      if (i % 5 == 0) {
        for (const auto& id : beating)
          REQUIRE(logic->heartbeat(id, {}, Credential{}).is_ok());
      }
      logic->tick();
    }
  }

  // The replicas of a/D as the status lists them: id -> state.
  std::map<std::string, std::string> replicas_of_d() const {
    std::map<std::string, std::string> out;
    auto all = status();
    for (const auto& r : all["applications"]["a"]["deployments"]["D"]["replicas"])
      out[r.value("id", "")] = r.value("state", "");
    return out;
  }

  nlohmann::json status() const { return nlohmann::json::parse(logic->status()); }

  std::string node_state(const std::string& id) const {
    for (const auto& n : logic->nodes()) {
      if (n.id == id)
        return n.state;
    }
    return "none";
  }

  std::string proxy_column(const std::string& id) const {
    for (const auto& n : logic->nodes()) {
      if (n.id == id)
        return n.proxy;
    }
    return "none";
  }
};

caf::error troupe_error(const std::string& message) {
  return to_caf_error(Status(errc::internal, message));
}

}  // namespace

TEST_CASE("logic: with nothing to recover the controller is ready at once") {
  Fixture f;
  CHECK_FALSE(f.start());
  CHECK_FALSE(f.logic->recovering());
  CHECK(f.status()["recovering"] == false);
  auto again = f.logic->finish_recovery();
  REQUIRE(again);
  CHECK_FALSE(*again);  // ended before: nothing more to do
  CHECK(f.logic->config());
  CHECK(f.logic->snapshot(0, 0));
}

TEST_CASE("logic: a stopping node leaves once its replicas run on another node") {
  Fixture f;
  f.start();
  auto a1 = f.handle();
  std::string old_id;
  f.running_replica(a1, &old_id);  // on n1
  auto a2 = f.handle();
  f.register_node("n2", a2);
  CHECK(f.logic->leave("n9", Credential{}).code() == errc::not_found);

  REQUIRE(f.logic->leave("n1", Credential{}).is_ok());
  CHECK(f.node_state("n1") == "DRAINING");
  CHECK(contains(f.log_text.str(), "node n1 is stopping: DRAINING"));
  // The replacement starts on n2; the replica on n1 serves until it runs.
  auto runs = f.reconcile_except_checks();
  REQUIRE(runs.size() == 1);
  const auto [cmd, run] = runs.front();
  CHECK(run.action == CommandAction::spawn);
  CHECK(cmd.node_id == "n2");
  CHECK(f.logic->settled_leaves().empty());
  CHECK(f.replicas_of_d()[old_id] == "RUNNING");

  f.logic->actors().remember_replica(cmd.replica_id, cmd.node_id, f.handle());
  f.logic->core().on_replica_ready(cmd.replica_id, cmd.version);
  runs = f.reconcile_except_checks();
  // Now the old one stops, and the node may go.
  REQUIRE(runs.size() == 1);
  CHECK(runs.front().first.kind == CommandKind::stop);
  CHECK(runs.front().first.replica_id == old_id);
  auto settled = f.logic->settled_leaves();
  REQUIRE(settled.size() == 1);
  CHECK(settled.front().node_id == "n1");
  CHECK(settled.front().message == "every replica runs on another node");
  CHECK(f.replicas_of_d()[cmd.replica_id] == "RUNNING");
  CHECK(f.logic->settled_leaves().empty());  // named once
}

TEST_CASE("logic: a stopping node whose replicas have nowhere to go leaves at once with them") {
  Fixture f;
  f.start();
  auto a1 = f.handle();
  std::string old_id;
  f.running_replica(a1, &old_id);  // on n1, the only node
  REQUIRE(f.logic->leave("n1", Credential{}).is_ok());
  f.reconcile_except_checks();
  auto settled = f.logic->settled_leaves();
  REQUIRE(settled.size() == 1);
  CHECK(settled.front().message ==
        "1 replicas cannot move: no other node has room for their replacements");
  // Not stopped by the controller: the node stops it itself, last.
  CHECK(f.replicas_of_d()[old_id] == "RUNNING");

  // A node that registers again is no longer leaving: ALIVE, and a leave
  // waiting for it is settled.
  auto a2 = f.handle();
  f.register_node("n2", a2);
  REQUIRE(f.logic->leave("n2", Credential{}).is_ok());
  f.register_node("n2", a2);
  CHECK(f.node_state("n2") == "ALIVE");
  settled = f.logic->settled_leaves();
  REQUIRE(settled.size() == 1);
  CHECK(settled.front().node_id == "n2");
  CHECK(settled.front().message == "the node is no longer leaving");
}

TEST_CASE("logic: the dashboard lists nodes - status with request rates - and the events") {
  Fixture f;
  f.start();
  auto a1 = f.handle();
  std::string id;
  auto replica = f.running_replica(a1, &id);
  f.logic->replica_metrics(ReplicaLoad{id, 1.0, 100});
  f.clock->advance(2.0);
  f.logic->replica_metrics(ReplicaLoad{id, 1.0, 300});
  f.logic->on_down(replica.address(), caf::exit_reason::kill, "exit_reason(kill)");
  f.reconcile_except_checks();
  auto d = nlohmann::json::parse(f.logic->dashboard());
  REQUIRE(d["nodes"].size() == 1);
  CHECK(d["nodes"][0]["id"] == "n1");
  CHECK(d["nodes"][0]["state"] == "ALIVE");
  auto& dep = d["status"]["applications"]["a"]["deployments"]["D"];
  CHECK(dep.contains("requests_per_s"));
  // The events, newest first: the crash and what it did to the status, the
  // deploy, the node.
  std::vector<std::string> kinds;
  std::string all;
  for (const auto& e : d["events"]) {
    kinds.push_back(e["kind"]);
    all += e["message"].get<std::string>() + "\n";
  }
  CAPTURE(all);
  CHECK(std::find(kinds.begin(), kinds.end(), "crash") != kinds.end());
  CHECK(contains(all, "replica " + id + " went down"));
  CHECK(contains(all, "deploy of a (generation 1)"));
  CHECK(contains(all, "node n1 joined (0 replicas)"));
  CHECK(contains(all, "deployment a/D: UPDATING -> HEALTHY"));
  CHECK(d["events"].back()["message"] == "node n1 joined (0 replicas)");  // the oldest
}

TEST_CASE("logic: a replica's load shows in status and the dashboard - rates - in flight - streams - p99 - models - restarts") {
  Fixture f;
  f.start();
  auto a1 = f.handle();
  std::string id;
  auto replica = f.running_replica(a1, &id);
  {
    auto s = nlohmann::json::parse(f.logic->status());
    auto& dep = s["applications"]["a"]["deployments"]["D"];
    CHECK(dep["p99_ms"].is_null());  // no report yet
    CHECK(dep["restarts"] == 0);
    CHECK(dep["replicas"][0]["models"] == nlohmann::json::array());
    CHECK(dep["replicas"][0]["requests_per_s"] == 0.0);
  }
  f.logic->replica_metrics(ReplicaLoad{id, 1.0, 100, 5, 0, 0.001});
  f.clock->advance(2.0);
  f.logic->replica_metrics(ReplicaLoad{id, 1.5, 300, 25, 2, 0.0042});
  f.logic->replica_models(id, 1, {"m1", "m2"});
  for (const auto& text : {f.logic->status(), f.logic->dashboard()}) {
    auto j = nlohmann::json::parse(text);
    auto& apps = j.contains("status") ? j["status"]["applications"] : j["applications"];
    auto& dep = apps["a"]["deployments"]["D"];
    CAPTURE(dep.dump());
    CHECK(dep["requests_per_s"].get<double>() == doctest::Approx(100.0));
    CHECK(dep["errors_per_s"].get<double>() == doctest::Approx(10.0));
    CHECK(dep["in_flight"].get<double>() == doctest::Approx(1.5));
    CHECK(dep["streams"] == 2);
    CHECK(dep["p99_ms"].get<double>() == doctest::Approx(4.2));
    auto& row = dep["replicas"][0];
    CHECK(row["requests_per_s"].get<double>() == doctest::Approx(100.0));
    CHECK(row["errors_per_s"].get<double>() == doctest::Approx(10.0));
    CHECK(row["streams"] == 2);
    CHECK(row["p99_ms"].get<double>() == doctest::Approx(4.2));
    CHECK(row["models"] == nlohmann::json::array({"m1", "m2"}));
  }
  // A crash counts as a restart of the deployment.
  f.logic->on_down(replica.address(), caf::exit_reason::kill, "exit_reason(kill)");
  auto s = nlohmann::json::parse(f.logic->status());
  CHECK(s["applications"]["a"]["deployments"]["D"]["restarts"] == 1);
}

TEST_CASE("logic: a heartbeat carries its node's load reports - applied only from a known node") {
  Fixture f;
  f.start();
  auto a1 = f.handle();
  std::string id;
  f.running_replica(a1, &id);
  auto requests_per_s = [&] {
    auto s = nlohmann::json::parse(f.logic->status());
    return s["applications"]["a"]["deployments"]["D"]["requests_per_s"].get<double>();
  };
  REQUIRE(f.logic->heartbeat("n1", {ReplicaLoad{id, 1.0, 100}}, Credential{}).is_ok());
  f.clock->advance(2.0);
  REQUIRE(f.logic->heartbeat("n1", {ReplicaLoad{id, 1.0, 300}}, Credential{}).is_ok());
  CHECK(requests_per_s() == doctest::Approx(100.0));
  // A node the controller does not know is told so, and what it carried is
  // not taken (it registers again, and its replicas report again).
  f.clock->advance(2.0);
  CHECK(f.logic->heartbeat("n9", {ReplicaLoad{id, 1.0, 10300}}, Credential{}).code() ==
        errc::not_found);
  CHECK(requests_per_s() == doctest::Approx(100.0));
}

TEST_CASE("logic: a registered node is ALIVE - it heartbeats - drains and leaves") {
  Fixture f;
  f.start();
  auto agent = f.handle();
  auto reg = f.register_node("n1", agent);
  CHECK(reg.incarnation == 1);
  CHECK_FALSE(reg.recovery_complete);
  CHECK(f.logic->actors().agent("n1") == agent);
  CHECK(std::count(f.monitored.begin(), f.monitored.end(), agent) == 1);
  CHECK(f.node_state("n1") == "ALIVE");
  CHECK(f.proxy_column("n1") == "NONE");
  CHECK(contains(f.log_text.str(),
                 "info node n1 registered (pid 4242, 127.0.0.1:8001, cpu=4, 0 "
                 "replicas)"));
  CHECK(f.logic->heartbeat("n1", {}, Credential{}).is_ok());
  CHECK(f.logic->heartbeat("n9", {}, Credential{}).code() == errc::not_found);
  f.reconcile();  // as the actor does at the start: the first snapshot
  auto seq_before = f.logic->core().snapshot_id().seq;
  REQUIRE(seq_before > 0);
  CHECK(f.logic->drain("n1", Credential{}).is_ok());
  CHECK(f.node_state("n1") == "DRAINING");
  // A new snapshot although no deployment changed: it names the drained
  // node, whose proxy then reports itself not ready.
  CHECK(f.logic->core().snapshot_id().seq > seq_before);
  auto snap = f.logic->snapshot(0, 0);
  REQUIRE(snap);
  CHECK(snap->draining_nodes == std::vector<std::string>{"n1"});
  auto seq_drained = f.logic->core().snapshot_id().seq;
  CHECK(f.register_node("n1", agent).incarnation == 2);
  // A registration that changes no node's listing is no new snapshot (no
  // push to every subscriber per node that joins).
  CHECK(f.logic->core().snapshot_id().seq == seq_drained);
  CHECK(contains(f.log_text.str(), "node n1 re-registered"));
  CHECK(f.node_state("n1") == "DRAINING");  // the operator's, kept across reconnects
  CHECK(f.logic->deregister("n1", Credential{}).is_ok());
  CHECK(f.node_state("n1") == "none");
  CHECK_FALSE(f.logic->actors().agent("n1"));
  REQUIRE(f.demonitored.size() == 1);
  CHECK(f.demonitored.front() == agent.address());
  CHECK(f.logic->deregister("n1", Credential{}).code() == errc::not_found);
}

TEST_CASE("logic: a refused registration changes nothing") {
  Fixture f;
  f.start();
  troupe::NodeInfo info{"n1", "127.0.0.1", 8001, "cpu=4", 4242, kProtocolVersion};
  auto reg = f.logic->register_node(info, AgentActor{}, {}, Credential{});
  REQUIRE_FALSE(reg);
  CHECK(reg.status().message() == "no agent handle given");
  CHECK(f.logic->nodes().empty());
  CHECK(f.monitored.empty());
}

TEST_CASE("logic: a deploy becomes a start on the node's agent") {
  Fixture f;
  f.start();
  auto agent = f.handle();
  f.register_node("n1", agent);
  auto app = make_app("a", "/a", {make_deployment("D", 1)});
  auto first = f.deploy(app);
  REQUIRE_MESSAGE(first, first.status().to_string());
  CHECK(first->changed);
  CHECK(first->generation == 1);
  auto runs = f.reconcile();
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].first.kind == CommandKind::start);
  CHECK(runs[0].first.node_id == "n1");
  CHECK(runs[0].second.action == CommandAction::spawn);
  CHECK(runs[0].second.agent == agent);
  CHECK(contains(runs[0].first.replica_id, "#5eed00-"));  // the incarnation's tag
  auto same = f.deploy(app);
  REQUIRE(same);
  CHECK_FALSE(same->changed);
  CHECK(contains(f.log_text.str(), "info deploy of a: unchanged (generation 1)"));
  CHECK(f.logic->deploy("not a record", Credential{}).status().code() != errc::ok);
}

TEST_CASE("logic: an agent that died alone leaves its node ALIVE - starts there fail at once") {
  Fixture f;
  f.start();
  auto agent = f.handle();
  f.register_node("n1", agent);
  CHECK_FALSE(f.logic->on_down(agent.address(), caf::exit_reason::kill, "killed"));
  CHECK(f.node_state("n1") == "ALIVE");
  CHECK(contains(f.log_text.str(), "warning lost the node agent of n1: killed"));
  CHECK(contains(f.log_text.str(), "node n1 still connected; waiting for its new agent"));
  REQUIRE(f.deploy(make_app("a", "/a", {make_deployment("D", 1)})));
  auto runs = f.reconcile();
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].second.action == CommandAction::no_agent);
  // Every retry fails the same way (what needs no message is fed back at
  // once), until the core gives the deployment up with that error.
  nlohmann::json d;
  for (int i = 0; i < 100 && d["status"] != "DEPLOY_FAILED"; ++i) {
    f.clock->advance(1.0);
    for (const auto& [cmd, run] : f.reconcile())
      CHECK(run.action != CommandAction::spawn);
    d = f.status()["applications"]["a"]["deployments"]["D"];
  }
  CHECK(d["status"] == "DEPLOY_FAILED");
  CHECK_MESSAGE(contains(d["message"], "Error:\nnode n1 has no agent connected"), d.dump());
}

TEST_CASE("logic: an agent whose connection drops takes its node down - a late notice does not") {
  Fixture f;
  f.start();
  auto old_agent = f.handle();
  auto agent = f.handle();
  f.register_node("n1", old_agent);
  f.register_node("n1", agent);  // a new connection before the old one's notice
  CHECK_FALSE(
      f.logic->on_down(old_agent.address(), caf::exit_reason::remote_link_unreachable, "lost"));
  CHECK(f.node_state("n1") == "ALIVE");
  CHECK(f.logic->on_down(agent.address(), caf::exit_reason::remote_link_unreachable, "lost"));
  CHECK(f.node_state("n1") == "DEAD");
  CHECK(contains(f.log_text.str(), "warning node n1 ALIVE -> DEAD"));
}

TEST_CASE("logic: a replica's crash reaches the core with its cause - a stop is a stop") {
  Fixture f;
  f.start();
  std::string id;
  auto replica = f.running_replica(f.handle(), &id);
  CHECK(f.status()["applications"]["a"]["deployments"]["D"]["replicas"][0]["state"] == "RUNNING");
  CHECK(f.logic->on_down(replica.address(),
                         troupe_error("replica " + id + " exited: killed by SIGSEGV"), "?"));
  CHECK(contains(f.log_text.str(), "warning replica " + id + " went down: replica " + id +
                                       " exited: killed by SIGSEGV"));
  auto runs = f.reconcile();  // the core replaces it
  auto d = f.status()["applications"]["a"]["deployments"]["D"];
  CHECK(d["status"] == "UNHEALTHY");
  CHECK_MESSAGE(contains(d["message"], "replica " + id + " exited: killed by SIGSEGV"), d.dump());
  // Making sure the old one is gone, and a new one.
  runs.erase(std::remove_if(runs.begin(), runs.end(),
                            [](const auto& r) { return r.first.kind != CommandKind::start; }),
             runs.end());
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].first.replica_id != id);

  // The replacement runs; a delete stops it through its agent, and its down
  // is then the stop.
  auto replacement = f.handle();
  f.logic->actors().remember_replica(runs[0].first.replica_id, "n1", replacement);
  f.logic->core().on_replica_ready(runs[0].first.replica_id, runs[0].first.version);
  f.reconcile();
  REQUIRE(f.logic->delete_application("a", Credential{}).is_ok());
  auto stops = f.reconcile_except_checks();
  REQUIRE(stops.size() == 1);
  CHECK(stops[0].first.kind == CommandKind::stop);
  CHECK(stops[0].second.action == CommandAction::stop_via_agent);
  CHECK(stops[0].second.replica == replacement);
  CHECK(f.logic->on_down(replacement.address(), caf::exit_reason::user_shutdown, "stopped"));
  CHECK_FALSE(contains(f.log_text.str(), "replica " + runs[0].first.replica_id + " went down"));
  f.reconcile();
  CHECK(f.logic->core().target_state().applications.empty());
  CHECK(f.status()["applications"].empty());
}

TEST_CASE("logic: health reports count only from the node that hosts the replica") {
  Fixture f;
  f.start();
  f.register_node("n1", f.handle());
  REQUIRE(f.deploy(make_app("a", "/a", {make_deployment("D", 1)})));
  auto runs = f.reconcile();
  REQUIRE(runs.size() == 1);
  const Command start = runs.front().first;
  REQUIRE(start.node_id == "n1");
  f.logic->actors().remember_replica(start.replica_id, "n1", f.handle());
  f.logic->core().on_replica_ready(start.replica_id, start.version);
  uint64_t watch = 0;  // its node is told to check it at the tick after it runs
  for (int tick = 0; tick < 2; ++tick) {
    for (const auto& [cmd, run] : f.reconcile()) {
      if (cmd.kind == CommandKind::watch_health && cmd.replica_id == start.replica_id)
        watch = cmd.check_seq;
    }
  }
  REQUIRE(watch != 0);
  f.register_node("n2", f.handle());
  const std::vector<HealthReport> failing = {{start.replica_id, watch, 0, 3, "stuck"},
                                             {"a#D#nobody-9", 1, 0, 3, "stuck"}};
  auto stops = [&] {
    int n = 0;
    for (const auto& [cmd, run] : f.reconcile_except_checks())
      n += (cmd.kind == CommandKind::stop || cmd.kind == CommandKind::kill) &&
           cmd.replica_id == start.replica_id;
    return n;
  };
  // n2 does not host it: ignored, and said once for the message.
  f.logic->health_reports("n2", failing);
  CHECK(stops() == 0);
  CHECK(f.replicas_of_d().at(start.replica_id) == "RUNNING");
  CHECK(contains(f.log_text.str(),
                 "warning ignored 2 health report(s) from node n2 on replicas "
                 "it does not host, e.g. " +
                     start.replica_id + " (on node n1)"));
  // Its own node's report of the same failures replaces it.
  f.logic->health_reports("n1", failing);
  CHECK(stops() == 1);
  CHECK(contains(f.log_text.str(), "health check of " + start.replica_id + " failed: stuck"));
}

TEST_CASE("logic: after a restart registrations are collected until every known node is back") {
  Fixture f;
  troupe::testing::TempDir dir;
  f.options.state_dir = dir.path();
  NodesFile before(dir.path());
  NodeRecord n1, n2;
  n1.id = "n1";
  n2.id = "n2";
  REQUIRE(before.save({{"n1", n1}, {"n2", n2}}));
  TargetState saved;
  saved.generation = 4;
  saved.applications["a"] = make_app("a", "/a", {make_deployment("D", 1)});
  saved.http.request_timeout_s = 1.5;
  saved.http.keep_alive_timeout_s = 7;
  std::static_pointer_cast<MemoryStore>(f.store)->saved = saved;
  CHECK(f.start());
  CHECK(f.logic->recovering());
  CHECK(contains(f.log_text.str(), "checkpoint found; collecting hosted replicas from 2 known"));
  // User calls and pulls wait; so do pushes.
  CHECK(f.deploy(make_app("b", "/b", {make_deployment("E", 1)})).status().code() ==
        errc::unavailable);
  CHECK(f.logic->snapshot(0, 0).status().code() == errc::unavailable);
  CHECK_FALSE(f.logic->subscribe(f.handle(), SnapshotId{}, "n1"));
  CHECK(f.logic->update().empty());

  HostedReplicaInfo h;
  h.replica_id = "a#D#old-1";
  h.app = "a";
  h.deployment = "D";
  h.handle = f.handle();
  CHECK_FALSE(f.register_node("n1", f.handle(), {h}).recovery_complete);
  CHECK(f.logic->recovering());
  CHECK(f.register_node("n2", f.handle()).recovery_complete);
  auto finished = f.logic->finish_recovery();
  REQUIRE(finished);
  CHECK(*finished);
  CHECK(f.status()["recovering"] == false);
  // The predecessor's replica is adopted: asked what it runs, not replaced.
  auto runs = f.reconcile();
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].first.kind == CommandKind::recover);
  CHECK(runs[0].first.replica_id == "a#D#old-1");
  CHECK(runs[0].second.action == CommandAction::query_version);
  CHECK(runs[0].second.replica == h.handle);
  // The checkpoint's http settings are in force again: the proxy that
  // subscribed while the controller recovered gets them with the first push.
  CHECK(f.logic->request_timeout_s() == 1.5);
  auto pushes = f.logic->due_pushes();
  REQUIRE(pushes.size() == 1);
  CHECK(pushes[0].snapshot->full);
  CHECK(pushes[0].snapshot->request_timeout_s == 1.5);
  CHECK(pushes[0].snapshot->keep_alive_timeout_s == 7);
}

namespace {

// The live nodes' list kept outside the state dir (a head candidate's, in
// etcd: node/ha_head.cpp), whose writes fail while `fail` is set (etcd
// without a quorum).
struct StoredList {
  std::string stored;
  bool fail = false;
  int writes = 0;

  ControllerOptions::NodesList list() {
    return {"etcd key /troupe/nodes", [this] { return stored; },
            [this](const std::string& content) {
              ++writes;
              if (fail)
                return false;
              stored = content;
              return true;
            }};
  }
};

TargetState one_application() {
  TargetState saved;
  saved.generation = 3;
  saved.applications["a"] = make_app("a", "/a", {make_deployment("D", 1)});
  return saved;
}

}  // namespace

TEST_CASE(
    "logic: a nodes list write that failed is retried on the tick - the next start awaits every "
    "live node") {
  StoredList etcd;
  etcd.stored = "n1\n";
  Fixture f;
  f.options.nodes_list = etcd.list();
  std::static_pointer_cast<MemoryStore>(f.store)->saved = one_application();
  CHECK(f.start());
  CHECK(contains(f.log_text.str(), "from 1 known nodes"));
  etcd.fail = true;
  // n2 joins while the controller recovers: not awaited, but live.
  CHECK_FALSE(f.register_node("n2", f.handle()).recovery_complete);
  CHECK(f.register_node("n1", f.handle()).recovery_complete);
  REQUIRE(f.logic->finish_recovery());
  CHECK(etcd.stored == "n1\n");
  CHECK(contains(f.log_text.str(), "cannot write etcd key /troupe/nodes"));
  f.register_node("n3", f.handle());
  CHECK(etcd.stored == "n1\n");
  // Tried again on the tick, not on every one.
  const std::vector<std::string> beating{"n1", "n2", "n3"};
  int tried = etcd.writes;
  f.ticks(0.5, beating);
  CHECK(etcd.writes == tried);
  f.ticks(1.0, beating);
  CHECK(etcd.writes == tried + 1);
  CHECK(etcd.stored == "n1\n");
  etcd.fail = false;
  f.ticks(1.5, beating);
  CHECK(etcd.stored == "n1\nn2\nn3\n");
  CHECK(contains(f.log_text.str(), "wrote etcd key /troupe/nodes again: 3 live nodes"));
  int written = etcd.writes;
  f.ticks(3.0, beating);
  CHECK(etcd.writes == written);  // written once: nothing more to do

  // The next controller (another head's, after a failover) waits for all
  // three: none of their replicas is started anew while one is missing.
  Fixture g;
  g.store = f.store;
  g.options.nodes_list = etcd.list();
  CHECK(g.start());
  CHECK(contains(g.log_text.str(), "from 3 known nodes"));
  CHECK_FALSE(g.register_node("n1", g.handle()).recovery_complete);
  CHECK_FALSE(g.register_node("n3", g.handle()).recovery_complete);
  CHECK(g.logic->recovering());
  CHECK(g.register_node("n2", g.handle()).recovery_complete);
}

TEST_CASE("logic: a nodes file that could not be written is written on a later tick") {
  troupe::testing::TempDir dir;
  const std::string path = dir.path() + "/nodes";
  Fixture f;
  f.options.state_dir = dir.path();
  CHECK_FALSE(f.start());
  // The file is replaced through nodes.tmp: a directory there fails the write.
  std::filesystem::create_directory(path + ".tmp");
  f.register_node("n1", f.handle());
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK(contains(f.log_text.str(), "cannot write " + path));
  std::filesystem::remove(path + ".tmp");
  f.ticks(1.5, {"n1"});
  REQUIRE(std::filesystem::exists(path));
  std::ifstream in(path);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(content == "n1\n");
  CHECK(NodesFile(dir.path()).load() == std::set<std::string>{"n1"});
}

TEST_CASE("logic: the recovery window ends the recovery when a node does not come back") {
  Fixture f;
  TargetState saved;
  saved.generation = 1;
  std::static_pointer_cast<MemoryStore>(f.store)->saved = saved;
  CHECK(f.start());
  f.clock->advance(2.9);
  CHECK_FALSE(f.logic->tick());
  f.clock->advance(0.1);
  CHECK(f.logic->tick());
  REQUIRE(f.logic->finish_recovery());
  CHECK_FALSE(f.logic->recovering());
  CHECK_FALSE(f.logic->tick());
}

TEST_CASE("logic: a checkpoint that cannot be recovered stops the controller") {
  Fixture f;
  f.store = std::make_shared<CorruptStore>();
  CHECK(f.start());  // unreadable is not empty: the recovery goes on
  auto finished = f.logic->finish_recovery();
  REQUIRE_FALSE(finished);
  CHECK(finished.status().code() == errc::corrupt);
  CHECK(contains(f.log_text.str(), "critical cannot recover:"));
  CHECK(f.logic->recovering());
}

TEST_CASE("logic: silent nodes turn DEAD on the tick") {
  Fixture f;
  f.options.node_timeout_s = 5.0;
  f.start();
  f.register_node("n1", f.handle());
  f.ticks(4.0);
  REQUIRE(f.logic->heartbeat("n1", {}, Credential{}).is_ok());
  f.ticks(4.0);
  CHECK(f.node_state("n1") == "ALIVE");
  f.ticks(1.5);
  CHECK(f.node_state("n1") == "DEAD");
}

TEST_CASE("logic: after its own pause the controller declares no node DEAD and replaces no replica") {
  Fixture f;
  f.options.node_timeout_s = 2.0;
  f.options.pause_grace_s = 10.0;
  f.start();
  std::string id;
  auto agent = f.handle();
  auto replica = f.running_replica(agent, &id);  // on n1
  f.register_node("n2", f.handle());
  f.ticks(1.0, {"n1", "n2"});
  REQUIRE(f.replicas_of_d() == std::map<std::string, std::string>{{id, "RUNNING"}});

  // Stopped for 10 s. Meanwhile n1 gave up its connection: on the resume the
  // controller learns that its agent and replica went down with it.
  f.clock->advance(10.0);
  CHECK_FALSE(
      f.logic->on_down(agent.address(), caf::exit_reason::remote_link_unreachable, "lost"));
  CHECK(contains(f.log_text.str(), "the controller made no progress for 10.0 s"));
  CHECK_FALSE(
      f.logic->on_down(replica.address(), caf::exit_reason::remote_link_unreachable, "lost"));
  CHECK(contains(f.log_text.str(), "replica " + id + " went down with the connection to node n1"));
  // Nine seconds of the grace, reconciling as the actor does: its node
  // checks it, nothing starts.
  for (int s = 0; s < 9; ++s) {
    f.ticks(1.0, {"n2"});
    for (const auto& [cmd, run] : f.reconcile()) {
      CHECK_MESSAGE(cmd.kind != CommandKind::start, cmd.replica_id);
      // Only its first watch, held for the node, which gets it again when
      // it registers.
      if (cmd.replica_id == id) {
        CHECK(cmd.kind == CommandKind::watch_health);
        CHECK(run.action == CommandAction::awaiting_node);
      }
    }
  }
  CHECK(f.node_state("n1") == "ALIVE");
  CHECK(f.node_state("n2") == "ALIVE");
  CHECK(f.replicas_of_d() == std::map<std::string, std::string>{{id, "RUNNING"}});

  // n1 reconnects and registers again with its replica: the same replica,
  // with its new handle; nothing is started or stopped.
  HostedReplicaInfo h;
  h.replica_id = id;
  h.app = "a";
  h.deployment = "D";
  h.handle = f.handle();
  auto seq_before = f.logic->core().snapshot_id().seq;
  f.register_node("n1", f.handle(), {h});
  CHECK(contains(f.log_text.str(), "replica " + id + " is back with its node n1"));
  // Proxies get its set again, with the new handle (the snapshots of the
  // grace lacked it).
  auto delta = f.logic->core().changes_since({f.logic->core().snapshot_id().epoch, seq_before});
  REQUIRE(delta);
  REQUIRE(delta->deployments.size() == 1);
  CHECK(delta->deployments[0].replicas.size() == 1);
  // Its node starts its checks over: the watch goes to it again.
  size_t watches = 0;
  for (const auto& [cmd, run] : f.reconcile()) {
    CHECK_MESSAGE(cmd.kind != CommandKind::start, cmd.replica_id);
    CHECK_MESSAGE(cmd.kind != CommandKind::stop, cmd.replica_id);
    if (cmd.kind == CommandKind::watch_health) {
      CHECK(cmd.replica_id == id);
      CHECK(cmd.node_id == "n1");
      CHECK(run.action == CommandAction::watch_health);
      ++watches;
    }
  }
  CHECK(watches == 1);
  f.ticks(15.0, {"n1", "n2"});
  CHECK(f.node_state("n1") == "ALIVE");
  CHECK(f.node_state("n2") == "ALIVE");
  CHECK(f.replicas_of_d() == std::map<std::string, std::string>{{id, "RUNNING"}});
  CHECK_FALSE(contains(f.log_text.str(), "-> DEAD"));
  CHECK_FALSE(contains(f.log_text.str(), "went down: "));
}

TEST_CASE("logic: after a pause a replica its node does not report again is replaced") {
  Fixture f;
  f.options.node_timeout_s = 2.0;
  f.start();
  std::string id;
  auto agent = f.handle();
  auto replica = f.running_replica(agent, &id);
  f.ticks(1.0, {"n1"});
  f.clock->advance(10.0);
  f.logic->on_down(agent.address(), caf::exit_reason::remote_link_unreachable, "lost");
  f.logic->on_down(replica.address(), caf::exit_reason::remote_link_unreachable, "lost");
  f.register_node("n1", f.handle());  // back, without it (it died meanwhile)
  CHECK(contains(f.log_text.str(), "replica " + id + " was not reported by node n1"));
  size_t starts = 0;
  for (const auto& [cmd, run] : f.reconcile_except_checks()) {
    if (cmd.kind == CommandKind::start) {
      ++starts;
      CHECK(cmd.replica_id != id);
    }
  }
  CHECK(starts == 1);
}

TEST_CASE("logic: after a pause a node that does not come back is DEAD when the grace ends") {
  Fixture f;
  f.options.node_timeout_s = 2.0;
  f.options.pause_grace_s = 10.0;
  f.start();
  std::string id;
  auto agent = f.handle();
  auto replica = f.running_replica(agent, &id);
  f.register_node("n2", f.handle());
  f.ticks(1.0, {"n1", "n2"});
  f.clock->advance(10.0);
  f.logic->on_down(agent.address(), caf::exit_reason::remote_link_unreachable, "lost");
  f.logic->on_down(replica.address(), caf::exit_reason::remote_link_unreachable, "lost");
  f.ticks(9.8, {"n2"});
  CHECK(f.node_state("n1") == "ALIVE");
  f.ticks(0.4, {"n2"});
  CHECK(f.node_state("n1") == "DEAD");
  CHECK(contains(f.log_text.str(), "did not register again within 10.0 s of the controller's resume"));
  // Its replica is replaced like any on a DEAD node.
  auto starts = f.starts();
  REQUIRE(starts.size() == 1);
  CHECK(starts[0].node_id == "n2");
}

TEST_CASE("logic: without a pause a dropped connection still takes its node down at once") {
  Fixture f;
  f.options.node_timeout_s = 2.0;
  f.start();
  auto agent = f.handle();
  f.register_node("n1", agent);
  f.ticks(1.0, {"n1"});
  f.clock->advance(0.4);  // less than a quarter of the node timeout
  CHECK(f.logic->on_down(agent.address(), caf::exit_reason::remote_link_unreachable, "lost"));
  CHECK(f.node_state("n1") == "DEAD");
  CHECK_FALSE(contains(f.log_text.str(), "made no progress"));
}

TEST_CASE("logic: subscribers get what changed - and all of it after new http settings") {
  Fixture f;
  f.start();
  std::string id;
  auto replica = f.running_replica(f.handle(), &id);
  auto proxy = f.handle();
  CHECK(f.logic->subscribe(proxy, SnapshotId{}, "n1"));
  CHECK(f.proxy_column("n1") == "STARTING");
  auto pushes = f.logic->due_pushes();
  REQUIRE(pushes.size() == 1);
  CHECK(pushes[0].to == proxy);
  CHECK(pushes[0].snapshot->full);
  REQUIRE(pushes[0].snapshot->deployments.size() == 1);
  REQUIRE(pushes[0].snapshot->deployments[0].replicas.size() == 1);
  CHECK(pushes[0].snapshot->request_timeout_s == 0);
  CHECK(pushes[0].snapshot->keep_alive_timeout_s == 0);
  CHECK(f.logic->due_pushes().empty());  // in flight
  f.logic->push_done(pushes[0].key, pushes[0].push, true);
  CHECK(f.logic->due_pushes().empty());  // current

  // The same applications with http settings: a new generation of the
  // target state (written ahead, so a restart keeps them), the same routes;
  // every proxy must learn the timeouts.
  TargetState declared = f.logic->core().target_state();
  declared.http.request_timeout_s = 30;
  declared.http.keep_alive_timeout_s = 75;
  auto json = f.logic->apply(encode_target_state(declared), Credential{});
  REQUIRE_MESSAGE(json, json.status().to_string());
  CHECK(nlohmann::json::parse(*json)["changed"] == true);
  CHECK(f.logic->core().target_state().http == declared.http);
  CHECK(f.logic->request_timeout_s() == 30);
  pushes = f.logic->due_pushes();
  REQUIRE(pushes.size() == 1);
  CHECK(pushes[0].snapshot->full);
  CHECK(pushes[0].snapshot->request_timeout_s == 30);
  CHECK(pushes[0].snapshot->keep_alive_timeout_s == 75);
  f.logic->push_done(pushes[0].key, pushes[0].push, true);
  CHECK(f.logic->due_pushes().empty());
  // Declaring them again changes nothing.
  json = f.logic->apply(encode_target_state(declared), Credential{});
  REQUIRE_MESSAGE(json, json.status().to_string());
  CHECK(nlohmann::json::parse(*json)["changed"] == false);
  CHECK(f.logic->due_pushes().empty());
  // A pull of an older id gets what changed since.
  auto pulled = f.logic->snapshot(0, 0);
  REQUIRE(pulled);
  CHECK(pulled->request_timeout_s == 30);
  CHECK(pulled->keep_alive_timeout_s == 75);
  CHECK(f.logic->subscribe(ProxyActor{}, SnapshotId{}, "n1") == false);
}

TEST_CASE("logic: one push in flight per subscriber - one delta of all it missed after the answer - in full after a failure") {
  Fixture f;
  f.start();
  std::string id;
  auto replica = f.running_replica(f.handle(), &id);
  // Another application whose one replica starts at once: a new published view.
  auto run_app = [&](const std::string& name) {
    REQUIRE(f.deploy(make_app(name, "/" + name, {make_deployment("E", 1)})));
    auto runs = f.reconcile_except_checks();
    REQUIRE(runs.size() == 1);
    REQUIRE(runs[0].second.action == CommandAction::spawn);
    f.logic->actors().remember_replica(runs[0].first.replica_id, runs[0].first.node_id,
                                       f.handle());
    f.logic->core().on_replica_ready(runs[0].first.replica_id, runs[0].first.version);
    f.reconcile();
  };
  auto quick = f.handle();
  auto failing = f.handle();
  CHECK(f.logic->subscribe(quick, SnapshotId{}, "n1"));
  CHECK(f.logic->subscribe(failing, SnapshotId{}, "n2"));
  auto first = f.logic->due_pushes();
  REQUIRE(first.size() == 2);
  CHECK(first[0].snapshot->full);
  CHECK(first[1].snapshot->full);
  CHECK(first[0].push != first[1].push);
  // Two changes while both pushes wait for their answers: nothing is sent.
  run_app("b");
  CHECK(f.logic->due_pushes().empty());
  run_app("c");
  CHECK(f.logic->due_pushes().empty());
  // An answer to an unknown push changes nothing.
  f.logic->push_done(first[0].key, first[0].push + first[1].push, true);
  CHECK(f.logic->due_pushes().empty());
  for (const auto& p : first) {
    f.logic->push_done(p.key, p.push, p.to == quick);
  }
  auto next = f.logic->due_pushes();
  REQUIRE(next.size() == 2);
  for (const auto& p : next) {
    CAPTURE(p.snapshot->full);
    if (p.to == quick) {
      // One delta: both applications that came meanwhile, nothing else.
      CHECK_FALSE(p.snapshot->full);
      REQUIRE(p.snapshot->deployments.size() == 2);
      CHECK(p.snapshot->deployments[0].app == "b");
      CHECK(p.snapshot->deployments[1].app == "c");
    } else {
      // Its last push may be lost: everything again.
      CHECK(p.to == failing);
      CHECK(p.snapshot->full);
      CHECK(p.snapshot->deployments.size() == 3);
    }
    f.logic->push_done(p.key, p.push, true);
  }
  CHECK(f.logic->due_pushes().empty());  // both current
}

TEST_CASE("logic: pushes in flight stay within the budget - the rest wait for answers - one always goes") {
  Fixture f;
  f.options.push_budget_entries = 3;
  f.start();
  std::string id;
  f.running_replica(f.handle(), &id);
  auto a = f.handle();
  auto b = f.handle();
  auto c = f.handle();
  for (const auto& proxy : {a, b, c})
    CHECK(f.logic->subscribe(proxy, SnapshotId{}, "n1"));
  // A full push lists the replica: weight 2. Two would be 4 > 3.
  auto first = f.logic->due_pushes();
  REQUIRE(first.size() == 1);
  REQUIRE(first[0].snapshot->deployments.size() == 1);
  CHECK(first[0].snapshot->deployments[0].replicas.size() == 1);
  CHECK(f.logic->due_pushes().empty());  // the others wait
  f.logic->push_done(first[0].key, first[0].push, true);
  auto second = f.logic->due_pushes();
  REQUIRE(second.size() == 1);
  CHECK(second[0].to != first[0].to);
  // A failed push frees its share of the budget too.
  f.logic->push_done(second[0].key, second[0].push, false);
  auto third = f.logic->due_pushes();
  REQUIRE(third.size() == 1);
  CHECK(f.logic->due_pushes().empty());
  f.logic->push_done(third[0].key, third[0].push, true);
  auto last = f.logic->due_pushes();
  REQUIRE(last.size() == 1);
  f.logic->push_done(last[0].key, last[0].push, true);
  CHECK(f.logic->due_pushes().empty());
  // Every subscriber got its snapshot, the one whose push failed again.
  std::set<caf::actor_addr> served{first[0].to.address(), third[0].to.address(),
                                   last[0].to.address()};
  CHECK(served == std::set<caf::actor_addr>{a.address(), b.address(), c.address()});
  CHECK((third[0].to == second[0].to || last[0].to == second[0].to));

  // A budget smaller than one push: it still goes when nothing is in flight.
  Fixture g;
  g.options.push_budget_entries = 1;
  g.start();
  g.running_replica(g.handle(), &id);
  CHECK(g.logic->subscribe(g.handle(), SnapshotId{}, "n1"));
  CHECK(g.logic->subscribe(g.handle(), SnapshotId{}, "n1"));
  CHECK(g.logic->due_pushes().size() == 1);
}

TEST_CASE(
    "logic: a snapshot held back by the push budget is the one rendered before - new http settings "
    "render anew") {
  Fixture f;
  f.options.push_budget_entries = 3;
  f.start();
  std::string id;
  f.running_replica(f.handle(), &id);
  auto a = f.handle();
  auto b = f.handle();
  // Nothing yet, and a position of another controller's epoch: both are due
  // the whole view, so both get one object (one message, one serialization).
  CHECK(f.logic->subscribe(a, SnapshotId{}, "n1"));
  CHECK(f.logic->subscribe(b, SnapshotId{f.logic->core().snapshot_id().epoch + 1, 7}, "n1"));
  auto first = f.logic->due_pushes();
  REQUIRE(first.size() == 1);
  CHECK(first[0].snapshot->full);
  CHECK(f.logic->due_pushes().empty());  // the budget holds the other back
  f.logic->push_done(first[0].key, first[0].push, true);
  auto second = f.logic->due_pushes();
  REQUIRE(second.size() == 1);
  CHECK(second[0].to != first[0].to);
  CHECK(second[0].snapshot == first[0].snapshot);
  f.logic->push_done(second[0].key, second[0].push, true);
  CHECK(f.logic->due_pushes().empty());

  // New http settings: the same snapshot id, but every subscriber is due the
  // whole view again with the new timeouts, rendered anew.
  TargetState declared = f.logic->core().target_state();
  declared.http.request_timeout_s = 30;
  auto json = f.logic->apply(encode_target_state(declared), Credential{});
  REQUIRE_MESSAGE(json, json.status().to_string());
  auto third = f.logic->due_pushes();
  REQUIRE(third.size() == 1);
  CHECK(third[0].snapshot != first[0].snapshot);
  CHECK(third[0].snapshot->full);
  CHECK(third[0].snapshot->request_timeout_s == 30);
  CHECK(first[0].snapshot->request_timeout_s == 0);
  f.logic->push_done(third[0].key, third[0].push, true);
  auto fourth = f.logic->due_pushes();
  REQUIRE(fourth.size() == 1);
  CHECK(fourth[0].snapshot == third[0].snapshot);
}

TEST_CASE("logic: a proxy that fails its health checks is named for a kill at the limit") {
  Fixture f;
  f.start();
  f.register_node("n1", f.handle());
  auto proxy = f.handle();
  f.logic->subscribe(proxy, SnapshotId{}, "n1");
  auto due = f.logic->due_proxy_checks();
  REQUIRE(due.size() == 1);
  CHECK(due[0].second == proxy);
  auto key = due[0].first;
  CHECK_FALSE(f.logic->settle_proxy_check(key, true, ""));
  CHECK(f.proxy_column("n1") == "HEALTHY");
  CHECK(f.logic->due_proxy_checks().empty());  // not before its period
  for (int failure = 1; failure <= 3; ++failure) {
    f.clock->advance(1.0);
    REQUIRE(f.logic->due_proxy_checks().size() == 1);
    auto kill = f.logic->settle_proxy_check(key, false, "io thread 0 has not run for 6.0 s");
    CHECK(static_cast<bool>(kill) == (failure == 3));
    if (kill)
      CHECK(kill == proxy);
  }
  CHECK(contains(f.log_text.str(),
                 "warning proxy of node n1 failed a health check (1 of 3): io "
                 "thread 0 has not run for 6.0 s"));
  CHECK(contains(f.log_text.str(), "proxy of node n1 is UNHEALTHY after 3 failed health checks"));
  CHECK(f.proxy_column("n1") == "UNHEALTHY");
  // Killed: its down notice drops it.
  CHECK_FALSE(f.logic->on_down(proxy.address(), caf::exit_reason::kill, "killed"));
  CHECK(f.proxy_column("n1") == "NONE");
}

TEST_CASE("logic: shutdown --nodes stops every node once - after the last replica is gone") {
  Fixture f;
  f.start();
  auto agent = f.handle();
  std::string id;
  auto replica = f.running_replica(agent, &id);
  auto other = f.handle();
  f.register_node("n2", other);
  CHECK(f.logic->nodes_to_stop().empty());  // no shutdown asked
  REQUIRE(f.logic->shutdown(true, Credential{}).is_ok());
  auto stops = f.reconcile_except_checks();
  REQUIRE(stops.size() == 1);
  CHECK(stops[0].second.action == CommandAction::stop_via_agent);
  CHECK(f.logic->nodes_to_stop().empty());  // its replica still runs
  CHECK(f.logic->on_down(replica.address(), caf::exit_reason::user_shutdown, "stopped"));
  f.reconcile();
  auto agents = f.logic->nodes_to_stop();
  CHECK(agents.size() == 2);
  CHECK(std::count(agents.begin(), agents.end(), agent) == 1);
  CHECK(std::count(agents.begin(), agents.end(), other) == 1);
  CHECK(contains(f.log_text.str(), "every replica is gone; stopping 2 nodes"));
  CHECK(f.logic->nodes_to_stop().empty());  // once
}

TEST_CASE("logic: a plain shutdown leaves the nodes running") {
  Fixture f;
  f.start();
  f.register_node("n1", f.handle());
  REQUIRE(f.logic->shutdown(false, Credential{}).is_ok());
  f.reconcile();
  CHECK(f.logic->core().is_shut_down());
  CHECK(f.logic->nodes_to_stop().empty());
}

TEST_CASE("logic: a handle's demand for a deployment without replicas reconciles at once") {
  Fixture f;
  f.start();
  f.register_node("n1", f.handle());
  REQUIRE(f.deploy(make_app("a", "/a", {make_deployment("D", 1)})));
  CHECK_FALSE(f.logic->handle_metrics("proxy-n1", "a", "D", 0));
  CHECK(f.logic->handle_metrics("proxy-n1", "a", "D", 2));
  f.reconcile();  // a replica is starting: the next tick is soon enough
  CHECK_FALSE(f.logic->handle_metrics("proxy-n1", "a", "D", 2));
}

TEST_CASE("logic: a kill is checked - named and logged") {
  Fixture f;
  f.options.ca_pem = "-----BEGIN CERTIFICATE-----";
  f.start();
  auto refused = f.logic->kill("controller", "", Credential{});
  REQUIRE_FALSE(refused);
  CHECK(refused.status().code() == errc::permission_denied);
  CHECK_FALSE(contains(f.log_text.str(), "on operator request"));

  Fixture open;
  open.start();
  auto t = open.logic->kill("controller", "", Credential{});
  REQUIRE(t);
  CHECK(t->controller);
  CHECK(contains(open.log_text.str(), "warning controller killed on operator request"));
  CHECK(open.logic->kill("replica", "a#D#1", Credential{}).status().message() ==
        "no replica 'a#D#1'");
}

TEST_CASE("logic: a credential replayed within its window is refused - the same request signed anew passes") {
  troupe::testing::TempDir dir;
  REQUIRE(security::init_ca(dir.path()).is_ok());
  REQUIRE(security::issue_certificate(dir.path(), "alice", security::Role::operator_).is_ok());
  auto alice = security::load_identity(dir.path(), "alice", std::time(nullptr));
  REQUIRE(alice);
  Fixture f;
  f.options.ca_pem = alice->ca_pem;
  f.start();
  // Admitted (the cluster has no node n1: the answer says so, past the
  // credential's check).
  auto cred = sign_request(*alice, Operation::drain, {"n1"});
  REQUIRE_FALSE(cred.empty());
  auto first = f.logic->drain("n1", cred);
  CHECK(first.code() == errc::not_found);
  // Captured and sent again: refused at the credential.
  auto replayed = f.logic->drain("n1", cred);
  CHECK(replayed.code() == errc::permission_denied);
  CHECK(contains(replayed.message(), "drain: this credential was used already"));
  // The operator's own retry signs anew: admitted.
  auto fresh = sign_request(*alice, Operation::drain, {"n1"});
  CHECK(f.logic->drain("n1", fresh).code() == errc::not_found);
}

TEST_CASE("logic: a rollback is checked - deploys the last good declaration - logged as an event") {
  Fixture tls;
  tls.options.ca_pem = "-----BEGIN CERTIFICATE-----";
  tls.start();
  auto refused = tls.logic->rollback("a", Credential{});
  REQUIRE_FALSE(refused);
  CHECK(refused.status().code() == errc::permission_denied);
  CHECK(refused.status().message() ==
        "permission denied: rollback needs a signed credential (an operator certificate of this "
        "cluster)");

  Fixture f;
  f.start();
  auto agent = f.handle();
  std::string id;
  f.running_replica(agent, &id);  // a/D v1, RUNNING: its last good declaration
  REQUIRE(f.logic->core().target_state().last_running.count("a") == 1);
  REQUIRE(f.deploy(make_app("a", "/a", {make_deployment("D", 1, "v2")})));
  f.reconcile();
  auto rolled = f.logic->rollback("a", Credential{});
  REQUIRE_MESSAGE(rolled, rolled.status().to_string());
  CHECK(rolled->generation == 3);
  CHECK(rolled->from_generation == 1);
  CHECK(f.logic->core().target_state().applications.at("a") ==
        make_app("a", "/a", {make_deployment("D", 1)}));
  CHECK(contains(f.log_text.str(),
                 "info rollback of a to generation 1's declaration: accepted (generation 3)"));
  auto d = nlohmann::json::parse(f.logic->dashboard());
  CHECK(d["events"][0]["message"] == "rollback of a to generation 1's declaration (generation 3)");

  auto again = f.logic->rollback("a", Credential{});
  REQUIRE_FALSE(again);
  CHECK(again.status().code() == errc::conflict);
  CHECK(contains(f.log_text.str(), "warning rollback of a refused: conflict: "));
}

// Eviction with judgement: a head cut off from both workers, which host the
// replicas (each worker one of D's two).
namespace {

struct CutOff {
  Fixture f;
  std::map<std::string, test::AnyHandle> agents;
  std::map<std::string, test::AnyHandle> replicas;  // replica id -> handle
  std::map<std::string, std::string> node_of;       // replica id -> node

  explicit CutOff(double unreachable_timeout_s = 60.0) {
    f.options.node_timeout_s = 2.0;
    f.options.unreachable_timeout_s = unreachable_timeout_s;
    f.start();
    for (const char* id : {"n1", "n2"}) {
      agents[id] = f.handle();
      f.register_node(id, agents[id]);
    }
    REQUIRE(f.deploy(make_app("a", "/a", {make_deployment("D", 2)})));
    for (const auto& [cmd, run] : f.reconcile()) {
      REQUIRE(cmd.kind == CommandKind::start);
      replicas[cmd.replica_id] = f.handle();
      node_of[cmd.replica_id] = cmd.node_id;
      f.logic->actors().remember_replica(cmd.replica_id, cmd.node_id, replicas[cmd.replica_id]);
      f.logic->core().on_replica_ready(cmd.replica_id, cmd.version);
    }
    REQUIRE(node_of.size() == 2);
    REQUIRE(std::set<std::string>{node_of.begin()->second, node_of.rbegin()->second} ==
            std::set<std::string>{"n1", "n2"});
    agents["head"] = f.handle();
    f.register_node("head", agents["head"]);
    f.reconcile();
    f.ticks(1.0, {"head", "n1", "n2"});
    f.reconcile();
    REQUIRE(running() == ids());
  }

  std::set<std::string> ids() const {
    std::set<std::string> out;
    for (const auto& [id, node] : node_of)
      out.insert(id);
    return out;
  }
  std::set<std::string> running() const {
    std::set<std::string> out;
    for (const auto& [id, state] : f.replicas_of_d()) {
      if (state == "RUNNING")
        out.insert(id);
    }
    return out;
  }
  // Seconds of ticks with only the head heartbeating, reconciling every
  // 0.5 s: the commands that came out.
  std::vector<Command> cut_for(double seconds) {
    std::vector<Command> out;
    for (int i = 0; i < static_cast<int>(seconds * 2 + 0.5); ++i) {
      f.ticks(0.5, {"head"});
      for (const auto& [cmd, run] : f.reconcile())
        out.push_back(cmd);
    }
    return out;
  }
  // The workers reconnect and register again with their replicas (handles
  // new after the connection was lost).
  void heal() {
    for (const char* node : {"n1", "n2"}) {
      std::vector<HostedReplicaInfo> hosted;
      for (const auto& [id, at] : node_of) {
        if (at != node)
          continue;
        HostedReplicaInfo h;
        h.replica_id = id;
        h.app = "a";
        h.deployment = "D";
        h.handle = f.handle();
        hosted.push_back(h);
      }
      agents[node] = f.handle();
      f.register_node(node, agents[node], hosted);
    }
  }
};

size_t count_kind(const std::vector<Command>& cmds, CommandKind kind) {
  return static_cast<size_t>(
      std::count_if(cmds.begin(), cmds.end(), [&](const Command& c) { return c.kind == kind; }));
}

}  // namespace

TEST_CASE(
    "logic: a head cut off from most nodes starts and stops nothing - the same replicas after the "
    "heal") {
  CutOff c;
  auto during = c.cut_for(3.0);
  CHECK(c.f.node_state("n1") == "UNREACHABLE");
  CHECK(c.f.node_state("n2") == "UNREACHABLE");
  CHECK(c.f.node_state("head") == "ALIVE");
  for (const auto& n : c.f.logic->nodes()) {
    if (n.id == "n1")
      CHECK_MESSAGE(contains(n.reason, "2 of 3 nodes lost within one node timeout"), n.reason);
  }
  CHECK(contains(c.f.log_text.str(), "warning node n1 ALIVE -> UNREACHABLE: no heartbeat for"));
  // Their connections drop: the agents' and replicas' notices wait for the
  // nodes, and change nothing.
  for (const char* node : {"n1", "n2"}) {
    CHECK_FALSE(c.f.logic->on_down(c.agents[node].address(),
                                   caf::exit_reason::remote_link_unreachable, "lost"));
  }
  for (const auto& [id, h] : c.replicas) {
    CHECK_FALSE(c.f.logic->on_down(h.address(), caf::exit_reason::remote_link_unreachable, "lost"));
    CHECK(contains(c.f.log_text.str(), "replica " + id + " went down with the connection to node " +
                                           c.node_of[id] + ", which is UNREACHABLE"));
  }
  // 15 s cut off, past several health-check periods (10 s): nothing started,
  // stopped or killed, no health check sent, the replicas still RUNNING.
  auto more = c.cut_for(12.0);
  during.insert(during.end(), more.begin(), more.end());
  CHECK(count_kind(during, CommandKind::start) == 0);
  CHECK(count_kind(during, CommandKind::stop) == 0);
  CHECK(count_kind(during, CommandKind::kill) == 0);
  CHECK(count_kind(during, CommandKind::watch_health) == 0);
  CHECK(c.running() == c.ids());
  CHECK(c.f.status()["applications"]["a"]["deployments"]["D"]["status"] == "HEALTHY");

  c.heal();
  CHECK(c.f.node_state("n1") == "ALIVE");
  CHECK(c.f.node_state("n2") == "ALIVE");
  for (const auto& [id, node] : c.node_of)
    CHECK(contains(c.f.log_text.str(), "replica " + id + " is back with its node " + node));
  auto after = c.cut_for(0.0);
  for (int i = 0; i < 4; ++i) {
    c.f.ticks(0.5, {"head", "n1", "n2"});
    for (const auto& [cmd, run] : c.f.reconcile())
      after.push_back(cmd);
  }
  CHECK(count_kind(after, CommandKind::start) == 0);
  CHECK(count_kind(after, CommandKind::stop) == 0);
  // Their nodes start their health checks over: the watches go to them
  // again (each node then checks at once).
  CHECK(count_kind(after, CommandKind::watch_health) == 2);
  CHECK(c.running() == c.ids());
  CHECK_FALSE(contains(c.f.log_text.str(), "-> DEAD"));
}

TEST_CASE(
    "logic: UNREACHABLE nodes lost past the unreachable timeout are DEAD - their replicas move") {
  CutOff c(10.0);
  auto during = c.cut_for(11.5);
  CHECK(count_kind(during, CommandKind::start) == 0);
  CHECK(c.f.node_state("n1") == "UNREACHABLE");
  auto after = c.cut_for(1.0);
  CHECK(c.f.node_state("n1") == "DEAD");
  CHECK(c.f.node_state("n2") == "DEAD");
  CHECK(contains(c.f.log_text.str(), "node n1 UNREACHABLE -> DEAD: UNREACHABLE for 10."));
  std::vector<Command> starts;
  for (const auto& cmd : after) {
    if (cmd.kind == CommandKind::start)
      starts.push_back(cmd);
  }
  REQUIRE(starts.size() == 2);
  for (const auto& s : starts) {
    CHECK(s.node_id == "head");
    CHECK(c.node_of.count(s.replica_id) == 0);
  }
}

TEST_CASE("logic: an operator's drain of an UNREACHABLE node moves its replicas at once") {
  CutOff c;
  c.cut_for(3.0);
  REQUIRE(c.f.node_state("n1") == "UNREACHABLE");
  CHECK(c.f.logic->drain("n1", Credential{}).is_ok());
  CHECK(c.f.node_state("n1") == "DEAD");
  CHECK(contains(c.f.log_text.str(),
                 "node n1 UNREACHABLE -> DEAD: drained by operator while UNREACHABLE"));
  auto cmds = c.cut_for(0.5);
  std::vector<Command> starts;
  for (const auto& cmd : cmds) {
    if (cmd.kind == CommandKind::start)
      starts.push_back(cmd);
  }
  REQUIRE(starts.size() == 1);
  CHECK(starts[0].node_id == "head");
  CHECK(c.f.node_state("n2") == "UNREACHABLE");
  // n1 comes back DRAINING: its old replica is stopped once the new one runs.
  c.heal();
  CHECK(c.f.node_state("n1") == "DRAINING");
}

TEST_CASE("logic: a replica down with its node's connection waits for the node's judgement") {
  Fixture f;
  f.options.node_timeout_s = 2.0;
  f.start();
  std::string id;
  auto agent = f.handle();
  auto replica = f.running_replica(agent, &id);
  f.register_node("n2", f.handle());
  f.ticks(1.0, {"n1", "n2"});
  // The replica's notice comes before the agent's: nothing yet.
  CHECK_FALSE(
      f.logic->on_down(replica.address(), caf::exit_reason::remote_link_unreachable, "lost"));
  CHECK(contains(f.log_text.str(), "replica " + id +
                                       " went down with the connection to node n1; waiting for "
                                       "the node to register again or be declared lost"));
  for (const auto& [cmd, run] : f.reconcile_except_checks())
    CHECK_MESSAGE(cmd.kind != CommandKind::start, cmd.replica_id);
  // The agent's: n1 alone is lost, DEAD, and its replica replaced on n2.
  CHECK(f.logic->on_down(agent.address(), caf::exit_reason::remote_link_unreachable, "lost"));
  CHECK(f.node_state("n1") == "DEAD");
  auto starts = f.starts();
  REQUIRE(starts.size() == 1);
  CHECK(starts[0].node_id == "n2");
}

TEST_CASE("logic: a replica held for a node that stays ALIVE is a crash after one node timeout") {
  Fixture f;
  f.options.node_timeout_s = 2.0;
  f.start();
  std::string id;
  auto agent = f.handle();
  auto replica = f.running_replica(agent, &id);
  f.ticks(1.0, {"n1"});
  CHECK_FALSE(
      f.logic->on_down(replica.address(), caf::exit_reason::remote_link_unreachable, "lost"));
  f.ticks(1.9, {"n1"});
  for (const auto& [cmd, run] : f.reconcile_except_checks())
    CHECK_MESSAGE(cmd.kind != CommandKind::start, cmd.replica_id);
  f.ticks(0.3, {"n1"});
  CHECK(contains(f.log_text.str(), "replica " + id +
                                       " went down with the connection to node n1, "
                                       "which neither registered again nor was declared lost"));
  CHECK(f.starts().size() == 1);
  CHECK(f.node_state("n1") == "ALIVE");
}

TEST_CASE(
    "logic: a proxy that lost its direct connection to a node gets that node's replicas again - "
    "not the whole view") {
  CutOff c;  // D's two replicas: one on n1, one on n2
  std::string on_n1, on_n2;
  for (const auto& [id, node] : c.node_of)
    (node == "n1" ? on_n1 : on_n2) = id;
  auto proxy = c.f.handle();
  auto other = c.f.handle();
  CHECK(c.f.logic->subscribe(proxy, SnapshotId{}, "n1"));
  CHECK(c.f.logic->subscribe(other, SnapshotId{}, "head"));
  for (const auto& p : c.f.logic->due_pushes())
    c.f.logic->push_done(p.key, p.push, true);
  REQUIRE(c.f.logic->due_pushes().empty());
  const auto current = c.f.logic->core().snapshot_id();

  // n1's proxy lost its direct connection to n2: it presents what it holds
  // and names n2.
  CHECK(c.f.logic->subscribe(proxy, current, "n1", "n2"));
  auto pushes = c.f.logic->due_pushes();
  REQUIRE(pushes.size() == 1);
  CHECK(pushes[0].to == proxy);
  const auto& snap = *pushes[0].snapshot;
  CHECK_FALSE(snap.full);
  CHECK(snap.seq == current.seq);
  REQUIRE(snap.deployments.size() == 1);
  CHECK(snap.deployments[0].partial);
  REQUIRE(snap.deployments[0].replicas.size() == 1);
  CHECK(snap.deployments[0].replicas[0].replica_id == on_n2);
  CHECK(snap.deployments[0].replicas[0].node_id == "n2");
  CHECK(snap.deployments[0].replicas[0].handle == c.replicas[on_n2]);
  CHECK(snap.deployments[0].removed_replicas.empty());
  c.f.logic->push_done(pushes[0].key, pushes[0].push, true);
  CHECK(c.f.logic->due_pushes().empty());  // asked once, sent once

  // Lost again while a change is pending: the change and n2's replica in
  // one delta (n1's replica crashed and left the set).
  REQUIRE(c.f.logic->on_down(c.replicas[on_n1].address(),
                             troupe_error("replica " + on_n1 + " exited: killed by SIGKILL"), "?"));
  c.f.reconcile_except_checks();
  CHECK(c.f.logic->subscribe(proxy, current, "n1", "n2"));
  pushes = c.f.logic->due_pushes();
  REQUIRE(pushes.size() == 2);  // the other proxy gets the change alone
  for (const auto& p : pushes) {
    REQUIRE(p.snapshot->deployments.size() == 1);
    const auto& e = p.snapshot->deployments[0];
    CHECK(e.partial);
    CHECK(e.removed_replicas == std::vector<std::string>{on_n1});
    if (p.to == proxy) {
      REQUIRE(e.replicas.size() == 1);
      CHECK(e.replicas[0].replica_id == on_n2);
    } else {
      CHECK(e.replicas.empty());
    }
  }
}
