#include "tests/support/http_client.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <limits>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace troupe::testing {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// "HTTP/1.1 200 OK\r\nName: value..." as received, without the blank line.
std::string head_of(const http::response_header<>& header) {
  std::string head = header.version() == 10 ? "HTTP/1.0 " : "HTTP/1.1 ";
  head += std::to_string(header.result_int());
  head += ' ';
  head += std::string(header.reason());
  for (const auto& field : header) {
    head += "\r\n";
    head += std::string(field.name_string());
    head += ": ";
    head += std::string(field.value());
  }
  return head;
}

}  // namespace

std::optional<HttpReply> http_get(uint16_t port, const std::string& target, double timeout_s) {
  return http_request(port, "GET", target, "", timeout_s);
}

std::optional<HttpReply> http_request(
    uint16_t port, const std::string& method, const std::string& target, const std::string& body,
    double timeout_s, const std::vector<std::pair<std::string, std::string>>& headers) {
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  // One deadline for the whole exchange: connect, send, the whole answer.
  stream.expires_after(std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(timeout_s)));

  http::request<http::string_body> req;
  req.version(11);
  if (auto verb = http::string_to_verb(method); verb != http::verb::unknown)
    req.method(verb);
  else
    req.method_string(method);
  req.target(target);
  req.set(http::field::host, "127.0.0.1");
  req.set(http::field::connection, "close");
  for (const auto& [name, value] : headers)
    req.set(name, value);
  if (!body.empty() || method != "GET") {
    req.body() = body;
    req.prepare_payload();  // Content-Length
  }

  http::response_parser<http::string_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  beast::flat_buffer buffer;
  beast::error_code result;
  stream.async_connect(tcp::endpoint(asio::ip::address_v4::loopback(), port),
                       [&](beast::error_code ec) {
                         if (ec) {
                           result = ec;
                           return;
                         }
                         http::async_write(stream, req, [&](beast::error_code ec, size_t) {
                           if (ec) {
                             result = ec;
                             return;
                           }
                           http::async_read(stream, buffer, parser,
                                            [&](beast::error_code ec, size_t) { result = ec; });
                         });
                       });
  ioc.run();
  if (result || !parser.is_done())
    return std::nullopt;  // refused, reset, timed out or malformed
  auto& res = parser.get();
  HttpReply r;
  r.status = res.result_int();
  r.head = head_of(res.base());
  r.body = std::move(res.body());
  return r;
}

std::optional<double> metric_value(uint16_t port, const std::string& series) {
  auto page = http_get(port, "/-/metrics", 10);
  if (!page || page->status != 200)
    return std::nullopt;
  const std::string& text = page->body;
  const std::string key = series + " ";
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos)
      end = text.size();
    if (text.compare(at, key.size(), key) == 0)
      return std::stod(text.substr(at + key.size(), end - at - key.size()));
    at = end + 1;
  }
  return std::nullopt;
}

bool closed_after_sending(uint16_t port, const std::string& bytes,
                          std::chrono::milliseconds deadline) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool closed = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size())) {
    auto until = std::chrono::steady_clock::now() + deadline;
    while (std::chrono::steady_clock::now() < until) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0)
        continue;
      char buf[4096];
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) {
        closed = true;
        break;
      }
    }
  }
  ::close(fd);
  return closed;
}

}  // namespace troupe::testing
