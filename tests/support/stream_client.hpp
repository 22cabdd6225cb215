// A raw-socket HTTP/1.1 client for streamed answers (chunked transfer
// encoding), for the streaming and cancellation tests: it sends one GET,
// reads the head, decodes the chunked body as it arrives (recording when
// each chunk's last byte came), can read at a limited rate, and can leave
// (close its socket) whenever the test wants. Every read has a deadline.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>

namespace troupe::testing {

// A raw-socket HTTP/1.1 client for one streamed GET: sends the request,
// reads the head, then decodes the chunked body incrementally, recording
// when each chunk's last byte arrived. Optionally reads at most
// `rate_bytes_per_s` (a token bucket, in reads of at most `read_size`).
class StreamClient {
 public:
  using Clock = std::chrono::steady_clock;

  struct Chunk {
    std::string data;
    Clock::time_point at;  // when its last byte arrived
  };
  enum class Next {
    chunk,    // `out` holds the next chunk
    end,      // the final zero chunk (and the empty trailer) arrived: a clean end
    eof,      // the connection ended before the final chunk
    timeout,  // nothing complete before the deadline
    error,    // a malformed chunk or a socket error
  };

  StreamClient() = default;
  ~StreamClient() { close(); }
  StreamClient(const StreamClient&) = delete;
  StreamClient& operator=(const StreamClient&) = delete;

  void limit_rate(double bytes_per_s, std::size_t read_size = 16 * 1024) {
    rate_ = bytes_per_s;
    read_size_ = read_size;
    tokens_ = 0;
    refilled_ = Clock::now();
  }

  // Connects to 127.0.0.1:port and sends GET `target`. The send time is
  // `sent_at`.
  bool get(uint16_t port, const std::string& target) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0)
      return false;
    if (rate_ > 0) {
      // A small receive buffer, so that the kernel does not read far ahead
      // of the rate limit.
      int size = 64 * 1024;
      ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
      return false;
    const std::string request = "GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1:" +
                                std::to_string(port) + "\r\nAccept: */*\r\n\r\n";
    sent_at = Clock::now();
    std::size_t done = 0;
    while (done < request.size()) {
      ssize_t n = ::send(fd_, request.data() + done, request.size() - done, MSG_NOSIGNAL);
      if (n <= 0)
        return false;
      done += static_cast<std::size_t>(n);
    }
    return true;
  }

  // Reads the status line and the header fields.
  bool read_head(Clock::time_point deadline) {
    for (;;) {
      auto end = buf_.find("\r\n\r\n");
      if (end != std::string::npos) {
        head = buf_.substr(0, end + 2);
        buf_.erase(0, end + 4);
        std::istringstream line(head);
        std::string version;
        line >> version >> status;
        return status > 0;
      }
      if (fill(deadline) <= 0)
        return false;
    }
  }

  // The value of header `name` (case-insensitive), "" when absent.
  std::string header(const std::string& name) const {
    std::istringstream in(head);
    std::string line;
    std::getline(in, line);  // status line
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r')
        line.pop_back();
      auto colon = line.find(':');
      if (colon == std::string::npos || colon != name.size())
        continue;
      bool same = true;
      for (std::size_t i = 0; i < colon; ++i)
        same = same && std::tolower(static_cast<unsigned char>(line[i])) ==
                           std::tolower(static_cast<unsigned char>(name[i]));
      if (!same)
        continue;
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(" \t"));
      while (!value.empty() && (value.back() == ' ' || value.back() == '\t'))
        value.pop_back();
      return value;
    }
    return "";
  }

  // The next chunk of a chunked body.
  Next next_chunk(Chunk& out, Clock::time_point deadline) {
    // The size line.
    std::string line;
    if (Next r = read_line(line, deadline); r != Next::chunk)
      return r;
    auto semi = line.find(';');
    std::string hex = line.substr(0, semi);
    while (!hex.empty() && (hex.back() == ' ' || hex.back() == '\t'))
      hex.pop_back();
    if (hex.empty() || hex.size() > 15 ||
        hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
      return Next::error;
    const std::size_t size = std::stoull(hex, nullptr, 16);
    if (size == 0) {
      // Trailer fields, then an empty line.
      for (;;) {
        if (Next r = read_line(line, deadline); r != Next::chunk)
          return r;
        if (line.empty())
          return Next::end;
      }
    }
    while (buf_.size() < size + 2) {
      ssize_t n = fill(deadline);
      if (n == 0)
        return Next::eof;
      if (n < 0)
        return n == -2 ? Next::timeout : Next::error;
    }
    if (buf_.compare(size, 2, "\r\n") != 0)
      return Next::error;
    out.data = buf_.substr(0, size);
    out.at = last_read_;
    buf_.erase(0, size + 2);
    return Next::chunk;
  }

  void close() {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = -1;
  }

  int status = 0;
  std::string head;
  Clock::time_point sent_at;

 private:
  Next read_line(std::string& line, Clock::time_point deadline) {
    for (;;) {
      auto end = buf_.find("\r\n");
      if (end != std::string::npos) {
        line = buf_.substr(0, end);
        buf_.erase(0, end + 2);
        return Next::chunk;
      }
      if (buf_.size() > 4096)
        return Next::error;
      ssize_t n = fill(deadline);
      if (n == 0)
        return Next::eof;
      if (n < 0)
        return n == -2 ? Next::timeout : Next::error;
    }
  }

  // Reads more into buf_: the byte count, 0 at the end of the connection,
  // -1 on an error, -2 at the deadline.
  ssize_t fill(Clock::time_point deadline) {
    std::size_t want = read_size_;
    if (rate_ > 0) {
      // Token bucket: at most `rate_` bytes per second, bursts of read_size_.
      for (;;) {
        auto now = Clock::now();
        tokens_ = std::min<double>(static_cast<double>(read_size_),
                                   tokens_ + rate_ * std::chrono::duration<double>(now - refilled_).count());
        refilled_ = now;
        if (tokens_ >= 1)
          break;
        if (now >= deadline)
          return -2;
        // Pacing the reads is the point here, not waiting for a condition.
        auto until = now + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>((1 - tokens_) / rate_));
        std::this_thread::sleep_until(std::min(until, deadline));
      }
      want = std::min<std::size_t>(want, static_cast<std::size_t>(tokens_));
    }
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() < 0)
        return -2;
      pollfd p{fd_, POLLIN, 0};
      int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, 1000)));
      if (ready < 0 && errno == EINTR)
        continue;
      if (ready < 0)
        return -1;
      if (ready == 0)
        continue;
      std::string piece(want, '\0');
      ssize_t n = ::recv(fd_, piece.data(), piece.size(), 0);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0)
        return errno == ECONNRESET ? 0 : -1;  // a reset ends the body too
      if (n > 0) {
        buf_.append(piece.data(), static_cast<std::size_t>(n));
        last_read_ = Clock::now();
        if (rate_ > 0)
          tokens_ -= static_cast<double>(n);
      }
      return n;
    }
  }

  int fd_ = -1;
  std::string buf_;
  Clock::time_point last_read_;
  double rate_ = 0;
  std::size_t read_size_ = 64 * 1024;
  double tokens_ = 0;
  Clock::time_point refilled_;
};

inline const char* describe(StreamClient::Next n) {
  switch (n) {
    case StreamClient::Next::chunk:
      return "chunk";
    case StreamClient::Next::end:
      return "end";
    case StreamClient::Next::eof:
      return "eof";
    case StreamClient::Next::timeout:
      return "timeout";
    case StreamClient::Next::error:
      return "error";
  }
  return "?";
}

}  // namespace troupe::testing
