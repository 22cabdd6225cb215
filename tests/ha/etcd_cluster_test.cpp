// The etcd test harness itself (tools/common/etcd_cluster.hpp): a real
// three-member etcd cluster on loopback, written and read with etcdctl,
// members killed and started again, quorum lost and regained, and no etcd
// process left behind by the destructor (also when the test throws).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "tools/common/etcd_cluster.hpp"
#include "tools/common/temp_dir.hpp"

using namespace std::chrono_literals;
namespace proc = troupe::proc;

namespace {

proc::RunResult put(const std::string& endpoints, const std::string& key, const std::string& value,
                    const std::string& command_timeout = "5s") {
  return proc::etcdctl(endpoints, {"--command-timeout=" + command_timeout, "put", key, value});
}

// The value of `key` read through `endpoints` ("" when absent or on error).
std::string get(const std::string& endpoints, const std::string& key) {
  auto r = proc::etcdctl(endpoints, {"--command-timeout=5s", "get", key, "--print-value-only"});
  if (r.exit_code != 0)
    return "(etcdctl get failed: " + r.err + ")";
  while (!r.out.empty() && (r.out.back() == '\n' || r.out.back() == '\r'))
    r.out.pop_back();
  return r.out;
}

std::string both(const proc::EtcdCluster& c, size_t a, size_t b) {
  return c.client_urls().at(a) + "," + c.client_urls().at(b);
}

}  // namespace

TEST_CASE("etcd cluster: three members become healthy - a put through m1 is read through m3") {
  proc::TempDir dir("etcd-cluster-basic");
  proc::EtcdCluster cluster(dir.path());
  REQUIRE(cluster.size() == 3);
  for (size_t i = 0; i < cluster.size(); ++i) {
    INFO("member " << cluster.member(i).name << "; log:\n" << cluster.log_tail(i));
    CHECK(cluster.member(i).name == "m" + std::to_string(i + 1));
    CHECK(cluster.member(i).client_url() ==
          "http://127.0.0.1:" + std::to_string(cluster.member(i).client_port));
    CHECK(cluster.healthy(i));
    CHECK(std::filesystem::is_directory(cluster.member(i).data_dir));
    CHECK(std::filesystem::exists(dir / (cluster.member(i).name + ".log")));
  }
  CHECK(cluster.endpoints() ==
        cluster.client_urls()[0] + "," + cluster.client_urls()[1] + "," + cluster.client_urls()[2]);
  CHECK(cluster.has_quorum(5s));

  auto p = put(cluster.member(0).client_url(), "/harness/k", "value-1");
  INFO("put: " << p.out << p.err);
  REQUIRE(p.exit_code == 0);
  CHECK(get(cluster.member(2).client_url(), "/harness/k") == "value-1");
  CHECK(get(cluster.endpoints(), "/harness/k") == "value-1");
}

TEST_CASE("etcd cluster: one member killed - the other two keep quorum - restarted it catches up") {
  proc::TempDir dir("etcd-cluster-one-down");
  proc::EtcdCluster cluster(dir.path());
  cluster.kill(1);
  CHECK_FALSE(cluster.running(1));
  CHECK_FALSE(cluster.healthy(1, 1s));
  REQUIRE(cluster.has_quorum(10s));

  // Written while m2 is down: m2 must get it from the others.
  auto p = put(both(cluster, 0, 2), "/harness/while-down", "written-without-m2");
  INFO("put: " << p.out << p.err);
  REQUIRE(p.exit_code == 0);
  CHECK(get(cluster.member(2).client_url(), "/harness/while-down") == "written-without-m2");

  cluster.start(1);
  INFO("m2 log:\n" << cluster.log_tail(1));
  REQUIRE(proc::wait_until([&] { return cluster.healthy(1, 1s); }, 20s, 100ms));
  CHECK(cluster.running(1));
  CHECK(get(cluster.member(1).client_url(), "/harness/while-down") == "written-without-m2");

  // A stop (SIGTERM) and a start work the same way.
  cluster.stop(0);
  CHECK_FALSE(cluster.running(0));
  REQUIRE(cluster.has_quorum(10s));
  REQUIRE(put(both(cluster, 1, 2), "/harness/m1-stopped", "yes").exit_code == 0);
  cluster.start(0);
  REQUIRE(proc::wait_until([&] { return cluster.healthy(0, 1s); }, 20s, 100ms));
  CHECK(get(cluster.member(0).client_url(), "/harness/m1-stopped") == "yes");
}

TEST_CASE("etcd cluster: two of three killed - quorum is lost - one restarted and it comes back") {
  proc::TempDir dir("etcd-cluster-quorum");
  proc::EtcdCluster cluster(dir.path());
  REQUIRE(put(cluster.endpoints(), "/harness/before", "kept").exit_code == 0);

  cluster.kill(1);
  cluster.kill(2);
  CHECK_FALSE(cluster.has_quorum(1s));
  auto refused = put(cluster.member(0).client_url(), "/harness/no-quorum", "lost", "1s");
  INFO("put without quorum: exit " << refused.exit_code << " " << refused.out << refused.err);
  CHECK(refused.exit_code != 0);
  CHECK_FALSE(cluster.healthy(0, 1s));

  cluster.start(2);
  INFO("m3 log:\n" << cluster.log_tail(2));
  REQUIRE(cluster.has_quorum(20s));
  // A put retried until the new leader is settled (the first may time out
  // while the two members elect one).
  REQUIRE(proc::wait_until(
      [&] { return put(both(cluster, 0, 2), "/harness/after", "back", "2s").exit_code == 0; }, 20s,
      100ms));
  CHECK(get(cluster.member(2).client_url(), "/harness/before") == "kept");
  CHECK(get(cluster.member(0).client_url(), "/harness/after") == "back");
  CHECK_FALSE(cluster.running(1));
}

TEST_CASE("etcd cluster: the destructor leaves no etcd process - running - stopped or killed - also on a throw") {
  proc::TempDir dir("etcd-cluster-cleanup");
  {
    proc::EtcdCluster cluster(dir / "a");
    CHECK(proc::processes_mentioning(dir / "a").size() == 3);
    cluster.kill(0);
    cluster.stop(1);
    CHECK(proc::processes_mentioning(dir / "a").size() == 1);
    cluster.start(0);
    CHECK(proc::processes_mentioning(dir / "a").size() == 2);
  }
  CHECK(proc::processes_mentioning(dir / "a").empty());

  // A test that fails while its cluster runs.
  CHECK_THROWS_AS(
      [&] {
        proc::EtcdCluster cluster(dir / "b");
        CHECK(proc::processes_mentioning(dir / "b").size() == 3);
        throw std::logic_error("the test failed");
      }(),
      std::logic_error);
  CHECK(proc::processes_mentioning(dir / "b").empty());
}

TEST_CASE("etcd cluster: a member that cannot start - the error names it with its log - nothing left running") {
  proc::TempDir dir("etcd-cluster-broken");
  // m2's data dir is a file: etcd m2 exits at once.
  std::ofstream(dir / "m2.data") << "not a directory\n";
  std::string what;
  try {
    proc::EtcdCluster cluster(dir.path(), 3, 20s);
  } catch (const std::runtime_error& e) {
    what = e.what();
  }
  INFO(what);
  CHECK(what.find("etcd member m2") != std::string::npos);
  CHECK(what.find("its log ends") != std::string::npos);
  CHECK(what.find("m2.data") != std::string::npos);  // etcd's own complaint, from m2.log
  CHECK(proc::processes_mentioning(dir.path()).empty());
}
