#include "tools/chaos/http_client.hpp"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <limits>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace chaos {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// One kept-alive connection, driven on an io_context of its own by the
// client's thread (each step runs the io_context until it completes or the
// deadline of the stream expires).
struct HttpClient::Connection {
  asio::io_context ioc;
  beast::tcp_stream stream{ioc};
  beast::flat_buffer buffer;  // bytes read past the previous answer

  void run() {
    ioc.restart();
    ioc.run();
  }
};

HttpClient::HttpClient(std::string host, uint16_t port) : host_(std::move(host)), port_(port) {}

HttpClient::~HttpClient() {
  close();
}

void HttpClient::close() {
  if (conn_) {
    beast::error_code ignored;  // closing: nothing left to report
    conn_->stream.socket().close(ignored);
  }
  conn_.reset();
}

bool HttpClient::connect_to(std::chrono::steady_clock::time_point deadline) {
  close();
  beast::error_code ec;
  auto address = asio::ip::make_address_v4(host_, ec);
  if (ec)
    return false;
  auto c = std::make_unique<Connection>();
  // Close-on-exec from the start: the chaos tool starts nodes from other
  // threads, and a child holding this socket would keep it open.
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return false;
  c->stream.socket().assign(tcp::v4(), fd, ec);
  if (ec) {
    ::close(fd);
    return false;
  }
  c->stream.expires_at(deadline);
  c->stream.async_connect(tcp::endpoint(address, port_), [&](beast::error_code e) { ec = e; });
  c->run();
  if (ec)
    return false;
  c->stream.socket().set_option(tcp::no_delay(true), ec);  // best effort: latency only
  conn_ = std::move(c);
  return true;
}

HttpResult HttpClient::get(const std::string& target, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  HttpResult result;
  // A kept-alive connection the server closed meanwhile is readable (EOF);
  // it must not take the request.
  if (conn_ && conn_->buffer.size() == 0) {
    pollfd p{conn_->stream.socket().native_handle(), POLLIN, 0};
    if (::poll(&p, 1, 0) > 0)
      close();
  }
  if (!conn_) {
    if (!connect_to(deadline)) {
      result.error = "connect";
      return result;
    }
    result.connected = true;
  }
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, host_ + ":" + std::to_string(port_));
  req.set(http::field::user_agent, "troupe-chaos");
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  beast::error_code ec;
  auto& c = *conn_;
  c.stream.expires_at(deadline);
  http::async_write(c.stream, req, [&](beast::error_code e, size_t) {
    ec = e;
    if (!e)
      http::async_read(c.stream, c.buffer, parser, [&](beast::error_code e2, size_t) { ec = e2; });
  });
  c.run();
  if (ec || !parser.is_done()) {
    result.error = ec == beast::error::timeout ? "timeout" : "reset";
    close();
    return result;
  }
  auto& res = parser.get();
  result.status = res.result_int();
  result.body = std::move(res.body());
  if (!res.keep_alive())
    close();
  return result;
}

}  // namespace chaos
