// The head's dashboard (/-/dashboard) in a real browser: headless Chromium
// loads the page from a running cluster once, and the test reads the DOM it
// rendered through the DevTools protocol (a WebSocket, Boost.Beast), also
// after a replica was killed: the same page, refreshing by itself, shows the
// replacement. A screenshot of the page is written next to the test binary
// (docs/dashboard.png is one such screenshot).
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <openssl/evp.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

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
