#include "runtime/wire.hpp"

#include <doctest/doctest.h>

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

}  // namespace

TEST_CASE("every wire type is registered under its portable name") {
  System s;
  caf::actor_system sys{s.cfg};
  for (auto name : {"troupe.NodeInfo", "troupe.NodeStatus", "troupe.NodeStatusList"}) {
    CAPTURE(name);
    CHECK(sys.types().make_value(name) != nullptr);
  }
  CHECK(sys.types().make_value("troupe.NoSuchType") == nullptr);
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
  std::vector<NodeStatus> rows{{"a", "h:1", "ALIVE", "cpu=1", 250, "registered", 7}};
  auto rows2 = round_trip(sys, rows);
  REQUIRE(rows2.size() == 1);
  CHECK(rows2[0].state == "ALIVE");
  CHECK(rows2[0].last_heartbeat_age_ms == 250);
  CHECK(rows2[0].reason == "registered");
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
