#include "tools/chaos/http_client.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

namespace chaos {

namespace {

using Clock = std::chrono::steady_clock;

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

// Waits until `fd` is ready for `events`; false at the deadline or on error.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    int ms = remaining_ms(deadline);
    int r = ::poll(&p, 1, ms);
    if (r > 0)
      return true;
    if (r == 0)
      return false;
    if (errno != EINTR)
      return false;
  }
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

HttpClient::~HttpClient() {
  close();
}

void HttpClient::close() {
  if (fd_ >= 0)
    ::close(fd_);
  fd_ = -1;
  buffer_.clear();
}

bool HttpClient::connect_to(Clock::time_point deadline) {
  close();
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0)
    return false;
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port_);
  if (::inet_pton(AF_INET, host_.c_str(), &addr.sin_addr) != 1) {
    close();
    return false;
  }
  int rc = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  if (rc == 0)
    return true;
  if (errno != EINPROGRESS || !wait_fd(fd_, POLLOUT, deadline)) {
    close();
    return false;
  }
  int err = 0;
  socklen_t len = sizeof(err);
  if (::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
    close();
    return false;
  }
  return true;
}

HttpResult HttpClient::get(const std::string& target, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  HttpResult result;
  // A kept-alive connection the server closed meanwhile is readable (EOF);
  // it must not take the request.
  if (fd_ >= 0) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 0) > 0 && buffer_.empty())
      close();
  }
  if (fd_ < 0) {
    if (!connect_to(deadline)) {
      result.error = "connect";
      return result;
    }
    result.connected = true;
  }
  std::string request = "GET " + target + " HTTP/1.1\r\nHost: " + host_ + ":" +
                        std::to_string(port_) + "\r\nUser-Agent: troupe-chaos\r\n\r\n";
  size_t sent = 0;
  while (sent < request.size()) {
    ssize_t n = ::send(fd_, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_fd(fd_, POLLOUT, deadline))
      continue;
    if (n < 0 && errno == EINTR)
      continue;
    result.error = Clock::now() >= deadline ? "timeout" : "reset";
    close();
    return result;
  }

  // Reads more bytes into buffer_; false on EOF, error or deadline (then
  // `why` is set).
  std::string why;
  auto read_more = [&]() -> bool {
    char chunk[16384];
    while (true) {
      ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n > 0) {
        buffer_.append(chunk, static_cast<size_t>(n));
        return true;
      }
      if (n == 0) {
        why = "reset";
        return false;
      }
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait_fd(fd_, POLLIN, deadline)) {
          why = "timeout";
          return false;
        }
        continue;
      }
      why = "reset";
      return false;
    }
  };
  auto fail = [&]() {
    result.status = 0;
    result.error = why.empty() ? "reset" : why;
    close();
    return result;
  };

  size_t header_end;
  while ((header_end = buffer_.find("\r\n\r\n")) == std::string::npos) {
    if (buffer_.size() > (1u << 20) || !read_more())
      return fail();
  }
  std::string head = buffer_.substr(0, header_end);
  buffer_.erase(0, header_end + 4);
  // Status line: HTTP/1.1 200 OK
  auto sp = head.find(' ');
  if (sp == std::string::npos || head.size() < sp + 4) {
    why = "reset";
    return fail();
  }
  result.status = std::atoi(head.c_str() + sp + 1);
  bool chunked = false;
  bool close_after = false;
  long long content_length = -1;
  size_t pos = head.find("\r\n");
  while (pos != std::string::npos) {
    size_t next = head.find("\r\n", pos + 2);
    std::string line =
        head.substr(pos + 2, next == std::string::npos ? std::string::npos : next - pos - 2);
    auto colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = lower(line.substr(0, colon));
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(" \t"));
      if (name == "content-length")
        content_length = std::atoll(value.c_str());
      else if (name == "transfer-encoding" && lower(value).find("chunked") != std::string::npos)
        chunked = true;
      else if (name == "connection" && lower(value).find("close") != std::string::npos)
        close_after = true;
    }
    pos = next;
  }
  int status = result.status;
  if (chunked) {
    std::string body;
    while (true) {
      size_t eol;
      while ((eol = buffer_.find("\r\n")) == std::string::npos) {
        if (!read_more())
          return fail();
      }
      long long size = std::strtoll(buffer_.substr(0, eol).c_str(), nullptr, 16);
      buffer_.erase(0, eol + 2);
      while (static_cast<long long>(buffer_.size()) < size + 2) {
        if (!read_more())
          return fail();
      }
      body.append(buffer_, 0, static_cast<size_t>(size));
      buffer_.erase(0, static_cast<size_t>(size) + 2);
      if (size == 0)
        break;
    }
    result.body = std::move(body);
  } else if (content_length >= 0) {
    while (static_cast<long long>(buffer_.size()) < content_length) {
      if (!read_more())
        return fail();
    }
    result.body = buffer_.substr(0, static_cast<size_t>(content_length));
    buffer_.erase(0, static_cast<size_t>(content_length));
  } else {
    // No length: the body ends with the connection.
    while (read_more()) {
    }
    if (why == "timeout")
      return fail();
    result.body = std::move(buffer_);
    buffer_.clear();
    close_after = true;
  }
  result.status = status;
  if (close_after)
    close();
  return result;
}

}  // namespace chaos
