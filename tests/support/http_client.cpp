#include "tests/support/http_client.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

namespace troupe::testing {

std::optional<HttpReply> http_get(uint16_t port, const std::string& target, double timeout_s) {
  return http_request(port, "GET", target, "", timeout_s);
}

std::optional<HttpReply> http_request(uint16_t port, const std::string& method,
                                      const std::string& target, const std::string& body,
                                      double timeout_s) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return std::nullopt;
  timeval tv{static_cast<time_t>(timeout_s),
             static_cast<suseconds_t>((timeout_s - static_cast<time_t>(timeout_s)) * 1e6)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return std::nullopt;
  }
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!body.empty() || method != "GET")
    req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n";
  req += body;
  for (size_t off = 0; off < req.size();) {
    auto n = ::send(fd, req.data() + off, req.size() - off, MSG_NOSIGNAL);
    if (n <= 0) {
      ::close(fd);
      return std::nullopt;
    }
    off += static_cast<size_t>(n);
  }
  std::string data;
  char buf[4096];
  while (true) {
    auto n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0)
      break;
    if (n < 0) {
      ::close(fd);
      return std::nullopt;  // timeout or reset
    }
    data.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  auto end = data.find("\r\n\r\n");
  if (end == std::string::npos || data.size() < 12)
    return std::nullopt;
  HttpReply r;
  r.head = data.substr(0, end);
  r.body = data.substr(end + 4);
  r.status = std::atoi(data.substr(9, 3).c_str());
  return r;
}

}  // namespace troupe::testing
