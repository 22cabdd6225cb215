// A small blocking HTTP/1.1 client (Boost.Beast) with keep-alive over
// loopback TCP, every request bounded by a deadline. One connection per
// client; the load generator runs one client per thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace chaos {

// Where a node's HTTP proxy listens.
struct Endpoint {
  std::string host;
  uint16_t port = 0;
};

struct HttpResult {
  // HTTP status, or 0 when no answer came; then `error` says why:
  // "connect" (refused or timed out connecting), "reset" (closed or reset
  // before a whole answer), "timeout" (no whole answer before the deadline).
  int status = 0;
  std::string error;
  std::string body;
  // True when a fresh connection was opened for this request.
  bool connected = false;
};

class HttpClient {
 public:
  HttpClient(std::string host, uint16_t port);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // GET `target`. Before reusing a keep-alive connection it checks that
  // the server has not closed it (then it connects afresh); once a request
  // is sent it is never sent again, so every request that was in flight when
  // a process died counts as failed.
  HttpResult get(const std::string& target, std::chrono::milliseconds timeout);
  void close();

 private:
  struct Connection;
  bool connect_to(std::chrono::steady_clock::time_point deadline);

  std::string host_;
  uint16_t port_;
  std::unique_ptr<Connection> conn_;  // empty: not connected
};

}  // namespace chaos
