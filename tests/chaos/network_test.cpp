// The chaos tool's hosts (tools/chaos/network.hpp) on this machine: two
// network namespaces on a bridge, with the faults the scenarios use checked
// by ping between them. Runs as root, like the suite.
#include <doctest/doctest.h>

#include <unistd.h>

#include <regex>

#include "tools/chaos/network.hpp"

using namespace chaos;

namespace {

struct Ping {
  bool answered = false;
  double ms = 0;
};

// One ping from `from` to `to`, waiting at most 2 s for the answer.
Ping ping(const Network& net, const std::string& from, const std::string& to) {
  auto argv = net.exec_prefix(from);
  argv.insert(argv.end(), {"ping", "-n", "-c", "1", "-W", "2", net.address(to)});
  auto r = run(argv, 10s);
  Ping p;
  std::smatch m;
  static const std::regex time(R"(time=([0-9.]+) ms)");
  if (r.exit_code == 0 && std::regex_search(r.out, m, time)) {
    p.answered = true;
    p.ms = std::stod(m[1]);
  }
  return p;
}

bool netns_listed(const std::string& needle) {
  return run({"/bin/sh", "-c", "ip netns list"}, 10s).out.find(needle) != std::string::npos;
}

}  // namespace

TEST_CASE("chaos/hosts in namespaces - partitions one way and both - delay and loss - all removed") {
  auto why = Network::unavailable();
  REQUIRE_MESSAGE(!why, (why ? *why : ""));
  TempDir dir;
  std::string tag = "troupe-chaos-" + std::to_string(::getpid()) + "-";
  {
    Network net({"a", "b"}, CHAOS_NETDELAY, dir.path());
    CHECK(net.address("a") != net.address("b"));
    CHECK(netns_listed(tag + "a"));
    REQUIRE(ping(net, "a", "b").answered);

    // a's packets to b lost: b never hears the request.
    auto out = net.partition("a", {"b"}, Direction::out);
    CHECK(!ping(net, "a", "b").answered);
    CHECK(!ping(net, "b", "a").answered);  // b's request arrives, a's answer is lost
    net.heal(out);
    CHECK(ping(net, "a", "b").answered);

    // b's packets to a lost: a's request arrives, the answer does not.
    auto in = net.partition("a", {"b"}, Direction::in);
    CHECK(!ping(net, "a", "b").answered);
    net.heal(in);
    CHECK(ping(net, "b", "a").answered);

    // 150 ms each way: a round trip takes at least 300 ms.
    auto slow = net.degrade("a", {"b"}, 150, 0, 1);
    auto p = ping(net, "a", "b");
    CHECK(p.answered);
    CHECK(p.ms >= 300);
    auto summary = net.heal(slow);
    CHECK(summary.find("a: seen") != std::string::npos);
    CHECK(summary.find("b: seen") != std::string::npos);
    p = ping(net, "a", "b");
    CHECK(p.answered);
    CHECK(p.ms < 300);

    // Every packet lost: counted as dropped.
    auto lossy = net.degrade("a", {"b"}, 0, 100, 1);
    CHECK(!ping(net, "a", "b").answered);
    summary = net.heal(lossy);
    CHECK(summary.find("a: seen 1 dropped 1") != std::string::npos);
    CHECK(ping(net, "a", "b").answered);
  }
  // Gone with the object.
  CHECK(!netns_listed(tag + "a"));
  CHECK(!netns_listed(tag + "b"));
}
