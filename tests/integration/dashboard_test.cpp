// The head's dashboard (/-/dashboard) in a real browser: headless Chromium
// loads the page from a running cluster once, and the test reads the DOM it
// rendered through the DevTools protocol (a WebSocket, Boost.Beast), also
// after a replica was killed: the same page, refreshing by itself, shows the
// replacement; and under load, its charts of each deployment's request rate,
// p99 latency and errors, and its count of restarts. Screenshots of the page
// are written next to the test binary (docs/dashboard.png is one such
// screenshot).
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <openssl/evp.h>

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>

#include "tests/support/cluster.hpp"
#include "tests/support/http_client.hpp"

using namespace troupe::testing;
using nlohmann::json;

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;

// Debian's chromium, from PATH; empty when it is not installed.
std::string chromium_path() {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    auto end = dirs.find(':', start);
    if (end == std::string::npos)
      end = dirs.size();
    auto candidate = dirs.substr(start, end - start) + "/chromium";
    if (::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    start = end + 1;
  }
  return "";
}

// One page of a headless Chromium, driven over the DevTools protocol.
class Browser {
 public:
  explicit Browser(const std::string& dir) {
    auto chromium = chromium_path();
    REQUIRE_MESSAGE(!chromium.empty(),
                    "no chromium on PATH: the README's test command installs Debian's chromium");
    port_ = free_port();
    std::filesystem::create_directories(dir + "/profile");
    chrome_ = ChildProcess({chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
                            "--no-first-run", "--user-data-dir=" + dir + "/profile",
                            "--remote-debugging-address=127.0.0.1",
                            "--remote-debugging-port=" + std::to_string(port_),
                            "--window-size=1280,1400", "about:blank"},
                           dir + "/chromium.log");
    // The DevTools endpoint lists the page once the browser is up.
    std::string ws;
    REQUIRE_MESSAGE(wait_until(
                        [&] {
                          auto r = http_get(port_, "/json/list", 2);
                          if (!r || r->status != 200)
                            return false;
                          for (const auto& t : json::parse(r->body, nullptr, false)) {
                            if (t.is_object() && t.value("type", "") == "page") {
                              ws = t.value("webSocketDebuggerUrl", "");
                              return !ws.empty();
                            }
                          }
                          return false;
                        },
                        30s, 100ms),
                    "headless Chromium did not start; its output:\n"
                        << chrome_.output());
    // ws://127.0.0.1:PORT/devtools/page/ID
    auto path = ws.substr(ws.find('/', std::string("ws://").size()));
    auto endpoints = resolver_.resolve("127.0.0.1", std::to_string(port_));
    asio::connect(socket_.next_layer(), endpoints);
    socket_.handshake("127.0.0.1:" + std::to_string(port_), path);
  }

  ~Browser() {
    beast::error_code ignored;
    socket_.close(beast::websocket::close_code::normal, ignored);
    chrome_.stop(5s);
  }

  // Sends a command and returns its result (REQUIREs that it succeeded).
  json call(const std::string& method, json params = json::object()) {
    int id = ++next_id_;
    socket_.write(asio::buffer(json{{"id", id}, {"method", method}, {"params", params}}.dump()));
    for (;;) {
      beast::flat_buffer buffer;
      socket_.read(buffer);
      auto message = json::parse(beast::buffers_to_string(buffer.data()));
      if (message.value("id", 0) != id)
        continue;  // an event
      REQUIRE_MESSAGE(!message.contains("error"), method << ": " << message["error"].dump());
      return message["result"];
    }
  }

  // A JavaScript expression's value in the page.
  json eval(const std::string& expression) {
    auto r = call("Runtime.evaluate", {{"expression", expression}, {"returnByValue", true}});
    return r["result"].value("value", json());
  }

  // The page's DOM as it is now.
  std::string dom() { return eval("document.documentElement.outerHTML").get<std::string>(); }

  // Completed refreshes of the dashboard page (its body's data-refreshed).
  int refreshes() {
    auto v = eval("Number(document.body && document.body.dataset.refreshed || 0)");
    return v.is_number() ? v.get<int>() : 0;
  }

  void screenshot(const std::string& path) {
    auto data = call("Page.captureScreenshot", {{"format", "png"}})["data"].get<std::string>();
    std::string png(data.size() / 4 * 3 + 3, '\0');
    int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(png.data()),
                            reinterpret_cast<const unsigned char*>(data.data()),
                            static_cast<int>(data.size()));
    REQUIRE(n > 0);
    // EVP_DecodeBlock counts the padding's zero bytes.
    size_t pad = data.size() >= 2 && data[data.size() - 1] == '=' ? (data[data.size() - 2] == '=' ? 2 : 1) : 0;
    png.resize(static_cast<size_t>(n) - pad);
    std::ofstream(path, std::ios::binary) << png;
  }

 private:
  uint16_t port_ = 0;
  ChildProcess chrome_;
  asio::io_context ioc_;
  tcp::resolver resolver_{ioc_};
  beast::websocket::stream<tcp::socket> socket_{ioc_};
  int next_id_ = 0;
};

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The replica ids of a deployment in a `status --json` answer.
std::set<std::string> replica_ids(const json& status, const std::string& app,
                                  const std::string& dep) {
  std::set<std::string> out;
  for (const auto& r : status["applications"][app]["deployments"][dep]["replicas"])
    out.insert(r.value("id", ""));
  return out;
}

// The attributes of deployment `key`'s chart `name` (rate, p99 or errors) as
// the page drew it last: {"points": samples with a value, "last": the newest
// sample's value (null when it had none), "max": the largest value shown
// (null without points), "paths": drawn <path> elements}; null when the page
// has no such chart.
json chart(Browser& browser, const std::string& key, const std::string& name) {
  return browser.eval(
      "(() => { const s = document.querySelector('svg[data-chart=\"" + name +
      "\"][data-deployment=\"" + key +
      "\"]'); if (!s) return null;"
      " const n = v => v === undefined || v === '' ? null : Number(v);"
      " return {points: n(s.dataset.points), last: n(s.dataset.last), max: n(s.dataset.max),"
      " paths: s.querySelectorAll('path').length}; })()");
}

// A number of chart()'s answer, or -1 when it is not a number.
double field(const json& chart, const char* name) {
  if (!chart.is_object() || !chart.contains(name) || !chart[name].is_number())
    return -1;
  return chart[name].get<double>();
}

// The restarts cell of deployment `key` (its data-restarts): -1 when the
// page has no such cell or it is empty (a head without the count).
int restarts(Browser& browser, const std::string& key) {
  auto v = browser.eval("(() => { const td = document.querySelector('tr[data-deployment=\"" + key +
                        "\"] td[data-restarts]'); return td ? td.dataset.restarts : ''; })()");
  if (!v.is_string() || v.get<std::string>().empty())
    return -1;
  return std::stoi(v.get<std::string>());
}

// Closed-loop load from one thread until stopped (also when the test fails):
// four requests that answer 200 (each computing 2 ms, so that the p99 is
// well above 0), then one that throws (500), again and again.
class MixedLoad {
 public:
  MixedLoad(uint16_t port, std::string prefix) {
    thread_ = std::thread([this, port, prefix] {
      for (uint64_t n = 0; !stop_; ++n) {
        bool fail = n % 5 == 4;
        auto r =
            http_request(port, "GET", prefix + (fail ? "?mode=throw" : "?spin_us=2000"), "", 10);
        int status = r ? r->status : 0;
        (status == 200 ? ok_ : status == 500 ? errors_ : other_)++;
      }
    });
  }
  ~MixedLoad() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable())
      thread_.join();
  }
  int ok() const { return ok_; }
  int errors() const { return errors_; }
  int other() const { return other_; }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> ok_{0}, errors_{0}, other_{0};
  std::thread thread_;
};

// Two replicas of the probe; their load reports every 0.5 s (the setting is
// autoscaling's, here with a fixed count: min = max).
const char* kProbe = R"(applications:
  - name: app
    route_prefix: /app
    import_path: libtroupe_examples.so:InlineProbe
    args: {nonblocking: false}
    deployments:
      - name: InlineProbe
        autoscaling_config:
          min_replicas: 2
          max_replicas: 2
          metrics_interval_s: 0.5
)";

const char* kApps = R"(applications:
  - name: echo
    route_prefix: /echo
    import_path: libtroupe_examples.so:Echo
    deployments:
      - name: Echo
        num_replicas: 3
  - name: greeter
    route_prefix: /greet
    import_path: libtroupe_examples.so:Hello
    deployments:
      - name: Hello
        num_replicas: 2
)";

}  // namespace

TEST_CASE("dashboard: headless Chromium shows every node - application and deployment - and a killed replica replaced") {
  Cluster c;
  c.start({"w1", "w2"});
  auto deployed = c.ctl({"deploy", c.write("apps.yaml", kApps), "--wait"});
  REQUIRE_MESSAGE(deployed.exit_code == 0, deployed.out << deployed.err);
  auto status = [&] {
    auto s = c.status();
    REQUIRE(s.is_object());
    return s;
  };

  // Only the head serves it, on its admin port; the ingress does not.
  auto ingress_page = http_get(c.http_ports.at("head"), "/-/dashboard", 5);
  REQUIRE(ingress_page);
  CHECK(ingress_page->status == 404);
  auto worker_page = http_get(c.admin_ports.at("w1"), "/-/dashboard", 5);
  REQUIRE(worker_page);
  CHECK(worker_page->status == 404);
  CHECK(has(worker_page->body, "the head serves it"));

  Browser browser(c.dir.path());
  const int refresh_ms = 500;
  browser.call("Page.navigate", {{"url", "http://127.0.0.1:" +
                                             std::to_string(c.admin_ports.at("head")) +
                                             "/-/dashboard?refresh=" + std::to_string(refresh_ms)}});
  REQUIRE(wait_until([&] { return browser.refreshes() >= 1; }, 20s, 50ms));
  // A mark on this page: it must still be there at the end (no reload).
  browser.eval("window.troupeTestMark = 42");

  auto dom = browser.dom();
  for (const auto& node : {"head", "w1", "w2"})
    CHECK_MESSAGE(has(dom, std::string("data-node=\"") + node + "\" data-state=\"ALIVE\""), node);
  CHECK(has(dom, "data-application=\"echo\" data-status=\"RUNNING\""));
  CHECK(has(dom, "data-application=\"greeter\" data-status=\"RUNNING\""));
  CHECK(has(dom, "data-deployment=\"echo/Echo\" data-status=\"HEALTHY\""));
  CHECK(has(dom, "data-deployment=\"greeter/Hello\" data-status=\"HEALTHY\""));
  auto before = replica_ids(status(), "echo", "Echo");
  REQUIRE(before.size() == 3);
  for (const auto& id : before)
    CHECK_MESSAGE(has(dom, "data-replica=\"" + id + "\" data-state=\"RUNNING\""), id);
  // The events show the deploy.
  CHECK(has(dom, "data-kind=\"deploy\""));

  // Kill one replica; once the controller lists its replacement RUNNING,
  // the page shows it at its next refresh (the one in flight may predate
  // it: at most two refreshes).
  const std::string victim = *before.begin();
  auto killed = c.ctl({"kill", "replica", victim});
  REQUIRE_MESSAGE(killed.exit_code == 0, killed.err);
  std::set<std::string> after;
  REQUIRE(wait_until(
      [&] {
        auto s = status();
        auto& d = s["applications"]["echo"]["deployments"]["Echo"];
        after = replica_ids(s, "echo", "Echo");
        size_t running = 0;
        for (const auto& r : d["replicas"])
          running += r.value("state", "") == "RUNNING";
        return d.value("status", "") == "HEALTHY" && running == 3 && !after.count(victim);
      },
      30s, 100ms));
  const int seen = browser.refreshes();
  REQUIRE(wait_until([&] { return browser.refreshes() >= seen + 2; }, 10s, 20ms));
  dom = browser.dom();
  CHECK_FALSE(has(dom, "data-replica=\"" + victim + "\""));
  for (const auto& id : after)
    CHECK_MESSAGE(has(dom, "data-replica=\"" + id + "\" data-state=\"RUNNING\""), id);
  CHECK(has(dom, "data-kind=\"crash\""));  // the event of the kill
  CHECK(browser.eval("window.troupeTestMark") == 42);

  browser.screenshot(bin_dir() + "/dashboard.png");
  CHECK(std::filesystem::file_size(bin_dir() + "/dashboard.png") > 10000);
}

TEST_CASE("dashboard: charts of a deployment under load - request rate - p99 latency - errors - and its restarts") {
  Cluster c;
  c.start({"w1"});
  c.deploy_yaml("probe.yaml", kProbe);
  const std::string key = "app/InlineProbe";
  const uint16_t port = c.http_ports.at("head");

  Browser browser(c.dir.path());
  browser.call("Page.navigate",
               {{"url", "http://127.0.0.1:" + std::to_string(c.admin_ports.at("head")) +
                            "/-/dashboard?refresh=500"}});
  REQUIRE(wait_until([&] { return browser.refreshes() >= 1; }, 20s, 50ms));
  // Three charts from the first refresh on; the restarts cell shows 0.
  CHECK(has(browser.dom(), "data-deployment=\"" + key + "\" data-status=\"HEALTHY\""));
  for (const auto& name : {"rate", "p99", "errors"})
    CHECK_MESSAGE(chart(browser, key, name).is_object(), name);
  CHECK(restarts(browser, key) == 0);

  MixedLoad load(port, "/app/");
  // While the load runs, the rate chart's newest sample is above 0: the
  // replicas reported it (every 0.5 s) and the page drew it (every 0.5 s).
  json rate;
  CHECK_MESSAGE(wait_until(
                    [&] {
                      rate = chart(browser, key, "rate");
                      return field(rate, "last") > 0;
                    },
                    30s, 100ms),
                rate.dump() << " ok " << load.ok() << " 500s " << load.errors());

  // Kill one replica under load; wait for its replacement.
  auto before = c.running_replicas("app", "InlineProbe");
  REQUIRE(before.size() == 2);
  const std::string victim = before.begin()->first;
  auto killed = c.ctl({"kill", "replica", victim});
  REQUIRE_MESSAGE(killed.exit_code == 0, killed.err);
  REQUIRE(wait_until(
      [&] {
        auto s = c.status();
        if (!s.is_object())
          return false;
        auto& d = s["applications"]["app"]["deployments"]["InlineProbe"];
        std::set<std::string> running;
        for (const auto& r : d["replicas"]) {
          if (r.value("state", "") == "RUNNING")
            running.insert(r.value("id", ""));
        }
        return d.value("status", "") == "HEALTHY" && running.size() == 2 && !running.count(victim);
      },
      60s, 200ms));
  // The restarts cell counts the killed replica (highlighted: a badge).
  int seen_restarts = -1;
  CHECK_MESSAGE(wait_until(
                    [&] {
                      seen_restarts = restarts(browser, key);
                      return seen_restarts >= 1;
                    },
                    20s, 100ms),
                "data-restarts " << seen_restarts);
  CHECK(browser.eval("!!document.querySelector('tr[data-deployment=\"" + key +
                     "\"] td[data-restarts] .badge')") == true);

  // The error and p99 charts have drawn the load too (reports after the
  // kill came from both replicas again).
  json errors, p99;
  CHECK_MESSAGE(wait_until(
                    [&] {
                      errors = chart(browser, key, "errors");
                      p99 = chart(browser, key, "p99");
                      return field(errors, "max") > 0 && field(p99, "max") > 0;
                    },
                    30s, 100ms),
                "errors " << errors.dump() << " p99 " << p99.dump());
  load.stop();
  INFO("ok " << load.ok() << ", 500s " << load.errors() << ", other " << load.other());
  CHECK(load.ok() > 0);
  CHECK(load.errors() > 0);

  // Without load the newest samples say 0 requests/s and no p99 (null: no
  // request finished), which the p99 chart keeps as a gap, not a point.
  CHECK_MESSAGE(wait_until(
                    [&] {
                      rate = chart(browser, key, "rate");
                      p99 = chart(browser, key, "p99");
                      return field(rate, "last") == 0 && p99.is_object() && p99["last"].is_null();
                    },
                    30s, 100ms),
                "rate " << rate.dump() << " p99 " << p99.dump());

  // What the charts show: the rate's largest value > 0 over several
  // samples, drawn; errors > 0; p99 a number of milliseconds (the ok
  // requests compute 2 ms, so at least that, to within the estimate's 9 %),
  // with fewer points than the rate: its null samples (before and after
  // the load) are gaps, not points.
  rate = chart(browser, key, "rate");
  errors = chart(browser, key, "errors");
  p99 = chart(browser, key, "p99");
  CAPTURE(rate.dump());
  CAPTURE(errors.dump());
  CAPTURE(p99.dump());
  CHECK(field(rate, "points") >= 2);
  CHECK(field(rate, "max") > 0);
  CHECK(field(rate, "paths") >= 1);
  CHECK(field(errors, "points") >= 2);
  CHECK(field(errors, "max") > 0);
  CHECK(field(errors, "paths") >= 1);
  CHECK(field(p99, "points") >= 1);
  CHECK(field(p99, "max") >= 1.5);
  CHECK(field(p99, "max") < 10000);
  CHECK(field(p99, "points") < field(rate, "points"));
  // The error rate never exceeds the request rate it is part of.
  CHECK(field(errors, "max") <= field(rate, "max"));

  browser.screenshot(bin_dir() + "/dashboard-charts.png");
  CHECK(std::filesystem::file_size(bin_dir() + "/dashboard-charts.png") > 10000);
}
