#include "runtime/wire.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "runtime/system_setup.hpp"

using namespace troupe;

namespace {

struct System {
  System() { configure_actor_system(cfg, TransportOptions{}); }
  caf::actor_system_config cfg;
};

template <class T>
T round_trip(caf::actor_system& sys, T value) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  REQUIRE_FALSE(sink(value));
  T out;
  caf::binary_deserializer source{sys, buf};
  REQUIRE_FALSE(source(out));
  return out;
}

// `name` is registered for T: made by name as a T, and (but for vectors,
// whose portable name CAF derives from the element's: "std::vector<...>") T's
// portable name.
template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};

template <class T>
void check_registered(caf::actor_system& sys, const std::string& name) {
  CAPTURE(name);
  auto value = sys.types().make_value(name);
  REQUIRE(value != nullptr);
  CHECK(value->matches(caf::make_rtti_pair<T>()));
  if constexpr (!is_vector<T>::value)
    CHECK(sys.types().portable_name(caf::make_rtti_pair<T>()) == name);
}

}  // namespace

TEST_CASE("every wire type is registered under its portable name") {
  System s;
  caf::actor_system sys{s.cfg};
  check_registered<NodeInfo>(sys, "troupe.NodeInfo");
  check_registered<NodeStatus>(sys, "troupe.NodeStatus");
  check_registered<std::vector<NodeStatus>>(sys, "troupe.NodeStatusList");
  check_registered<BatchSettings>(sys, "troupe.BatchSettings");
  check_registered<ReplicaSpec>(sys, "troupe.ReplicaSpec");
  check_registered<ReplicaMetadata>(sys, "troupe.ReplicaMetadata");
  check_registered<ReplicaLoad>(sys, "troupe.ReplicaLoad");
  check_registered<std::vector<ReplicaLoad>>(sys, "troupe.ReplicaLoadList");
  check_registered<ReplicaModels>(sys, "troupe.ReplicaModels");
  check_registered<DeploymentLoad>(sys, "troupe.DeploymentLoad");
  check_registered<HealthSettings>(sys, "troupe.HealthSettings");
  check_registered<HealthReport>(sys, "troupe.HealthReport");
  check_registered<HealthWatch>(sys, "troupe.HealthWatch");
  check_registered<std::vector<HealthWatch>>(sys, "troupe.HealthWatchList");
  check_registered<std::vector<HealthReport>>(sys, "troupe.HealthReportList");
  check_registered<std::vector<DeploymentLoad>>(sys, "troupe.DeploymentLoadList");
  check_registered<std::vector<ReplicaModels>>(sys, "troupe.ReplicaModelsList");
  check_registered<HostedReplicaInfo>(sys, "troupe.HostedReplicaInfo");
  check_registered<std::vector<HostedReplicaInfo>>(sys, "troupe.HostedReplicaList");
  check_registered<HttpRequest>(sys, "troupe.HttpRequest");
  check_registered<HttpResponse>(sys, "troupe.HttpResponse");
  check_registered<RouteEntry>(sys, "troupe.RouteEntry");
  check_registered<ReplicaEndpoint>(sys, "troupe.ReplicaEndpoint");
  check_registered<DeploymentEndpoints>(sys, "troupe.DeploymentEndpoints");
  check_registered<RoutingSnapshot>(sys, "troupe.RoutingSnapshot");
  check_registered<PeerEndpoint>(sys, "troupe.PeerEndpoint");
  check_registered<Credential>(sys, "troupe.Credential");
  // Handles that travel as message elements of their own (interfaces).
  check_registered<ReplicaActor>(sys, "troupe.ReplicaActor");
  check_registered<MetricsSinkActor>(sys, "troupe.MetricsSinkActor");
  check_registered<ProxyActor>(sys, "troupe.ProxyActor");
  check_registered<AgentActor>(sys, "troupe.AgentActor");
  check_registered<ControllerActor>(sys, "troupe.ControllerActor");
  check_registered<ProxyKeeperActor>(sys, "troupe.ProxyKeeperActor");
  check_registered<PeerActor>(sys, "troupe.PeerActor");
  check_registered<TrafficWeights>(sys, "troupe.TrafficWeights");
  CHECK(sys.types().make_value("troupe.NoSuchType") == nullptr);
  // A tripwire: a wire type registered in register_wire_types but not
  // checked above (add it there).
  size_t registered = 0;
  for (auto& [name, factory] : s.cfg.value_factories_by_name)
    registered += name.rfind("troupe.", 0) == 0 ? 1 : 0;
  CHECK(registered == 35);
}

TEST_CASE("wire types survive serialization") {
  System s;
  caf::actor_system sys{s.cfg};
  NodeInfo info{"w1", "127.0.0.1", 8001, "cpu=2", 42, kProtocolVersion};
  auto info2 = round_trip(sys, info);
  CHECK(info2.id == "w1");
  CHECK(info2.http_port == 8001);
  CHECK(info2.resources == "cpu=2");
  CHECK(info2.pid == 42);
  CHECK(info2.protocol_version == kProtocolVersion);
  CHECK(info2.peer_port == 0);
  info.peer_port = 7401;
  CHECK(round_trip(sys, info).peer_port == 7401);
  std::vector<NodeStatus> rows{{"a", "h:1", "ALIVE", "cpu=1", 250, "registered", 7, "HEALTHY"}};
  auto rows2 = round_trip(sys, rows);
  REQUIRE(rows2.size() == 1);
  CHECK(rows2[0].state == "ALIVE");
  CHECK(rows2[0].last_heartbeat_age_ms == 250);
  CHECK(rows2[0].reason == "registered");
  CHECK(rows2[0].pid == 7);
  CHECK(rows2[0].proxy == "HEALTHY");
  ReplicaLoad load{"shop#Cart#3", 1.5, 1200, 7, 2, 0.0125};
  auto load2 = round_trip(sys, load);
  CHECK(load2.replica_id == "shop#Cart#3");
  CHECK(load2.ongoing == 1.5);
  CHECK(load2.finished == 1200);
  CHECK(load2.errors == 7);
  CHECK(load2.streams == 2);
  CHECK(load2.p99_s == 0.0125);
  // A node's heartbeat carries its replicas' loads; its model lists go
  // together.
  auto loads2 = round_trip(sys, std::vector<ReplicaLoad>{load, ReplicaLoad{"shop#Cart#4", 0.5, 3}});
  REQUIRE(loads2.size() == 2);
  CHECK(loads2[1].replica_id == "shop#Cart#4");
  CHECK(loads2[1].finished == 3);
  auto lists2 = round_trip(
      sys, std::vector<ReplicaModels>{{"shop#Cart#3", 9, {"m1", "m2"}}, {"shop#Cart#4", 1, {}}});
  REQUIRE(lists2.size() == 2);
  CHECK(lists2[0].replica_id == "shop#Cart#3");
  CHECK(lists2[0].seq == 9);
  CHECK(lists2[0].model_ids == std::vector<std::string>{"m1", "m2"});
  CHECK(lists2[1].model_ids.empty());
  auto reports2 = round_trip(sys, std::vector<HealthReport>{{"shop#Cart#3", 4, 3, 2, "db down"}});
  REQUIRE(reports2.size() == 1);
  CHECK(reports2[0].replica_id == "shop#Cart#3");
  CHECK(reports2[0].watch == 4);
  CHECK(reports2[0].passed == 3);
  CHECK(reports2[0].failures == 2);
  CHECK(reports2[0].failure == "db down");
  auto watches2 = round_trip(sys, std::vector<HealthWatch>{{"shop#Cart#3", 5, {1.5, 2.0, 3, 0.1}}});
  REQUIRE(watches2.size() == 1);
  CHECK(watches2[0].replica_id == "shop#Cart#3");
  CHECK(watches2[0].watch == 5);
  CHECK(watches2[0].settings.timeout_s == 2.0);
  auto settings2 = round_trip(sys, HealthSettings{2.5, 7.0, 4, 0.2});
  CHECK(settings2.period_s == 2.5);
  CHECK(settings2.timeout_s == 7.0);
  CHECK(settings2.threshold == 4);
  CHECK(settings2.jitter == 0.2);
  auto deployments2 = round_trip(sys, std::vector<DeploymentLoad>{{"shop", "Cart", 2.5}});
  REQUIRE(deployments2.size() == 1);
  CHECK(deployments2[0].app == "shop");
  CHECK(deployments2[0].deployment == "Cart");
  CHECK(deployments2[0].queued_and_inflight == 2.5);
  RouteEntry route{"/greet", "greet", "Hello", {{"Canary", 0.25}, {"Hello", 0.75}}, "X-User"};
  auto route2 = round_trip(sys, route);
  CHECK(route2.prefix == "/greet");
  CHECK(route2.ingress == "Hello");
  CHECK(route2.traffic == TrafficWeights{{"Canary", 0.25}, {"Hello", 0.75}});
  CHECK(route2.traffic_key_header == "X-User");
  CHECK(route2.shadow.empty());
  CHECK_FALSE(route2.open_inference);
  route.shadow = {{"Mirror", 0.5}, {"Slow", 1.0}};
  auto route3 = round_trip(sys, route);
  CHECK(route3.shadow == TrafficWeights{{"Mirror", 0.5}, {"Slow", 1.0}});
  CHECK(route3.traffic == route.traffic);
  CHECK_FALSE(route3.open_inference);
  route.open_inference = true;
  auto route4 = round_trip(sys, route);
  CHECK(route4.open_inference);
  CHECK(route4.shadow == route.shadow);
  CHECK(route4.traffic_key_header == "X-User");
}

TEST_CASE("statuses cross the wire as CAF errors and come back intact") {
  System s;
  caf::actor_system sys{s.cfg};
  Status st(errc::version_mismatch, "controller speaks 2");
  auto err = to_caf_error(st);
  CHECK(err.category() == kErrorCategory);
  auto back = from_caf_error(err);
  CHECK(back.code() == errc::version_mismatch);
  CHECK(back.message() == "controller speaks 2");
  CHECK(sys.render(err).find("controller speaks 2") != std::string::npos);
  CHECK(from_caf_error(caf::make_error(caf::sec::request_timeout)).code() == errc::timeout);
  CHECK(from_caf_error(caf::error{}).is_ok());
}

TEST_CASE("the app identifier is set so foreign CAF systems are refused") {
  System s;
  auto ids = caf::get_or(s.cfg, "middleman.app-identifiers", std::vector<std::string>{});
  CHECK(ids == std::vector<std::string>{kAppIdentifier});
}

TEST_CASE("a routing snapshot carries the declared http timeouts and the peer listeners") {
  System s;
  caf::actor_system sys{s.cfg};
  RoutingSnapshot snap;
  snap.epoch = 3;
  snap.request_timeout_s = 1.5;
  snap.keep_alive_timeout_s = 75;
  snap.peers = {{"w1", "10.0.0.1", 7401}, {"w2", "10.0.0.2", 7402}};
  auto back = round_trip(sys, snap);
  CHECK(back.epoch == 3);
  CHECK(back.request_timeout_s == 1.5);
  CHECK(back.keep_alive_timeout_s == 75);
  CHECK(back.peers == snap.peers);
}

TEST_CASE("model multiplexing fields survive serialization - ReplicaSpec - and ReplicaEndpoint inspects them") {
  System s;
  caf::actor_system sys{s.cfg};
  ReplicaSpec spec;
  spec.replica_id = "a#M#1";
  spec.max_num_models_per_replica = 3;
  auto spec2 = round_trip(sys, spec);
  CHECK(spec2.replica_id == "a#M#1");
  CHECK(spec2.max_num_models_per_replica == 3);
  CHECK(ReplicaSpec{}.max_num_models_per_replica == -1);
  // A ReplicaEndpoint carries an actor handle, which a serializer without a
  // connection cannot load: check that inspect() covers the new fields.
  ReplicaEndpoint ep;
  ep.replica_id = "a#M#1";
  ep.model_ids = {"m1", "m,2"};
  ep.model_ids_seq = 17;
  const std::string text = caf::deep_to_string(ep);
  CAPTURE(text);
  CHECK(text.find("\"m1\", \"m,2\"") != std::string::npos);
  CHECK(text.find("17") != std::string::npos);
}

TEST_CASE("batching settings survive serialization in ReplicaSpec and ReplicaMetadata") {
  System s;
  caf::actor_system sys{s.cfg};
  CHECK(ReplicaSpec{}.batch == BatchSettings{});
  CHECK(BatchSettings{}.max_batch_size == 1);
  ReplicaSpec spec;
  spec.batch.max_batch_size = 32;
  spec.batch.wait_s = 0.005;
  spec.batch.adaptive = true;
  auto spec2 = round_trip(sys, spec);
  CHECK(spec2.batch == spec.batch);
  ReplicaMetadata m;
  m.batch.max_batch_size = 8;
  m.batch.wait_s = 0.25;
  auto m2 = round_trip(sys, m);
  CHECK(m2.batch.max_batch_size == 8);
  CHECK(m2.batch.wait_s == 0.25);
  CHECK_FALSE(m2.batch.adaptive);
}

namespace {

// A snapshot of two deployments, one replica each, whose handle is `handle`.
RoutingSnapshot sample_snapshot(const caf::actor& handle) {
  RoutingSnapshot snap;
  snap.epoch = 7;
  snap.seq = 12;
  snap.full = true;
  snap.routes_changed = true;
  snap.routes = {RouteEntry{"/shop", "shop", "Cart"}};
  for (const char* name : {"Cart", "Price"}) {
    DeploymentEndpoints d{"shop", name, {}};
    ReplicaEndpoint ep;
    ep.replica_id = std::string("shop#") + name + "#1";
    ep.node_id = "w1";
    ep.max_ongoing_requests = 5;
    ep.handle = caf::actor_cast<ReplicaActor>(handle);
    ep.model_ids = {"m1"};
    ep.model_ids_seq = 3;
    d.replicas.push_back(ep);
    snap.deployments.push_back(d);
  }
  snap.dead_nodes = {"w9"};
  snap.peers = {{"w1", "127.0.0.1", 7401}};
  return snap;
}

std::vector<char> bytes_of(caf::actor_system& sys, RoutingSnapshot& snap) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  REQUIRE_FALSE(sink(snap));
  return buf;
}

}  // namespace

TEST_CASE(
    "wire: a shared snapshot is serialized once - the same bytes field by field - and a copy has "
    "no encoding") {
  System s;
  caf::actor_system sys{s.cfg};
  auto echo = sys.spawn([]() -> caf::behavior { return {[](int x) { return x + 1; }}; });
  auto snap = sample_snapshot(echo);
  const auto plain = bytes_of(sys, snap);
  auto before = snapshot_encoding_counts();
  // Without an encoding: serialized field by field, nothing counted.
  CHECK(bytes_of(sys, snap) == plain);
  CHECK(snapshot_encoding_counts().serialized == before.serialized);
  CHECK(snapshot_encoding_counts().copied == before.copied);

  share_encoding(snap);
  CHECK(bytes_of(sys, snap) == plain);
  CHECK(bytes_of(sys, snap) == plain);
  CHECK(bytes_of(sys, snap) == plain);
  auto after = snapshot_encoding_counts();
  CHECK(after.serialized == before.serialized + 1);
  CHECK(after.copied == before.copied + 2);

  // A copy may change: it starts without the encoding, and what it writes
  // is its own content.
  RoutingSnapshot copy = snap;
  CHECK_FALSE(copy.wire.encoding);
  copy.seq = 13;
  copy.deployments.pop_back();
  const auto changed = bytes_of(sys, copy);
  CHECK(changed != plain);
  RoutingSnapshot assigned;
  share_encoding(assigned);
  assigned = copy;
  CHECK_FALSE(assigned.wire.encoding);
  CHECK(bytes_of(sys, assigned) == changed);
  CHECK(snapshot_encoding_counts().serialized == after.serialized);
  CHECK(snapshot_encoding_counts().copied == after.copied);
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
}

TEST_CASE(
    "wire: a snapshot sent to two other systems is serialized once - each reads all of it and its "
    "handles work") {
  // Three actor systems in this process, connected over 127.0.0.1 as a head
  // and two proxies' nodes are: the head sends one message to both.
  struct Node {
    caf::actor_system_config cfg;
    std::unique_ptr<caf::actor_system> sys;
    caf::actor receiver;
    uint16_t port = 0;
    std::mutex mutex;
    std::vector<char> received;  // the snapshot it read, serialized again here
    Node() {
      configure_actor_system(cfg, TransportOptions{});
      sys = std::make_unique<caf::actor_system>(cfg);
    }
  };
  Node head, b, c;
  auto echo = head.sys->spawn([]() -> caf::behavior { return {[](int x) { return x + 1; }}; });
  for (Node* n : {&b, &c}) {
    // Keeps what it read, then asks the replica handle it got, which lives
    // in the head's system, and answers with that answer.
    n->receiver = n->sys->spawn([n](caf::event_based_actor* self) -> caf::behavior {
      return {[n, self](snapshot_atom, RoutingSnapshot& snap) -> caf::result<caf::message> {
        {
          std::lock_guard<std::mutex> lock(n->mutex);
          n->received = bytes_of(*n->sys, snap);
        }
        if (snap.deployments.size() != 2 || snap.deployments[1].replicas.size() != 1)
          return caf::make_error(caf::sec::unexpected_message);
        return self->delegate(caf::actor_cast<caf::actor>(snap.deployments[1].replicas[0].handle),
                              41);
      }};
    });
    auto published = n->sys->middleman().publish(n->receiver, 0, "127.0.0.1");
    if (!published)
      FAIL(n->sys->render(published.error()));
    n->port = *published;
  }
  auto snap = sample_snapshot(echo);
  const auto plain = bytes_of(*head.sys, snap);
  auto msg = caf::make_message(snapshot_atom::value, snap);
  share_encoding(msg.get_mutable_as<RoutingSnapshot>(1));
  auto before = snapshot_encoding_counts();
  {
    caf::scoped_actor self{*head.sys};
    for (Node* n : {&b, &c}) {
      auto there = head.sys->middleman().remote_actor("127.0.0.1", n->port);
      if (!there)
        FAIL(head.sys->render(there.error()));
      int answer = 0;
      self->request(*there, std::chrono::seconds(10), msg)
          .receive([&](int x) { answer = x; },
                   [&](caf::error& err) { FAIL_CHECK(head.sys->render(err)); });
      CHECK(answer == 42);
    }
  }
  auto after = snapshot_encoding_counts();
  CHECK(after.serialized == before.serialized + 1);
  CHECK(after.copied == before.copied + 1);
  for (Node* n : {&b, &c}) {
    std::lock_guard<std::mutex> lock(n->mutex);
    // The same content, the handles naming the same actors of the head.
    CHECK(n->received == plain);
  }
  for (Node* n : {&b, &c})
    caf::anon_send_exit(n->receiver, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
}
