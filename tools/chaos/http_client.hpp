// A small blocking HTTP/1.1 client with keep-alive over loopback TCP, every
// step bounded by a deadline (poll on a non-blocking socket). One connection
// per client; the load generator runs one client per thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace chaos {

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
  HttpClient(std::string host, uint16_t port) : host_(std::move(host)), port_(port) {}
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
  bool connect_to(std::chrono::steady_clock::time_point deadline);

  std::string host_;
  uint16_t port_;
  int fd_ = -1;
  std::string buffer_;  // bytes read past the previous answer
};

}  // namespace chaos
