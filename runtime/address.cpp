#include "runtime/address.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

namespace troupe {

std::string Endpoint::to_string() const {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<Endpoint> parse_endpoint(const std::string& text) {
  auto fail = [&](const std::string& why) {
    return Result<Endpoint>(errc::invalid_argument,
                            "address '" + text + "' is not HOST:PORT: " + why);
  };
  std::string host;
  std::string port;
  if (!text.empty() && text[0] == '[') {
    auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return fail("expected [IPv6]:PORT");
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string::npos)
      return fail("missing ':PORT'");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string::npos)
      return fail("write IPv6 addresses as [ADDR]:PORT");
  }
  if (host.empty())
    return fail("missing host");
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos) {
    return fail("port '" + port + "' is not a number");
  }
  long value = std::strtol(port.c_str(), nullptr, 10);
  if (value < 1 || value > 65535)
    return fail("port " + port + " is outside 1-65535");
  return Endpoint{host, static_cast<uint16_t>(value)};
}

Status validate_node_id(const std::string& id) {
  if (id.empty() || id.size() > 64) {
    return Status(errc::invalid_argument, "node id '" + id + "' must have 1-64 characters");
  }
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) {
      return Status(errc::invalid_argument,
                    "node id '" + id + "' may contain only letters, digits, '.', '_' and '-'");
    }
  }
  return Status::ok();
}

namespace {

std::string numeric(const sockaddr* a, socklen_t len) {
  char host[NI_MAXHOST];
  if (::getnameinfo(a, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0)
    return "";
  return host;
}

// The source address of the route towards host:port.
std::string route_source(const Endpoint& toward) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(toward.host.c_str(), std::to_string(toward.port).c_str(), &hints, &found) != 0)
    return "";
  std::string out;
  for (auto* a = found; a != nullptr && out.empty(); a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0)
      continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0)
      out = numeric(reinterpret_cast<sockaddr*>(&local), len);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return out;
}

std::string first_interface_address() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0)
    return "";
  std::string out;
  for (auto* i = list; i != nullptr && out.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK))
      continue;
    if (i->ifa_addr->sa_family == AF_INET)
      out = numeric(i->ifa_addr, sizeof(sockaddr_in));
  }
  ::freeifaddrs(list);
  return out;
}

}  // namespace

bool is_wildcard(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

std::string advertised_host(const std::string& bind, const std::optional<Endpoint>& toward) {
  if (!is_wildcard(bind))
    return bind;
  if (toward) {
    auto source = route_source(*toward);
    if (!source.empty() && !is_wildcard(source))
      return source;
  }
  auto address = first_interface_address();
  return address.empty() ? bind : address;
}

}  // namespace troupe
