// A minimal blocking HTTP/1.1 client for integration tests (Boost.Beast): one
// request per connection (Connection: close), the whole exchange bounded by
// a timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace troupe::testing {

struct HttpReply {
  int status = 0;
  std::string head;  // status line and headers
  std::string body;
};

// GET http://127.0.0.1:<port><target>; nullopt when the connection fails or
// no complete answer arrives within `timeout_s`.
std::optional<HttpReply> http_get(uint16_t port, const std::string& target, double timeout_s = 30);

// Any method, with a body (sent with Content-Length) and extra header
// fields (name, value).
std::optional<HttpReply> http_request(
    uint16_t port, const std::string& method, const std::string& target, const std::string& body,
    double timeout_s = 30,
    const std::vector<std::pair<std::string, std::string>>& headers = {});

// The value of one series of the /-/metrics page of the node whose admin
// listener is on `port`: `series` is its name and labels as the page writes
// them (e.g. `troupe_proxy_replica_sends_total{transport="peer"}`).
// nullopt when the page did not answer 200 or has no such series.
std::optional<double> metric_value(uint16_t port, const std::string& series);

// Connects to 127.0.0.1:port, sends `bytes`, and reports whether the other
// side closed the connection within `deadline` (reading and discarding
// whatever it sends). False also when the connection or the send failed.
bool closed_after_sending(uint16_t port, const std::string& bytes,
                          std::chrono::milliseconds deadline);

}  // namespace troupe::testing
